"""DisMAE (Zhang, Wang, Wang, Chua, ECCV 2024, arXiv 2407.07544) and its MAE baseline (He et al.,
CVPR 2022), after the authors' release (rookiehb/DisMAE @ ff91675, ``models_dmae.py``): semantic
and variation ViT encoders, one decoder, ``rec + lambda1 * ada + lambda2 * ce`` and a domain
classifier on its own schedule (``docs/methods/dismae.md``)."""

from __future__ import annotations

import os
from functools import partial

import torch
import torch.nn as nn
import torch.nn.functional as F

from dg_plugins import hparams as hp_lib
from dg_plugins.algorithms.base import (Algorithm, decay_groups, domain_labels, optimizer_step,
                                        register_algorithm, split_minibatches)
from dg_plugins.datasets.image_folder import IMAGENET_MEAN, IMAGENET_STD
from dg_plugins.networks import vit as vitlib

#: The semantic encoder ``vit_arch "auto"`` builds at 224x224 (the paper's ViT-B/16).
ENCODER_ARCH_224 = "vit_base_patch16_224"
#: Mask ratio of the domain classifier's feature pass (the release's 15%).
DCLS_MASK_RATIO = 0.15


def build_encoder(input_shape, hparams) -> nn.Module:
    """The semantic encoder (and UDG fine-tuning backbone): a headless ViT, sin-cos positions."""
    vit = vitlib.create_vit(hparams.get("vit_arch", "auto"), input_shape, pretrained=False,
                            num_classes=0, arch_224=ENCODER_ARCH_224, class_token=True,
                            global_pool="token")
    vitlib.install_sincos_pos_embed(vit)
    return vit


