"""DMG: Domain-specific Masks for Generalization (Chattopadhyay, Balaji and Hoffman, "Learning to
Balance Specificity and Invariance for In and Out of Domain Generalization", ECCV 2020; official
code github.com/prithv1/DMG).

Every source domain ``d`` owns a vector of mask logits ``m~^d`` per masked layer; its keep
probabilities are ``m^d = sigmoid(m~^d)`` (the paper's Fig. 2). A training sample of domain ``d``
draws a binary mask ``b ~ Bernoulli(m^d)`` (per sample, per channel; one variable per channel is
shared over the spatial positions of a conv map, or over the tokens of a ViT) and the layer's
activations are multiplied by it. The sampled mask is differentiated with the straight-through
estimator (the forward pass uses ``b``, the backward pass ``m^d``: ``b + m - m.detach()``).
Objective (paper Eq. 2 and 3, in the official code's form)::

    L = mean_i CE(f(x_i; b_i), y_i)
        + lambda_O * sum_layers mean_{d_i < d_j} sIoU(m^{d_i}, m^{d_j})
        + lambda_S * sum_layers sum_d ||m^d||_1                           (paper Fig. 6, off)

    sIoU(a, b) = (sum_k a_k b_k + eps) / (sum_k (a_k + b_k - a_k b_k) + eps),   eps = 1e-6

The soft IoU acts on the probabilities, is averaged over domain pairs (the paper's Eq. 2 sums them;
the two differ only by the effective ``lambda_O``) and summed over masked layers. With a single
source domain there is no pair and the overlap term is 0.

Inference ("soft-scale", as in the paper and the official code): for each source domain the
activations are scaled by its probabilities ``m^d`` (no sampling) and the *logits* of the
``num_domains`` passes are averaged (the code's ``scores.mean(0)``). The network below the first
masked layer is run once; only the masked tail is repeated per domain. ``dmg_test_ensemble
"masks"`` is the paper's Mask-Ens (average the soft masks, one pass; paper Table 5);
:meth:`DMG.predict_known_domain` is DMG-KD (the known domain's soft mask, paper Table 3).

Masked layers (hparam ``dmg_mask_layers``)
-------------------------------------------
A comma-separated list of the featurizer's stage names (the mask acts on the *input* of that
stage, i.e. the output of the previous one) and/or ``fc`` (the pooled feature that goes into the
classifier, after the featurizer's dropout). ``"auto"`` (default) resolves per backbone:

* ResNet-18/50 (torchvision, and timm's ``resnet50.ram_in1k``): ``layer3,layer4,fc`` as the
  official run script does (``MASK_LAYERS=layer3,layer4,fc``, channel masks in conv mode); the
  paper text's "last residual block + first fc" is ``"layer4,fc"``.
* any other staged featurizer (the MNIST CNN: ``block4,fc``; LeNet: ``fc2,fc``; the timm ViT:
  ``block{L-1},fc``, i.e. the token channels entering the last transformer block and the pooled
  feature): the input of its last stage and the pooled feature, the analogue of masking the top of
  the network (``layer4`` + ``fc`` on a ResNet).
* featurizers without stage access (DomainBed's DINOv2 recipe, plugin featurizers): ``fc`` only.

Explicit names are checked against the featurizer's stages (the error lists the valid ones).

DomainBed mapping and choices
-----------------------------
* The domain of a sample is the index of its minibatch (DomainBed gives one batch per source
  environment; the official code draws a pooled batch of 64 and reads the domain label: the base
  hparam ``batch_sampling`` "pooled" gives that, a minibatch then holding a domain's share of the
  pooled batch, possibly 0 rows).
* The network has DomainBed's Adam (``lr``, ``weight_decay``); the mask logits have their own Adam
  (``dmg_mask_lr``, default ``None`` = the job's ``lr``; same weight decay, as the official code
  gives both optimizers the same settings). LR schedule: the base hparam ``lr_schedule``
  (default "constant", as in DomainBed; the release's PACS config is "exp_epoch" with
  ``lr_decay`` 0.99, its DomainNet config "inv_step"), applied to the network's optimizer and,
  with ``dmg_mask_lr_schedule`` true, to the masks' (see :meth:`DMG.lr_schedule_exempt`).
* Classifier init: PyTorch's default, or with ``dmg_fc_init_std`` ``s`` the DomainNet release's
  ``N(0, s)`` weights and zero bias (its ``s`` = 0.001; :func:`init_classifier`).
* BatchNorm stays in train mode while training (the official code's ``model.train()``, DomainBed's
  ``freeze_bn=False``). The fc mask comes after the ResNet's ``resnet_dropout``.
* ``update`` reports ``loss``, ``ce``, ``overlap`` (the soft-IoU term before ``lambda_O``) and
  ``iou_hard``: the mean over masked layers of the mean pairwise IoU of the masks thresholded at
  0.5 (``1[m^d > 0.5]``, the paper's specialisation measure, Fig. 4-5; two empty masks count as
  IoU 1), both for the masks before the step. Both are 0.0 with a single source domain (no pairs).

Paper-faithful configuration (PACS; the paper's implementation details and the official config)
-----------------------------------------------------------------------------------------------
ImageNet-pretrained torchvision ResNet-18 or ResNet-50 (``resnet18`` true/false,
``resnet50_augmix`` false), Adam lr 1e-4 for network and masks (``lr`` 1e-4, ``dmg_mask_lr``
1e-4), batch 64 (pooled in the paper; here ``batch_size`` 21 per source domain x 3 = 63 is the
closest per-domain split), ``weight_decay`` 1e-5, ``dmg_lambda_overlap`` 0.1,
``dmg_lambda_sparsity`` 0, ``dmg_mask_layers`` ``layer3,layer4,fc``; see
``sweeps/dmg_pacs_paper.sh``. The release's per-epoch exponential decay 0.99 of the network's
lr and its pooled (unbalanced) batches of 64 are ``{"lr_schedule": "exp_epoch",
"batch_sampling": "pooled", "batch_size": 64}``. DomainBed's PACS augmentation replaces the paper's
by default (``RandomResizedCrop(224, scale 0.8-1)``, flip, ``ColorJitter(0.4, 0.4, 0.4, 0.4)``;
DomainBed's ``domainbed/datasets.py`` uses scale 0.7-1, jitter 0.3 and ``RandomGrayscale`` (p
0.1)).
"""

