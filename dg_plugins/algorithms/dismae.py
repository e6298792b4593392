"""DisMAE (Zhang, Wang, Wang, Chua, "Disentangling Masked Autoencoders for Unsupervised Domain
Generalization", ECCV 2024, arXiv 2407.07544) and the plain MAE baseline (He et al., "Masked
Autoencoders Are Scalable Vision Learners", CVPR 2022) it builds on.

The paper's equations were not available to us; the behaviour follows the authors' release
(rookiehb/DisMAE @ ff91675, ``models_dmae.py``, configuration ``mae_vit_cls``), generalised where
that code hard-codes 3 domains, 20 classes and equal per-domain batches.

Model (all ViT pieces from :mod:`dg_plugins.networks.vit`)
    * **semantic encoder** ``encoder``: a timm ``VisionTransformer`` (class token, fixed 2-D
      sin-cos position embedding, final LayerNorm) run on the patches kept by a random mask of
      ratio ``dismae_mask_ratio`` (0.8); unmasked at inference.
    * **variation encoder** ``var_blocks``: ``dismae_var_depth`` more blocks of the same width that
      share the patch embedding, position embedding, class token and final norm of the semantic
      encoder, on an independent mask of ratio ``dismae_mask_ratio - dismae_var_mask_offset``;
      only its class token ``v`` is used.
    * **decoder** :class:`MaskedDecoder`: ``Linear(D, Dd)``, learned mask token, fixed sin-cos
      position embedding, ``dismae_decoder_depth`` blocks, LayerNorm, ``Linear(Dd, p*p*C)``, on the
      sequence ``[semantic CLS, patch slots (kept semantic tokens unshuffled, mask tokens
      elsewhere), v]``; the first and last outputs are dropped and a sigmoid applied.
    * **domain classifier** ``domain_classifier``: MLP ``D -> 3D -> ReLU -> num_domains`` on the
      *detached* semantic class token (the release's ``reweight_classifier``).
    * ``classifier``: linear head on the semantic class token (the release's ``s_classifier``
      with ``--is_linear``).

Losses (one ``update``; ``x`` = all source batches concatenated, domain = minibatch index)
    * ``rec``: ``sum_i sum_{p in M_i} mean_pixels (D(s_i, v_i)_p - x_ip)^2 / (sum_i |M_i| + 1)``
      over the masked patches ``M_i`` of the semantic mask (the release's normaliser).
    * ``ada``, the adaptive contrastive loss: for each source domain k, the anchor ``a`` is the
      domain's first sample; the swapped reconstructions ``D(s_a, v_j)`` for every sample j of the
      same domain give errors ``e_j = sum_{all patches} mean_pixels relu((D(s_a, v_j) - x_a)^2 -
      m) / (|M_a| + 1)`` (margin ``dismae_margin``); InfoNCE over the domain's candidates with
      temperature ``dismae_tau`` and the anchor's own variation token as the positive:
      ``l_k = -log softmax(-e / tau)_a``; weight ``w_k = 1 / max(dismae_wmin, p(k | sg[c_a]))``
      (softmax of the domain classifier on the detached anchor class token, computed without
      gradient); ``ada = sum_k w_k l_k``.
    * ``ce``: cross-entropy of ``classifier`` on the semantic class token of the masked pass (DG
      variant only).
    * total: ``rec + dismae_lambda1 * ada + dismae_lambda2 * ce``; one AdamW step (betas 0.9/0.95,
      ``weight_decay`` on matrices only: no decay on biases, norms and other 1-D parameters).
    * domain classifier: its own SGD (``dismae_dcls_lr``, momentum ``dismae_dcls_momentum``,
      weight decay 0.05) on the detached class tokens of a 15%-masked forward pass without
      gradient, with the domain labels. The release trains it for one full pass over the data on
      epochs 0-5 and every 15th epoch up to epoch 100; in steps: one SGD step after the main step
      whenever ``epoch = step // E`` satisfies ``epoch < 6`` or ``epoch % 15 == 0 and epoch <=
      100``, ``E`` (:func:`dcls_epoch_steps`) being the hparam ``dismae_dcls_epoch_steps`` when
      set (0 = a step after every update), else the run's real epoch length, which the train job
      sets (source in-split size / batch; in UDG pretraining, the pretraining set's size / the
      step's batch over all domains), else 100. ``dcls_loss``/``dcls_acc`` are the classifier's CE and
      accuracy on the detached class tokens of the current masked pass (reported every step).

Choices where the release is unclear or hard-coded (each documented):
    * ``dismae_unnorm_target`` (default False, as released): False reconstructs the input pixels
      as given (DomainBed's image datasets are ImageNet-normalised, so part of the target range is
      out of the sigmoid's reach, as in the release); True de-normalises 3-channel images larger
      than 28x28 with ImageNet's mean/std to [0, 1] first (28x28 datasets are already in [0, 1]).
    * ``dismae_init``: ``"random"`` (MAE's init, as released) or a path to a local MAE checkpoint
      (``{"model": state_dict}`` or a bare state dict in MAE's key names): encoder keys must
      match; decoder keys are loaded where their shapes match; the variation blocks stay random.
    * One anchor per domain per step (the release's ``ada_iter=0``); any number of domains and any
      batch split.
    * ``vit_arch`` (base hparam, chosen by :func:`dg_plugins.networks.vit.resolve_vit_arch` as for
      every ViT): ``"auto"`` is the paper's ViT-B/16 (``vit_base_patch16_224``) at 224x224 and
      :data:`~dg_plugins.networks.vit.VIT_28` at 28x28; ``"tiny"`` the 2-block presets; or any
      timm ViT or preset name. The variation depth (6) and decoder width (512) defaults shrink to
      3 and 64 on 28x28 datasets.

UDG (see :mod:`dg_plugins.algorithms.udg_finetune`): :meth:`pretrain_update` is the same step on unlabelled
images with ``lambda2 = 0``; :meth:`pretrained_state` returns the semantic encoder's weights in
the key names of :func:`build_encoder`'s ViT (the fine-tuning model).
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn as nn
import torch.nn.functional as F

from dg_plugins import hparams as hp_lib
from dg_plugins.algorithms.base import (Algorithm, decay_groups, optimizer_step,
                                        register_algorithm, split_minibatches)
from dg_plugins.datasets.image_folder import IMAGENET_MEAN, IMAGENET_STD
from dg_plugins.networks import vit as vitlib

#: The semantic encoder ``vit_arch "auto"`` builds at 224x224 (the paper's ViT-B/16).
ENCODER_ARCH_224 = "vit_base_patch16_224"
#: Mask ratio of the domain classifier's feature pass (the release's 15%).
DCLS_MASK_RATIO = 0.15


def build_encoder(input_shape, hparams) -> nn.Module:
    """The semantic encoder (and the UDG fine-tuning backbone): a timm ViT without head, with MAE's
    fixed sin-cos position embedding (a buffer) and a class token."""
    vit = vitlib.create_vit(hparams.get("vit_arch", "auto"), input_shape, pretrained=False,
                            num_classes=0, arch_224=ENCODER_ARCH_224, class_token=True,
                            global_pool="token")
    vitlib.install_sincos_pos_embed(vit)
    return vit


def _variation_blocks(input_shape, hparams, depth: int) -> nn.Sequential:
    """``depth`` blocks shaped like the semantic encoder's (built as a ViT of that depth)."""
    vit = vitlib.create_vit(hparams.get("vit_arch", "auto"), input_shape, pretrained=False,
                            num_classes=0, arch_224=ENCODER_ARCH_224, depth=depth)
    return vit.blocks