def mae_init_(module: nn.Module) -> None:
    """MAE's initialisation (xavier-uniform Linear weights, N(0, 0.02) tokens)."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.xavier_uniform_(m.weight)
        elif isinstance(m, nn.LayerNorm) and m.elementwise_affine:
            nn.init.ones_(m.weight)
        else:
            continue
        if m.bias is not None:
            nn.init.zeros_(m.bias)
    for m in module.modules():
        patch = getattr(getattr(m, "patch_embed", None), "proj", None)
        if isinstance(patch, nn.Conv2d):
            nn.init.xavier_uniform_(patch.weight.view(patch.weight.shape[0], -1))
            if patch.bias is not None:
                nn.init.zeros_(patch.bias)
        for name in ("cls_token", "mask_token"):
            token = getattr(m, name, None)
            if isinstance(token, nn.Parameter):
                nn.init.normal_(token, std=0.02)


def patchify(x: torch.Tensor, patch: int) -> torch.Tensor:
    """``[B, C, H, W]`` -> ``[B, N, p*p*C]``, pixels in MAE's (row, column, channel) order."""
    b, c, h, w = x.shape
    x = x.reshape(b, c, h // patch, patch, w // patch, patch)
    return x.permute(0, 2, 4, 3, 5, 1).reshape(b, (h // patch) * (w // patch), patch * patch * c)


class MaskedDecoder(nn.Module):
    """MAE's decoder on ``[CLS, N patch slots, extra]`` (extra: DisMAE's variation code) -> the
    N patch predictions through a sigmoid."""

    def __init__(self, embed_dim: int, width: int, depth: int, grid, patch_pixels: int):
        super().__init__()
        from dg_plugins import compat  # noqa: F401  (before timm)
        from timm.models.vision_transformer import Block

        heads = max(1, width // 64)
        if width % heads:
            raise ValueError(f"dismae_decoder_width {width} must be a multiple of {heads} heads")
        self.embed = nn.Linear(embed_dim, width)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, width))
        self.register_buffer("pos_embed", vitlib.sincos_pos_embed_2d(width, grid, 1))
        norm = partial(nn.LayerNorm, eps=1e-6)
        self.blocks = nn.Sequential(*[Block(width, heads, 4.0, qkv_bias=True, norm_layer=norm)
                                      for _ in range(depth)])
        self.norm = norm(width)
        self.pred = nn.Linear(width, patch_pixels)

    def forward(self, latent: torch.Tensor, ids_restore: torch.Tensor,
                extra: torch.Tensor | None) -> torch.Tensor:
        h = self.embed(latent)
        patches = vitlib.restore_order(h[:, 1:], ids_restore, self.mask_token)
        seq = [h[:, :1] + self.pos_embed[:, :1], patches + self.pos_embed[:, 1:]]
        if extra is not None:
            seq.append(self.embed(extra).unsqueeze(1) + self.pos_embed[:, :1])
        h = self.norm(self.blocks(torch.cat(seq, dim=1)))
        return torch.sigmoid(self.pred(h[:, 1:1 + ids_restore.shape[1]]))


def _shared_space(dataset: str) -> dict:
    width = 64 if dataset in hp_lib.SMALL_IMAGE_DATASETS else 512
    return {
        "lr": (1e-4, hp_lib._log_uniform(-4.5, -3.5), hp_lib.positive),
        "weight_decay": (0.05, hp_lib._choice([0.0, 0.05]), hp_lib.non_negative),
        "batch_size": (32, hp_lib._int_pow2(3, 5.5), hp_lib.positive),
        "dismae_mask_ratio": (0.8, lambda r: r.choice([0.7, 0.75, 0.8]), hp_lib.probability),
        "dismae_decoder_depth": (1, lambda r: 1, hp_lib.positive),
        "dismae_decoder_width": (width, lambda r: width, hp_lib.positive),
        "dismae_lambda2": (1.0, lambda r: 1.0, hp_lib.non_negative),
        "dismae_unnorm_target": (False, lambda r: False),
        "dismae_init": ("random", lambda r: "random", lambda v: None if v.strip() else
                        "must be 'random' or the path of a local MAE checkpoint"),
        # UDG fine-tuning (udg_finetune): null = the per-label-fraction table
        "udg_ft_lr": (None, lambda r: None),
        "udg_ft_batch_size": (None, lambda r: None),
        "udg_ft_mode": ("auto", lambda r: "auto", hp_lib.one_of("auto", "linear", "full")),
    }


class _MaskedAutoencoder(Algorithm):
    """What MAE and DisMAE share: encoder, decoder, reconstruction loss, head, UDG hooks."""

    VARIATION = False
    #: CPU test size: 2-block tiny ViT, 1 variation block, a 32-wide decoder.
    TINY_TEST_HPARAMS = {"vit_arch": "tiny", "dismae_decoder_width": 32}

    def __init__(self, input_shape, num_classes, num_domains, hparams):
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self.mask_ratio = float(hparams["dismae_mask_ratio"])
        self.encoder = build_encoder(self.input_shape, hparams)
        dims = vitlib.vit_dims(self.encoder)
        self.patch = int(dims.patch_size[0])
        width = dims.embed_dim
        if self.VARIATION:
            self.var_blocks = vitlib.create_vit(
                hparams.get("vit_arch", "auto"), self.input_shape, pretrained=False, num_classes=0,
                arch_224=ENCODER_ARCH_224, depth=int(hparams["dismae_var_depth"])).blocks
        self.decoder = MaskedDecoder(width, int(hparams["dismae_decoder_width"]),
                                     int(hparams["dismae_decoder_depth"]), dims.grid_size,
                                     self.patch * self.patch * self.input_shape[0])
        self.classifier = nn.Linear(width, num_classes)
        self.register_buffer("step", torch.zeros((), dtype=torch.long))
        channels = self.input_shape[0]
        self.unnorm = bool(hparams["dismae_unnorm_target"]) and channels == 3 and \
            self.input_shape[1] > 28
        self.register_buffer("target_mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
                             if channels == 3 else torch.zeros(1, channels, 1, 1), persistent=False)
        self.register_buffer("target_std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
                             if channels == 3 else torch.ones(1, channels, 1, 1), persistent=False)
        mae_init_(self)
        if hparams["dismae_init"] != "random":
            self.load_mae_checkpoint(hparams["dismae_init"])
        self.optimizer = torch.optim.AdamW(  # not DisMAE's domain classifier, added after
            decay_groups(self.named_parameters(), hparams["weight_decay"]), lr=hparams["lr"],
            betas=(0.9, 0.95))

    def load_mae_checkpoint(self, path: str) -> None:
        """Encoder (and the decoder keys whose shapes match) from a local MAE checkpoint."""
        if not os.path.isfile(path):
            raise FileNotFoundError(f"dismae_init {path!r} is not a file; give a local MAE "
                                    "checkpoint or 'random'")
        state = torch.load(path, map_location="cpu", weights_only=False)
        state = state.get("model", state) if isinstance(state, dict) else state
        enc = {k: v for k, v in state.items() if not k.startswith(("decoder", "mask_token"))
               and k != "pos_embed"}
        own = self.encoder.state_dict()
        missing = [k for k in own if k not in enc and k != "pos_embed"]
        bad = [k for k in enc if k in own and enc[k].shape != own[k].shape]
        if missing or bad:
            raise ValueError(f"{path} does not fit the semantic encoder (vit_arch "
                             f"{self.hparams['vit_arch']!r}): missing {missing[:5]}, shape "
                             f"mismatches {bad[:5]}")
        self.encoder.load_state_dict({k: enc[k] for k in own if k != "pos_embed"}, strict=False)
        names = {"decoder_embed.": "embed.", "decoder_norm.": "norm.", "decoder_pred.": "pred.",
                 "decoder_blocks.": "blocks.", "mask_token": "mask_token"}
        dec_own = self.decoder.state_dict()
        renamed = {new + key[len(old):]: value for key, value in state.items()
                   for old, new in names.items() if key.startswith(old)}
        self.decoder.load_state_dict({k: v for k, v in renamed.items()
                                      if k in dec_own and dec_own[k].shape == v.shape},
                                     strict=False)

    def target(self, x: torch.Tensor) -> torch.Tensor:
        if self.unnorm:
            x = x * self.target_std + self.target_mean
        return patchify(x, self.patch)

    def semantic(self, tokens: torch.Tensor, mask_ratio: float):
        """Patch tokens -> (normed latent ``[B, 1 + K, D]``, mask, ids_restore)."""
        if mask_ratio > 0:
            masked = vitlib.random_masking(tokens, mask_ratio)
            kept, mask, ids_restore = masked.tokens, masked.mask, masked.ids_restore
        else:
            kept, mask = tokens, tokens.new_zeros(tokens.shape[:2])
            ids_restore = torch.arange(tokens.shape[1], device=tokens.device).expand(
                tokens.shape[0], -1)
        h = vitlib.prepend_prefix_tokens(self.encoder, kept)
        h = vitlib.final_norm(self.encoder, vitlib.run_blocks(self.encoder, h))
        return h, mask, ids_restore

    def variation(self, tokens: torch.Tensor, mask_ratio: float) -> torch.Tensor:
        """The variation encoder's class token ``[B, D]`` (own blocks, independent mask)."""
        masked = vitlib.random_masking(tokens, mask_ratio)
        h = self.var_blocks(vitlib.prepend_prefix_tokens(self.encoder, masked.tokens))
        return vitlib.final_norm(self.encoder, h)[:, 0]

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.semantic(vitlib.embed_patches(self.encoder, x), 0.0)[0][:, 0]

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))

    def add_ce(self, loss, latent, y) -> tuple[torch.Tensor, dict]:
        """``(loss + lambda2 * CE, {"ce": CE})`` on the class token; ``loss`` alone without y."""
        if y is None:
            return loss, {}
        ce = F.cross_entropy(self.classifier(latent[:, 0]), y)
        return loss + self.hparams["dismae_lambda2"] * ce, {"ce": ce.item()}

    @staticmethod
    def rec_loss(pred, target, mask) -> torch.Tensor:
        per_patch = (pred - target).pow(2).mean(dim=-1)
        return (per_patch * mask).sum() / (mask.sum() + 1)

    def pretrained_state(self) -> dict[str, torch.Tensor]:
        """The semantic encoder's weights (:func:`build_encoder`'s keys), detached copies."""
        return {k: v.detach().clone() for k, v in self.encoder.state_dict().items()}

    #: ``(input_shape, hparams) -> ViT``: UDG fine-tuning's backbone (loads pretrained_state).
    build_finetune_encoder = staticmethod(build_encoder)

    def _update(self, x, y, domain) -> dict:
        """MAE's step: ``rec + lambda2 * CE`` (DisMAE's adds its terms)."""
        tokens = vitlib.embed_patches(self.encoder, x)
        latent, mask, ids_restore = self.semantic(tokens, self.mask_ratio)
        rec = self.rec_loss(self.decoder(latent, ids_restore, None), self.target(x), mask)
        loss, out = self.add_ce(rec, latent, y)
        optimizer_step(self.optimizer, loss)
        self.step += 1
        return {"loss": loss.item(), "rec": rec.item(), **out}

    def update(self, minibatches, unlabeled=None) -> dict:
        return self._update(*split_minibatches(minibatches))

    def pretrain_update(self, images) -> dict:
        """One self-supervised step (``lambda2 = 0``) on one image batch per source environment."""
        if not images:
            raise ValueError("pretrain_update() got no image batches")
        return self._update(torch.cat(list(images)), None, domain_labels(images))


