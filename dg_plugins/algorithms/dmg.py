"""DMG: domain-specific masks (Chattopadhyay, Balaji, Hoffman, ECCV 2020; github.com/prithv1/DMG).
Per source domain, straight-through Bernoulli channel masks on a few layers; loss CE + lambda_O *
the mean pairwise soft IoU of the masks (Eq. 2, 3, the release's form); ``predict`` averages the
logits under every domain's soft mask. Details: ``docs/methods/dmg.md``."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from dg_plugins import hparams as hp_lib
from dg_plugins.algorithms.base import (FeatureClassifier, adam, optimizer_step,
                                        positive_or_null, register_algorithm, split_minibatches)
from dg_plugins.networks.featurizers import ResNet
from dg_plugins.networks.staged import StagedFeaturizer

#: The name that stands for the pooled feature entering the classifier.
FC = "fc"
#: ``dmg_test_ensemble`` choices: average the per-domain logits, or average the soft masks.
ENSEMBLES = ("logits", "masks")
EPS = 1e-6


def _layer_list(value) -> str | None:
    names = [n.strip() for n in value.split(",")]
    if not value.strip() or any(not n for n in names):
        return ("must be 'auto' or a comma-separated list of stage names and/or 'fc' "
                "(e.g. 'layer3,layer4,fc' on a ResNet)")
    if len(set(names)) != len(names):
        return "names a layer twice"
    return None


def soft_iou(a: torch.Tensor, b: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """Soft IoU over the last dimension (paper Eq. 2, the release's eps)."""
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
    pairs = torch.combinations(torch.arange(probs.shape[0], device=probs.device), 2)
    if not len(pairs):
        return probs.new_zeros(())
    return fn(probs[pairs[:, 0]], probs[pairs[:, 1]]).mean()


@register_algorithm("DMG")
class DMG(FeatureClassifier):
    """DMG: ERM's network with a learnable Bernoulli channel mask per source domain and layer."""

    #: the MNIST CNN and the tiny test ViT (non-ResNet rules); test_dmg.py covers the ResNet
    TINY_TEST_HPARAMS: dict = {"vit": True, "vit_arch": "dg_vit_test_patch32_224",
                               "mnist_cnn_width": 32}

    @staticmethod
    def hparam_space(dataset: str) -> dict:
        return {
            "dmg_lambda_overlap": (0.1, lambda r: float(10 ** r.uniform(-5, 0)),
                                   hp_lib.non_negative),
            "dmg_lambda_sparsity": (0.0, lambda r: 0.0, hp_lib.non_negative),
            "dmg_mask_lr": (None, lambda r: None,
                            positive_or_null("must be a number > 0, or null for the job's lr")),
            "dmg_mask_layers": ("auto", lambda r: "auto", _layer_list),
            "dmg_test_ensemble": ("logits", lambda r: "logits", hp_lib.one_of(*ENSEMBLES)),
            "dmg_mask_lr_schedule": (False, lambda r: False),
            "dmg_fc_init_std": (None, lambda r: None, positive_or_null(
                "must be a number > 0, or null for PyTorch's default classifier init")),
        }

    def __init__(self, input_shape, num_classes, num_domains, hparams):
        super().__init__(input_shape, num_classes, num_domains, hparams)
        # dmg_mask_layers -> the masked layers in network order (fc last)
        featurizer, spec = self.featurizer, hparams["dmg_mask_layers"]
        staged = (isinstance(featurizer, StagedFeaturizer) and bool(featurizer.stage_names)
                  and not getattr(featurizer, "dinov2", False))
        valid = (tuple(featurizer.stage_names) if staged else ()) + (FC,)
        names = [n.strip() for n in spec.split(",")]
        unknown = [n for n in names if n not in valid]
        if spec.strip() == "auto":
            names = ["layer3", "layer4", FC] if isinstance(featurizer, ResNet) else valid[-2:]
        elif _layer_list(spec):
            raise ValueError(f"hparam 'dmg_mask_layers' {_layer_list(spec)}, got {spec!r}")
        elif unknown:
            raise ValueError(
                f"hparam 'dmg_mask_layers' names {', '.join(map(repr, unknown))}, which "
                f"{type(featurizer).__name__} does not have; valid names: {', '.join(valid)} (a "
                "stage name masks that stage's input; 'fc' masks the pooled feature), or 'auto'")
        self.mask_layers = tuple(sorted(names, key=valid.index))
        self.mask_stages = tuple(n for n in self.mask_layers if n != FC)
        self.mask_fc = FC in self.mask_layers
        widths = [self.featurizer.n_outputs if name == FC else self.featurizer.stage_widths[name]
                  for name in self.mask_layers]
        # mask logits m~^d ~ U(0, 1) (the paper), [num_domains, width] per masked layer
        self.mask_logits = nn.ParameterList(
            [nn.Parameter(torch.rand(num_domains, width)) for width in widths])
        self.lambda_overlap = float(hparams["dmg_lambda_overlap"])
        self.lambda_sparsity = float(hparams["dmg_lambda_sparsity"])
        self.test_ensemble = hparams["dmg_test_ensemble"]
        fc_std = hparams.get("dmg_fc_init_std")
        if fc_std is not None:  # the DomainNet release's init: N(0, std) weights, zero bias
            for module in self.classifier.modules():
                if isinstance(module, nn.Linear):
                    nn.init.normal_(module.weight, 0.0, float(fc_std))
                    if module.bias is not None:
                        nn.init.zeros_(module.bias)
        mask_lr = hparams["dmg_mask_lr"]
        self.optimizer = adam(self.network.parameters(), hparams)
        self.mask_optimizer = adam(self.mask_logits.parameters(), hparams,
                                   lr=None if mask_lr is None else float(mask_lr))

    def lr_schedule_exempt(self) -> set[str]:
        """The mask optimizer keeps its lr unless ``dmg_mask_lr_schedule`` (the PACS release)."""
        return set() if self.hparams.get("dmg_mask_lr_schedule") else {"mask_optimizer"}

    def mask_probs(self) -> list[torch.Tensor]:
        """``m^d = sigmoid(m~^d)`` per masked layer, each ``[num_domains, width]``."""
        return [torch.sigmoid(logits) for logits in self.mask_logits]

    def _scale(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``h * mask``, broadcast over H x W of conv maps or over the tokens of a ViT."""
        if h.dim() > 2:
            if self.featurizer.channel_dim in (-1, h.dim() - 1):
                mask = mask.reshape(mask.shape[0], *([1] * (h.dim() - 2)), mask.shape[1])
            else:
                mask = mask.reshape(*mask.shape, *([1] * (h.dim() - 2)))
        return h * mask

    def _run(self, x: torch.Tensor, masks: list[torch.Tensor], start: str | None = None):
        """Logits with ``masks`` applied; ``x``: the image, or the input of stage ``start``
        (``"fc"``: the pooled feature)."""
        if start == FC:
            features = x
        elif self.mask_stages:
            hooks = {name: (lambda h, m=mask: self._scale(h, m))
                     for name, mask in zip(self.mask_stages, masks)}
            features = self.featurizer.forward_stages(x, start=start, hooks=hooks)
        else:
            features = self.featurizer(x)
        if self.mask_fc:
            features = self._scale(features, masks[-1])
        return self.classifier(features)

    def _trunk(self, x: torch.Tensor) -> tuple[torch.Tensor, str | None]:
        """The unmasked part: the first masked stage's input and name (``"fc"``: pooled feature)."""
        if self.mask_stages:
            first = self.mask_stages[0]
            return self.featurizer.forward_stages(x, stop=first), first
        return self.featurizer(x), FC

    def overlap(self, probs: list[torch.Tensor] | None = None) -> torch.Tensor:
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

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """Logits averaged over the domains' soft masks (``"logits"``), or under their average
        (``"masks"``, Mask-Ens)."""
        probs = self.mask_probs()
        h, start = self._trunk(x)
        if self.test_ensemble == "masks":
            return self._run(h, [p.mean(0, keepdim=True) for p in probs], start)
        logits = [self._run(h, [p[d:d + 1] for p in probs], start)
                  for d in range(self.num_domains)]
        return torch.stack(logits).mean(0)

    def predict_known_domain(self, x: torch.Tensor, domain) -> torch.Tensor:
        """DMG-KD: logits under the soft mask of source domain ``domain`` (an int or ``[N]``)."""
        domain = torch.as_tensor(domain, device=x.device, dtype=torch.long)
        if ((domain < 0) | (domain >= self.num_domains)).any():
            raise ValueError(f"predict_known_domain: domain {domain.tolist()} is not a source "
                             f"domain index in [0, {self.num_domains})")
        index = domain.reshape(1) if domain.dim() == 0 else domain
        h, start = self._trunk(x)
        return self._run(h, [p[index] for p in self.mask_probs()], start)