def mae_init_(module: nn.Module) -> None:
    """MAE's initialisation: xavier-uniform Linear weights (and the patch projection, as a
    flattened matrix), zero biases, unit LayerNorms, N(0, 0.02) class/mask tokens."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.xavier_uniform_(m.weight)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm):
            if m.weight is not None:
                nn.init.ones_(m.weight)
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
    """``[B, C, H, W]`` -> ``[B, N, p*p*C]`` in the patch embedding's row-major order, pixels as
    MAE orders them (row, column, channel)."""
    b, c, h, w = x.shape
    x = x.reshape(b, c, h // patch, patch, w // patch, patch)
    return x.permute(0, 2, 4, 3, 5, 1).reshape(b, (h // patch) * (w // patch), patch * patch * c)


class MaskedDecoder(nn.Module):
    """MAE's decoder with DisMAE's extra token: input ``[CLS, N patch slots, extra]`` (the extra
    token, DisMAE's variation code, gets the class-token position embedding), output the N patch
    predictions (first and last positions dropped) through a sigmoid."""

    def __init__(self, embed_dim: int, width: int, depth: int, num_patches: int, grid,
                 patch_pixels: int):
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
        """``latent [B, 1 + K, D]`` (class token first), ``ids_restore [B, N]``, ``extra [B, D]``
        or None (plain MAE) -> ``[B, N, p*p*C]`` in (0, 1)."""
        h = self.embed(latent)
        patches = vitlib.restore_order(h[:, 1:], ids_restore, self.mask_token)
        seq = [h[:, :1] + self.pos_embed[:, :1], patches + self.pos_embed[:, 1:]]
        if extra is not None:
            seq.append(self.embed(extra).unsqueeze(1) + self.pos_embed[:, :1])
        h = self.norm(self.blocks(torch.cat(seq, dim=1)))
        return torch.sigmoid(self.pred(h[:, 1:1 + ids_restore.shape[1]]))


def _mask_ratio_check(value):
    return None if 0 <= value < 1 else "must be in [0, 1)"


def _init_check(value):
    return None if value.strip() else "must be 'random' or the path of a local MAE checkpoint"


def _shared_space(dataset: str) -> dict:
    """The hparams MAE and DisMAE share (same names, same meaning)."""
    small = dataset in hp_lib.SMALL_IMAGE_DATASETS
    return {
        "lr": (1e-4, lambda r: 10 ** r.uniform(-4.5, -3.5), hp_lib.positive),
        "weight_decay": (0.05, lambda r: r.choice([0.0, 0.05]), hp_lib.non_negative),
        "batch_size": (32, lambda r: int(2 ** r.uniform(3, 5.5)), hp_lib.positive),
        "dismae_mask_ratio": (0.8, lambda r: r.choice([0.7, 0.75, 0.8]), _mask_ratio_check),
        "dismae_decoder_depth": (1, lambda r: 1, hp_lib.positive),
        "dismae_decoder_width": (64 if small else 512, lambda r: 64 if small else 512,
                                 hp_lib.positive),
        "dismae_lambda2": (1.0, lambda r: 1.0, hp_lib.non_negative),
        "dismae_unnorm_target": (False, lambda r: False),
        "dismae_init": ("random", lambda r: "random", _init_check),
        # UDG fine-tuning (dg_plugins.algorithms.udg_finetune): null = the per-label-fraction table.
        "udg_ft_lr": (None, lambda r: None),
        "udg_ft_batch_size": (None, lambda r: None),
        "udg_ft_mode": ("auto", lambda r: "auto", hp_lib.one_of("auto", "linear", "full")),
    }


class _MaskedAutoencoder(Algorithm):
    """What MAE and DisMAE share: the semantic encoder, the decoder, the reconstruction loss, the
    classifier head, predict, and the UDG hooks."""

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
            self.var_blocks = _variation_blocks(self.input_shape, hparams,
                                                int(hparams["dismae_var_depth"]))
        self.decoder = MaskedDecoder(width, int(hparams["dismae_decoder_width"]),
                                     int(hparams["dismae_decoder_depth"]), dims.num_patches,
                                     dims.grid_size,
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

    # ---- pieces ------------------------------------------------------------------------------

    def load_mae_checkpoint(self, path: str) -> None:
        """Encoder from an MAE checkpoint (keys as timm's ViT: ``blocks.*``, ``patch_embed.*``,
        ``cls_token``, ``norm.*``; ``pos_embed`` is the fixed sin-cos table and is skipped);
        decoder keys (``decoder_embed``, ``mask_token``, ``decoder_blocks.i``, ``decoder_norm``,
        ``decoder_pred``) where the shapes match."""
        import os

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
        loaded = {}
        for key, value in state.items():
            for old, new in names.items():
                if key.startswith(old):
                    target = new + key[len(old):]
                    if target in dec_own and dec_own[target].shape == value.shape:
                        loaded[target] = value
        self.decoder.load_state_dict(loaded, strict=False)

    def target(self, x: torch.Tensor) -> torch.Tensor:
        if self.unnorm:
            x = x * self.target_std + self.target_mean
        return patchify(x, self.patch)

    def semantic(self, tokens: torch.Tensor, mask_ratio: float):
        """Position-embedded patch tokens -> (normed ``[B, 1 + K, D]`` latent, mask, ids_restore)."""
        if mask_ratio > 0:
            masked = vitlib.random_masking(tokens, mask_ratio)
            kept, mask, ids_restore = masked.tokens, masked.mask, masked.ids_restore
        else:
            kept = tokens
            mask = tokens.new_zeros(tokens.shape[:2])
            ids_restore = torch.arange(tokens.shape[1], device=tokens.device).expand(
                tokens.shape[0], -1)
        h = vitlib.prepend_prefix_tokens(self.encoder, kept)
        h = vitlib.final_norm(self.encoder, vitlib.run_blocks(self.encoder, h))
        return h, mask, ids_restore

    def variation(self, tokens: torch.Tensor, mask_ratio: float) -> torch.Tensor:
        """The variation encoder's class token ``[B, D]`` (shared patch/position embedding, class
        token and final norm; own blocks; independent mask)."""
        masked = vitlib.random_masking(tokens, mask_ratio)
        h = vitlib.prepend_prefix_tokens(self.encoder, masked.tokens)
        h = self.var_blocks(h)
        return vitlib.final_norm(self.encoder, h)[:, 0]

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The unmasked semantic class token (inference)."""
        tokens = vitlib.embed_patches(self.encoder, x)
        return self.semantic(tokens, 0.0)[0][:, 0]

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))

    @staticmethod
    def rec_loss(pred, target, mask) -> torch.Tensor:
        """``sum_i sum_{p in M_i} mean_pixels (pred - target)^2 / (sum_i |M_i| + 1)``."""
        per_patch = (pred - target).pow(2).mean(dim=-1)
        return (per_patch * mask).sum() / (mask.sum() + 1)

    def pretrained_state(self) -> dict[str, torch.Tensor]:
        """The semantic encoder's weights (keys of :func:`build_encoder`'s ViT), detached copies."""
        return {k: v.detach().clone() for k, v in self.encoder.state_dict().items()}

    #: ``(input_shape, hparams) -> ViT``: a fresh backbone with the semantic encoder's
    #: architecture, for UDG fine-tuning (it loads :meth:`pretrained_state` exactly).
    build_finetune_encoder = staticmethod(build_encoder)

    def _update(self, x, y, domain) -> dict:
        raise NotImplementedError

    def update(self, minibatches, unlabeled=None) -> dict:
        x, y, domain = split_minibatches(minibatches)
        return self._update(x, y, domain)

    def pretrain_update(self, images) -> dict:
        """One self-supervised step (``lambda2 = 0``, no labels) on one image batch per source
        environment."""
        if not images:
            raise ValueError("pretrain_update() got no image batches")
        x = torch.cat(list(images))
        domain = torch.cat([torch.full((len(xi),), i, dtype=torch.long, device=xi.device)
                            for i, xi in enumerate(images)])
        return self._update(x, None, domain)