@register_algorithm("MAE")
class MAE(_MaskedAutoencoder):
    """Masked autoencoder (He et al., CVPR 2022): ``rec + lambda2 * CE`` (UDG pretraining: rec)."""

    hparam_space = staticmethod(_shared_space)


#: The domain classifier's epoch when neither the hparam nor the job gives one.
FALLBACK_EPOCH_STEPS = 100


def dcls_epoch_steps(hparams, run_epoch_steps: float | None) -> int:
    """The domain classifier's epoch in steps: the hparam, the run's epoch, or the fallback."""
    value = hparams.get("dismae_dcls_epoch_steps")
    if value is not None:
        return int(value)
    if run_epoch_steps:
        return max(1, int(round(run_epoch_steps)))
    return FALLBACK_EPOCH_STEPS


def dcls_active(step: int, epoch_steps: int) -> bool:
    """Whether the domain classifier trains at ``step``: epochs 0-5, then every 15th up to 100
    (always when ``epoch_steps`` is 0)."""
    if epoch_steps <= 0:
        return True
    epoch = step // epoch_steps
    return epoch < 6 or (epoch % 15 == 0 and epoch <= 100)


@register_algorithm("DisMAE")
class DisMAE(_MaskedAutoencoder):
    """DisMAE, DG variant: ``rec + lambda1 * ada + lambda2 * CE`` (``docs/methods/dismae.md``)."""

    VARIATION = True
    TINY_TEST_HPARAMS = {**_MaskedAutoencoder.TINY_TEST_HPARAMS, "dismae_var_depth": 1}

    @staticmethod
    def hparam_space(dataset: str) -> dict:
        small = dataset in hp_lib.SMALL_IMAGE_DATASETS
        return {
            **_shared_space(dataset),
            "dismae_var_depth": (3 if small else 6, lambda r: 3 if small else 6, hp_lib.positive),
            "dismae_var_mask_offset": (0.1, lambda r: 0.1, hp_lib.unit_interval),
            "dismae_lambda1": (1e-3, hp_lib._log_uniform(-4, -2), hp_lib.non_negative),
            "dismae_tau": (0.4, lambda r: 0.4, hp_lib.positive),
            "dismae_margin": (8e-3, lambda r: 8e-3, hp_lib.non_negative),
            "dismae_wmin": (0.15, lambda r: 0.15, hp_lib.decay_rate),
            "dismae_dcls_lr": (5e-4, lambda r: 5e-4, hp_lib.positive),
            "dismae_dcls_momentum": (0.99, lambda r: 0.99, hp_lib.unit_interval),
            # None: the run's epoch (Algorithm.epoch_steps); 0: a classifier step every update
            "dismae_dcls_epoch_steps": (None, lambda r: None, lambda v: None if isinstance(
                v, int) and not isinstance(v, bool) and v >= 0 else
                "must be null (the run's epoch) or a non-negative integer"),
        }

    def __init__(self, input_shape, num_classes, num_domains, hparams):
        ratio = float(hparams["dismae_mask_ratio"]) - float(hparams["dismae_var_mask_offset"])
        if not 0 <= ratio < 1:
            raise ValueError(
                f"dismae_mask_ratio - dismae_var_mask_offset = {ratio:g} is the variation "
                "encoder's mask ratio and must be in [0, 1); lower dismae_var_mask_offset")
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self.var_mask_ratio = ratio
        width = self.encoder.embed_dim
        self.domain_classifier = nn.Sequential(nn.Linear(width, 3 * width), nn.ReLU(),
                                               nn.Linear(3 * width, max(1, num_domains)))
        mae_init_(self.domain_classifier)
        self.dcls_optimizer = torch.optim.SGD(self.domain_classifier.parameters(),
                                              lr=hparams["dismae_dcls_lr"],
                                              momentum=hparams["dismae_dcls_momentum"],
                                              weight_decay=0.05)

    @staticmethod
    def anchors(domain: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(anchor of each sample, anchor indices)``: a domain's anchor is its first sample."""
        present = torch.unique(domain)
        first = torch.stack([torch.nonzero(domain == d)[0, 0] for d in present])
        lookup = torch.full((int(domain.max()) + 1,), -1, dtype=torch.long, device=domain.device)
        lookup[present] = first
        return lookup[domain], first

    @staticmethod
    def contrastive_terms(errors: torch.Tensor, domain: torch.Tensor, positive: torch.Tensor,
                          tau: float) -> torch.Tensor:
        """Per domain present, InfoNCE ``-log softmax(-errors / tau)[positive]`` over it."""
        losses = []
        for k, d in enumerate(torch.unique(domain)):
            idx = torch.nonzero(domain == d)[:, 0]
            logits = -errors.index_select(0, idx) / tau
            target = torch.nonzero(idx == positive[k])[0, 0]
            losses.append(torch.logsumexp(logits, 0) - logits[target])
        return torch.stack(losses)

    def adaptive_weights(self, cls: torch.Tensor, domains: torch.Tensor) -> torch.Tensor:
        """``1 / max(wmin, p(domain | sg[cls]))``, without gradient."""
        with torch.no_grad():
            probs = F.softmax(self.domain_classifier(cls.detach()), dim=1)
            p = probs.gather(1, domains.view(-1, 1)).squeeze(1)
            return 1.0 / p.clamp(min=self.hparams["dismae_wmin"])

    def _update(self, x, y, domain) -> dict:
        hp = self.hparams
        tokens = vitlib.embed_patches(self.encoder, x)
        latent, mask, ids_restore = self.semantic(tokens, self.mask_ratio)
        v = self.variation(tokens, self.var_mask_ratio)
        target = self.target(x)
        rec = self.rec_loss(self.decoder(latent, ids_restore, v), target, mask)

        # adaptive contrastive loss: each domain's anchor decoded with every same-domain v_j.
        # index_select, not latent[anchor_of]: its backward adds repeated rows in a fixed order
        # (advanced indexing's parallel atomic adds made identical CPU runs drift ~1e-7).
        anchor_of, anchors = self.anchors(domain)
        swapped = self.decoder(latent.index_select(0, anchor_of),
                               ids_restore.index_select(0, anchor_of), v)
        excess = F.relu((swapped - target.index_select(0, anchor_of)).pow(2)
                        - hp["dismae_margin"])
        errors = excess.mean(dim=-1).sum(dim=1) / (mask.index_select(0, anchor_of).sum(dim=1) + 1)
        terms = self.contrastive_terms(errors, domain, anchors, hp["dismae_tau"])
        weights = self.adaptive_weights(latent[anchors, 0], domain[anchors])
        ada = (weights * terms).sum()

        loss, out = self.add_ce(rec + hp["dismae_lambda1"] * ada, latent, y)
        optimizer_step(self.optimizer, loss)

        with torch.no_grad():  # monitoring on the detached class tokens of this pass
            logits = self.domain_classifier(latent[:, 0].detach())
            dcls_loss = F.cross_entropy(logits, domain).item()
            dcls_acc = (logits.argmax(1) == domain).float().mean().item()
        if dcls_active(int(self.step), dcls_epoch_steps(hp, self.epoch_steps)):
            self.domain_classifier_step(x, domain)
        self.step += 1
        return {"loss": loss.item(), "rec": rec.item(), "ada": ada.item(), **out,
                "dcls_loss": dcls_loss, "dcls_acc": dcls_acc}

    def domain_classifier_step(self, x: torch.Tensor, domain: torch.Tensor) -> float:
        """One SGD step of the domain classifier on detached class tokens of a 15%-masked pass."""
        with torch.no_grad():
            tokens = vitlib.embed_patches(self.encoder, x)
            cls = self.semantic(tokens, DCLS_MASK_RATIO)[0][:, 0]
        loss = F.cross_entropy(self.domain_classifier(cls), domain)
        optimizer_step(self.dcls_optimizer, loss)
        return loss.item()
