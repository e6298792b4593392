"""DMG's mechanism (domain-specific masks, Chattopadhyay et al. ECCV 2020): the soft-IoU penalty,
the straight-through gradient, specialisation of the masks, the soft-scale logit ensemble with a
shared trunk, Mask-Ens and DMG-KD, checked against independent computations."""

import copy
import itertools

import pytest
import torch
import torch.nn.functional as F

import dg_plugins.datasets  # noqa: F401  (registers Debug28)
from support.helpers import tiny_hparams
from dg_plugins import hparams as hp_lib
from dg_plugins.algorithms import ERM
from dg_plugins.algorithms import dmg as dmg_module
from dg_plugins.algorithms.dmg import DMG, hard_iou, soft_iou
from dg_plugins.registry import DATASETS

RESNET_SHAPE = (3, 32, 32)  # ResNet-18 on small inputs: the ResNet code path at CPU-test cost


def debug28(num_domains=2, **overrides):
    torch.manual_seed(0)
    dataset = DATASETS.get("Debug28")("", [], {})
    hp = tiny_hparams("DMG", "Debug28", **{"mnist_cnn_width": 16, **overrides})
    return DMG(dataset.input_shape, dataset.num_classes, num_domains, hp), dataset, hp


def resnet(num_domains=3, cls=DMG, **overrides):
    torch.manual_seed(0)
    hp = tiny_hparams(cls.__name__, "Debug224", **{"vit": False, "backbone": "resnet",
                                                   **overrides})
    return cls(RESNET_SHAPE, 5, num_domains, hp), hp


def batches_of(dataset, sizes):
    return [(dataset[i].tensors[0][:n], dataset[i].tensors[1][:n]) for i, n in enumerate(sizes)]


def reference_siou(a, b, eps=1e-6):
    """Soft IoU written out coordinate by coordinate (paper Eq. 2 plus the code's eps)."""
    inter = sum(float(x) * float(y) for x, y in zip(a, b))
    union = sum(float(x) + float(y) - float(x) * float(y) for x, y in zip(a, b))
    return (inter + eps) / (union + eps)


# Soft and hard IoU ---------------------------------------------------------------------------

def test_soft_iou_is_one_for_identical_masks_and_near_zero_for_disjoint_ones():
    a = torch.tensor([1.0, 1.0, 0.0, 0.0])
    assert soft_iou(a, a).item() == pytest.approx(1.0)
    assert soft_iou(a, 1 - a).item() < 1e-6
    p = torch.rand(7, 10)
    assert torch.allclose(soft_iou(p, p), (p * p).sum(-1) / (2 * p - p * p).sum(-1), atol=1e-6)
    q = torch.rand(10)
    assert soft_iou(p[0], q).item() == pytest.approx(reference_siou(p[0], q), rel=1e-5)


def test_hard_iou_counts_shared_kept_units_and_empty_pairs_are_identical():
    a = torch.tensor([True, True, True, False])
    b = torch.tensor([False, True, True, True])
    assert hard_iou(a, b).item() == pytest.approx(2 / 4)
    empty = torch.zeros(4, dtype=torch.bool)
    assert hard_iou(empty, empty).item() == 1.0 and hard_iou(a, empty).item() == 0.0


def test_overlap_is_the_pair_mean_summed_over_layers_and_update_adds_it_to_the_loss():
    algorithm, dataset, _ = debug28(num_domains=3, dmg_lambda_overlap=0.3)
    probs = [torch.sigmoid(p.detach()) for p in algorithm.mask_logits]
    expected = sum(sum(reference_siou(p[i], p[j]) for i, j in itertools.combinations(range(3), 2))
                   / 3 for p in probs)
    hard = sum(sum(hard_iou(p[i] > 0.5, p[j] > 0.5).item()
                   for i, j in itertools.combinations(range(3), 2)) / 3 for p in probs) / 2
    out = algorithm.update(batches_of(dataset, [4, 4, 4]))
    assert out["overlap"] == pytest.approx(expected, rel=1e-5)
    assert out["loss"] == pytest.approx(out["ce"] + 0.3 * expected, rel=1e-5)
    assert out["iou_hard"] == pytest.approx(hard)
    assert set(out) == {"loss", "ce", "overlap", "iou_hard"}