@register_algorithm("MAE")
class MAE(_MaskedAutoencoder):
    """Plain masked autoencoder baseline (He et al., CVPR 2022) with DisMAE's semantic encoder and
    decoder, no variation branch and no contrastive loss. DG variant: ``rec + dismae_lambda2 *
    CE`` on the masked pass's class token (keys ``loss``, ``rec``, ``ce``); UDG pretraining: ``rec``
    only (keys ``loss``, ``rec``)."""

    @staticmethod
    def hparam_space(dataset: str) -> dict:
        return _shared_space(dataset)

    def __init__(self, input_shape, num_classes, num_domains, hparams):
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self.optimizer = torch.optim.AdamW(
            decay_groups(self.named_parameters(), hparams["weight_decay"]), lr=hparams["lr"],
            betas=(0.9, 0.95))

    def _update(self, x, y, domain) -> dict:
        tokens = vitlib.embed_patches(self.encoder, x)
        latent, mask, ids_restore = self.semantic(tokens, self.mask_ratio)
        rec = self.rec_loss(self.decoder(latent, ids_restore, None), self.target(x), mask)
        loss = rec
        out = {}
        if y is not None:
            ce = F.cross_entropy(self.classifier(latent[:, 0]), y)
            loss = rec + self.hparams["dismae_lambda2"] * ce
            out["ce"] = ce.item()
        optimizer_step(self.optimizer, loss)
        self.step += 1
        return {"loss": loss.item(), "rec": rec.item(), **out}


