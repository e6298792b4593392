"""The Algorithm contract as pytest tests, shipped so that a method's author runs them on their
own algorithms (``python -m dg_plugins.scripts.check_algorithm MODULE``, or
``DG_PLUGINS_IMPORT=MODULE python -m pytest --pyargs dg_plugins.contract``): on Debug28 and
Debug224 with ``TINY_TEST_HPARAMS``, on CPU and CUDA, what methods get wrong (optimizers,
gradients, update keys and floats, predict's logits, 1 and 3 domains, the lr schedule, resume).
Algorithms: ``$DG_PLUGINS_CONTRACT_ALGORITHMS``, else ``$DG_PLUGINS_IMPORT``'s, else dg_plugins'
own; a test module importing these tests may set ``CONTRACT_ALGORITHMS`` instead."""

from __future__ import annotations

import collections
import copy
import json
import math
import os

import pytest
import torch

from dg_plugins import hparams, plugins
from dg_plugins.job.records import read_record_lines
from dg_plugins.registry import ALGORITHMS, DATASETS

#: The datasets every algorithm is built on (in-memory, no files).
CONTRACT_DATASETS = ("Debug28", "Debug224")
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
UPDATES = 3
#: Record keys that differ between two runs of the same job (wall clock, memory, the folder).
VOLATILE_KEYS = ("step_time", "mem_gb", "args")


def selected_algorithms() -> list[str]:
    """The algorithms the contract runs on (module docstring)."""
    plugins.load()
    named = [n.strip() for n in os.environ.get(plugins.CONTRACT_ENV, "").split(",") if n.strip()]
    if named:
        return [ALGORITHMS.resolve(name, say=f"${plugins.CONTRACT_ENV}") for name in named]
    return (plugins.algorithms_of(plugins.modules_from_env())
            or plugins.algorithms_of(["dg_plugins.algorithms"]))


def pytest_generate_tests(metafunc) -> None:
    """Parametrize ``name`` by algorithm and ``case`` by (algorithm, dataset, device)."""
    names = getattr(metafunc.module, "CONTRACT_ALGORITHMS", None)
    names = selected_algorithms() if names is None else names
    if "name" in metafunc.fixturenames:
        metafunc.parametrize("name", names)
    if "case" in metafunc.fixturenames:
        cases = [(a, d, dev) for a in names for d in CONTRACT_DATASETS for dev in DEVICES]
        metafunc.parametrize("case", cases, ids=["-".join(c) for c in cases])


def tiny_hparams(algorithm: str, dataset: str, **overrides) -> dict:
    """Default hparams made CPU-sized (random init, ResNet-18, batch 8, the algorithm's
    ``TINY_TEST_HPARAMS``), then ``overrides``, all validated."""
    changes = {"pretrained": False, "resnet18": True, "resnet50_augmix": False, "batch_size": 8,
               **getattr(ALGORITHMS.get(algorithm), "TINY_TEST_HPARAMS", {}), **overrides}
    hp = hparams.default_hparams(algorithm, dataset)
    return hp | hparams.validate(algorithm, dataset, changes)


def minibatches(dataset, batch_size, envs, device="cpu"):
    """``batch_size`` items (cycling) of each environment in ``envs`` as ``(x, y)``."""
    items = [[dataset[i][j % len(dataset[i])] for j in range(batch_size)] for i in envs]
    return [(torch.stack([x for x, _ in env]).to(device),
             torch.as_tensor([y for _, y in env]).to(device)) for env in items]


def build(name, dataset_name, num_domains=2, device="cpu", **overrides):
    torch.manual_seed(0)
    dataset = DATASETS.get(dataset_name)("", [], {})
    hp = tiny_hparams(name, dataset_name, **overrides)
    algorithm = ALGORITHMS.get(name)(dataset.input_shape, dataset.num_classes, num_domains, hp)
    return algorithm.to(device), dataset, hp


def trainable(algorithm):
    return {n: p for n, p in algorithm.named_parameters() if p.requires_grad}


def read_records(folder, drop=()) -> list[dict]:
    """A job folder's records, without the keys in ``drop``."""
    return [{k: v for k, v in json.loads(line).items() if k not in drop}
            for line in read_record_lines(os.path.join(folder, "results.jsonl"))]


def test_tiny_test_hparams_are_declared_hparams(name):
    for dataset in CONTRACT_DATASETS:
        hparams.validate(name, dataset, dict(ALGORITHMS.get(name).TINY_TEST_HPARAMS))


def test_every_trainable_parameter_is_in_exactly_one_optimizer(name):
    algorithm, _, _ = build(name, "Debug28")
    optimizers = algorithm.optimizers()
    assert optimizers, f"{name} exposes no optimizer to resume checkpoints"
    owners = collections.defaultdict(list)
    for opt_name, opt in optimizers.items():
        for p in (p for group in opt.param_groups for p in group["params"]):
            owners[id(p)].append(opt_name)
    problems = [f"{pname}: in {owners[id(p)] or 'no optimizer'}"
                for pname, p in trainable(algorithm).items() if len(owners[id(p)]) != 1]
    assert not problems, f"{name}: " + "; ".join(problems)


