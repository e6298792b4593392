"""GMoE (Li et al., "Sparse Mixture-of-Experts are Domain Generalizable Learners", ICLR 2023) and
its dense baseline ERM_ViT (Table 1's "ERM (ViT-S/16)"): a timm ViT whose FFNs in some blocks are
sparse mixtures of experts (Eq. 3), minimising ``CE + gmoe_aux_weight * sum_layers L_aux``.
Backbone, placement, capacity, per-dataset defaults: ``docs/methods/gmoe.md``."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from dg_plugins import hparams as H
from dg_plugins.algorithms.base import (Algorithm, adam, optimizer_step, positive_or_null,
                                        register_algorithm, split_minibatches)
from dg_plugins.algorithms.erm import ERM

#: The paper's DeiT-S/16 (timm's ``.fb_in1k`` weights): ``vit_arch "auto"`` at 224x224.
DEIT_S = "deit_small_patch16_224"

#: (lr, weight_decay) per dataset, from the official GMoE ``hparams_registry.py``.
GMOE_LR_WD = {"PACS": (3e-5, 1e-6), "VLCS": (3e-5, 1e-6), "OfficeHome": (1e-5, 1e-6),
              "TerraIncognita": (5e-5, 1e-4), "DomainNet": (5e-5, 0.0)}


def _moe_layers_check(value) -> str | None:
    if value == "auto":
        return None
    try:
        [int(p) for p in value.split(",") if p.strip()]
    except ValueError:
        return "must be 'auto' or comma-separated block indices such as '8,10'"
    return None if value.strip() else "must be 'auto' or block indices such as '8,10'"


def backbone_space(dataset: str) -> dict:
    """Hparams ERM_ViT and GMoE share: stochastic depth and the per-dataset lr / weight decay."""
    space = {"gmoe_drop_path": (0.1, H._constant(0.1), H.probability)}
    if dataset in GMOE_LR_WD:
        lr, wd = GMOE_LR_WD[dataset]
        # the official registry's random draws (docs/methods/gmoe.md): 10^U(-4.5, -2.5) and 0
        space["lr"] = (lr, H._log_uniform(-4.5, -2.5), H.positive)
        space["weight_decay"] = (wd, H._constant(0.0), H.non_negative)
    return space


def auto_moe_layers(depth: int) -> list[int]:
    """The last two even-indexed blocks of a ViT of ``depth`` blocks ({8, 10} at 12)."""
    return list(range(0, depth, 2))[-2:]


@register_algorithm("ERM_ViT")
class ERM_ViT(Algorithm):
    """ERM on a timm ViT (DeiT-S/16 at 224x224), with GMoE's backbone and per-dataset hparams."""

    #: the 2-block width-64 presets
    TINY_TEST_HPARAMS: dict = {"vit_arch": "tiny"}

    hparam_space = staticmethod(backbone_space)

    def __init__(self, input_shape, num_classes, num_domains, hparams):
        super().__init__(input_shape, num_classes, num_domains, hparams)
        from dg_plugins.networks.vit import create_vit

        self.network = create_vit(hparams["vit_arch"], self.input_shape,
                                  pretrained=hparams.get("pretrained", True),
                                  pretrained_path=hparams.get("pretrained_path"),
                                  drop_path_rate=hparams["gmoe_drop_path"],
                                  num_classes=num_classes, arch_224=DEIT_S)
        self.adapt_network()
        self.optimizer = adam(self.network.parameters(), hparams)

    def adapt_network(self) -> None:
        """Change ``self.network`` before the optimizer is built (GMoE: MoE layers)."""

    @property
    def classifier(self) -> nn.Module:
        return self.network.head

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.network.forward_head(self.network.forward_features(x), pre_logits=True)

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        return self.network(x)

    update = ERM.update  # reads only predict and optimizer


@register_algorithm("GMoE")
class GMoE(ERM_ViT):
    """GMoE: ERM_ViT with sparse MoE FFNs in the ``gmoe_moe_layers`` blocks."""

    TINY_TEST_HPARAMS: dict = {"vit_arch": "tiny", "gmoe_router_dim": 16}

    @staticmethod
    def hparam_space(dataset: str) -> dict:
        """GMoE's own hparams: the official defaults, but a 64-wide router on 28x28 datasets."""
        router_dim = 64 if dataset in H.SMALL_IMAGE_DATASETS else 256
        return {
            **backbone_space(dataset),
            "gmoe_num_experts": (6, H._constant(6), H.positive),
            "gmoe_top_k": (1, H._constant(1), H.positive),
            "gmoe_moe_layers": ("auto", H._constant("auto"), _moe_layers_check),
            "gmoe_aux_weight": (0.01, H._constant(0.01), H.non_negative),
            "gmoe_capacity_factor": (1.5, H._constant(1.5), H.positive),
            "gmoe_eval_capacity": (None, H._constant(None), positive_or_null(
                "must be null (no token dropping at evaluation) or a capacity factor > 0 "
                "(1.5: the official code's evaluation)")),
            "gmoe_gate_noise": (1.0, H._constant(1.0), H.positive),
            "gmoe_router_dim": (router_dim, H._constant(router_dim), H.positive),
            "gmoe_expert_dropout": (0.1, H._constant(0.1), H.probability),
        }

    def adapt_network(self) -> None:
        from dg_plugins.networks.moe import MoEFFN
        from dg_plugins.networks.vit import replace_ffn

        hparams = self.hparams
        spec = hparams["gmoe_moe_layers"]
        indices = auto_moe_layers(len(self.network.blocks)) if spec == "auto" else spec
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
        return [self.network.blocks[i].mlp for i in self.moe_blocks]

    def pop_routing(self) -> list:
        """Each MoE layer's ``RoutingStats`` of the last forward (then forgotten)."""
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
