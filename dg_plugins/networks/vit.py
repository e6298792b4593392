"""Shared Vision Transformer building blocks over timm's ``VisionTransformer``.

The ViT-based methods (GMoE, its dense baseline ERM_ViT, DisMAE, and ERM's ViT featurizer) build
their networks from the same pieces, all of which work on any timm ``VisionTransformer``:

Building (offline-safe)
    :func:`create_vit` builds a timm ViT architecture by name (``timm.create_model``) or one of the
    small presets of :data:`VIT_PRESETS` (timm's own ``VisionTransformer`` class with sizes timm
    does not ship: a ViT for 28x28 inputs and a tiny 224x224 test model). ``"auto"`` picks the
    architecture from the input shape (:func:`resolve_vit_arch`). Pretrained weights come through
    :func:`dg_plugins.networks.pretrained.timm_model` (fails fast offline) or a local checkpoint
    (:func:`dg_plugins.networks.pretrained.load_local_weights`). :func:`vit_dims` reads depth,
    width and heads of a built model.

Tokens
    :func:`embed_tokens` is exactly what timm's ``forward_features`` does before the blocks;
    :func:`embed_patches` + :func:`random_masking` + :func:`prepend_prefix_tokens` is the
    masked-autoencoder order of He et al.,
    "Masked Autoencoders Are Scalable Vision Learners" (CVPR 2022): patch embedding, plus position
    embedding, masking, then the class token with its own position embedding.
    :func:`run_blocks` runs a range of blocks, :func:`final_norm` and :func:`pool_tokens` finish
    like timm's ``forward_features`` / ``forward_head(pre_logits=True)``. :func:`restore_order`
    puts kept tokens back at their positions (MAE's ``ids_restore`` convention).

Position embeddings
    :func:`sincos_pos_embed_2d` computes MAE's fixed 2-D sine-cosine embedding;
    :func:`install_sincos_pos_embed` puts it on a timm ViT as a frozen buffer.

FFN replacement
    :func:`replace_ffn` swaps ``vit.blocks[i].mlp`` for a module made from the dense one (GMoE's
    sparse mixture-of-experts layers, Li et al., ICLR 2023, Sec. 4 / Eq. 3).

Featurizer
    :class:`ViTFeaturizer` is ERM's timm ViT featurizer (hparams ``vit_arch``, ``dinov2``,
    ``vit_attn_tune``, ``vit_dropout``, ``pretrained``, ``pretrained_path``), with DomainBed's
    DINOv2 recipe (``domainbed/networks.py``, class ``DinoV2``).

timm (and torchvision under it) is imported only when a model is built or a timm-specific helper
runs, after :mod:`dg_plugins.compat`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, Iterable, Mapping, NamedTuple, Sequence

import torch
import torch.nn as nn
import torch.utils.checkpoint

from dg_plugins.networks import pretrained as weights
from dg_plugins.networks.staged import StagedFeaturizer

# --------------------------------------------------------------------------------------------
# Presets and architecture choice
# --------------------------------------------------------------------------------------------

#: ViT for 28x28 inputs (RotatedMNIST, ColoredMNIST, Debug28): 4x4 patches -> 7x7 = 49 tokens
#: plus CLS; width 64, 6 blocks, 4 heads of 16 dims, MLP ratio 4 (0.30M parameters). One Adam
#: step on 320 images of 1x28x28 takes about 0.41 s on 2 CPU cores (DomainBed's MNIST CNN: 1.2 s).
VIT_28 = "dg_vit_patch4_28"
#: Tiny 224x224 ViT for CPU unit tests (Debug224): 32x32 patches -> 7x7 = 49 tokens plus CLS;
#: width 64, 4 blocks, 2 heads (0.35M parameters, most of it the 3072x64 patch projection).
VIT_TEST_224 = "dg_vit_test_patch32_224"
#: The two presets above cut to 2 blocks: what ``vit_arch "tiny"`` builds (CPU tests, smoke runs).
VIT_TINY_28 = "dg_vit_tiny_patch4_28"
VIT_TINY_224 = "dg_vit_tiny_patch32_224"

_PRESETS = {
    VIT_28: dict(img_size=28, patch_size=4, embed_dim=64, depth=6, num_heads=4, mlp_ratio=4.0,
                 qkv_bias=True),
    VIT_TEST_224: dict(img_size=224, patch_size=32, embed_dim=64, depth=4, num_heads=2,
                       mlp_ratio=4.0, qkv_bias=True),
}
_PRESETS[VIT_TINY_28] = {**_PRESETS[VIT_28], "depth": 2}
_PRESETS[VIT_TINY_224] = {**_PRESETS[VIT_TEST_224], "depth": 2}
#: Named small ViTs that timm lacks: name -> keyword arguments of timm's ``VisionTransformer``
#: (``img_size`` is the size the preset is meant for; :func:`create_vit` takes the size from the
#: input shape). Read-only; :func:`vit_preset` returns a mutable copy. Methods may name a preset
#: wherever a timm architecture is accepted (e.g. hparam ``vit_arch``). Presets have no published
#: weights: they are randomly initialised unless a local checkpoint is given.
VIT_PRESETS: Mapping[str, Mapping] = MappingProxyType(
    {name: MappingProxyType(kwargs) for name, kwargs in _PRESETS.items()})

#: What ``"auto"`` builds for 224x224 inputs when the caller names no paper backbone: ERM's ViT
#: featurizer (``backbone`` ``vit``, as DomainBed's ``vit`` hparam), timm's augreg ViT-S/16. The
#: methods with a ViT of their own pass their paper's (:func:`resolve_vit_arch`).
DEFAULT_ARCH_224 = "vit_small_patch16_224.augreg_in21k_ft_in1k"
#: The architecture ``"auto"`` picks for 28x28 inputs.
DEFAULT_ARCH_28 = VIT_28
#: DomainBed's DINOv2 backbone (ViT-B/14), as a timm name; used when hparam ``dinov2`` is set.
DINOV2_ARCH = "vit_base_patch14_dinov2.lvd142m"

#: What ``"tiny"`` builds, per input size.
_TINY = {28: VIT_TINY_28, 224: VIT_TINY_224}


def vit_preset(name: str) -> dict:
    """A copy of preset ``name``'s ``VisionTransformer`` keyword arguments (depth, width, ...)."""
    if name not in VIT_PRESETS:
        raise KeyError(f"unknown ViT preset {name!r}; presets: {sorted(VIT_PRESETS)}")
    return dict(VIT_PRESETS[name])


