"""MPBM's mechanism (arXiv 2502.16064): the per-feature attention mixup, the SGLD queries, the
three alternating steps and the online feature correlation, each checked against an independent
computation or an invariant that a wrong implementation breaks."""

import copy
import json
import warnings

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import dg_plugins.datasets  # noqa: F401  (registers Debug28)
from helpers import tiny_hparams
from helpers import VOLATILE_KEYS, read_records
from dg_plugins.algorithms.mpbm import (MPBM, MixupAttentionGenerator, UPDATE_KEYS,
                                        soft_cross_entropy)
from dg_plugins.hparams import HparamError
from dg_plugins.registry import DATASETS


def make(num_domains=1, input_shape=None, **overrides):
    torch.manual_seed(0)
    dataset = DATASETS.get("Debug28")("", [], {})
    changes = {"mnist_cnn_width": 32, "mpbm_warmup_steps": 0, "mpbm_T": 2, **overrides}
    hp = tiny_hparams("MPBM", "Debug28", **changes)
    shape = input_shape or dataset.input_shape
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        algorithm = MPBM(shape, dataset.num_classes, num_domains, hp)
    return algorithm, dataset, hp


def batch(dataset, n=8, env=0):
    return dataset[env].tensors[0][:n], dataset[env].tensors[1][:n]


# -- the generator ---------------------------------------------------------------------------------

