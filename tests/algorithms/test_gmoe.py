"""GMoE and ERM_ViT (dg_plugins.algorithms.gmoe): placement, hparams, the update's objective
against an independent computation, evaluation determinism, parameter counts."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F

import dg_plugins.datasets  # noqa: F401  (registers Debug28)
from support.helpers import tiny_hparams
from dg_plugins import hparams as H
from dg_plugins.algorithms.gmoe import ERM_ViT, GMOE_LR_WD, GMoE, auto_moe_layers
from dg_plugins.networks.moe import MoEFFN
from dg_plugins.registry import DATASETS


def make(cls=GMoE, dataset_name="Debug28", num_domains=2, seed=0, **overrides):
    """The algorithm on the 6-block 28x28 ViT (vit_arch "auto" on Debug28; the contract tests'
    "tiny" has 2 blocks, too few to show the last-two placement)."""
    overrides.setdefault("vit_arch", "auto")
    torch.manual_seed(seed)
    dataset = DATASETS.get(dataset_name)("", [], {})
    hp = tiny_hparams(cls.__name__, dataset_name, **overrides)
    return cls(dataset.input_shape, dataset.num_classes, num_domains, hp), dataset, hp


def batches_of(dataset, sizes):
    return [(dataset[i].tensors[0][:n], dataset[i].tensors[1][:n]) for i, n in enumerate(sizes)]


@pytest.mark.parametrize("depth, expected", [(12, [8, 10]), (6, [2, 4]), (4, [0, 2]),
                                             (7, [4, 6]), (2, [0])])
def test_auto_placement_is_the_last_two_even_indexed_blocks(depth, expected):
    assert auto_moe_layers(depth) == expected


def test_moe_layers_replace_the_chosen_blocks_and_copy_their_dense_ffn():
    dense, _, _ = make(ERM_ViT)
    algorithm, _, _ = make(GMoE)  # same seed: the same ViT is built before the MoE layers
    assert algorithm.moe_blocks == (2, 4)  # the 6-block 28x28 ViT
    for i, block in enumerate(algorithm.network.blocks):
        if i in (2, 4):
            mlp = dense.network.blocks[i].mlp
            assert isinstance(block.mlp, MoEFFN) and block.mlp.num_experts == 6
            assert torch.equal(block.mlp.w1[5], mlp.fc1.weight)
            assert torch.equal(block.mlp.b2[0], mlp.fc2.bias)
        else:
            assert not isinstance(block.mlp, MoEFFN)
    explicit, _, _ = make(GMoE, gmoe_moe_layers="-1")
    assert explicit.moe_blocks == (5,)


def test_auto_at_224_is_deit_small_with_moe_in_blocks_8_and_10():
    hp = tiny_hparams("GMoE", "PACS", vit_arch="auto", gmoe_router_dim=256)
    with torch.device("meta"):
        algorithm = GMoE((3, 224, 224), 7, 3, hp)
    assert algorithm.moe_blocks == (8, 10) and len(algorithm.network.blocks) == 12
    layer = algorithm.moe_layers[0]
    assert (layer.dim, layer.hidden, layer.num_experts, layer.top_k) == (384, 1536, 6, 1)
    assert layer.router.codebook.shape == (256, 6)
    assert algorithm.network.blocks[11].drop_path2.drop_prob == pytest.approx(0.1)


def test_parameter_count_difference_is_the_extra_experts_plus_the_routers():
    dense, _, _ = make(ERM_ViT)
    sparse, _, hp = make(GMoE)
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    dim, hidden, experts, proj = 64, 256, 6, hp["gmoe_router_dim"]
    ffn = dim * hidden + hidden + hidden * dim + dim
    router = dim * proj + proj + proj * experts + 1
    assert count(sparse) - count(dense) == 2 * ((experts - 1) * ffn + router)


@pytest.mark.parametrize("dataset", sorted(GMOE_LR_WD))
def test_per_dataset_lr_and_weight_decay_defaults(dataset):
    for name in ("GMoE", "ERM_ViT"):
        hp = H.default_hparams(name, dataset)
        assert (hp["lr"], hp["weight_decay"]) == GMOE_LR_WD[dataset]
        drawn = H.random_hparams(name, dataset, 3)
        assert 10 ** -4.5 <= drawn["lr"] <= 10 ** -2.5 and drawn["weight_decay"] == 0.0
    assert H.default_hparams("GMoE", "Debug28")["lr"] == H.default_hparams("ERM", "Debug28")["lr"]
    assert H.default_hparams("GMoE", dataset)["gmoe_router_dim"] == 256
    assert H.default_hparams("GMoE", "RotatedMNIST5k")["gmoe_router_dim"] == 64


@pytest.mark.parametrize("dataset", sorted(GMOE_LR_WD))
def test_random_search_draws_as_the_official_registry(dataset):
    """hparams_seed > 0 draws lr from 10^U(-4.5, -2.5) and weight decay 0 on the five datasets,
    each from the RandomState seeded by (seed, name) as DomainBed (and the release) do."""
    import numpy as np

    from dg_plugins.seeds import seed_hash

    lrs = []
    for seed in range(1, 40):
        for name in ("GMoE", "ERM_ViT"):
            drawn = H.random_hparams(name, dataset, seed)
            expected = 10 ** np.random.RandomState(seed_hash(seed, "lr")).uniform(-4.5, -2.5)
            assert drawn["lr"] == pytest.approx(expected, rel=1e-12)
            assert drawn["weight_decay"] == 0.0
        lrs.append(drawn["lr"])
    assert max(lrs) > 1e-3 > 1e-4 > min(lrs)  # the range reaches above the old 10^-4 bound
    job = H.job_hparams("GMoE", dataset, 2, 1)  # a sweep job's hparams (DomainBed's seeding)
    assert job["weight_decay"] == 0.0 and 10 ** -4.5 <= job["lr"] <= 10 ** -2.5


@pytest.mark.parametrize("overrides, match", [
    ({"gmoe_eval_capacity": -1.0}, "gmoe_eval_capacity"),
    ({"gmoe_eval_capacity": "x"}, "gmoe_eval_capacity"),
    ({"gmoe_moe_layers": "8,x"}, "gmoe_moe_layers"),
    ({"gmoe_top_k": 0}, "gmoe_top_k"),
])
def test_bad_hparams_are_rejected_by_name(overrides, match):
    with pytest.raises(H.HparamError, match=match):
        H.validate("GMoE", "PACS", overrides)


def test_top_k_above_the_number_of_experts_raises():
    with pytest.raises(ValueError, match="gmoe_top_k=3 exceeds gmoe_num_experts=2"):
        make(GMoE, gmoe_top_k=3, gmoe_num_experts=2)
    with pytest.raises(ValueError, match="out of range"):
        make(GMoE, gmoe_moe_layers="6")


def test_update_is_one_adam_step_on_cross_entropy_plus_weighted_aux_losses():
    algorithm, dataset, hp = make(GMoE, weight_decay=0.0, gmoe_aux_weight=0.5)
    batches = batches_of(dataset, [6, 4])
    reference = copy.deepcopy(algorithm.network)
    x = torch.cat([b[0] for b in batches])
    y = torch.cat([b[1] for b in batches])
    torch.manual_seed(7)
    logits = reference(x)
    stats = [b.mlp.pop_routing() for b in reference.blocks if isinstance(b.mlp, MoEFFN)]
    aux = sum(s.aux_loss for s in stats)
    expected = F.cross_entropy(logits, y) + 0.5 * aux
    opt = torch.optim.Adam(reference.parameters(), lr=hp["lr"])
    opt.zero_grad()
    expected.backward()
    opt.step()

    torch.manual_seed(7)  # the same gate noise, dropout and drop-path draws
    out = algorithm.update(batches)
    assert set(out) == {"loss", "aux_loss", "drop_frac", "load_entropy"}
    assert math.isclose(out["loss"], expected.item(), rel_tol=1e-5)
    assert math.isclose(out["aux_loss"], aux.item(), rel_tol=1e-5)
    assert out["drop_frac"] == pytest.approx(sum(s.drop_frac.item() for s in stats) / 2)
    assert 0 < out["load_entropy"] <= math.log(6) + 1e-6
    for (name, p), q in zip(algorithm.network.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, msg=name)
    assert all(layer.last_routing is None for layer in algorithm.moe_layers)


def test_gradients_reach_router_codebook_and_temperature_in_an_update():
    algorithm, dataset, _ = make(GMoE)
    algorithm.update(batches_of(dataset, [8, 8]))
    for layer in algorithm.moe_layers:
        for p in (layer.router.proj.weight, layer.router.codebook, layer.router.temperature):
            assert p.grad is not None and p.grad.abs().sum() > 0


def test_eval_without_capacity_is_deterministic_and_independent_of_batch_mates():
    algorithm, dataset, _ = make(GMoE, gmoe_eval_capacity=None)
    algorithm.update(batches_of(dataset, [8, 8]))
    x = dataset[0].tensors[0][:3]
    others = dataset[1].tensors[0][:13]
    algorithm.eval()
    with torch.no_grad():
        alone = algorithm.predict(x)
        assert torch.equal(alone, algorithm.predict(x))
        torch.testing.assert_close(algorithm.predict(torch.cat([x, others]))[:3], alone)
        torch.testing.assert_close(algorithm.predict(torch.cat([others, x]))[-3:], alone)


def test_with_an_eval_capacity_a_prediction_can_depend_on_batch_mates():
    """The faithful setting (a capacity at evaluation) drops tokens batch-wide: shown with a
    small factor so that drops certainly happen."""
    algorithm, dataset, _ = make(GMoE, gmoe_eval_capacity=0.3)
    x = dataset[0].tensors[0][:3]
    others = dataset[1].tensors[0][:13]
    algorithm.eval()
    with torch.no_grad():
        alone = algorithm.predict(x)
        assert not torch.allclose(algorithm.predict(torch.cat([others, x]))[-3:], alone)


def test_top2_routing_trains():
    algorithm, dataset, _ = make(GMoE, gmoe_top_k=2)
    batches = batches_of(dataset, [8, 8])
    outs = [algorithm.update(batches) for _ in range(2)]
    assert all(math.isfinite(v) for o in outs for v in o.values())
    assert all(layer.top_k == 2 for layer in algorithm.moe_layers)


def test_erm_vit_update_is_cross_entropy_and_predict_is_the_network():
    algorithm, dataset, _ = make(ERM_ViT, gmoe_drop_path=0.0)
    batches = batches_of(dataset, [4, 4])
    x = torch.cat([b[0] for b in batches])
    y = torch.cat([b[1] for b in batches])
    algorithm.eval()
    with torch.no_grad():
        expected = F.cross_entropy(algorithm.network(x), y).item()
        torch.testing.assert_close(algorithm.predict(x),
                                   algorithm.classifier(algorithm.features(x)))
    algorithm.train()
    out = algorithm.update(batches)
    assert set(out) == {"loss"} and math.isclose(out["loss"], expected, rel_tol=1e-5)


def test_training_lowers_the_loss_on_a_fixed_batch():
    algorithm, dataset, _ = make(GMoE, lr=3e-3, gmoe_drop_path=0.0)
    batches = batches_of(dataset, [8, 8])
    losses = [algorithm.update(batches)["loss"] for _ in range(20)]
    assert losses[-1] < 0.5 * losses[0]