def test_sparsity_adds_the_l1_norm_of_the_soft_masks():
    algorithm, dataset, _ = debug28(dmg_lambda_overlap=0.0, dmg_lambda_sparsity=0.01)
    l1 = sum(torch.sigmoid(p.detach()).sum().item() for p in algorithm.mask_logits)
    out = algorithm.update(batches_of(dataset, [4, 4]))
    assert out["loss"] == pytest.approx(out["ce"] + 0.01 * l1, rel=1e-5)


def test_a_single_source_domain_has_no_overlap_term():
    algorithm, dataset, _ = debug28(num_domains=1)
    out = algorithm.update(batches_of(dataset, [6]))
    assert out["overlap"] == 0.0 and out["iou_hard"] == 0.0
    assert out["loss"] == pytest.approx(out["ce"])


# Training: Bernoulli masks with the straight-through estimator ----------------------------------

def test_training_uses_sampled_binary_masks_and_the_straight_through_gradient(monkeypatch):
    """The forward pass uses the sampled b (per sample, per channel); the mask logits receive
    d CE / d mask * p (1 - p) summed over the samples of their domain (b replaced by p in the
    backward pass)."""
    algorithm, dataset, _ = debug28(num_domains=2, dmg_lambda_overlap=0.0)
    reference = copy.deepcopy(algorithm)
    drawn = []
    real_bernoulli = torch.bernoulli

    def record(p, *args, **kwargs):
        b = real_bernoulli(p, *args, **kwargs)
        drawn.append(b)
        return b

    monkeypatch.setattr(dmg_module.torch, "bernoulli", record)
    batches = batches_of(dataset, [5, 3])
    out = algorithm.update(batches)
    monkeypatch.undo()

    x = torch.cat([b[0] for b in batches])
    y = torch.cat([b[1] for b in batches])
    domain = torch.tensor([0] * 5 + [1] * 3)
    assert len(drawn) == 2 and all(b.shape == (8, w.shape[1])
                                   for b, w in zip(drawn, reference.mask_logits))
    assert all(set(b.unique().tolist()) <= {0.0, 1.0} for b in drawn)
    # Independent forward: MNIST CNN blocks by hand, mask b broadcast over H x W before block4.
    feat = reference.featurizer
    h = x
    for name in ("block1", "block2", "block3"):
        h = feat.blocks[name](h)
    masks = [b.clone().requires_grad_(True) for b in drawn]
    h = feat.blocks["block4"](h * masks[0][:, :, None, None])
    logits = reference.classifier(feat.avgpool(h).flatten(1) * masks[1])
    ce = F.cross_entropy(logits, y)
    assert out["ce"] == pytest.approx(ce.item(), rel=1e-6)
    ce.backward()
    for layer, (m, logit) in enumerate(zip(masks, reference.mask_logits)):
        p = torch.sigmoid(logit.detach())
        expected = torch.zeros_like(p).index_add_(0, domain, m.grad * p[domain] * (1 - p[domain]))
        got = algorithm.mask_logits[layer].grad
        assert got.abs().sum() > 0
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-7)


def test_masks_specialise_with_the_overlap_penalty():
    """Short run, large mask lr: with lambda_O > 0 the thresholded masks of different domains
    overlap clearly less than with lambda_O = 0, while many units stay on (not a collapse)."""
    dataset = DATASETS.get("Debug28")("", [], {})
    batches = batches_of(dataset, [8, 8, 8])
    result = {}
    for lam in (0.0, 0.1):
        algorithm, _, _ = debug28(num_domains=3, dmg_lambda_overlap=lam, dmg_mask_lr=0.1, lr=1e-2)
        for _ in range(50):
            out = algorithm.update(batches)
        kept = torch.cat([(p > 0.5).flatten() for p in algorithm.mask_probs()]).float().mean()
        result[lam] = (out["iou_hard"], kept.item())
    assert result[0.1][0] < result[0.0][0] - 0.3, result
    assert result[0.1][1] > 0.25, result


def test_masks_have_their_own_optimizer_with_dmg_mask_lr():
    algorithm, _ = resnet(lr=1e-3, dmg_mask_lr=0.05)
    groups = algorithm.mask_optimizer.param_groups
    assert [p for g in groups for p in g["params"]] == list(algorithm.mask_logits)
    assert all(g["lr"] == 0.05 for g in groups)
    assert all(g["lr"] == 1e-3 for g in algorithm.optimizer.param_groups)
    default, _ = resnet(lr=1e-3)
    assert default.mask_optimizer.param_groups[0]["lr"] == 1e-3


