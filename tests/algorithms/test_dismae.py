"""DisMAE's and MAE's mechanism: masks, the reconstruction and adaptive contrastive losses against
independent computations, the detached domain-classifier weights, and the UDG hooks."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F

import dg_plugins.datasets  # noqa: F401  (registers Debug28/Debug224)
from support.helpers import tiny_hparams
from dg_plugins.algorithms.dismae import (MAE, DisMAE, build_encoder, dcls_active, patchify)
from dg_plugins.networks import vit as vitlib
from dg_plugins.registry import DATASETS


def make(cls=DisMAE, dataset="Debug224", num_domains=3, num_classes=2, **overrides):
    torch.manual_seed(0)
    shape = DATASETS.get(dataset).INPUT_SHAPE
    hp = tiny_hparams(cls.__name__, dataset, **overrides)
    return cls(shape, num_classes, num_domains, hp), shape, hp


def batches(shape, sizes, num_classes=2, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(n, *shape, generator=g), torch.randint(0, num_classes, (n,), generator=g))
            for n in sizes]


def test_each_mask_keeps_the_configured_number_of_tokens():
    """Semantic encoder: floor(N * 0.2) patches + CLS; variation encoder: floor(N * 0.3) + CLS, on
    an independent mask; ViT-B/16 at 224 gives 39 and 58 of 196 (the release's counts)."""
    algorithm, shape, _ = make()
    assert vitlib.num_kept_tokens(196, 0.8) == 39 and vitlib.num_kept_tokens(196, 0.7) == 58
    n = algorithm.encoder.patch_embed.num_patches
    assert n == 49
    x = torch.randn(4, *shape)
    tokens = vitlib.embed_patches(algorithm.encoder, x)
    latent, mask, _ = algorithm.semantic(tokens, algorithm.mask_ratio)
    assert latent.shape[1] == 1 + vitlib.num_kept_tokens(n, 0.8) == 1 + 9
    assert mask.sum(1).tolist() == [n - 9] * 4
    seen = []
    handle = algorithm.var_blocks.register_forward_hook(lambda m, i, o: seen.append(i[0].shape))
    v = algorithm.variation(tokens, algorithm.var_mask_ratio)
    handle.remove()
    assert seen == [torch.Size([4, 1 + vitlib.num_kept_tokens(n, 0.7), 64])] and v.shape == (4, 64)
    assert algorithm.var_mask_ratio == pytest.approx(0.7)


def test_contrastive_term_is_infonce_over_negative_errors():
    """Lower when the positive's error is the smallest; log(n) when all errors are equal."""
    domain = torch.tensor([0, 0, 0, 0, 1, 1, 1])
    positive = torch.tensor([0, 4])
    equal = DisMAE.contrastive_terms(torch.full((7,), 0.3), domain, positive, 0.4)
    torch.testing.assert_close(equal, torch.tensor([math.log(4), math.log(3)]))
    best = torch.tensor([0.1, 0.5, 0.5, 0.5, 0.1, 0.5, 0.5])
    worst = torch.tensor([0.9, 0.5, 0.5, 0.5, 0.9, 0.5, 0.5])
    low = DisMAE.contrastive_terms(best, domain, positive, 0.4)
    high = DisMAE.contrastive_terms(worst, domain, positive, 0.4)
    assert (low < equal).all() and (high > equal).all()
    logits = -best[:4] / 0.4
    torch.testing.assert_close(low[0], -F.log_softmax(logits, 0)[0])


def test_update_losses_match_an_independent_computation():
    """rec, ada and ce of one update equal a sample-by-sample recomputation with the same masks:
    every domain's first sample is the anchor, decoded with each same-domain variation token."""
    algorithm, shape, hp = make(num_domains=3)
    mb = batches(shape, [3, 2, 4])
    ref = copy.deepcopy(algorithm)
    torch.manual_seed(5)
    out = algorithm.update(mb)

    x = torch.cat([b[0] for b in mb])
    y = torch.cat([b[1] for b in mb])
    domain = torch.tensor([0] * 3 + [1] * 2 + [2] * 4)
    torch.manual_seed(5)
    with torch.no_grad():
        tokens = vitlib.embed_patches(ref.encoder, x)
        latent, mask, ids = ref.semantic(tokens, ref.mask_ratio)
        v = ref.variation(tokens, ref.var_mask_ratio)
        target = patchify(x, ref.patch)
        pred = ref.decoder(latent, ids, v)
        rec = sum(((pred[i] - target[i]) ** 2).mean(-1)[mask[i] > 0].sum()
                  for i in range(len(x))) / (mask.sum() + 1)
        ada = 0.0
        for d, start, size in [(0, 0, 3), (1, 3, 2), (2, 5, 4)]:
            a = start
            errs = []
            for j in range(start, start + size):
                swap = ref.decoder(latent[a:a + 1], ids[a:a + 1], v[j:j + 1])[0]
                excess = torch.clamp((swap - target[a]) ** 2 - hp["dismae_margin"], min=0)
                errs.append(excess.mean(-1).sum() / (mask[a].sum() + 1))
            errs = torch.stack(errs)
            term = -F.log_softmax(-errs / hp["dismae_tau"], 0)[0]
            p = F.softmax(ref.domain_classifier(latent[a:a + 1, 0]), 1)[0, d]
            ada = ada + term / max(hp["dismae_wmin"], p.item())
        ce = F.cross_entropy(ref.classifier(latent[:, 0]), y)
    assert out["rec"] == pytest.approx(rec.item(), rel=1e-5)
    assert out["ada"] == pytest.approx(float(ada), rel=1e-5)
    assert out["ce"] == pytest.approx(ce.item(), rel=1e-5)
    expected = rec + hp["dismae_lambda1"] * ada + hp["dismae_lambda2"] * ce
    assert out["loss"] == pytest.approx(float(expected), rel=1e-5)
    assert set(out) == {"loss", "rec", "ada", "ce", "dcls_loss", "dcls_acc"}


def test_adaptive_weight_uses_detached_features_and_no_gradient_reaches_the_encoder():
    algorithm, shape, hp = make()
    cls = torch.randn(3, 64, requires_grad=True)
    domains = torch.tensor([0, 1, 2])
    w = algorithm.adaptive_weights(cls, domains)
    assert not w.requires_grad
    p = F.softmax(algorithm.domain_classifier(cls.detach()), 1)[torch.arange(3), domains]
    torch.testing.assert_close(w, 1 / p.clamp(min=hp["dismae_wmin"]))
    # the classifier's own step: its parameters move, the encoders' neither move nor get gradient
    before = copy.deepcopy(algorithm.state_dict())
    x = torch.cat([b[0] for b in batches(shape, [2, 2, 2])])
    algorithm.domain_classifier_step(x, torch.tensor([0, 0, 1, 1, 2, 2]))
    after = algorithm.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(k.startswith("domain_classifier.") for k in changed)
    assert all(p.grad is None for n, p in algorithm.named_parameters()
               if not n.startswith("domain_classifier."))
    # the main step: no gradient into the domain classifier, it does not move
    algorithm.hparams = {**hp, "dismae_dcls_epoch_steps": 1}
    algorithm.step.fill_(7)  # epoch 7: the classifier does not train at this step
    dcls = copy.deepcopy(algorithm.domain_classifier.state_dict())
    algorithm.dcls_optimizer.zero_grad(set_to_none=True)
    algorithm.update(batches(shape, [2, 2, 2]))
    assert all(p.grad is None for p in algorithm.domain_classifier.parameters())
    for k, value in algorithm.domain_classifier.state_dict().items():
        assert torch.equal(value, dcls[k])


def test_domain_classifier_schedule_maps_epochs_to_steps():
    on = [s for s in range(0, 1700) if dcls_active(s, 10)]
    epochs = sorted({s // 10 for s in on})
    assert epochs == [0, 1, 2, 3, 4, 5, 15, 30, 45, 60, 75, 90]
    assert all(dcls_active(s, 0) for s in range(50))


@pytest.mark.parametrize("cls", [MAE, DisMAE])
def test_reconstruction_loss_falls_on_a_fixed_batch(cls):
    algorithm, shape, _ = make(cls, dataset="Debug28", lr=2e-3)
    g = torch.Generator().manual_seed(3)  # flat colour images: predictable from visible patches
    images = [torch.rand(4, shape[0], 1, 1, generator=g).expand(4, *shape) for _ in range(2)]
    torch.manual_seed(0)
    recs = [algorithm.pretrain_update(images)["rec"] for _ in range(25)]
    assert sum(recs[-5:]) / 5 < 0.5 * sum(recs[:5]) / 5, recs


def test_rec_loss_counts_masked_patches_only():
    pred = torch.rand(2, 4, 3)
    target = torch.rand(2, 4, 3)
    mask = torch.tensor([[1.0, 0, 0, 1], [0, 0, 1, 0]])
    per = ((pred - target) ** 2).mean(-1)
    expected = (per[0, 0] + per[0, 3] + per[1, 2]) / 4
    torch.testing.assert_close(DisMAE.rec_loss(pred, target, mask), expected)
    x = torch.arange(2 * 3 * 4 * 4, dtype=torch.float).view(2, 3, 4, 4)
    p = patchify(x, 2)
    assert p.shape == (2, 4, 12)
    assert p[0, 1].view(2, 2, 3)[1, 0, 2].item() == x[0, 2, 1, 2].item()  # patch (0, 1), pixel (1, 0)


@pytest.mark.parametrize("num_domains", [2, 3, 5])
def test_any_number_of_domains_and_uneven_batches(num_domains):
    algorithm, shape, _ = make(dataset="Debug28", num_domains=num_domains, num_classes=7)
    sizes = [2 + (i % 3) for i in range(num_domains)]
    mb = batches(shape, sizes, num_classes=7)
    assert algorithm.domain_classifier[-1].out_features == num_domains
    out = algorithm.update(mb)
    assert all(math.isfinite(v) for v in out.values())
    pre = algorithm.pretrain_update([b[0] for b in mb])
    assert set(pre) == {"loss", "rec", "ada", "dcls_loss", "dcls_acc"}
    _, anchors = DisMAE.anchors(torch.cat([torch.full((n,), i) for i, n in enumerate(sizes)]))
    assert anchors.tolist() == [sum(sizes[:i]) for i in range(num_domains)]
    algorithm.eval()
    assert algorithm.predict(mb[0][0]).shape == (sizes[0], 7)


def test_predict_is_the_classifier_on_the_unmasked_semantic_cls():
    algorithm, shape, _ = make()
    algorithm.eval()
    x = torch.randn(3, *shape)
    with torch.no_grad():
        expected = algorithm.classifier(algorithm.encoder.forward_features(x)[:, 0])
        torch.testing.assert_close(algorithm.predict(x), expected)


@pytest.mark.parametrize("cls", [MAE, DisMAE])
def test_pretrained_state_is_exactly_the_semantic_encoder(cls):
    algorithm, shape, hp = make(cls)
    state = algorithm.pretrained_state()
    fresh = build_encoder(shape, hp)
    assert set(state) == set(fresh.state_dict())
    assert not any(k.startswith(("var_blocks", "decoder", "domain_classifier", "classifier"))
                   for k in state)
    fresh.load_state_dict(state)
    x = torch.randn(2, *shape)
    fresh.eval(), algorithm.eval()
    with torch.no_grad():
        torch.testing.assert_close(fresh.forward_features(x)[:, 0], algorithm.features(x))


def test_mae_has_no_variation_branch_and_fixed_keys():
    algorithm, shape, _ = make(MAE)
    assert not hasattr(algorithm, "var_blocks") and not hasattr(algorithm, "domain_classifier")
    mb = batches(shape, [2, 3])
    assert set(algorithm.update(mb)) == {"loss", "rec", "ce"}
    assert set(algorithm.pretrain_update([b[0] for b in mb])) == {"loss", "rec"}


def test_unnorm_target_denormalises_rgb_images():
    algorithm, shape, _ = make(dismae_unnorm_target=True)
    x = torch.zeros(1, *shape)
    t = algorithm.target(x)
    assert t.view(-1, 3)[0].tolist() == pytest.approx([0.485, 0.456, 0.406])
    plain, _, _ = make()
    assert torch.equal(plain.target(x), patchify(x, plain.patch))


def test_bad_mask_offset_and_missing_checkpoint_are_rejected():
    with pytest.raises(ValueError, match="dismae_var_mask_offset"):
        make(dismae_mask_ratio=0.05, dismae_var_mask_offset=0.1)
    with pytest.raises(FileNotFoundError, match="dismae_init"):
        make(dismae_init="/nonexistent/mae.pth")


def test_mae_checkpoint_initialises_the_encoder_and_decoder(tmp_path):
    donor, shape, hp = make(MAE)
    state = {k: v for k, v in donor.encoder.state_dict().items()}
    state.update({f"decoder_{k}": v for k, v in donor.decoder.state_dict().items()
                  if k.startswith(("embed", "norm", "pred", "blocks"))})
    state["mask_token"] = donor.decoder.mask_token.detach()
    path = tmp_path / "mae.pth"
    torch.save({"model": state}, path)
    torch.manual_seed(123)
    other = DisMAE(shape, 2, 3, {**tiny_hparams("DisMAE", "Debug224"), "dismae_init": str(path)})
    for k, v in donor.encoder.state_dict().items():
        assert torch.equal(other.encoder.state_dict()[k], v), k
    assert torch.equal(other.decoder.pred.weight, donor.decoder.pred.weight)
    assert torch.equal(other.decoder.mask_token, donor.decoder.mask_token)


def test_domain_classifier_epoch_is_the_hparam_else_the_runs_epoch():
    """The release trains the domain classifier on epochs 0-5 and every 15th: an epoch is the
    hparam when set, else the run's real epoch (set by the job), else 100 steps."""
    from dg_plugins.algorithms.dismae import FALLBACK_EPOCH_STEPS, dcls_active, dcls_epoch_steps

    assert dcls_epoch_steps({"dismae_dcls_epoch_steps": 7}, 41.7) == 7
    assert dcls_epoch_steps({"dismae_dcls_epoch_steps": None}, 41.7) == 42
    assert dcls_epoch_steps({"dismae_dcls_epoch_steps": None}, 0.3) == 1
    assert dcls_epoch_steps({"dismae_dcls_epoch_steps": None}, None) == FALLBACK_EPOCH_STEPS
    assert [dcls_active(s, 42) for s in (0, 251, 252, 15 * 42, 16 * 42)] == [
        True, True, False, True, False]
    from dg_plugins import hparams

    with pytest.raises(hparams.HparamError, match="non-negative integer"):
        hparams.validate("DisMAE", "Debug28", {"dismae_dcls_epoch_steps": -1})
    assert hparams.validate("DisMAE", "Debug28", {"dismae_dcls_epoch_steps": 0})