def test_a_job_lr_schedule_scales_every_optimizer_but_the_exempt_ones(name):
    """``set_lr_factor`` scales every optimizer's initial lr but the exempt ones' (no compounding);
    an algorithm with its own torch scheduler refuses."""
    algorithm, _, _ = build(name, "Debug28")
    if algorithm.schedulers():
        with pytest.raises(ValueError, match="lr_schedule must stay 'constant'"):
            algorithm.set_lr_factor(0.5)
        return
    initial = {n: [g["lr"] for g in o.param_groups] for n, o in algorithm.optimizers().items()}
    exempt = algorithm.lr_schedule_exempt()
    assert exempt <= set(initial), f"{name} exempts unknown optimizers {exempt - set(initial)}"
    for factor in (0.5, 0.1):
        algorithm.set_lr_factor(factor)
        for opt_name, opt in algorithm.optimizers().items():
            scale = 1.0 if opt_name in exempt else factor
            assert [g["lr"] for g in opt.param_groups] == pytest.approx(
                [lr * scale for lr in initial[opt_name]]), (name, opt_name)


def test_updates_predict_and_state(case):
    """Updates give floats with fixed keys, gradients reach every parameter (or it is exempt),
    predict's logits have the right shape, are deterministic and survive a state_dict round trip."""
    name, dataset_name, device = case
    # 224x224 images: 2 per environment are enough for every check here, 4x cheaper than 8
    algorithm, dataset, hp = build(name, dataset_name, device=device,
                                   **({"batch_size": 2} if dataset_name == "Debug224" else {}))
    batches = minibatches(dataset, hp["batch_size"], [0, 1], device)
    got_grad = set()
    handles = [p.register_post_accumulate_grad_hook(
        lambda p, n=n: got_grad.add(n) if p.grad is not None and p.grad.abs().sum() > 0 else None)
        for n, p in trainable(algorithm).items()]
    before = copy.deepcopy(algorithm.state_dict())
    keys = None
    for _ in range(UPDATES):
        out = algorithm.update(batches, None)
        assert isinstance(out, dict) and out, f"{name}.update returned {out!r}"
        bad = {k: v for k, v in out.items() if not isinstance(k, str) or type(v) is not float}
        assert not bad, f"{name}.update must return Python floats: {bad}"
        assert all(math.isfinite(v) for v in out.values()), out
        assert keys is None or set(out) == keys, f"update keys changed: {keys} -> {set(out)}"
        keys = set(out)
    for handle in handles:
        handle.remove()
    exempt = ALGORITHMS.get(name).GRADIENT_EXEMPT
    missing = [n for n in trainable(algorithm) if n not in got_grad
               and not any(n.startswith(prefix) for prefix in exempt)]
    assert not missing, f"{name}: no gradient reached {missing} in {UPDATES} updates " \
                        "(declare GRADIENT_EXEMPT with a reason if that is intended)"
    after = algorithm.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before
               if before[k].is_floating_point()), "update changed nothing"

    x = minibatches(dataset, 4, [2], device)[0][0]
    algorithm.eval()
    with torch.no_grad():
        logits = algorithm.predict(x)
        assert tuple(logits.shape) == (4, dataset.num_classes), \
            f"{name}.predict of 4 images must give logits [4, {dataset.num_classes}], got " \
            f"{list(logits.shape)}"
        assert torch.isfinite(logits).all()
        assert torch.equal(logits, algorithm.predict(x)), "eval predictions are not deterministic"
    clone = type(algorithm)(dataset.input_shape, dataset.num_classes, len(batches), hp).to(device)
    clone.load_state_dict(algorithm.state_dict())
    clone.eval()
    with torch.no_grad():
        torch.testing.assert_close(clone.predict(x), logits)


@pytest.mark.parametrize("num_domains", [1, 3])
def test_one_and_three_source_domains(name, num_domains):
    """Single-source (1 domain) and 3 domains: updates run and keep their keys."""
    algorithm, dataset, hp = build(name, "Debug28", num_domains=num_domains)
    batches = minibatches(dataset, hp["batch_size"], list(range(num_domains)))
    first = algorithm.update(batches, None)
    second = algorithm.update(batches, None)
    assert set(first) == set(second)
    assert all(math.isfinite(v) for v in second.values())
    algorithm.eval()
    with torch.no_grad():
        assert algorithm.predict(batches[0][0]).shape == (hp["batch_size"], dataset.num_classes)


def test_resume_round_trip_gives_the_records_of_an_uninterrupted_run(name, tmp_path):
    """A job stopped after a checkpoint and resumed writes the records of an uninterrupted run."""
    from dg_plugins.train import run as train
    from dg_plugins.train.cli import build_parser

    hp = {k: v for k, v in tiny_hparams(name, "Debug28").items()
          if k in ALGORITHMS.get(name).TINY_TEST_HPARAMS or k == "batch_size"}

    def args(out, *extra):
        return build_parser().parse_args([
            "--dataset", "Debug28", "--algorithm", name, "--output_dir", str(out),
            "--steps", "6", "--checkpoint_freq", "2", "--hparams", json.dumps(hp), *extra])

    full, cut = tmp_path / "full", tmp_path / "cut"
    assert train.run(args(full)) == "done"
    assert train.run(args(cut), stop_after_step=2) == "stopped"
    assert train.run(args(cut, "--resume")) == "done"
    assert read_records(cut, VOLATILE_KEYS) == read_records(full, VOLATILE_KEYS)