#: Steps per epoch of the domain classifier's schedule when neither the hparam nor a job gives
#: the run's epoch length (e.g. DomainBed's train through the bridge).
FALLBACK_EPOCH_STEPS = 100


def _epoch_steps_check(value):
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    return None if ok else "must be null (the run's epoch) or a non-negative integer"


def dcls_epoch_steps(hparams, run_epoch_steps: float | None) -> int:
    """The epoch length (in steps) of the domain classifier's schedule: the hparam
    ``dismae_dcls_epoch_steps`` when set, else the run's epoch (``Algorithm.epoch_steps``, rounded,
    at least 1), else :data:`FALLBACK_EPOCH_STEPS`."""
    value = hparams.get("dismae_dcls_epoch_steps")
    if value is not None:
        return int(value)
    if run_epoch_steps:
        return max(1, int(round(run_epoch_steps)))
    return FALLBACK_EPOCH_STEPS


def dcls_active(step: int, epoch_steps: int) -> bool:
    """Whether the domain classifier trains at ``step``: epochs 0-5, then every 15th epoch up to
    epoch 100 (the release's ``inter_ada=15``, ``max_epoch_ada=100``), an epoch being
    ``epoch_steps`` steps; every step when ``epoch_steps`` is 0."""
    if epoch_steps <= 0:
        return True
    epoch = step // epoch_steps
    return epoch < 6 or (epoch % 15 == 0 and epoch <= 100)