def resolve_vit_arch(arch: str, input_shape: Sequence[int], *,
                     arch_224: str = DEFAULT_ARCH_224) -> str:
    """The one rule by which every ViT of the package is chosen from the hparam ``vit_arch``.

    * ``"auto"``: ``(C, 28, 28)`` -> :data:`DEFAULT_ARCH_28`; ``(C, 224, 224)`` -> ``arch_224``,
      the paper backbone of the model being built: ERM's featurizer :data:`DEFAULT_ARCH_224`
      (ViT-S/16), GMoE and ERM_ViT ``deit_small_patch16_224`` (DeiT-S/16, Li et al.), DisMAE and
      MAE ``vit_base_patch16_224`` (ViT-B/16, Zhang et al.); each passes its own.
    * ``"tiny"``: the 2-block presets, :data:`VIT_TINY_28` / :data:`VIT_TINY_224` (CPU tests, the
      quick start's pretraining), whatever the model.
    * anything else: used as given (a preset of :data:`VIT_PRESETS` or a timm ViT name, built at
      the input's size).

    ``"auto"`` and ``"tiny"`` with another input size raise, listing the rules and the fix."""
    if arch not in ("auto", "tiny"):
        return arch
    shape = tuple(int(s) for s in input_shape)
    rule = {28: DEFAULT_ARCH_28, 224: arch_224} if arch == "auto" else _TINY
    if len(shape) == 3 and shape[1] == shape[2] and shape[1] in rule:
        return rule[shape[1]]
    rules = ", ".join(f"(C, {size}, {size}) -> {name!r}" for size, name in rule.items())
    raise ValueError(
        f"vit_arch {arch!r} has no rule for input shape {shape}; rules: {rules}. Name an "
        f"architecture instead: a preset {sorted(VIT_PRESETS)} or a timm ViT "
        "(timm.list_models('vit_*')), which is built at the input's size")


# --------------------------------------------------------------------------------------------
# Building
# --------------------------------------------------------------------------------------------

def _timm_vit_class():
    from dg_plugins import compat  # noqa: F401  (before timm)
    from timm.models.vision_transformer import VisionTransformer

    return VisionTransformer


