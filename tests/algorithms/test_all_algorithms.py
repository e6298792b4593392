"""The Algorithm contract, for every registered algorithm on Debug28 and Debug224 (timm-style:
the registry drives the list)."""

import copy

import pytest
import torch

import dg_plugins.algorithms  # noqa: F401  (registers)
import dg_plugins.datasets  # noqa: F401
from conftest import tiny_hparams
from dg_plugins.registry import ALGORITHMS, DATASETS

CASES = [(a, d) for a in ALGORITHMS.list() for d in ("Debug28", "Debug224")]


def minibatches(dataset, batch_size, envs):
    """The first ``batch_size`` items of each environment in ``envs`` as ``(x, y)``."""
    out = []
    for i in envs:
        items = [dataset[i][j] for j in range(batch_size)]
        out.append((torch.stack([x for x, _ in items]), torch.as_tensor([y for _, y in items])))
    return out


def test_catalog_lists_every_builtin_algorithm():
    """Sweeps validate names against catalog.BUILTIN_ALGORITHMS without importing torch."""
    from dg_plugins import catalog

    builtin = [n for n, cls in ALGORITHMS.items() if cls.__module__.startswith("dg_plugins.")]
    assert sorted(catalog.BUILTIN_ALGORITHMS) == sorted(builtin)


@pytest.fixture(params=CASES, ids=[f"{a}-{d}" for a, d in CASES])
def built(request):
    algorithm_name, dataset_name = request.param
    torch.manual_seed(0)
    dataset = DATASETS.get(dataset_name)("", [], {})
    hp = tiny_hparams(algorithm_name, dataset_name)
    cls = ALGORITHMS.get(algorithm_name)
    train_envs = [0, 1]
    algorithm = cls(dataset.input_shape, dataset.num_classes, len(train_envs), hp)
    return algorithm, dataset, hp, train_envs


def test_update_returns_floats_and_predict_shape(built):
    algorithm, dataset, hp, envs = built
    batches = minibatches(dataset, hp["batch_size"], envs)
    before = copy.deepcopy(algorithm.state_dict())
    for _ in range(3):
        out = algorithm.update(batches, None)
        assert isinstance(out, dict) and out
        assert all(isinstance(k, str) and type(v) is float for k, v in out.items()), out
    after = algorithm.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before if before[k].is_floating_point())
    algorithm.eval()
    logits = algorithm.predict(batches[0][0])
    assert logits.shape == (hp["batch_size"], dataset.num_classes)


def test_eval_predictions_are_deterministic(built):
    algorithm, dataset, hp, envs = built
    algorithm.update(minibatches(dataset, hp["batch_size"], envs), None)
    x = minibatches(dataset, 4, [2])[0][0]
    algorithm.eval()
    with torch.no_grad():
        assert torch.equal(algorithm.predict(x), algorithm.predict(x))


def test_state_dict_round_trip(built):
    algorithm, dataset, hp, envs = built
    algorithm.update(minibatches(dataset, hp["batch_size"], envs), None)
    clone = type(algorithm)(dataset.input_shape, dataset.num_classes, len(envs), hp)
    clone.load_state_dict(algorithm.state_dict())
    x = minibatches(dataset, 4, [2])[0][0]
    algorithm.eval()
    clone.eval()
    with torch.no_grad():
        torch.testing.assert_close(clone.predict(x), algorithm.predict(x))
