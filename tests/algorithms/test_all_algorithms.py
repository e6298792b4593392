"""The Algorithm contract, checked on every registered algorithm (timm-style: the registry drives
the list), on Debug28 and Debug224 with each algorithm's ``TINY_TEST_HPARAMS``, on CPU and on CUDA
when a GPU is present.

It catches what methods get wrong: a trainable parameter outside every optimizer (or in two), a
parameter that never gets a gradient, update keys that change between calls (records need a fixed
schema), NaN outputs, a method that breaks with 1 (single-source) or 3 source domains, and state
that a resumed job loses (Python attributes instead of buffers, optimizers or schedulers the
checkpoint cannot see).
"""

import copy
import math

import pytest
import torch

import dg_plugins.algorithms  # noqa: F401  (registers)
import dg_plugins.datasets  # noqa: F401
from helpers import TEST_PLUGIN_MODULES, tiny_hparams
from helpers import VOLATILE_KEYS, read_records
from dg_plugins import catalog
from dg_plugins.registry import ALGORITHMS, DATASETS

#: Built-in algorithms and the test-only ones of tests/plugins/ (other test helpers registered
#: temporarily by single tests are not part of the contract run).
NAMES = [n for n, cls in ALGORITHMS.items()
         if cls.__module__.startswith("dg_plugins.") or cls.__module__ in TEST_PLUGIN_MODULES]
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
CASES = [(a, d, dev) for a in NAMES for d in ("Debug28", "Debug224") for dev in DEVICES]
UPDATES = 3


def case_id(case):
    return "-".join(case)


def minibatches(dataset, batch_size, envs, device="cpu"):
    """``batch_size`` items (cycling) of each environment in ``envs`` as ``(x, y)``."""
    out = []
    for i in envs:
        items = [dataset[i][j % len(dataset[i])] for j in range(batch_size)]
        out.append((torch.stack([x for x, _ in items]).to(device),
                    torch.as_tensor([y for _, y in items]).to(device)))
    return out


def build(name, dataset_name, num_domains=2, device="cpu", **overrides):
    torch.manual_seed(0)
    dataset = DATASETS.get(dataset_name)("", [], {})
    hp = tiny_hparams(name, dataset_name, **overrides)
    algorithm = ALGORITHMS.get(name)(dataset.input_shape, dataset.num_classes, num_domains, hp)
    return algorithm.to(device), dataset, hp


def trainable(algorithm):
    return {n: p for n, p in algorithm.named_parameters() if p.requires_grad}


def test_every_builtin_algorithm_is_derived_into_the_catalog():
    """Sweeps and collect_results know the built-in names without importing torch: the catalog
    derives them from the source, and must agree with the registry."""
    builtin = [n for n, cls in ALGORITHMS.items() if cls.__module__.startswith("dg_plugins.")]
    assert catalog.BUILTIN_ALGORITHMS == builtin
    assert all(name in catalog.ALGORITHM_ORDER for name in builtin)


def test_test_only_plugins_are_in_the_contract_run():
    assert "ToyTwoHeads" in NAMES


@pytest.mark.parametrize("name", NAMES)
def test_tiny_test_hparams_are_declared_hparams(name):
    from dg_plugins import hparams

    for dataset in ("Debug28", "Debug224"):
        hparams.validate(name, dataset, dict(ALGORITHMS.get(name).TINY_TEST_HPARAMS))


@pytest.mark.parametrize("name", NAMES)
def test_every_trainable_parameter_is_in_exactly_one_optimizer(name):
    algorithm, _, _ = build(name, "Debug28")
    optimizers = algorithm.optimizers()
    assert optimizers, f"{name} exposes no optimizer to resume checkpoints"
    owners = {}
    for opt_name, opt in optimizers.items():
        for group in opt.param_groups:
            for p in group["params"]:
                owners.setdefault(id(p), []).append(opt_name)
    problems = []
    for pname, p in trainable(algorithm).items():
        found = owners.get(id(p), [])
        if len(found) != 1:
            problems.append(f"{pname}: in {found or 'no optimizer'}")
    assert not problems, f"{name}: " + "; ".join(problems)


@pytest.mark.parametrize("name", NAMES)
def test_a_job_lr_schedule_scales_every_optimizer_but_the_exempt_ones(name):
    """``set_lr_factor`` (the job's ``lr_schedule``): every param group of every optimizer not in
    ``lr_schedule_exempt()`` gets its initial lr x the factor (not compounding), the exempt ones
    keep theirs; an algorithm that drives an lr with its own torch scheduler refuses clearly."""
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


@pytest.fixture(params=CASES, ids=[case_id(c) for c in CASES])
def case(request):
    return request.param


def test_updates_predict_and_state(case):
    """A few updates: float outputs with identical keys, all finite; every trainable parameter gets
    a nonzero gradient (or is declared exempt); parameters change; predict has the right shape, is
    finite and deterministic in eval mode; a state_dict round trip reproduces predictions."""
    name, dataset_name, device = case
    # 224x224 images: 2 per environment are enough for every check here, 4x cheaper than 8
    algorithm, dataset, hp = build(name, dataset_name, device=device,
                                   **({"batch_size": 2} if dataset_name == "Debug224" else {}))
    envs = [0, 1]
    batches = minibatches(dataset, hp["batch_size"], envs, device)
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
        assert logits.shape == (4, dataset.num_classes)
        assert torch.isfinite(logits).all()
        assert torch.equal(logits, algorithm.predict(x)), "eval predictions are not deterministic"
    clone = type(algorithm)(dataset.input_shape, dataset.num_classes, len(envs), hp).to(device)
    clone.load_state_dict(algorithm.state_dict())
    clone.eval()
    with torch.no_grad():
        torch.testing.assert_close(clone.predict(x), logits)


@pytest.mark.parametrize("num_domains", [1, 3])
@pytest.mark.parametrize("name", NAMES)
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


@pytest.mark.parametrize("name", NAMES)
def test_resume_round_trip_gives_the_records_of_an_uninterrupted_run(name, tmp_path):
    """train on Debug28, interrupted after a checkpoint and resumed with --resume, writes exactly
    the records of an uninterrupted run (all state is in buffers, optimizers and schedulers)."""
    import json

    from dg_plugins.train import run as train
    from dg_plugins.scripts.train import build_parser

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