def create_vit(arch: str, input_shape: Sequence[int], *, pretrained: bool,
               pretrained_path: str | None = None, drop_path_rate: float = 0.0,
               num_classes: int = 0, arch_224: str = DEFAULT_ARCH_224,
               **overrides) -> nn.Module:
    """Build a timm ``VisionTransformer`` for images of ``input_shape = (C, H, W)``.

    Args:
        arch: a timm architecture (``"deit_small_patch16_224"``, with or without a pretrained
            tag such as ``.fb_in1k``), a preset of :data:`VIT_PRESETS`, ``"auto"`` or ``"tiny"``
            (see :func:`resolve_vit_arch`; ``arch_224`` is what ``"auto"`` means at 224x224).
        input_shape: ``(C, H, W)``; the model is built with ``img_size=(H, W)`` and ``C`` input
            channels. ``H`` and ``W`` must be multiples of the patch size.
        pretrained: load pretrained weights: from ``pretrained_path`` when given (a local
            checkpoint; the classifier head's keys are ignored, every other key must match), else
            timm's own weights for ``arch`` through
            :func:`~dg_plugins.networks.pretrained.timm_model`, which fails fast with the fixes
            when they are neither cached nor downloadable. Presets have no published weights:
            without ``pretrained_path`` they are randomly initialised whatever ``pretrained``
            says (as the 28x28 CNN is). False: random initialisation (``pretrained_path`` unused).
        drop_path_rate: stochastic depth, increasing linearly over the blocks (timm's rule).
        num_classes: size of the linear head on the pooled feature; 0 for none (``head`` is an
            Identity and the model returns the pooled feature).
        **overrides: further ``VisionTransformer`` keyword arguments (``global_pool``,
            ``class_token``, ``depth``, ``embed_dim``, ``drop_rate``, ...); for a preset they
            update its table entry.

    Channels: pretrained weights are RGB. With ``C != 3`` and pretrained weights (downloaded or
    local) the model is built with 3 channels, loaded, and its patch projection adapted by timm's
    ``adapt_input_conv`` (sums the RGB filters for ``C = 1``; repeats and rescales them otherwise),
    which is what timm itself does when it loads weights into a model with other channels. A local
    checkpoint must therefore hold 3-channel weights when ``C != 3``.
    """
    from dg_plugins import compat  # noqa: F401  (before timm)
    import timm

    shape = tuple(int(s) for s in input_shape)
    if len(shape) != 3:
        raise ValueError(f"input_shape must be (C, H, W), got {shape}")
    channels, height, width = shape
    name = resolve_vit_arch(arch, shape, arch_224=arch_224)
    is_preset = name in VIT_PRESETS
    if not is_preset and not timm.is_model(name):
        raise ValueError(f"unknown ViT architecture {name!r}: expected 'auto', 'tiny', a preset "
                         f"{sorted(VIT_PRESETS)} or a timm model name (timm.list_models('vit_*'))")
    local_path = pretrained_path if pretrained else None
    download = bool(pretrained) and not local_path and not is_preset
    loads_weights = download or bool(local_path)
    build_channels = 3 if loads_weights else channels
    kwargs = dict(img_size=(height, width) if height != width else height,
                  in_chans=build_channels, num_classes=num_classes,
                  drop_path_rate=drop_path_rate)
    if is_preset:
        kwargs = {**vit_preset(name), **kwargs, **overrides}
        model = _timm_vit_class()(**kwargs)
    else:
        try:
            model = weights.timm_model(name, download, **{**kwargs, **overrides})
        except TypeError as err:  # e.g. a CNN given img_size: not a ViT
            raise ValueError(f"timm model {name!r} could not be built as a ViT ({err}); "
                             f"{_CHOOSE_A_VIT}") from err
    if not isinstance(model, _timm_vit_class()):
        raise ValueError(f"{name!r} builds a timm {type(model).__name__}, not a timm "
                         f"VisionTransformer; {_CHOOSE_A_VIT}")
    _check_patch_grid(model, name, (height, width))
    if local_path:
        weights.load_local_weights(model, local_path)
    if build_channels != channels:
        adapt_patch_embed_channels(model, channels)
    return model


_CHOOSE_A_VIT = ("choose a ViT architecture (timm.list_models('vit_*'), 'deit_*', ...), a preset "
                 f"{sorted(VIT_PRESETS)}, 'auto' or 'tiny'")