# Layers, parameters --------------------------------------------------------------------------

def test_resnet_masks_layer3_layer4_fc_and_adds_only_the_mask_logits():
    algorithm, hp = resnet(num_domains=3)
    erm, _ = resnet(num_domains=3, cls=ERM)
    assert algorithm.mask_layers == ("layer3", "layer4", "fc")
    assert [tuple(p.shape) for p in algorithm.mask_logits] == [(3, 128), (3, 256), (3, 512)]
    count = sum(p.numel() for p in algorithm.parameters())
    assert count - sum(p.numel() for p in erm.parameters()) == 3 * (128 + 256 + 512)
    logits = torch.cat([p.detach().flatten() for p in algorithm.mask_logits])
    assert 0 <= logits.min() and logits.max() <= 1  # U(0, 1) init


def test_layer_choices_per_backbone_and_validation():
    alt, _ = resnet(dmg_mask_layers="fc, layer4")
    assert alt.mask_layers == ("layer4", "fc")
    assert [p.shape[1] for p in alt.mask_logits] == [256, 512]
    cnn, _, _ = debug28()
    assert cnn.mask_layers == ("block4", "fc")
    lenet, _, _ = debug28(backbone="lenet")
    assert lenet.mask_layers == ("fc2", "fc")
    with pytest.raises(ValueError, match=r"'layer5'.*valid names: layer1, layer2, layer3, "
                                         r"layer4, fc"):
        resnet(dmg_mask_layers="layer4,layer5")
    with pytest.raises(hp_lib.HparamError, match="dmg_mask_layers"):
        hp_lib.validate("DMG", "PACS", {"dmg_mask_layers": "layer4,,fc"})
    with pytest.raises(hp_lib.HparamError, match="dmg_mask_lr"):
        hp_lib.validate("DMG", "PACS", {"dmg_mask_lr": -1})
    with pytest.raises(hp_lib.HparamError, match="dmg_test_ensemble"):
        hp_lib.validate("DMG", "PACS", {"dmg_test_ensemble": "mean"})
    assert hp_lib.validate("DMG", "PACS", {"dmg_mask_lr": None}) == {"dmg_mask_lr": None}


# Inference -----------------------------------------------------------------------------------

def resnet_by_hand(algorithm, x, masks):
    """ResNet-18 forward written out from torchvision's modules with the three channel masks
    (``[N or 1, C]``) on the inputs of layer3 and layer4 and on the pooled feature."""
    net = algorithm.featurizer.network
    h = net.layer2(net.layer1(net.maxpool(net.relu(net.bn1(net.conv1(x))))))
    h = net.layer3(h * masks[0][:, :, None, None])
    h = net.layer4(h * masks[1][:, :, None, None])
    pooled = torch.flatten(net.avgpool(h), 1)
    return algorithm.classifier(pooled * masks[2])


def test_predict_averages_the_soft_mask_logits_and_runs_the_trunk_once():
    algorithm, _ = resnet(num_domains=3)
    with torch.no_grad():
        for p in algorithm.mask_logits:
            p.normal_(0, 2)  # masks that differ between domains
    algorithm.eval()
    x = torch.randn(4, *RESNET_SHAPE)
    calls = {"layer2": 0, "layer3": 0}
    net = algorithm.featurizer.network
    handles = [getattr(net, name).register_forward_hook(
        lambda *_, n=name: calls.__setitem__(n, calls[n] + 1)) for name in calls]
    with torch.no_grad():
        got = algorithm.predict(x)
    for handle in handles:
        handle.remove()
    assert calls == {"layer2": 1, "layer3": 3}
    probs = [torch.sigmoid(p.detach()) for p in algorithm.mask_logits]
    with torch.no_grad():
        per_domain = [resnet_by_hand(algorithm, x, [p[d:d + 1] for p in probs]) for d in range(3)]
        torch.testing.assert_close(got, torch.stack(per_domain).mean(0))
        # DMG-KD: one domain's soft mask; per-sample domains pick per-sample masks.
        torch.testing.assert_close(algorithm.predict_known_domain(x, 2), per_domain[2])
        mixed = algorithm.predict_known_domain(x, torch.tensor([0, 1, 2, 0]))
        torch.testing.assert_close(mixed, torch.stack([per_domain[d][i] for i, d in
                                                       enumerate([0, 1, 2, 0])]))
        # Mask-Ens: one pass with the domain-averaged soft masks.
        algorithm.test_ensemble = "masks"
        torch.testing.assert_close(algorithm.predict(x), resnet_by_hand(
            algorithm, x, [p.mean(0, keepdim=True) for p in probs]))
        assert not torch.allclose(algorithm.predict(x), got, atol=1e-4)
    with pytest.raises(ValueError, match="source domain index"):
        algorithm.predict_known_domain(x, 3)


