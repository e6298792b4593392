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
from support.helpers import tiny_hparams
from support.helpers import VOLATILE_KEYS, read_records
from dg_plugins.algorithms.mpbm import (DIAG_KEYS, LOSS_KEYS, MPBM, PHASES, UPDATE_KEYS,
                                        MixupAttentionGenerator, image_correlation,
                                        nearest_cosine, outside_hull_share, phase_at,
                                        soft_cross_entropy, top_instance_share)
from dg_plugins.hparams import HparamError
from dg_plugins.registry import DATASETS


def make(num_domains=1, input_shape=None, **overrides):
    torch.manual_seed(0)
    dataset = DATASETS.get("Debug28")("", [], {})
    changes = {"mnist_cnn_width": 32, "mpbm_schedule": "online", "mpbm_warmup_steps": 0,
               "mpbm_T": 2, **overrides}
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
    from dg_plugins.train import run as train
    from dg_plugins.scripts.train import build_parser

    hp = {"mpbm_schedule": "online", "mpbm_warmup_steps": 3, "mpbm_T": 1, "mpbm_corr_every": 2,
          "batch_size": 8,
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


# -- the phased schedule ---------------------------------------------------------------------------

#: 2 pre-training steps, then 2 rounds of 2 C, 2 query, 2 g/D, 2 synthetic-set (12 rows at 8 a
#: step) and 2 fine-tuning steps; the last round's fine-tuning goes on.
PHASED = {"mpbm_schedule": "phased", "mpbm_pretrain_steps": 2, "mpbm_corr_steps": 2,
          "mpbm_query_steps": 2, "mpbm_gen_steps": 2, "mpbm_synth_size": 12,
          "mpbm_finetune_steps": 2, "mpbm_rounds": 2, "mpbm_T": 1, "batch_size": 8,
          "mnist_cnn_width": 16, "mpbm_diag_every": 0}
SCHEDULE = (["erm"] * 2 + ["corr"] * 2 + ["query"] * 2 + ["gen"] * 2 + ["synth"] * 2
            + ["finetune"] * 2) + (["corr"] * 2 + ["query"] * 2 + ["gen"] * 2 + ["synth"] * 2
                                   + ["finetune"] * 4)


def phased(**overrides):
    return make(**{**PHASED, **overrides})


def batches(dataset, steps, n=8, seed=0):
    """``steps`` random batches of ``n`` rows of environment 0 (the same for a given seed)."""
    x_all, y_all = dataset[0].tensors
    rng = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        index = torch.randint(0, len(y_all), (n,), generator=rng)
        yield x_all[index], y_all[index]


def test_phase_at_walks_the_rounds_and_the_last_fine_tuning_goes_on():
    algorithm, _, hp = phased()
    got = [algorithm.phase(s) for s in range(len(SCHEDULE))]
    assert [name for name, _, _ in got] == SCHEDULE
    assert [r for _, r, _ in got] == [0, 0] + [1] * 10 + [2] * 12
    assert [o for _, _, o in got][:12] == [0, 1] * 6 and got[-1] == ("finetune", 2, 3)
    assert algorithm.phase(10 ** 6)[:2] == ("finetune", 2)
    assert phase_at(5, {**hp, "mpbm_synth_size": 17}, 8) == ("query", 1, 1)
    assert [phase_at(s, {**hp, "mpbm_synth_size": 17}, 8)[0] for s in (8, 9, 10, 11)] == \
        ["synth"] * 3 + ["finetune"]  # ceil(17 / 8) = 3 synthetic-set steps
    assert [phase_at(s, {**hp, "mpbm_corr_steps": 0}, 8)[0] for s in (2, 3, 4)] == \
        ["query", "query", "gen"]  # no C phase: C stays what it was
    online = {**hp, "mpbm_schedule": "online", "mpbm_warmup_steps": 3}
    assert [phase_at(s, online, 8) for s in (0, 2, 3, 9)] == [
        ("erm", 0, 0), ("erm", 0, 2), ("online", 0, 0), ("online", 0, 6)]


def test_phased_updates_train_each_part_only_in_its_phase():
    """f and h change only in pre-training and fine-tuning steps (the extractor is frozen while g
    and D train, and while C, the queries and the synthetic set are made); g and D only in the
    g/D steps; the query bank only in query steps; every update reports its phase and round."""
    algorithm, dataset, _ = phased()
    parts = {"network": algorithm.network, "generator": algorithm.generator,
             "discriminator": algorithm.discriminator}
    changes = {name: set() for name in list(parts) + ["query_bank", "corr"]}
    for step, (x, y) in enumerate(batches(dataset, len(SCHEDULE))):
        before = {name: copy.deepcopy(m.state_dict()) for name, m in parts.items()}
        bank, corr = algorithm.query_bank.clone(), algorithm.corr.clone()
        out = algorithm.update([(x, y)])
        assert tuple(out) == UPDATE_KEYS
        assert PHASES[int(out["phase"])] == SCHEDULE[step]
        for name, module in parts.items():
            if any(not torch.equal(v, before[name][k]) for k, v in module.state_dict().items()):
                changes[name].add(SCHEDULE[step])
        if not torch.equal(bank, algorithm.query_bank):
            changes["query_bank"].add(SCHEDULE[step])
        if not torch.equal(corr, algorithm.corr):
            changes["corr"].add(SCHEDULE[step])
        trains_f = SCHEDULE[step] in ("erm", "finetune")
        assert (out["sup"] > 0) == trains_f and (out["mix"] > 0) == (SCHEDULE[step] == "finetune")
        assert (out["gen"] > 0) == (out["disc"] > 0) == (SCHEDULE[step] == "gen")
    assert changes == {"network": {"erm", "finetune"}, "generator": {"gen"},
                       "discriminator": {"gen"}, "query_bank": {"query"}, "corr": {"corr"}}
    assert int(algorithm.bank_count) == 16  # 2 query steps x 8 rows, restarted in round 2


def test_corr_phase_computes_c_from_the_frozen_features_of_its_steps():
    algorithm, dataset, _ = phased()
    seen = []
    algorithm.featurizer.register_forward_hook(
        lambda m, i, o: seen.append((m.training, o.detach().clone())))
    data = list(batches(dataset, 4))
    for x, y in data:
        seen.clear()
        algorithm.update([(x, y)])
    # steps 2 and 3 are the C phase: one eval-mode forward each, and C is their features' corrcoef
    corr_features = []
    algorithm2, _, _ = phased()
    for step, (x, y) in enumerate(data):
        if step >= 2:
            corr_features.append(algorithm2.frozen_features(x))
        algorithm2.update([(x, y)])
    expected = np.corrcoef(torch.cat(corr_features).double().numpy().T)
    expected = np.nan_to_num(expected)
    np.fill_diagonal(expected, 1.0)
    np.testing.assert_allclose(algorithm2.corr.numpy(), expected, atol=2e-4)
    assert int(algorithm2.corr_refreshed_at) == 3
    assert [training for training, _ in seen] == [False]  # step 3: one frozen forward


def test_synthetic_set_is_made_once_per_round_from_the_generator():
    """The set is written only in the synthetic-set steps, filled to mpbm_synth_size, stamped with
    its round, replaced in round 2, and its rows are mixes of the generator (each in the hull of
    real features, its soft label a distribution)."""
    algorithm, dataset, hp = phased()
    writes, sets = [], {}
    for step, (x, y) in enumerate(batches(dataset, len(SCHEDULE))):
        before = algorithm.synth_z.clone()
        algorithm.update([(x, y)])
        if not torch.equal(before, algorithm.synth_z):
            writes.append(step)
        if SCHEDULE[step] == "synth" and SCHEDULE[step + 1] == "finetune":
            assert int(algorithm.synth_count) == 12
            sets[int(algorithm.synth_round)] = algorithm.synth_z.clone()
    assert writes == [8, 9, 18, 19]
    assert set(sets) == {1, 2} and not torch.equal(sets[1], sets[2])
    torch.testing.assert_close(algorithm.synth_y.sum(dim=1), torch.ones(12))
    assert (algorithm.synth_y >= 0).all()


def test_fine_tuning_trains_h_on_the_stored_set_and_f_on_real_data_only():
    """A fine-tuning step is ``L_sup + lambda_mix CE(h(z), ytilde)`` on rows drawn from the stored
    set: with lambda_mix 0.5 or 0 the extractor ends the step identical (stored features carry no
    gradient to f), the classifier does not, and ``mix`` is the CE of the drawn rows."""
    states = {}
    for lambda_mix in (0.0, 0.5):
        algorithm, dataset, _ = phased(mpbm_lambda_mix=lambda_mix, weight_decay=0.0)
        data = list(batches(dataset, 11))
        for x, y in data[:10]:
            algorithm.update([(x, y)])
        assert algorithm.phase()[0] == "finetune"
        if lambda_mix:
            torch.manual_seed(11)
            index = torch.randint(0, 12, (8,))
            with torch.no_grad():
                expected = soft_cross_entropy(algorithm.classifier(algorithm.synth_z[index]),
                                              algorithm.synth_y[index]).item()
        torch.manual_seed(11)
        out = algorithm.update([data[10]])
        states[lambda_mix] = algorithm
    assert abs(out["mix"] - expected) < 1e-5
    assert abs(out["loss"] - (out["sup"] + 0.5 * out["mix"])) < 1e-5
    for (name, p0), p5 in zip(states[0.0].network.named_parameters(),
                              states[0.5].network.parameters()):
        same = torch.equal(p0, p5)
        assert same == name.startswith("0."), name  # network = Sequential(featurizer, classifier)


def test_phased_resume_in_the_middle_of_a_phase_gives_the_records_of_an_uninterrupted_run(
        tmp_path):
    """The real train command: a job stopped after the checkpoint of step 7 (inside the g/D phase,
    the query bank full, the generator half trained) and continued by ``train --resume`` in a new
    process writes the records of an uninterrupted run, phases and diagnostics included."""
    import subprocess
    import sys

    from dg_plugins.train import run as train
    from dg_plugins.scripts.train import build_parser

    hp = {**PHASED, "mpbm_gen_steps": 4, "mpbm_diag_every": 3}
    common = ["--dataset", "Debug28", "--algorithm", "MPBM", "--test_envs", "1", "2",
              "--steps", "26", "--checkpoint_freq", "7", "--hparams", json.dumps(hp)]
    full, cut = tmp_path / "full", tmp_path / "cut"
    assert train.run(build_parser().parse_args(common + ["--output_dir", str(full)])) == "done"
    assert train.run(build_parser().parse_args(common + ["--output_dir", str(cut)]),
                     stop_after_step=7) == "stopped"
    proc = subprocess.run([sys.executable, "-m", "dg_plugins.scripts.train", *common,
                           "--output_dir", str(cut), "--resume"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    got, expected = read_records(cut, VOLATILE_KEYS), read_records(full, VOLATILE_KEYS)
    assert got == expected
    assert [r["step"] for r in expected] == [0, 7, 14, 21, 25]
    full_hp = tiny_hparams("MPBM", "Debug28", **hp)
    for previous, record in zip([-1] + [r["step"] for r in expected], expected):
        window = [phase_at(s, full_hp, 8) for s in range(previous + 1, record["step"] + 1)]
        assert record["phase"] == pytest.approx(np.mean([PHASES.index(p) for p, _, _ in window]))
        assert record["round"] == pytest.approx(np.mean([r for _, r, _ in window]))
    assert phase_at(7, full_hp, 8)[0] == "gen" and expected[-1]["round"] == 2
    assert expected[-1]["diag_query_corr"] != 0.0


# -- the value projection --------------------------------------------------------------------------

def test_value_projection_lets_a_mix_leave_the_hull_and_is_learned_by_the_generator():
    torch.manual_seed(7)
    d, nb, b = 12, 4, 6
    q, values = torch.randn(b, d), torch.randn(b, nb, d)
    labels = F.one_hot(torch.randint(0, 3, (b, nb)), 3).float()
    gen = MixupAttentionGenerator(d, value_projection=True)
    z, _, weights = gen(q, values, torch.eye(d), labels)  # W_V = I: the paper's mix
    torch.testing.assert_close(z, torch.einsum("bid,bid->bd", weights, values))
    assert outside_hull_share(z, values) == 0.0
    with torch.no_grad():
        gen.value.weight.add_(0.5 * torch.randn(d, d))
    z, _, weights = gen(q, values, torch.eye(d), labels)
    torch.testing.assert_close(z, torch.einsum("bid,bid->bd", weights,
                                               values @ gen.value.weight.T))
    assert outside_hull_share(z, values) > 0.2

    algorithm, dataset, _ = make(mpbm_value_proj=True, mpbm_lr_g=1e-2)
    _, y, q, features, y_onehot, groups = step_inputs(algorithm, dataset)
    start = algorithm.generator.value.weight.clone()
    algorithm.generator_step(q, features, y_onehot, y, groups)
    assert algorithm.generator.value.weight.grad.abs().sum() > 0
    assert not torch.equal(algorithm.generator.value.weight, start)
    # the f/h step of the online schedule: no gradient into W_V
    algorithm.generator.zero_grad(set_to_none=True)
    z, y_mix = algorithm.synthetic_features(q, features, y_onehot, groups)
    soft_cross_entropy(algorithm.classifier(z), y_mix).backward()
    assert algorithm.generator.value.weight.grad is None


# -- diagnostics -----------------------------------------------------------------------------------

def test_query_diagnostics_of_a_query_equal_to_its_source_and_of_pure_noise():
    algorithm, dataset, _ = make(mpbm_clamp="unit")
    x, y = batch(dataset, 8)
    q = algorithm.query_features(x)
    same = algorithm.query_diagnostics(x, x.clone(), y, q)
    assert abs(same["diag_query_corr"] - 1.0) < 1e-6
    assert same["diag_query_clamped"] == same["diag_source_clamped"]
    algorithm.eval()
    with torch.no_grad():
        expected_acc = (algorithm.predict(x).argmax(1) == y).float().mean().item()
    assert same["diag_query_acc"] == expected_acc
    noise = torch.rand(x.shape, generator=torch.Generator().manual_seed(123))
    other = algorithm.query_diagnostics(x, noise, y, q)
    assert abs(other["diag_query_corr"]) < 0.05
    corners = torch.where(noise > 0.5, 1.0, 0.0)
    assert algorithm.query_diagnostics(x, corners, y, q)["diag_query_clamped"] == 1.0
    assert algorithm.query_diagnostics(x, 0.2 + 0.6 * noise, y, q)["diag_query_clamped"] == 0.0
    # an affine change of the image keeps correlation 1; a constant image has correlation 0
    assert abs(image_correlation(0.5 * x + 0.1, x) - 1).max() < 1e-6
    assert (image_correlation(torch.full_like(x, 0.3), x) == 0).all()


def test_mix_diagnostics_measure_concentration_nearness_and_the_hull():
    weights = torch.zeros(2, 4, 10)
    weights[0, 1] = 1.0  # every dimension on instance 1: a whole-instance mix
    weights[1, torch.arange(10) % 4, torch.arange(10)] = 1.0  # dimensions spread 3, 3, 2, 2
    torch.testing.assert_close(top_instance_share(weights), torch.tensor([1.0, 0.3]))
    real = torch.randn(5, 6)
    torch.testing.assert_close(nearest_cosine(real[:3] * 2.0, real), torch.ones(3))
    values = torch.tensor([[[0.0, 1.0], [2.0, 3.0]]])
    assert outside_hull_share(torch.tensor([[1.0, 2.0]]), values) == 0.0
    assert outside_hull_share(torch.tensor([[2.5, 2.0]]), values) == 0.5

    # the probe on an untrained model: mixes of real features under MPBM's default generator
    algorithm, dataset, _ = make(mpbm_diag_every=1)
    x, y = batch(dataset, 8)
    values = algorithm.probe(x, y)
    assert set(values) == set(DIAG_KEYS)
    assert 1 / 5 <= values["diag_attn_top_share"] <= 1
    assert values["diag_synth_outside_hull"] == 0.0 and 0 < values["diag_synth_cos"] <= 1 + 1e-6
    assert int(algorithm.diag_step) == 0
    assert algorithm.diag.tolist() == [values[k] for k in DIAG_KEYS]


@pytest.mark.parametrize("schedule", ["phased", "online"])
def test_probes_report_carried_values_and_leave_the_training_unchanged(schedule):
    """With probes every step or none, the same updates give the same parameters and losses (the
    probe draws from its own generator and runs in eval mode); update returns the last probe's
    values at every step, 0.0 before the first."""
    runs = {}
    for every in (0, 3):
        algorithm, dataset, _ = phased(mpbm_schedule=schedule, mpbm_warmup_steps=2,
                                       mpbm_diag_every=every)
        outs = [algorithm.update([b]) for b in batches(dataset, 14)]
        runs[every] = (algorithm, outs)
    (a0, outs0), (a3, outs3) = runs[0], runs[3]
    for k, v in a0.state_dict().items():
        if k not in ("diag", "diag_step"):
            assert torch.equal(v, a3.state_dict()[k]), k
    for o0, o3 in zip(outs0, outs3):
        assert {k: o0[k] for k in LOSS_KEYS} == {k: o3[k] for k in LOSS_KEYS}
        assert all(o0[k] == 0.0 for k in DIAG_KEYS)
    corr = [o["diag_query_corr"] for o in outs3]
    assert corr[0] != 0.0 and corr[0] == corr[1] == corr[2] and corr[3] != corr[2]
    assert int(a3.diag_step) == 12


def test_phased_hparams_are_checked():
    with pytest.raises(HparamError, match="mpbm_schedule"):
        tiny_hparams("MPBM", "Debug28", mpbm_schedule="alternating")
    with pytest.raises(HparamError, match="mpbm_query_steps"):
        tiny_hparams("MPBM", "Debug28", mpbm_query_steps=0)
    with pytest.raises(HparamError, match="mpbm_rounds"):
        tiny_hparams("MPBM", "Debug28", mpbm_rounds=0)