def _check_patch_grid(vit: nn.Module, name: str, size: tuple[int, int]) -> None:
    patch = tuple(vit.patch_embed.patch_size)
    if getattr(vit.patch_embed, "dynamic_img_pad", False):
        return
    if size[0] % patch[0] or size[1] % patch[1]:
        raise ValueError(f"input size {size} is not a multiple of {name!r}'s patch size {patch}; "
                         f"use vit_arch 'auto' or a preset {sorted(VIT_PRESETS)}, or override "
                         "patch_size")


def adapt_patch_embed_channels(vit: nn.Module, channels: int) -> None:
    """Replace ``vit``'s patch projection by one taking ``channels`` input channels, its filters
    derived from the current (RGB) ones by timm's ``adapt_input_conv``."""
    from dg_plugins import compat  # noqa: F401  (before timm)
    from timm.models import adapt_input_conv

    proj = vit.patch_embed.proj
    if proj.in_channels != 3:
        raise ValueError(f"the patch projection takes {proj.in_channels} channels; only RGB (3) "
                         "filters are adapted to other channel counts")
    new = nn.Conv2d(channels, proj.out_channels, kernel_size=proj.kernel_size,
                    stride=proj.stride, padding=proj.padding, bias=proj.bias is not None)
    new.to(device=proj.weight.device, dtype=proj.weight.dtype)
    with torch.no_grad():
        new.weight.copy_(adapt_input_conv(channels, proj.weight))
        if proj.bias is not None:
            new.bias.copy_(proj.bias)
    vit.patch_embed.proj = new
    vit.in_chans = channels


class ViTDims(NamedTuple):
    """Sizes of a built ViT (see :func:`vit_dims`)."""

    depth: int
    embed_dim: int
    num_heads: int
    mlp_hidden_dim: int
    patch_size: tuple[int, int]
    grid_size: tuple[int, int]
    num_patches: int
    num_prefix_tokens: int


def vit_dims(vit: nn.Module) -> ViTDims:
    """Depth, width, heads, FFN hidden width, patch and grid sizes, and the number of prefix
    (class/register) tokens of a timm ViT. The FFN width is read from block 0's ``mlp.fc1``."""
    blocks = _blocks(vit)
    first = blocks[0]
    fc1 = getattr(getattr(first, "mlp", None), "fc1", None)
    return ViTDims(
        depth=len(blocks), embed_dim=int(vit.embed_dim), num_heads=int(first.attn.num_heads),
        mlp_hidden_dim=int(fc1.out_features) if isinstance(fc1, nn.Linear) else -1,
        patch_size=tuple(vit.patch_embed.patch_size), grid_size=tuple(vit.patch_embed.grid_size),
        num_patches=int(vit.patch_embed.num_patches),
        num_prefix_tokens=int(vit.num_prefix_tokens))


def _blocks(vit: nn.Module) -> nn.Sequential:
    blocks = getattr(vit, "blocks", None)
    if blocks is None or not len(blocks):
        raise TypeError(f"expected a timm VisionTransformer with blocks, got {type(vit).__name__}")
    return blocks


# --------------------------------------------------------------------------------------------
# Tokens
# --------------------------------------------------------------------------------------------

def embed_tokens(vit: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Images ``[B, C, H, W]`` -> tokens ``[B, P + N, D]`` (P prefix tokens, N patches): exactly
    timm's ``forward_features`` before the blocks (patch embedding, class/register tokens, position
    embedding, ``pos_drop``, ``patch_drop``, ``norm_pre``)."""
    x = vit.patch_embed(x)
    x = vit._pos_embed(x)
    x = vit.patch_drop(x)
    return vit.norm_pre(x)


def _patch_pos_embed(vit: nn.Module, grid: tuple[int, int]) -> torch.Tensor | None:
    """The position embedding rows of the patches, ``[1, N, D]``, resampled when the ViT takes
    dynamic image sizes and ``grid`` differs from its own."""
    pos = vit.pos_embed
    if pos is None:
        return None
    prefix = 0 if vit.no_embed_class else vit.num_prefix_tokens
    if tuple(grid) != tuple(vit.patch_embed.grid_size):
        from dg_plugins import compat  # noqa: F401  (before timm)
        from timm.layers import resample_abs_pos_embed

        pos = resample_abs_pos_embed(pos, new_size=grid, old_size=vit.patch_embed.grid_size,
                                     num_prefix_tokens=prefix)
    return pos[:, prefix:]


def embed_patches(vit: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Images -> patch tokens ``[B, N, D]`` with their position embedding added, no prefix tokens
    (the first step of the MAE order; mask them with :func:`random_masking`, then call
    :func:`prepend_prefix_tokens`)."""
    x = vit.patch_embed(x)
    if x.ndim == 4:  # dynamic_img_size: NHWC, flattened after the position embedding
        grid = (x.shape[1], x.shape[2])
        x = x.flatten(1, 2)
    else:
        grid = tuple(vit.patch_embed.grid_size)
    pos = _patch_pos_embed(vit, grid)
    return x if pos is None else x + pos