from __future__ import annotations

import itertools

import torch
import torch.nn as nn
import torch.nn.functional as F

from dg_plugins import hparams as hp_lib
from dg_plugins.algorithms.base import (FeatureClassifier, adam, optimizer_step,
                                        register_algorithm, split_minibatches)
from dg_plugins.networks.featurizers import ResNet
from dg_plugins.networks.staged import StagedFeaturizer

#: The name that stands for the pooled feature entering the classifier.
FC = "fc"
#: ``dmg_test_ensemble`` choices: average the per-domain logits, or average the soft masks.
ENSEMBLES = ("logits", "masks")
EPS = 1e-6


def _optional_positive(value) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        return "must be a number > 0, or null for the job's lr"
    return None


def _optional_std(value) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        return "must be a number > 0, or null for PyTorch's default classifier init"
    return None


def _layer_list(value) -> str | None:
    names = [n.strip() for n in value.split(",")]
    if not value.strip() or any(not n for n in names):
        return ("must be 'auto' or a comma-separated list of stage names and/or 'fc' "
                "(e.g. 'layer3,layer4,fc' on a ResNet)")
    if len(set(names)) != len(names):
        return "names a layer twice"
    return None


def init_classifier(classifier: nn.Module, std: float) -> None:
    """The DomainNet release's classifier init (``MODEL.PARAM_INIT: "custom"``): every
    ``nn.Linear`` of ``classifier`` gets ``N(0, std)`` weights and zero bias (``weights_init``
    in ``utils/misc.py`` lines 20-30, applied to the new fc in ``models/basic_model.py`` lines
    56-58 of github.com/prithv1/DMG at 6b162b4, with std 0.001)."""
    with torch.no_grad():
        for module in classifier.modules():
            if isinstance(module, nn.Linear):
                module.weight.normal_(0.0, std)
                if module.bias is not None:
                    module.bias.zero_()