def test_attention_is_the_reconstructed_formula_and_sums_to_one_per_dimension():
    torch.manual_seed(1)
    d, nb, b = 6, 4, 3
    gen = MixupAttentionGenerator(d)
    q, values = torch.randn(b, d), torch.randn(b, nb, d)
    corr = torch.from_numpy(np.corrcoef(np.random.RandomState(0).randn(d, 50))).float()
    weights = gen.attention(q, values, corr)
    wq, wk = gen.query.weight.detach().numpy(), gen.key.weight.detach().numpy()
    for s in range(b):
        qq = wq @ q[s].numpy()
        scores = np.stack([(qq * (wk @ values[s, i].numpy())) @ corr.numpy() for i in range(nb)])
        scores /= np.sqrt(d)
        expected = np.exp(scores) / np.exp(scores).sum(axis=0, keepdims=True)  # over instances
        np.testing.assert_allclose(weights[s].detach().numpy(), expected, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(weights.sum(dim=1), torch.ones(b, d))
    assert (weights.std(dim=2) > 1e-4).any(), "weights should differ between feature dimensions"


def test_synthetic_features_lie_in_the_per_dimension_hull_and_labels_mix_by_mean_weight():
    torch.manual_seed(2)
    d, nb, b, classes = 16, 5, 10, 3
    gen = MixupAttentionGenerator(d)
    q, values = 3 * torch.randn(b, d), 3 * torch.randn(b, nb, d)
    labels = F.one_hot(torch.randint(0, classes, (b, nb)), classes).float()
    z, y_mix, weights = gen(q, values, torch.eye(d), labels)
    assert (z >= values.amin(dim=1) - 1e-5).all() and (z <= values.amax(dim=1) + 1e-5).all()
    torch.testing.assert_close(z, torch.einsum("bid,bid->bd", weights, values))
    abar = weights.mean(dim=2)
    for s in range(b):
        expected = sum(abar[s, i] * labels[s, i] for i in range(nb))
        torch.testing.assert_close(y_mix[s], expected)
    torch.testing.assert_close(y_mix.sum(dim=1), torch.ones(b))


def test_groups_index_the_batch_for_any_batch_size():
    algorithm, _, hp = make(mpbm_nb=5)
    for size in (1, 3, 7):
        groups = algorithm.draw_groups(size, "cpu")
        assert groups.shape == (size, 5) and groups.min() >= 0 and groups.max() < size


# -- SGLD queries ----------------------------------------------------------------------------------

def resnet_model(**overrides):
    """A random ResNet-18 on 32x32 inputs: it has BatchNorm buffers to check."""
    return make(input_shape=(3, 32, 32), backbone="resnet", resnet18=True, **overrides)


def test_sgld_leaves_parameters_and_batchnorm_buffers_unchanged_and_stays_in_range():
    algorithm, _, _ = resnet_model(mpbm_T=3, mpbm_eta=0.05)
    algorithm.train()
    torch.manual_seed(3)
    x, y = torch.rand(6, 3, 32, 32), torch.randint(0, 2, (6,))
    state = copy.deepcopy(algorithm.state_dict())
    assert any("running_mean" in k for k in state)
    x_t = algorithm.sgld_queries(x, y)
    algorithm.query_features(x_t)
    for key, value in algorithm.state_dict().items():
        assert torch.equal(value, state[key]), key
    assert all(p.grad is None for p in algorithm.parameters())
    assert all(m.training for m in algorithm.modules()), "train mode must be restored"
    lo = x.amin(dim=(0, 2, 3)).view(1, 3, 1, 1)
    hi = x.amax(dim=(0, 2, 3)).view(1, 3, 1, 1)
    assert ((x_t >= lo) & (x_t <= hi)).all() and not torch.equal(x_t, x)


def test_sgld_raises_the_classifier_loss_on_average():
    algorithm, dataset, _ = make(mpbm_T=5, mpbm_eta=0.01, lr=1e-2)
    x, y = batch(dataset, 16)
    for _ in range(10):  # a model that fits the batch: its loss is low before the queries
        algorithm.update([(x, y)])
    algorithm.eval()
    with torch.no_grad():
        before = F.cross_entropy(algorithm.predict(x), y)
    algorithm.train()
    gains = []
    for noise in (0.0, 1.0):
        algorithm.hparams["mpbm_sgld_noise"] = noise
        torch.manual_seed(4)
        x_t = algorithm.sgld_queries(x, y)
        algorithm.eval()
        with torch.no_grad():
            gains.append((F.cross_entropy(algorithm.predict(x_t), y) - before).item())
        algorithm.train()
    assert gains[0] > 0, f"gradient ascent did not raise the loss: {gains}"
    assert gains[1] > 0, f"SGLD did not raise the loss on average: {gains}"


def test_clamp_modes():
    algorithm, _, _ = make(mpbm_clamp="unit", mpbm_eta=1.0)
    x, y = torch.rand(4, 3, 28, 28), torch.randint(0, 2, (4,))
    x_t = algorithm.sgld_queries(x, y)
    assert x_t.min() >= 0 and x_t.max() <= 1 and (x_t == 0).any() and (x_t == 1).any()
    algorithm.hparams["mpbm_clamp"] = "imagenet"
    lo, hi = algorithm.input_range(x)
    torch.testing.assert_close(lo.flatten(), torch.tensor([-0.485 / 0.229, -0.456 / 0.224,
                                                           -0.406 / 0.225]))
    torch.testing.assert_close(hi.flatten(), torch.tensor([0.515 / 0.229, 0.544 / 0.224,
                                                           0.594 / 0.225]))
    algorithm.hparams["mpbm_clamp"] = "none"
    assert algorithm.input_range(x) is None


# -- the three steps -------------------------------------------------------------------------------

def step_inputs(algorithm, dataset, n=8):
    x, y = batch(dataset, n)
    q = algorithm.query_features(algorithm.sgld_queries(x, y))
    features = algorithm.featurizer(x)
    y_onehot = F.one_hot(y, algorithm.num_classes).float()
    groups = algorithm.draw_groups(n, "cpu")
    return x, y, q, features, y_onehot, groups


def test_generator_step_updates_only_the_generator():
    algorithm, dataset, _ = make()
    _, y, q, features, y_onehot, groups = step_inputs(algorithm, dataset)
    others = {n: p.clone() for n, p in algorithm.named_parameters()
              if not n.startswith("generator.")}
    gen_before = copy.deepcopy(algorithm.generator.state_dict())
    algorithm.generator_step(q, features, y_onehot, y, groups)
    for name, p in algorithm.named_parameters():
        if name.startswith("generator."):
            assert p.grad is not None and p.grad.abs().sum() > 0, name
            assert not torch.equal(p, gen_before[name[len("generator."):]]), name
        else:
            assert p.grad is None, f"{name} got a gradient in the generator step"
            assert torch.equal(p, others[name]), name


def test_model_step_trains_f_through_the_mixed_features_but_not_g():
    algorithm, dataset, _ = make()
    _, _, q, features, y_onehot, groups = step_inputs(algorithm, dataset)
    z, y_mix = algorithm.synthetic_features(q, features, y_onehot, groups)
    soft_cross_entropy(algorithm.classifier(z), y_mix).backward()
    assert all(p.grad is None for p in algorithm.generator.parameters())
    grads = [p.grad for p in algorithm.featurizer.parameters()]
    assert all(g is not None for g in grads) and sum(g.abs().sum() for g in grads) > 0


def test_lambda_mix_zero_makes_the_model_step_an_erm_step():
    """With lambda_mix = 0 the f/h update is exactly one Adam step on CE(h(f(x)), y); with 0.5 it
    differs (the mix term reaches f and h)."""
    for lambda_mix, same in ((0.0, True), (0.5, False)):
        algorithm, dataset, hp = make(mpbm_lambda_mix=lambda_mix, weight_decay=0.0)
        x, y = batch(dataset)
        reference = copy.deepcopy(algorithm.network)
        loss = F.cross_entropy(reference(x), y)
        opt = torch.optim.Adam(reference.parameters(), lr=hp["lr"])
        opt.zero_grad()
        loss.backward()
        opt.step()
        out = algorithm.update([(x, y)])
        assert abs(out["sup"] - loss.item()) < 1e-6
        assert (out["mix"] == 0.0) == same
        equal = [torch.allclose(p, r) for p, r in zip(algorithm.network.parameters(),
                                                      reference.parameters())]
        assert all(equal) if same else not all(equal)
        if not same:
            assert abs(out["loss"] - (out["sup"] + 0.5 * out["mix"])) < 1e-5


def test_lambda_adv_adds_exactly_its_term_to_the_generator_gradient_and_zero_removes_it():
    grads, outs = {}, {}
    for lambda_adv in (0.0, 0.5):
        algorithm, dataset, _ = make(mpbm_lambda_adv=lambda_adv)
        torch.manual_seed(5)
        _, y, q, features, y_onehot, groups = step_inputs(algorithm, dataset)
        reference = copy.deepcopy(algorithm)
        _, outs[lambda_adv] = algorithm.generator_step(q, features, y_onehot, y, groups)
        grads[lambda_adv] = [p.grad.clone() for p in algorithm.generator.parameters()]
    # independent gradient of the adversarial term alone, -log D(z)
    z, _, _ = reference.generator(q, features.detach()[groups], reference.corr, y_onehot[groups])
    adv = -torch.log(torch.sigmoid(reference.discriminator(z))).mean()
    adv_grads = torch.autograd.grad(adv, list(reference.generator.parameters()))
    for g0, g5, ga in zip(grads[0.0], grads[0.5], adv_grads):
        torch.testing.assert_close(g5 - g0, 0.5 * ga, rtol=1e-4, atol=1e-6)
    assert outs[0.0]["adv"] == 0.0 and abs(outs[0.5]["adv"] - adv.item()) < 1e-5
    assert abs(outs[0.0]["gen"] - outs[0.5]["gen"]) < 1e-6

    algorithm, dataset, _ = make(mpbm_lambda_adv=0.0)
    disc = copy.deepcopy(algorithm.discriminator.state_dict())
    out = algorithm.update([batch(dataset)])
    assert out["adv"] == out["disc"] == out["disc_acc"] == 0.0
    assert all(torch.equal(v, disc[k]) for k, v in algorithm.discriminator.state_dict().items())


def test_discriminator_learns_to_separate_random_synthetic_from_real_features():
    algorithm, dataset, _ = make(mpbm_lr_d=1e-3)
    x, _ = batch(dataset, 16)
    with torch.no_grad():
        real = algorithm.featurizer(x)
    fake = torch.randn_like(real) * real.std() + real.mean()
    first = algorithm.discriminator_step(real, fake)
    for _ in range(40):
        last = algorithm.discriminator_step(real, fake)
    assert last["disc"] < first["disc"] and last["disc_acc"] >= 0.9


def test_query_label_and_max_objective_alternatives():
    algorithm, dataset, _ = make(mpbm_gen_mix_label="query")
    _, y, q, features, y_onehot, groups = step_inputs(algorithm, dataset)
    z, _, _ = algorithm.generator(q, features.detach()[groups], algorithm.corr, y_onehot[groups])
    expected = F.cross_entropy(algorithm.classifier(z), y).item()
    _, out = algorithm.generator_step(q, features, y_onehot, y, groups)
    assert abs(out["gen"] - expected) < 1e-5

    for objective in ("min", "max"):
        algorithm, dataset, _ = make(mpbm_gen_objective=objective, mpbm_lambda_adv=0.0,
                                     mpbm_lr_g=1e-2)
        _, y, q, features, y_onehot, groups = step_inputs(algorithm, dataset)
        gens = [algorithm.generator_step(q, features, y_onehot, y, groups)[1]["gen"]
                for _ in range(8)]
        assert (gens[-1] < gens[0]) if objective == "min" else (gens[-1] > gens[0])


# -- schedule, records, state ----------------------------------------------------------------------

def test_warmup_is_erm_and_records_keep_their_keys():
    algorithm, dataset, hp = make(mpbm_warmup_steps=2, weight_decay=0.0)
    x, y = batch(dataset)
    reference = copy.deepcopy(algorithm.network)
    opt = torch.optim.Adam(reference.parameters(), lr=hp["lr"])
    outs = []
    for i in range(3):
        if i < 2:
            opt.zero_grad()
            F.cross_entropy(reference(x), y).backward()
            opt.step()
        outs.append(algorithm.update([(x, y)]))
        if i < 2:
            for p, r in zip(algorithm.network.parameters(), reference.parameters()):
                torch.testing.assert_close(p, r)
    assert all(tuple(o) == UPDATE_KEYS for o in outs)
    assert all(outs[i][k] == 0.0 for i in (0, 1) for k in ("mix", "gen", "adv", "disc"))
    assert outs[2]["mix"] > 0 and outs[2]["gen"] > 0 and outs[2]["disc"] > 0
    assert int(algorithm.step) == 3


def test_correlation_estimate_equals_numpy_corrcoef_of_the_features_seen():
    algorithm, _, _ = make()
    rng = np.random.RandomState(0)
    d = algorithm.feat_mean.numel()
    mixing = rng.randn(d, d)
    chunks = [rng.randn(n, d) @ mixing + 3.0 for n in (5, 1, 12, 7)]
    for chunk in chunks:
        algorithm.accumulate_features(torch.tensor(chunk, dtype=torch.float32))
    expected = np.corrcoef(np.concatenate(chunks).T)
    np.testing.assert_allclose(algorithm.correlation_estimate().numpy(), expected, atol=2e-4)
    dead = torch.tensor(np.concatenate(chunks), dtype=torch.float32)
    dead[:, 0] = 1.0  # a feature with zero variance
    algorithm.feat_count.zero_(), algorithm.feat_mean.zero_(), algorithm.feat_m2.zero_()
    algorithm.accumulate_features(dead)
    corr = algorithm.correlation_estimate()
    assert torch.isfinite(corr).all() and corr[0, 0] == 1 and (corr[0, 1:] == 0).all()


def test_updates_feed_the_train_mode_features_into_the_correlation_and_refresh_it():
    """The features f(x) that the updates compute in train mode are the ones accumulated; ``corr``
    is refreshed every mpbm_corr_every steps; the state survives a state_dict round trip."""
    algorithm, dataset, hp = make(mpbm_warmup_steps=2, mpbm_corr_every=3, mpbm_corr_window="all",
                                  mnist_cnn_width=16)
    seen = []
    algorithm.featurizer.register_forward_hook(
        lambda m, i, o: seen.append(o.detach().clone()) if m.training else None)
    x, y = batch(dataset, 16)
    assert torch.equal(algorithm.corr, torch.eye(16))
    algorithm.update([(x, y)])
    algorithm.update([(x, y)])
    expected = np.corrcoef(torch.cat(seen).double().numpy().T)
    np.testing.assert_allclose(algorithm.correlation_estimate().numpy(), expected, atol=2e-4)
    algorithm.update([(x, y)])  # first MPBM step: refreshes corr from the warm-up features
    np.testing.assert_allclose(algorithm.corr.numpy(), expected, atol=2e-4)
    assert int(algorithm.corr_refreshed_at) == 2
    algorithm.update([(x, y)])
    algorithm.update([(x, y)])
    assert int(algorithm.corr_refreshed_at) == 2  # steps 3 and 4: not yet
    algorithm.update([(x, y)])
    assert int(algorithm.corr_refreshed_at) == 5
    np.testing.assert_allclose(algorithm.corr.numpy(),
                               np.corrcoef(torch.cat(seen[:5]).double().numpy().T), atol=2e-4)
    clone, _, _ = make(mpbm_warmup_steps=2, mpbm_corr_every=3, mnist_cnn_width=16)
    clone.load_state_dict(algorithm.state_dict())
    for name in ("corr", "feat_m2", "feat_mean", "feat_count", "step", "corr_refreshed_at"):
        assert torch.equal(getattr(clone, name), getattr(algorithm, name)), name


def test_round_window_restarts_the_statistics_after_a_refresh():
    algorithm, dataset, _ = make(mpbm_warmup_steps=1, mpbm_corr_every=100)
    x, y = batch(dataset)
    algorithm.update([(x, y)])
    assert float(algorithm.feat_count) == 8
    algorithm.update([(x, y)])  # refresh at step 1, then this step's 8 features
    assert int(algorithm.corr_refreshed_at) == 1 and float(algorithm.feat_count) == 8


def test_several_sources_are_pooled_with_one_warning():
    dataset = DATASETS.get("Debug28")("", [], {})
    hp = tiny_hparams("MPBM", "Debug28", mnist_cnn_width=16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        MPBM(dataset.input_shape, 2, 1, hp)
        assert not caught
        algorithm = MPBM(dataset.input_shape, 2, 2, hp)
        algorithm.update([batch(dataset, 4, 0), batch(dataset, 4, 1)])
        algorithm.update([batch(dataset, 4, 0), batch(dataset, 4, 1)])
    assert len([w for w in caught if "single-source" in str(w.message)]) == 1


def test_bad_hparams_raise_clear_errors():
    with pytest.raises(HparamError, match="mpbm_clamp"):
        tiny_hparams("MPBM", "Debug28", mpbm_clamp="pixels")
    with pytest.raises(HparamError, match="mpbm_gen_mix_label"):
        tiny_hparams("MPBM", "Debug28", mpbm_gen_mix_label="soft")
    with pytest.raises(HparamError, match="mpbm_nb"):
        tiny_hparams("MPBM", "Debug28", mpbm_nb=0)
    with pytest.raises(ValueError, match="imagenet"):
        make(input_shape=(1, 28, 28), mpbm_clamp="imagenet")


def test_resume_across_the_warmup_boundary_gives_the_records_of_an_uninterrupted_run(tmp_path):
    from dg_plugins.engine import train
    from dg_plugins.scripts.train import build_parser

    hp = {"mpbm_warmup_steps": 3, "mpbm_T": 1, "mpbm_corr_every": 2, "batch_size": 8,
          "mnist_cnn_width": 16}

    def args(out, *extra):
        return build_parser().parse_args([
            "--dataset", "Debug28", "--algorithm", "MPBM", "--output_dir", str(out),
            "--test_envs", "1", "2", "--steps", "7", "--checkpoint_freq", "2",
            "--hparams", json.dumps(hp), *extra])

    full, cut = tmp_path / "full", tmp_path / "cut"
    assert train.run(args(full)) == "done"
    assert train.run(args(cut), stop_after_step=2) == "stopped"  # inside the warm-up
    assert train.run(args(cut, "--resume")) == "done"
    got, expected = read_records(cut, VOLATILE_KEYS), read_records(full, VOLATILE_KEYS)
    assert got == expected and expected[-1]["disc"] > 0


@pytest.mark.parametrize("backbone, shape, extra", [
    ("lenet", (3, 32, 32), {}),
    ("vit", (3, 224, 224), {"vit_arch": "dg_vit_test_patch32_224"}),
])
def test_full_steps_run_on_lenet_and_vit(backbone, shape, extra):
    """The MNIST CNN and ResNet-18 are covered by the contract tests (Debug28 / Debug224)."""
    algorithm, _, _ = make(input_shape=shape, backbone=backbone, mpbm_T=1, **extra)
    torch.manual_seed(6)
    x, y = torch.rand(4, *shape), torch.randint(0, 2, (4,))
    out = algorithm.update([(x, y)])
    assert out["mix"] > 0 and out["gen"] > 0 and out["disc"] > 0
    assert algorithm.generator.query.weight.shape == (algorithm.featurizer.n_outputs,) * 2