def prepend_prefix_tokens(vit: nn.Module, patches: torch.Tensor) -> torch.Tensor:
    """Patch tokens ``[B, K, D]`` (already position-embedded, possibly masked) -> ``[B, P + K, D]``:
    the class (and register) tokens with their position embedding (none when the ViT has
    ``no_embed_class``) in front, then ``pos_drop`` and ``norm_pre`` as in timm's forward.
    timm's ``patch_drop`` is not applied: masking replaces it."""
    prefix = []
    if vit.cls_token is not None:
        prefix.append(vit.cls_token)
    if getattr(vit, "reg_token", None) is not None:
        prefix.append(vit.reg_token)
    if prefix:
        prefix = torch.cat(prefix, dim=1)
        if vit.pos_embed is not None and not vit.no_embed_class:
            prefix = prefix + vit.pos_embed[:, :vit.num_prefix_tokens]
        patches = torch.cat([prefix.expand(patches.shape[0], -1, -1), patches], dim=1)
    return vit.norm_pre(vit.pos_drop(patches))


def num_kept_tokens(num_tokens: int, mask_ratio: float) -> int:
    """How many of ``num_tokens`` tokens a random mask of ``mask_ratio`` keeps:
    ``floor(num_tokens * (1 - mask_ratio) + 1e-6)``. This is MAE's (and the released DisMAE's)
    ``int(L * (1 - mask_ratio))`` (e.g. 196 at 0.8 -> 39, at 0.7 -> 58; 49 at 0.8 -> 9), except that
    a product that float error puts just below an integer is not floored one lower
    (``int(10 * (1 - 0.9))`` is 0 in floating point; here it is 1)."""
    if not 0.0 <= mask_ratio < 1.0:
        raise ValueError(f"mask_ratio must be in [0, 1), got {mask_ratio}")
    kept = int(math.floor(num_tokens * (1.0 - mask_ratio) + 1e-6))
    if kept < 1:
        raise ValueError(f"mask_ratio {mask_ratio} keeps no token of {num_tokens}; the largest "
                         f"ratio keeping one is {1 - 1 / num_tokens:.4f}")
    return kept


@dataclass
class MaskedTokens:
    """Output of :func:`random_masking`.

    Attributes:
        tokens: kept tokens ``[B, K, D]`` in shuffled order
            (``tokens[b, j] = x[b, ids_keep[b, j]]``).
        mask: ``[B, N]``, 0 where a token is kept and 1 where it is removed (MAE's convention), in
            the original token order; ``mask.sum(1) == N - K`` for every sample.
        ids_restore: ``[B, N]``, the inverse of the shuffle: position ``n`` of the original order
            is position ``ids_restore[b, n]`` of ``[kept tokens, removed tokens]`` (MAE's
            ``ids_restore``; see :func:`restore_order`).
        ids_keep: ``[B, K]``, the original indices of the kept tokens, in ``tokens`` order.
    """

    tokens: torch.Tensor
    mask: torch.Tensor
    ids_restore: torch.Tensor
    ids_keep: torch.Tensor


def random_masking(tokens: torch.Tensor, mask_ratio: float, *,
                   generator: torch.Generator | None = None) -> MaskedTokens:
    """Keep a random subset of :func:`num_kept_tokens` ``(N, mask_ratio)`` tokens of each sample of
    ``tokens [B, N, D]``, drawn independently per sample (MAE's ``random_masking``: sort uniform
    noise, keep the smallest). ``generator`` (on ``tokens``' device) makes the draw reproducible.
    With ``mask_ratio`` 0 every token is kept, in a random order."""
    batch, num, dim = tokens.shape
    kept = num_kept_tokens(num, mask_ratio)
    noise = torch.rand(batch, num, device=tokens.device, generator=generator)
    ids_shuffle = torch.argsort(noise, dim=1)
    ids_restore = torch.argsort(ids_shuffle, dim=1)
    ids_keep = ids_shuffle[:, :kept]
    kept_tokens = torch.gather(tokens, 1, ids_keep.unsqueeze(-1).expand(-1, -1, dim))
    mask = torch.ones(batch, num, device=tokens.device, dtype=tokens.dtype)
    mask[:, :kept] = 0
    mask = torch.gather(mask, 1, ids_restore)
    return MaskedTokens(kept_tokens, mask, ids_restore, ids_keep)