@register_algorithm("DisMAE")
class DisMAE(_MaskedAutoencoder):
    """DisMAE, DG variant (see the module docstring for the model and every loss term):
    ``rec + lambda1 * ada + lambda2 * CE``; ``update`` returns ``loss``, ``rec``, ``ada``, ``ce``,
    ``dcls_loss``, ``dcls_acc``. ``predict`` is ``classifier`` on the unmasked semantic class
    token. UDG pretraining (:meth:`pretrain_update`) drops the CE term (and the ``ce`` key)."""

    VARIATION = True
    TINY_TEST_HPARAMS = {**_MaskedAutoencoder.TINY_TEST_HPARAMS, "dismae_var_depth": 1}

    @staticmethod
    def hparam_space(dataset: str) -> dict:
        small = dataset in hp_lib.SMALL_IMAGE_DATASETS
        return {
            **_shared_space(dataset),
            "dismae_var_depth": (3 if small else 6, lambda r: 3 if small else 6, hp_lib.positive),
            "dismae_var_mask_offset": (0.1, lambda r: 0.1, hp_lib.unit_interval),
            "dismae_lambda1": (1e-3, lambda r: 10 ** r.uniform(-4, -2), hp_lib.non_negative),
            "dismae_tau": (0.4, lambda r: 0.4, hp_lib.positive),
            "dismae_margin": (8e-3, lambda r: 8e-3, hp_lib.non_negative),
            "dismae_wmin": (0.15, lambda r: 0.15, lambda v: None if 0 < v <= 1 else
                            "must be in (0, 1]"),
            "dismae_dcls_lr": (5e-4, lambda r: 5e-4, hp_lib.positive),
            "dismae_dcls_momentum": (0.99, lambda r: 0.99, hp_lib.unit_interval),
            # None: the run's epoch (Algorithm.epoch_steps, set by the job); an int: that many
            # steps per epoch; 0: a classifier step after every update.
            "dismae_dcls_epoch_steps": (None, lambda r: None, _epoch_steps_check),
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
        params = [(n, p) for n, p in self.named_parameters()
                  if not n.startswith("domain_classifier.")]
        self.optimizer = torch.optim.AdamW(decay_groups(params, hparams["weight_decay"]),
                                           lr=hparams["lr"], betas=(0.9, 0.95))
        self.dcls_optimizer = torch.optim.SGD(self.domain_classifier.parameters(),
                                              lr=hparams["dismae_dcls_lr"],
                                              momentum=hparams["dismae_dcls_momentum"],
                                              weight_decay=0.05)

    # ---- the adaptive contrastive loss --------------------------------------------------------

    @staticmethod
    def anchors(domain: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(anchor of each sample, anchor indices)``: the anchor of a sample is the first sample
        of its domain in the batch; anchors are listed by domain index (absent domains
        skipped)."""
        present = torch.unique(domain)
        first = torch.stack([torch.nonzero(domain == d)[0, 0] for d in present])
        lookup = torch.full((int(domain.max()) + 1,), -1, dtype=torch.long, device=domain.device)
        lookup[present] = first
        return lookup[domain], first

    @staticmethod
    def contrastive_terms(errors: torch.Tensor, domain: torch.Tensor, positive: torch.Tensor,
                          tau: float) -> torch.Tensor:
        """Per domain present in ``domain`` (in index order), the InfoNCE loss
        ``-log softmax(-errors / tau)[positive]`` over the samples of that domain; ``positive``
        holds, per domain, the batch index of the positive candidate."""
        losses = []
        for k, d in enumerate(torch.unique(domain)):
            idx = torch.nonzero(domain == d)[:, 0]
            logits = -errors.index_select(0, idx) / tau
            target = torch.nonzero(idx == positive[k])[0, 0]
            losses.append(torch.logsumexp(logits, 0) - logits[target])
        return torch.stack(losses)

    def adaptive_weights(self, cls: torch.Tensor, domains: torch.Tensor) -> torch.Tensor:
        """``1 / max(wmin, p(domain | sg[cls]))``, computed without gradient (the domain classifier
        neither receives nor passes gradient through the contrastive loss)."""
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
        pred = self.decoder(latent, ids_restore, v)
        rec = self.rec_loss(pred, target, mask)

        # adaptive contrastive loss: each domain's anchor decoded with every same-domain v_j.
        # The anchor rows are gathered with index_select, whose backward (index_add_) adds the
        # repeated rows' gradients in a fixed order on every device; advanced indexing
        # (latent[anchor_of]) accumulates them with parallel atomic adds on a multi-threaded CPU,
        # so two identical runs drifted apart (~1e-7 after a few steps) unless torch's
        # deterministic algorithms were on.
        anchor_of, anchors = self.anchors(domain)
        swapped = self.decoder(latent.index_select(0, anchor_of),
                               ids_restore.index_select(0, anchor_of), v)
        excess = F.relu((swapped - target.index_select(0, anchor_of)).pow(2)
                        - hp["dismae_margin"])
        errors = excess.mean(dim=-1).sum(dim=1) / (mask.index_select(0, anchor_of).sum(dim=1) + 1)
        terms = self.contrastive_terms(errors, domain, anchors, hp["dismae_tau"])
        weights = self.adaptive_weights(latent[anchors, 0], domain[anchors])
        ada = (weights * terms).sum()

        loss = rec + hp["dismae_lambda1"] * ada
        out = {}
        if y is not None:
            ce = F.cross_entropy(self.classifier(latent[:, 0]), y)
            loss = loss + hp["dismae_lambda2"] * ce
            out["ce"] = ce.item()
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
        """One SGD step of the domain classifier on the detached class tokens of a 15%-masked
        pass (no gradient through the encoders)."""
        with torch.no_grad():
            tokens = vitlib.embed_patches(self.encoder, x)
            cls = self.semantic(tokens, DCLS_MASK_RATIO)[0][:, 0]
        loss = F.cross_entropy(self.domain_classifier(cls), domain)
        optimizer_step(self.dcls_optimizer, loss)
        return loss.item()


def parameter_counts(model: nn.Module) -> dict[str, int]:
    """Trainable parameters per top-level part (for the benchmark's printout)."""
    counts = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            part = name.split(".")[0]
            counts[part] = counts.get(part, 0) + p.numel()
    counts["total"] = sum(counts.values())
    return counts


__all__ = ["DisMAE", "MAE", "MaskedDecoder", "build_encoder", "dcls_active", "dcls_epoch_steps",
           "mae_init_", "parameter_counts", "patchify"]