def test_mask_ens_is_chosen_by_hparam():
    algorithm, _ = resnet(num_domains=2, dmg_test_ensemble="masks")
    with torch.no_grad():
        for p in algorithm.mask_logits:
            p.normal_(0, 2)
    algorithm.eval()
    x = torch.randn(2, *RESNET_SHAPE)
    mean_masks = [torch.sigmoid(p.detach()).mean(0, keepdim=True) for p in algorithm.mask_logits]
    with torch.no_grad():
        torch.testing.assert_close(algorithm.predict(x), resnet_by_hand(algorithm, x, mean_masks))


def test_vit_masks_broadcast_over_tokens():
    """On the tiny ViT the mask of the last block's input scales every token's channels."""
    torch.manual_seed(0)
    dataset = DATASETS.get("Debug224")("", [], {})
    hp = tiny_hparams("DMG", "Debug224")
    algorithm = DMG(dataset.input_shape, dataset.num_classes, 2, hp)
    last = algorithm.featurizer.stage_names[-1]
    assert algorithm.mask_layers == (last, "fc")
    with torch.no_grad():
        for p in algorithm.mask_logits:
            p.normal_(0, 2)
    algorithm.eval()
    x = dataset[0].tensors[0][:2]
    probs = [torch.sigmoid(p.detach()) for p in algorithm.mask_logits]
    feat = algorithm.featurizer
    with torch.no_grad():
        expected = []
        for d in range(2):
            h = feat.forward_stages(x, stop=last)
            h = feat.stage(last)(h * probs[0][d].view(1, 1, -1))
            pooled = feat.pool(h)
            expected.append(algorithm.classifier(pooled * probs[1][d]))
        torch.testing.assert_close(algorithm.predict(x), (expected[0] + expected[1]) / 2)


# The release's schedule and classifier init ------------------------------------------------

def test_set_lr_factor_leaves_the_mask_optimizer_unless_dmg_mask_lr_schedule():
    """The PACS release never steps its mask scheduler; with ``dmg_mask_lr_schedule`` (its
    iteration mode, DomainNet) the masks follow the job's schedule too. The factor always applies
    to the initial lr (a pure function of the step, not compounding)."""
    for follows in (False, True):
        algorithm, _, _ = debug28(dmg_mask_lr_schedule=follows, dmg_mask_lr=0.02)
        for factor in (0.5, 0.25):
            algorithm.set_lr_factor(factor)
            assert algorithm.optimizer.param_groups[0]["lr"] == pytest.approx(1e-3 * factor)
            mask_lr = algorithm.mask_optimizer.param_groups[0]["lr"]
            assert mask_lr == pytest.approx(0.02 * factor if follows else 0.02)
        state = algorithm.optimizer.state_dict()["param_groups"][0]
        assert state["initial_lr"] == 1e-3  # saved with the optimizer: a resume keeps it


def test_dmg_fc_init_std_draws_the_classifier_from_a_small_normal_with_zero_bias():
    """The DomainNet release's ``weights_init`` (N(0, 0.001), bias 0) on a ResNet-18's fc of
    512 x 5 weights; the default keeps PyTorch's init (uniform, std ~ 1/sqrt(3 x 512))."""
    algorithm, _ = resnet(dmg_fc_init_std=0.001)
    weight, bias = algorithm.classifier.weight, algorithm.classifier.bias
    assert weight.shape == (5, 512)
    assert weight.std().item() == pytest.approx(0.001, rel=0.1)
    assert weight.mean().abs().item() < 1e-4  # 5 standard errors of the mean
    assert torch.count_nonzero(bias).item() == 0
    default, _ = resnet()
    assert default.classifier.weight.std().item() == pytest.approx((1 / (3 * 512)) ** 0.5,
                                                                   rel=0.1)
    assert torch.count_nonzero(default.classifier.bias).item() == 5
    with pytest.raises(hp_lib.HparamError, match="'dmg_fc_init_std' must be a number > 0"):
        hp_lib.validate("DMG", "PACS", {"dmg_fc_init_std": 0})