def restore_order(kept: torch.Tensor, ids_restore: torch.Tensor,
                  fill: torch.Tensor) -> torch.Tensor:
    """Undo :func:`random_masking`'s shuffle: ``kept [B, K, D]`` (patch tokens only, in the order
    the masking returned) -> ``[B, N, D]`` with each kept token back at its original position and
    ``fill`` (e.g. a learned mask token, broadcastable to ``[B, 1, D]``) at removed positions
    (MAE's decoder input, ``ids_restore`` convention)."""
    batch, k, dim = kept.shape
    num = ids_restore.shape[1]
    fill = fill.to(kept.dtype).reshape(-1, 1, dim).expand(batch, num - k, dim)
    shuffled = torch.cat([kept, fill], dim=1)
    return torch.gather(shuffled, 1, ids_restore.unsqueeze(-1).expand(-1, -1, dim))


def run_blocks(vit: nn.Module, tokens: torch.Tensor, start: int = 0,
               end: int | None = None) -> torch.Tensor:
    """Run blocks ``start <= i < end`` (``end`` None: to the last) of ``vit`` on ``tokens``,
    with activation checkpointing when timm's ``set_grad_checkpointing`` is on."""
    blocks = _blocks(vit)
    depth = len(blocks)
    end = depth if end is None else end
    if not 0 <= start <= end <= depth:
        raise ValueError(f"block range [{start}, {end}) is not within the ViT's {depth} blocks "
                         f"(need 0 <= start <= end <= {depth})")
    checkpointing = getattr(vit, "grad_checkpointing", False) and torch.is_grad_enabled()
    for block in blocks[start:end]:
        if checkpointing:
            tokens = torch.utils.checkpoint.checkpoint(block, tokens, use_reentrant=False)
        else:
            tokens = block(tokens)
    return tokens


