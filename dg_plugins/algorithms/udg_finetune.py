"""Fine-tuning in the unsupervised-DG (UDG) protocol (DARLING's, as DisMAE's release runs it,
``train_finetune.py``): a pretrained ViT backbone plus a head, trained on a labelled fraction of
the sources (``docs/udg_protocol.md``). Built by :mod:`dg_plugins.train.udg`, not registered."""

from __future__ import annotations

import contextlib

import torch
import torch.nn as nn

from dg_plugins.algorithms.base import Algorithm, decay_groups
from dg_plugins.algorithms.erm import ERM

#: label fraction -> (mode, lr, batch size per domain), from the release's fine-tuning scripts.
FINETUNE_TABLE = {0.01: ("linear", 0.025, 32), 0.05: ("linear", 0.05, 64),
                  0.1: ("full", 5e-5, 12), 1.0: ("full", 5e-5, 12)}


def finetune_settings(label_fraction: float, hparams) -> tuple[str, float, int]:
    """``(mode, lr, batch size per domain)``: the release's row, then the ``udg_ft_*`` overrides."""
    if not 0 < label_fraction <= 1:
        raise ValueError(f"label_fraction must be in (0, 1], got {label_fraction}")
    keys = sorted(FINETUNE_TABLE)
    mode, lr, batch = FINETUNE_TABLE[max([k for k in keys if k <= label_fraction + 1e-12],
                                         default=keys[0])]
    if hparams.get("udg_ft_mode", "auto") != "auto":
        mode = hparams["udg_ft_mode"]
    if hparams.get("udg_ft_lr") is not None:
        lr = float(hparams["udg_ft_lr"])
    if hparams.get("udg_ft_batch_size") is not None:
        batch = int(hparams["udg_ft_batch_size"])
    if lr <= 0 or batch <= 0:
        raise ValueError(f"udg_ft_lr ({lr}) and udg_ft_batch_size ({batch}) must be positive")
    return mode, lr, batch


class FineTuner(Algorithm):
    """``head(backbone(x))`` trained with cross-entropy; ``backbone``: the pretrained ViT."""

    def __init__(self, input_shape, num_classes, num_domains, hparams, backbone: nn.Module,
                 label_fraction: float):
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self.mode, self.lr, self.batch_size = finetune_settings(label_fraction, hparams)
        self.backbone = backbone
        width = backbone.num_features
        from timm.layers import trunc_normal_  # the official MAE's (torch 2.13's draws others)

        linear = nn.Linear(width, num_classes)
        trunc_normal_(linear.weight, std=0.01)
        nn.init.zeros_(linear.bias)
        if self.mode == "linear":
            self.backbone.requires_grad_(False)
            self.head = nn.Sequential(nn.BatchNorm1d(width, affine=False), linear)
        else:
            self.head = nn.Sequential(linear)
        self.optimizer = torch.optim.AdamW(decay_groups(self.named_parameters(), 0.05),
                                           lr=self.lr, betas=(0.9, 0.95))

    def train(self, mode: bool = True):
        super().train(mode)
        if self.mode == "linear":
            self.backbone.eval()  # frozen: always inference behaviour
        return self

    def features(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad() if self.mode == "linear" else contextlib.nullcontext():
            return self.backbone(x)

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))

    update = ERM.update  # reads only predict and optimizer