def soft_iou(a: torch.Tensor, b: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """``(sum_k a_k b_k + eps) / (sum_k (a_k + b_k - a_k b_k) + eps)`` over the last dimension
    (paper Eq. 2 with the official code's eps)."""
    inter = (a * b).sum(-1)
    union = (a + b - a * b).sum(-1)
    return (inter + eps) / (union + eps)


def hard_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """IoU of the boolean masks ``a`` and ``b`` over the last dimension (1 when both are empty)."""
    inter = (a & b).sum(-1).float()
    union = (a | b).sum(-1).float()
    return torch.where(union > 0, inter / union.clamp_min(1), torch.ones_like(union))


def pairwise_mean(fn, probs: torch.Tensor) -> torch.Tensor:
    """Mean of ``fn(probs[i], probs[j])`` over row pairs ``i < j`` (0 with fewer than 2 rows)."""
    pairs = list(itertools.combinations(range(probs.shape[0]), 2))
    if not pairs:
        return probs.new_zeros(())
    i, j = (torch.tensor(idx, device=probs.device) for idx in zip(*pairs))
    return fn(probs[i], probs[j]).mean()


def auto_mask_layers(featurizer: nn.Module) -> tuple[str, ...]:
    """What ``dmg_mask_layers="auto"`` masks on ``featurizer`` (see the module docstring)."""
    if isinstance(featurizer, ResNet):
        return ("layer3", "layer4", FC)
    if _has_stages(featurizer):
        return (featurizer.stage_names[-1], FC)
    return (FC,)


def _has_stages(featurizer: nn.Module) -> bool:
    return (isinstance(featurizer, StagedFeaturizer) and bool(featurizer.stage_names)
            and not getattr(featurizer, "dinov2", False))


def resolve_mask_layers(featurizer: nn.Module, spec: str) -> tuple[str, ...]:
    """``dmg_mask_layers`` -> the masked layers in network order (stages first, ``fc`` last).
    Unknown names raise, listing the valid ones for this featurizer."""
    if spec.strip() == "auto":
        return auto_mask_layers(featurizer)
    problem = _layer_list(spec)
    if problem:
        raise ValueError(f"hparam 'dmg_mask_layers' {problem}, got {spec!r}")
    stages = tuple(featurizer.stage_names) if _has_stages(featurizer) else ()
    valid = stages + (FC,)
    names = [n.strip() for n in spec.split(",")]
    unknown = [n for n in names if n not in valid]
    if unknown:
        raise ValueError(
            f"hparam 'dmg_mask_layers' names {', '.join(map(repr, unknown))}, which "
            f"{type(featurizer).__name__} does not have; valid names: {', '.join(valid)} "
            "(a stage name masks that stage's input; 'fc' masks the pooled feature), or 'auto'")
    return tuple(sorted(names, key=valid.index))


@register_algorithm("DMG")
class DMG(FeatureClassifier):
    """Domain-specific masks (Chattopadhyay et al., ECCV 2020): ERM's network with one learnable
    Bernoulli channel mask per source domain on a few layers, trained with cross-entropy plus a
    soft-IoU penalty on the overlap of the domains' masks; prediction averages the logits under
    every domain's soft mask. See the module docstring for equations, layer choice and the
    paper-faithful configuration."""

    #: Debug28 runs the MNIST CNN (block4,fc); Debug224 the tiny test ViT (last block + fc), so the
    #: contract tests cover the non-ResNet rules; tests/algorithms/test_dmg.py covers the ResNet.
    TINY_TEST_HPARAMS: dict = {"vit": True, "vit_arch": "dg_vit_test_patch32_224",
                               "mnist_cnn_width": 32}

    @staticmethod
    def hparam_space(dataset: str) -> dict:
        """DMG's own hparams: ``dmg_lambda_overlap`` (lambda_O, paper default 0.1; sweeps draw
        10^U(-5, 0), the paper's sweep range {0, 1e-5, ..., 1}), ``dmg_lambda_sparsity``
        (lambda_S, 0; the paper's L1 alternative, Fig. 6), ``dmg_mask_lr`` (``None`` = the job's
        lr), ``dmg_mask_layers`` ("auto", see the module docstring), ``dmg_test_ensemble``
        ("logits" = Pred-Ens, the paper's default; "masks" = Mask-Ens), ``dmg_mask_lr_schedule``
        (false: the job's ``lr_schedule`` leaves the mask optimizer alone, as the PACS release;
        true: masks follow it too, as the DomainNet release) and ``dmg_fc_init_std`` (``None``:
        PyTorch's classifier init; a std: the DomainNet release's ``N(0, std)``, zero bias)."""
        return {
            "dmg_lambda_overlap": (0.1, lambda r: float(10 ** r.uniform(-5, 0)),
                                   hp_lib.non_negative),
            "dmg_lambda_sparsity": (0.0, lambda r: 0.0, hp_lib.non_negative),
            "dmg_mask_lr": (None, lambda r: None, _optional_positive),
            "dmg_mask_layers": ("auto", lambda r: "auto", _layer_list),
            "dmg_test_ensemble": ("logits", lambda r: "logits", hp_lib.one_of(*ENSEMBLES)),
            "dmg_mask_lr_schedule": (False, lambda r: False),
            "dmg_fc_init_std": (None, lambda r: None, _optional_std),
        }

    def __init__(self, input_shape, num_classes, num_domains, hparams):
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self.mask_layers = resolve_mask_layers(self.featurizer, hparams["dmg_mask_layers"])
        #: masked stages (the hook points), in network order; ``fc`` is handled separately.
        self.mask_stages = tuple(n for n in self.mask_layers if n != FC)
        self.mask_fc = FC in self.mask_layers
        widths = [self.featurizer.n_outputs if name == FC else self.featurizer.stage_widths[name]
                  for name in self.mask_layers]
        # Mask logits m~^d ~ U(0, 1) (the paper's implementation details): one
        # [num_domains, width] tensor per masked layer.
        self.mask_logits = nn.ParameterList(
            [nn.Parameter(torch.rand(num_domains, width)) for width in widths])
        self.lambda_overlap = float(hparams["dmg_lambda_overlap"])
        self.lambda_sparsity = float(hparams["dmg_lambda_sparsity"])
        self.test_ensemble = hparams["dmg_test_ensemble"]
        fc_std = hparams.get("dmg_fc_init_std")
        if fc_std is not None:
            init_classifier(self.classifier, float(fc_std))
        mask_lr = hparams["dmg_mask_lr"]
        self.optimizer = adam(self.network.parameters(), hparams)
        self.mask_optimizer = adam(self.mask_logits.parameters(), hparams,
                                   lr=hparams["lr"] if mask_lr is None else float(mask_lr))

    def lr_schedule_exempt(self) -> set[str]:
        """The mask optimizer keeps its lr unless ``dmg_mask_lr_schedule``: the release's PACS
        run never steps the mask scheduler (epoch mode; the lines that would are commented out,
        ``trainers/subnetwork_supermask_trainer.py`` 540-545), while in iteration mode (its
        DomainNet config) both schedulers step (lines 196-203)."""
        return set() if self.hparams.get("dmg_mask_lr_schedule") else {"mask_optimizer"}

    # Masks -----------------------------------------------------------------------------------

    def mask_probs(self) -> list[torch.Tensor]:
        """``m^d = sigmoid(m~^d)`` per masked layer, each ``[num_domains, width]``."""
        return [torch.sigmoid(logits) for logits in self.mask_logits]

    def _scale(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``h * mask`` with ``mask`` ``[N or 1, C]`` over the featurizer's channel dimension:
        broadcast over H x W for conv maps, over tokens for ``[N, tokens, C]`` ViT inputs."""
        if h.dim() > 2:
            if self.featurizer.channel_dim in (-1, h.dim() - 1):
                mask = mask.reshape(mask.shape[0], *([1] * (h.dim() - 2)), mask.shape[1])
            else:
                mask = mask.reshape(*mask.shape, *([1] * (h.dim() - 2)))
        return h * mask

    def _run(self, x: torch.Tensor, masks: list[torch.Tensor], start: str | None = None):
        """Logits of the network with ``masks`` (one per masked layer, ``[N or 1, C]``) applied.
        ``start=None``: ``x`` is the image; else ``x`` is the (unmasked) input of stage
        ``start``, the first masked stage."""
        if self.mask_stages:
            hooks = {name: (lambda h, m=mask: self._scale(h, m))
                     for name, mask in zip(self.mask_stages, masks)}
            features = self.featurizer.forward_stages(x, start=start, hooks=hooks)
        else:
            features = self.featurizer(x)
        if self.mask_fc:
            features = self._scale(features, masks[-1])
        return self.classifier(features)

    def _trunk(self, x: torch.Tensor) -> tuple[torch.Tensor, str | None]:
        """Run the unmasked part once: the input of the first masked stage (and its name), or the
        pooled feature when only ``fc`` is masked (name ``"fc"``)."""
        if self.mask_stages:
            first = self.mask_stages[0]
            return self.featurizer.forward_stages(x, stop=first), first
        return self.featurizer(x), FC

    def _tail(self, h: torch.Tensor, start: str, masks: list[torch.Tensor]) -> torch.Tensor:
        """The masked tail from :meth:`_trunk`'s output ``h`` (masks as in :meth:`_run`)."""
        if start == FC:
            return self.classifier(self._scale(h, masks[-1]))
        return self._run(h, masks, start=start)

    # Training --------------------------------------------------------------------------------

    def overlap(self, probs: list[torch.Tensor] | None = None) -> torch.Tensor:
        """``sum_layers mean_{i<j} sIoU(m^{d_i}, m^{d_j})`` on the soft masks (0 for 1 domain)."""
        probs = self.mask_probs() if probs is None else probs
        return sum(pairwise_mean(soft_iou, p) for p in probs)

    def iou_hard(self, probs: list[torch.Tensor] | None = None) -> float:
        """Mean over layers of the mean pairwise IoU of ``1[m^d > 0.5]`` (0.0 for 1 domain)."""
        probs = self.mask_probs() if probs is None else probs
        if self.num_domains < 2:
            return 0.0
        with torch.no_grad():
            values = [pairwise_mean(hard_iou, p > 0.5) for p in probs]
        return float(sum(values) / len(values))

    def update(self, minibatches, unlabeled=None):
        x, y, domain = split_minibatches(minibatches)
        probs = self.mask_probs()
        masks = []
        for p in probs:
            p_sample = p[domain]  # [N, C]: the keep probabilities of each sample's domain
            b = torch.bernoulli(p_sample.detach())
            masks.append(b + p_sample - p_sample.detach())  # straight-through estimator
        ce = F.cross_entropy(self._run(x, masks), y)
        overlap = self.overlap(probs)
        loss = ce + self.lambda_overlap * overlap
        if self.lambda_sparsity:
            loss = loss + self.lambda_sparsity * sum(p.sum() for p in probs)
        optimizer_step((self.optimizer, self.mask_optimizer), loss)
        return {"loss": loss.item(), "ce": ce.item(), "overlap": overlap.detach().item(),
                "iou_hard": self.iou_hard(probs)}

    # Inference -------------------------------------------------------------------------------

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """Soft-scale logits averaged over the source domains (``dmg_test_ensemble "logits"``),
        or one pass with the domain-averaged soft masks (``"masks"``, Mask-Ens)."""
        probs = self.mask_probs()
        h, start = self._trunk(x)
        if self.test_ensemble == "masks":
            return self._tail(h, start, [p.mean(0, keepdim=True) for p in probs])
        logits = [self._tail(h, start, [p[d:d + 1] for p in probs])
                  for d in range(self.num_domains)]
        return torch.stack(logits).mean(0)

    def predict_known_domain(self, x: torch.Tensor, domain) -> torch.Tensor:
        """DMG-KD: logits under the soft mask of the known source domain ``domain`` (an int, or
        a ``[N]`` tensor of per-sample source-domain indices)."""
        domain = torch.as_tensor(domain, device=x.device, dtype=torch.long)
        if ((domain < 0) | (domain >= self.num_domains)).any():
            raise ValueError(f"predict_known_domain: domain {domain.tolist()} is not a source "
                             f"domain index in [0, {self.num_domains})")
        index = domain.reshape(1) if domain.dim() == 0 else domain
        h, start = self._trunk(x)
        return self._tail(h, start, [p[index] for p in self.mask_probs()])
