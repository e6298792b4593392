"""GMoE (Li et al., "Sparse Mixture-of-Experts are Domain Generalizable Learners", ICLR 2023) and
its dense baseline ERM_ViT (the paper's "ERM (ViT-S/16)" row of Table 1).

Both are a timm ViT trained by ERM (cross-entropy on the pooled source minibatches, one Adam step
per ``update``, constant LR); GMoE replaces the FFN of some blocks by a sparse mixture of experts
(:class:`dg_plugins.networks.moe.MoEFFN`: cosine router, noisy top-k routing with capacity and
batch-prioritised token dropping, Eq. 3) and adds the load-balancing loss of each MoE layer:

    L = CE(f(x), y) + gmoe_aux_weight * sum_{MoE layers} L_aux      (L_aux: Tutel's importance +
                                                                     load loss, see moe.py)

Backbone (hparams shared by both)
    ``vit_arch`` (the base hparam, chosen by :func:`dg_plugins.networks.vit.resolve_vit_arch` as
    for every ViT) ``"auto"``: the paper's DeiT-S/16 (timm ``deit_small_patch16_224``) for 224x224
    inputs, the 28x28 preset ``dg_vit_patch4_28`` (6 blocks, width 64) for 28x28 inputs; ``"tiny"``
    the 2-block presets; or any timm ViT / preset name. ImageNet weights when ``pretrained`` (or
    ``pretrained_path``); stochastic depth ``gmoe_drop_path`` 0.1; a linear head on the class token
    (randomly initialised). The paper's GMoE-S/16 is the default at 224.

MoE placement ``gmoe_moe_layers``
    ``"auto"`` = the last two even-indexed blocks (0-based), the paper's "last-two" placement:
    blocks 8 and 10 of the 12-block DeiT-S (the official ``moe_layers = ['F']*8 + ['S','F']*2``),
    2 and 4 of the 6-block 28x28 ViT, 0 and 2 of the 4-block test ViT; for an odd depth ``d`` it
    is ``d-1, d-3``. Or explicit indices ``"8,10"`` (negative ones count from the end). Every MoE
    layer's experts start as copies of the block's (pretrained) dense FFN; routers are random.

Evaluation capacity ``gmoe_eval_capacity``
    Default ``None``: no token is dropped in eval mode, so a sample's logits depend only on the
    sample. With dropping, a test image's prediction depends on the other images of its
    evaluation batch, and the accuracy loop (DomainBed's and ours) evaluates in batches of 64 with
    a smaller last one, not in training batches (32 per domain x the source domains), so the
    capacity would act differently at evaluation than in training anyway. ``1.5`` reproduces the
    official code, which keeps the training capacity rule at evaluation.

Router width ``gmoe_router_dim``: 256 (official) on the 224x224 datasets; 64 on the 28x28 ones
(RotatedMNIST, ColoredMNIST, RotatedMNIST5k, Debug28), whose ViT is 64 wide: a 256-wide projection
there costs as much as an expert's fc1 (measured: the MoE layer took 2.5x the dense FFN's time
with 256, 1.4x with 64, on 16,000 tokens on CPU).

Top-k ``gmoe_top_k``: 1 in the paper; with k > 1 the k gates are divided by their sum before
dropping (Tutel's ``normalize_gate``), and slots are assigned to all first choices before any
second choice, each column in batch-priority order.

``update`` returns ``loss`` (the objective above), ``aux_loss`` (``sum`` of ``L_aux`` over the
MoE layers, unweighted), ``drop_frac`` (fraction of token-to-expert assignments dropped, mean over
the MoE layers) and ``load_entropy`` (entropy in nats of the share of assignments each expert got,
mean over the layers; ``ln E`` is perfectly balanced). ERM_ViT returns ``loss``.

Per-dataset defaults (the official ``hparams_registry.py``): lr / weight decay PACS 3e-5 / 1e-6,
VLCS 3e-5 / 1e-6, OfficeHome 1e-5 / 1e-6, TerraIncognita 5e-5 / 1e-4, DomainNet 5e-5 / 0; other
datasets keep the base defaults (5e-5 / 0 at 224, 1e-3 / 0 on 28x28 images). Random sweeps
(``hparams_seed`` > 0) on those five datasets draw as the official registry does (Luodian/
Generalizable-Mixture-of-Experts @0689d55, ``domainbed/hparams_registry.py`` lines 171-195): lr
from 10^U(-4.5, -2.5), weight decay 0 (its random value is ``lambda r: 0.``).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from dg_plugins import hparams as H
from dg_plugins.algorithms.base import Algorithm, adam, optimizer_step, register_algorithm, \
    split_minibatches
from dg_plugins.algorithms.erm import ERM

#: The DeiT-S/16 of the paper (ImageNet-1k weights ``.fb_in1k`` in timm): ``vit_arch "auto"`` at
#: 224x224.
DEIT_S = "deit_small_patch16_224"

#: (lr, weight_decay) per dataset, from the official GMoE ``hparams_registry.py``.
GMOE_LR_WD = {
    "PACS": (3e-5, 1e-6),
    "VLCS": (3e-5, 1e-6),
    "OfficeHome": (1e-5, 1e-6),
    "TerraIncognita": (5e-5, 1e-4),
    "DomainNet": (5e-5, 0.0),
}


def _eval_capacity_check(value) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        return ("must be null (no token dropping at evaluation) or a capacity factor > 0 "
                "(1.5: the official code's evaluation)")
    return None


def _moe_layers_check(value) -> str | None:
    if value == "auto":
        return None
    try:
        [int(p) for p in value.split(",") if p.strip()]
    except ValueError:
        return "must be 'auto' or comma-separated block indices such as '8,10'"
    return None if value.strip() else "must be 'auto' or block indices such as '8,10'"


def backbone_space(dataset: str) -> dict:
    """Hparams ERM_ViT and GMoE share: stochastic depth and the per-dataset lr / weight decay (the
    ViT is the base hparam ``vit_arch``)."""
    space = {
        "gmoe_drop_path": (0.1, H._constant(0.1), H.probability),
    }
    if dataset in GMOE_LR_WD:
        lr, wd = GMOE_LR_WD[dataset]
        # the official registry's random draws (module docstring): 10^U(-4.5, -2.5) and 0
        space["lr"] = (lr, H._log_uniform(-4.5, -2.5), H.positive)
        space["weight_decay"] = (wd, H._constant(0.0), H.non_negative)
    return space


def moe_space(dataset: str) -> dict:
    """GMoE's own hparams: the official defaults, except the router's projection width on the
    28x28 datasets (64, the width of their ViT, instead of 256: see the module docstring)."""
    router_dim = 64 if dataset in H.SMALL_IMAGE_DATASETS else 256
    return {
        "gmoe_num_experts": (6, H._constant(6), H.positive),
        "gmoe_top_k": (1, H._constant(1), H.positive),
        "gmoe_moe_layers": ("auto", H._constant("auto"), _moe_layers_check),
        "gmoe_aux_weight": (0.01, H._constant(0.01), H.non_negative),
        "gmoe_capacity_factor": (1.5, H._constant(1.5), H.positive),
        "gmoe_eval_capacity": (None, H._constant(None), _eval_capacity_check),
        "gmoe_gate_noise": (1.0, H._constant(1.0), H.positive),
        "gmoe_router_dim": (router_dim, H._constant(router_dim), H.positive),
        "gmoe_expert_dropout": (0.1, H._constant(0.1), H.probability),
    }


def auto_moe_layers(depth: int) -> list[int]:
    """The last two even-indexed blocks (0-based) of a ViT of ``depth`` blocks ({8, 10} at 12)."""
    evens = [i for i in range(depth) if i % 2 == 0]
    return evens[-2:]


def build_vit(input_shape, num_classes: int, hparams) -> nn.Module:
    """The timm ViT (with its linear head) both algorithms train."""
    from dg_plugins.networks.vit import create_vit

    return create_vit(hparams["vit_arch"], input_shape,
                      pretrained=hparams.get("pretrained", True),
                      pretrained_path=hparams.get("pretrained_path"),
                      drop_path_rate=hparams["gmoe_drop_path"], num_classes=num_classes,
                      arch_224=DEIT_S)


@register_algorithm("ERM_ViT")
class ERM_ViT(Algorithm):
    """ERM on a timm ViT (DeiT-S/16 at 224x224): GMoE's dense baseline, with GMoE's backbone and
    per-dataset hparams. ``network`` is the timm model; ``predict(x) = network(x)``."""

    #: the 2-block width-64 presets
    TINY_TEST_HPARAMS: dict = {"vit_arch": "tiny"}

    @staticmethod
    def hparam_space(dataset: str) -> dict:
        return backbone_space(dataset)

    def __init__(self, input_shape, num_classes, num_domains, hparams):
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self.network = build_vit(self.input_shape, num_classes, hparams)
        self.adapt_network()
        self.optimizer = adam(self.network.parameters(), hparams)

    def adapt_network(self) -> None:
        """Change ``self.network`` before the optimizer is built (GMoE: MoE layers)."""

    @property
    def classifier(self) -> nn.Module:
        return self.network.head

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The pooled (class-token) feature the head reads."""
        return self.network.forward_head(self.network.forward_features(x), pre_logits=True)

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        return self.network(x)

    #: ERM's update (cross-entropy on the pooled source batches, one Adam step): it reads only
    #: ``predict`` and ``optimizer``, which this class defines.
    update = ERM.update