def final_norm(vit: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """The ViT's norm after the blocks (``vit.norm``; an Identity when the model norms after
    pooling, e.g. ``global_pool='avg'``, where :func:`pool_tokens` applies ``fc_norm``)."""
    return vit.norm(tokens)


def pool_tokens(vit: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Normed tokens ``[B, P + K, D]`` -> the pooled feature ``[B, D]``: timm's
    ``forward_head(pre_logits=True)`` (pooling by ``vit.global_pool``: the class token for
    ``'token'``, the mean of the non-prefix tokens for ``'avg'``; then ``fc_norm`` and
    ``head_drop``)."""
    return vit.forward_head(tokens, pre_logits=True)


# --------------------------------------------------------------------------------------------
# Fixed 2-D sine-cosine position embeddings
# --------------------------------------------------------------------------------------------

def sincos_pos_embed_2d(embed_dim: int, grid_size: int | Sequence[int],
                        num_prefix_tokens: int = 0) -> torch.Tensor:
    """MAE's fixed 2-D sine-cosine position embedding, ``[1, num_prefix_tokens + H * W, D]``
    (float32; the prefix rows, e.g. the class token's, are zeros).

    Patch ``n = r * W + c`` (row ``r``, column ``c``, row-major like the patch embedding's
    flattening) gets ``[sin(c * w), cos(c * w), sin(r * w), cos(r * w)]``, each block ``D / 4``
    wide, with ``w_i = 10000 ** (-i / (D / 4))`` for ``i = 0 .. D/4 - 1``: the first half of the
    dimensions encodes the column and the second half the row (MAE's ``get_2d_sincos_pos_embed``
    builds its grid with ``meshgrid(w, h)``, so its "h" half is the column index).
    ``grid_size``: ``G`` for a ``G x G`` grid, or ``(H, W)``. ``embed_dim`` must be a multiple of 4.
    """
    if embed_dim % 4:
        raise ValueError(f"embed_dim must be a multiple of 4 for a 2-D sin-cos embedding, got "
                         f"{embed_dim}")
    rows, cols = (grid_size, grid_size) if isinstance(grid_size, int) else tuple(grid_size)
    quarter = embed_dim // 4
    omega = 1.0 / 10000 ** (torch.arange(quarter, dtype=torch.float64) / quarter)
    r, c = torch.meshgrid(torch.arange(rows, dtype=torch.float64),
                          torch.arange(cols, dtype=torch.float64), indexing="ij")

    def encode(pos: torch.Tensor) -> torch.Tensor:
        angles = pos.reshape(-1, 1) * omega
        return torch.cat([angles.sin(), angles.cos()], dim=1)

    grid = torch.cat([encode(c), encode(r)], dim=1)
    prefix = torch.zeros(num_prefix_tokens, embed_dim, dtype=torch.float64)
    return torch.cat([prefix, grid], dim=0).unsqueeze(0).float()


def install_sincos_pos_embed(vit: nn.Module) -> torch.Tensor:
    """Replace ``vit.pos_embed`` (a learned Parameter) by the fixed :func:`sincos_pos_embed_2d` for
    its patch grid, registered as a persistent buffer under the same name: never trained, moved by
    ``.to()``, saved in ``state_dict`` under the key ``pos_embed`` (so checkpoints still load into a
    standard timm ViT). The class-token row, when the ViT has one, is zeros. Returns the buffer."""
    if getattr(vit, "pos_embed", None) is None:
        raise ValueError("this ViT has no position embedding (pos_embed None); build it with "
                         "pos_embed='learn' (timm's default) to install a sin-cos one")
    old = vit.pos_embed
    prefix = 0 if vit.no_embed_class else vit.num_prefix_tokens
    table = sincos_pos_embed_2d(old.shape[-1], vit.patch_embed.grid_size, prefix)
    if table.shape != old.shape:
        raise ValueError(f"sin-cos table {tuple(table.shape)} does not match pos_embed "
                         f"{tuple(old.shape)}")
    table = table.to(device=old.device, dtype=old.dtype)
    if "pos_embed" in vit._parameters:
        del vit._parameters["pos_embed"]
    vit.register_buffer("pos_embed", table)
    return vit.pos_embed


# --------------------------------------------------------------------------------------------
# FFN replacement
# --------------------------------------------------------------------------------------------

def parse_block_indices(block_indices: str | int | Iterable[int], depth: int) -> list[int]:
    """Block indices from ints or a comma-separated string (``"8,10"``); negative indices count
    from the end (``"-4,-2"`` is blocks 8 and 10 of a 12-block ViT). Raises on an index outside
    the depth, on duplicates (after resolving negatives) and on an empty list."""
    if isinstance(block_indices, str):
        try:
            raw = [int(part) for part in block_indices.split(",") if part.strip()]
        except ValueError:
            raise ValueError(f"block indices {block_indices!r} must be comma-separated integers "
                             "such as '8,10'") from None
    elif isinstance(block_indices, int):
        raw = [block_indices]
    else:
        raw = list(block_indices)
    if not raw:
        raise ValueError("no block index given")
    resolved = []
    for index in raw:
        if isinstance(index, bool) or not isinstance(index, int):
            raise TypeError(f"block index {index!r} is not an integer")
        if not -depth <= index < depth:
            raise ValueError(f"block index {index} is out of range for a ViT of depth {depth} "
                             f"(valid: 0..{depth - 1}, or -{depth}..-1 from the end)")
        resolved.append(index % depth)
    duplicates = sorted({i for i in resolved if resolved.count(i) > 1})
    if duplicates:
        raise ValueError(f"block indices {raw} name block(s) {duplicates} more than once "
                         f"(depth {depth})")
    return resolved


def replace_ffn(vit: nn.Module, block_indices: str | int | Iterable[int],
                factory: Callable[[int, nn.Module], nn.Module]) -> list[nn.Module]:
    """Replace ``vit.blocks[i].mlp`` by ``factory(i, old_mlp)`` for each index (see
    :func:`parse_block_indices`); the factory gets the dense module so that it can copy its
    weights. All indices are checked before any block changes. Returns the new modules in the
    order given."""
    blocks = _blocks(vit)
    indices = parse_block_indices(block_indices, len(blocks))
    for i in indices:
        if not isinstance(getattr(blocks[i], "mlp", None), nn.Module):
            raise TypeError(f"block {i} ({type(blocks[i]).__name__}) has no 'mlp' module")
    new_modules = []
    for i in indices:
        new = factory(i, blocks[i].mlp)
        if not isinstance(new, nn.Module):
            raise TypeError(f"the FFN factory returned {type(new).__name__} for block {i}; it "
                            "must return an nn.Module")
        blocks[i].mlp = new
        new_modules.append(new)
    return new_modules


# --------------------------------------------------------------------------------------------
# ERM's ViT featurizer
# --------------------------------------------------------------------------------------------

class ViTFeaturizer(StagedFeaturizer):
    """A timm ViT featurizer: ``forward(x)`` returns the pooled feature ``[B, n_outputs]``.

    hparams:
        ``vit_arch``: what :func:`create_vit` builds (a timm ViT name, a preset of
            :data:`VIT_PRESETS`, or ``"auto"``; default ``"auto"`` when absent);
        ``dinov2``: build DomainBed's DINOv2 ViT-B/14 (:data:`DINOV2_ARCH`) instead and use
            DomainBed's feature (``domainbed/networks.py``, ``DinoV2``): the normed class tokens of
            the last 4 blocks and the mean normed patch token of the last block, concatenated
            (``n_outputs = 5 * width``);
        ``vit_attn_tune``: train only parameters whose name contains ``attn``;
        ``vit_dropout``: dropout on the feature;
        ``pretrained``, ``pretrained_path``: as :func:`create_vit`.

    The feature is timm's pooled pre-logits (the final-normed class token for class-token ViTs);
    ``network`` is the timm model (no head). Unlike DomainBed's DinoV2, inputs with other than 3
    channels are accepted (pretrained patch filters are adapted; see :func:`create_vit`).

    Stages (the :class:`~dg_plugins.networks.staged.StagedFeaturizer` interface): the stem is
    :func:`embed_tokens`, stage ``blockI`` is ``network.blocks[I]`` (input ``[B, tokens, width]``,
    so a channel hook acts on the last dimension), the pool is :func:`pool_tokens` then dropout.
    The DINOv2 recipe pools over several blocks and has no stage access.
    """

    channel_dim = -1

    def __init__(self, input_shape: Sequence[int], hparams: Mapping):
        super().__init__()
        use_pretrained = hparams.get("pretrained", True)
        self.dinov2 = bool(hparams["dinov2"])
        arch = DINOV2_ARCH if self.dinov2 else hparams.get("vit_arch", "auto")
        self.network = create_vit(arch, input_shape, pretrained=use_pretrained,
                                  pretrained_path=hparams.get("pretrained_path"), num_classes=0)
        width = self.network.num_features
        self.n_outputs = 5 * width if self.dinov2 else width
        self.stage_names = tuple(f"block{i}" for i in range(len(self.network.blocks)))
        self.stage_widths = {name: self.network.embed_dim for name in self.stage_names}
        self.dropout = nn.Dropout(hparams["vit_dropout"])
        if hparams["vit_attn_tune"]:
            for name, p in self.network.named_parameters():
                p.requires_grad_("attn" in name)

    def stem(self, x: torch.Tensor) -> torch.Tensor:
        if self.dinov2:
            raise ValueError("the DINOv2 featurizer pools over several blocks and has no stage "
                             "access; use another vit_arch (hparam dinov2 false)")
        return embed_tokens(self.network, x)

    def stage(self, name: str) -> nn.Module:
        return self.network.blocks[self.stage_names.index(self.check_stage(name))]

    def pool(self, h: torch.Tensor) -> torch.Tensor:
        return self.dropout(pool_tokens(self.network, final_norm(self.network, h)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.dinov2:
            return self.dropout(self.network(x))
        blocks = self.network.get_intermediate_layers(x, n=4, return_prefix_tokens=True, norm=True)
        class_tokens = [prefix[:, 0] for _, prefix in blocks]
        mean_patch = blocks[-1][0].mean(dim=1)
        return self.dropout(torch.cat(class_tokens + [mean_patch], dim=-1))


__all__ = [
    "DEFAULT_ARCH_224", "DEFAULT_ARCH_28", "DINOV2_ARCH", "MaskedTokens", "VIT_28", "VIT_PRESETS",
    "VIT_TEST_224", "VIT_TINY_224", "VIT_TINY_28", "ViTDims", "ViTFeaturizer",
    "adapt_patch_embed_channels", "create_vit", "embed_patches", "embed_tokens", "final_norm",
    "install_sincos_pos_embed", "num_kept_tokens", "parse_block_indices", "pool_tokens",
    "prepend_prefix_tokens", "random_masking", "replace_ffn", "resolve_vit_arch",
    "restore_order", "run_blocks", "sincos_pos_embed_2d", "vit_dims", "vit_preset",
]