@register_algorithm("GMoE")
class GMoE(ERM_ViT):
    """GMoE: the ERM_ViT backbone with sparse MoE FFNs in the ``gmoe_moe_layers`` blocks, trained
    on CE + ``gmoe_aux_weight`` x the sum of the layers' load/importance losses (Li et al., ICLR
    2023, Eq. 3; module docstring for every choice). ``moe_layers`` holds the MoE modules."""

    TINY_TEST_HPARAMS: dict = {"vit_arch": "tiny", "gmoe_router_dim": 16}

    @staticmethod
    def hparam_space(dataset: str) -> dict:
        return {**backbone_space(dataset), **moe_space(dataset)}

    def adapt_network(self) -> None:
        from dg_plugins.networks.moe import MoEFFN
        from dg_plugins.networks.vit import replace_ffn

        hparams = self.hparams
        depth = len(self.network.blocks)
        spec = hparams["gmoe_moe_layers"]
        indices = auto_moe_layers(depth) if spec == "auto" else spec
        num_experts, top_k = hparams["gmoe_num_experts"], hparams["gmoe_top_k"]
        if top_k > num_experts:
            raise ValueError(f"gmoe_top_k={top_k} exceeds gmoe_num_experts={num_experts}; "
                             "choose gmoe_top_k <= gmoe_num_experts")
        options = dict(num_experts=num_experts, top_k=top_k,
                       capacity_factor=hparams["gmoe_capacity_factor"],
                       eval_capacity_factor=hparams["gmoe_eval_capacity"],
                       gate_noise=hparams["gmoe_gate_noise"],
                       router_dim=hparams["gmoe_router_dim"],
                       expert_dropout=hparams["gmoe_expert_dropout"])
        replace_ffn(self.network, indices, lambda i, mlp: MoEFFN.from_dense(mlp, **options))
        self.moe_blocks = tuple(sorted(
            i for i, block in enumerate(self.network.blocks) if isinstance(block.mlp, MoEFFN)))

    @property
    def moe_layers(self) -> list[nn.Module]:
        """The MoE layers, in block order."""
        return [self.network.blocks[i].mlp for i in self.moe_blocks]

    def pop_routing(self) -> list:
        """Each MoE layer's :class:`~dg_plugins.networks.moe.RoutingStats` of the last forward
        (then forgotten)."""
        return [layer.pop_routing() for layer in self.moe_layers]

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.network(x)
        self.pop_routing()  # the routing of a pass outside update is not kept
        return logits

    def features(self, x: torch.Tensor) -> torch.Tensor:
        feats = super().features(x)
        self.pop_routing()
        return feats

    def update(self, minibatches, unlabeled=None):
        x, y, _ = split_minibatches(minibatches)
        logits = self.network(x)
        stats = self.pop_routing()
        aux = torch.stack([s.aux_loss for s in stats]).sum()
        ce = F.cross_entropy(logits, y)
        loss = ce + self.hparams["gmoe_aux_weight"] * aux
        optimizer_step(self.optimizer, loss)
        values = torch.stack([loss.detach(), aux.detach(),
                              torch.stack([s.drop_frac for s in stats]).mean(),
                              torch.stack([s.load_entropy for s in stats]).mean()]).tolist()
        return dict(zip(("loss", "aux_loss", "drop_frac", "load_entropy"), values))
