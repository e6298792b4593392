"""Vision Transformer building blocks over timm's ``VisionTransformer``, shared by GMoE, ERM_ViT,
DisMAE, MAE and ERM's ViT featurizer: building (offline-safe, presets), tokens in timm's and
MAE's orders (He et al., CVPR 2022), MAE's sin-cos position embedding, FFN replacement (GMoE).
timm loads only when a model is built. Details: ``docs/networks.md``."""

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

#: ViT for 28x28 inputs: 4x4 patches (49 tokens plus CLS), width 64, 6 blocks, 4 heads (0.30M).
VIT_28 = "dg_vit_patch4_28"
#: Tiny 224x224 ViT for CPU tests: 32x32 patches, width 64, 4 blocks, 2 heads (0.35M).
VIT_TEST_224 = "dg_vit_test_patch32_224"
#: The two presets above cut to 2 blocks: what ``vit_arch "tiny"`` builds.
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
#: Named small ViTs that timm lacks (read-only ``VisionTransformer`` keyword arguments; no
#: published weights), accepted wherever a timm architecture is (e.g. hparam ``vit_arch``).
VIT_PRESETS: Mapping[str, Mapping] = MappingProxyType(
    {name: MappingProxyType(kwargs) for name, kwargs in _PRESETS.items()})

#: What ``"auto"`` builds for 224x224 inputs unless a method passes its paper's ViT.
DEFAULT_ARCH_224 = "vit_small_patch16_224.augreg_in21k_ft_in1k"
#: The architecture ``"auto"`` picks for 28x28 inputs.
DEFAULT_ARCH_28 = VIT_28
#: DomainBed's DINOv2 backbone (ViT-B/14), as a timm name; used when hparam ``dinov2`` is set.
DINOV2_ARCH = "vit_base_patch14_dinov2.lvd142m"

#: What ``"tiny"`` builds, per input size.
_TINY = {28: VIT_TINY_28, 224: VIT_TINY_224}


def vit_preset(name: str) -> dict:
    """A copy of preset ``name``'s ``VisionTransformer`` keyword arguments."""
    if name not in VIT_PRESETS:
        raise KeyError(f"unknown ViT preset {name!r}; presets: {sorted(VIT_PRESETS)}")
    return dict(VIT_PRESETS[name])


def resolve_vit_arch(arch: str, input_shape: Sequence[int], *,
                     arch_224: str = DEFAULT_ARCH_224) -> str:
    """The one rule choosing every ViT from the hparam ``vit_arch``: ``"auto"`` (``arch_224`` at
    224x224), ``"tiny"``, or a name (``docs/networks.md``)."""
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


def _timm():
    from dg_plugins import compat  # noqa: F401  (before timm)
    import timm

    return timm


def create_vit(arch: str, input_shape: Sequence[int], *, pretrained: bool,
               pretrained_path: str | None = None, drop_path_rate: float = 0.0,
               num_classes: int = 0, arch_224: str = DEFAULT_ARCH_224,
               **overrides) -> nn.Module:
    """A timm ``VisionTransformer`` for ``input_shape = (C, H, W)`` (``arch``:
    :func:`resolve_vit_arch`), pretrained or local weights' RGB filters adapted to ``C``."""
    shape = tuple(int(s) for s in input_shape)
    if len(shape) != 3:
        raise ValueError(f"input_shape must be (C, H, W), got {shape}")
    channels, height, width = shape
    name = resolve_vit_arch(arch, shape, arch_224=arch_224)
    is_preset = name in VIT_PRESETS
    # a name of weights.TIMM_HUB_IDS is timm's: no timm import before its weights check
    if not is_preset and name not in weights.TIMM_HUB_IDS and not _timm().is_model(name):
        raise ValueError(f"unknown ViT architecture {name!r}: expected 'auto', 'tiny', a preset "
                         f"{sorted(VIT_PRESETS)} or a timm model name (timm.list_models('vit_*'))")
    local_path = pretrained_path if pretrained else None
    download = bool(pretrained) and not local_path and not is_preset
    build_channels = 3 if download or local_path else channels
    kwargs = dict(img_size=(height, width) if height != width else height,
                  in_chans=build_channels, num_classes=num_classes,
                  drop_path_rate=drop_path_rate)
    if is_preset:
        kwargs = {**vit_preset(name), **kwargs, **overrides}
        model = _timm().models.vision_transformer.VisionTransformer(**kwargs)
    else:
        try:
            model = weights.timm_model(name, download, **{**kwargs, **overrides})
        except TypeError as err:  # e.g. a CNN given img_size: not a ViT
            raise ValueError(f"timm model {name!r} could not be built as a ViT ({err}); "
                             f"{_CHOOSE_A_VIT}") from err
    if not isinstance(model, _timm().models.vision_transformer.VisionTransformer):
        raise ValueError(f"{name!r} builds a timm {type(model).__name__}, not a timm "
                         f"VisionTransformer; {_CHOOSE_A_VIT}")
    patch = tuple(model.patch_embed.patch_size)
    if not getattr(model.patch_embed, "dynamic_img_pad", False) and (height % patch[0]
                                                                     or width % patch[1]):
        raise ValueError(f"input size {(height, width)} is not a multiple of {name!r}'s patch "
                         f"size {patch}; use vit_arch 'auto' or a preset {sorted(VIT_PRESETS)}, "
                         "or override patch_size")
    if local_path:
        weights.load_local_weights(model, local_path)
    if build_channels != channels:  # RGB filters adapted by timm's adapt_input_conv
        from timm.models import adapt_input_conv

        proj = model.patch_embed.proj
        new = nn.Conv2d(channels, proj.out_channels, kernel_size=proj.kernel_size,
                        stride=proj.stride, padding=proj.padding, bias=proj.bias is not None)
        new.to(device=proj.weight.device, dtype=proj.weight.dtype)
        with torch.no_grad():
            new.weight.copy_(adapt_input_conv(channels, proj.weight))
            if proj.bias is not None:
                new.bias.copy_(proj.bias)
        model.patch_embed.proj = new
        model.in_chans = channels
    return model


_CHOOSE_A_VIT = ("choose a ViT architecture (timm.list_models('vit_*'), 'deit_*', ...), a preset "
                 f"{sorted(VIT_PRESETS)}, 'auto' or 'tiny'")


class ViTDims(NamedTuple):
    depth: int
    embed_dim: int
    num_heads: int
    mlp_hidden_dim: int
    patch_size: tuple[int, int]
    grid_size: tuple[int, int]
    num_patches: int
    num_prefix_tokens: int


def vit_dims(vit: nn.Module) -> ViTDims:
    """Sizes of a timm ViT (FFN width read from block 0's ``mlp.fc1``)."""
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


def embed_tokens(vit: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Images -> tokens ``[B, P + N, D]``: timm's ``forward_features`` before the blocks."""
    return vit.norm_pre(vit.patch_drop(vit._pos_embed(vit.patch_embed(x))))


def embed_patches(vit: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Images -> position-embedded patch tokens ``[B, N, D]`` (MAE order, no prefix tokens);
    the position embedding resampled for a dynamic-size ViT."""
    x = vit.patch_embed(x)
    grid = tuple(vit.patch_embed.grid_size)
    if x.ndim == 4:  # dynamic_img_size: NHWC, flattened after the position embedding
        grid, x = (x.shape[1], x.shape[2]), x.flatten(1, 2)
    pos = vit.pos_embed
    if pos is None:
        return x
    prefix = 0 if vit.no_embed_class else vit.num_prefix_tokens
    if grid != tuple(vit.patch_embed.grid_size):
        from timm.layers import resample_abs_pos_embed

        pos = resample_abs_pos_embed(pos, new_size=grid, old_size=vit.patch_embed.grid_size,
                                     num_prefix_tokens=prefix)
    return x + pos[:, prefix:]


def prepend_prefix_tokens(vit: nn.Module, patches: torch.Tensor) -> torch.Tensor:
    """``[B, K, D]`` -> ``[B, P + K, D]``: prefix tokens in front, ``pos_drop``, ``norm_pre``."""
    prefix = [t for t in (vit.cls_token, getattr(vit, "reg_token", None)) if t is not None]
    if prefix:
        prefix = torch.cat(prefix, dim=1)
        if vit.pos_embed is not None and not vit.no_embed_class:
            prefix = prefix + vit.pos_embed[:, :vit.num_prefix_tokens]
        patches = torch.cat([prefix.expand(patches.shape[0], -1, -1), patches], dim=1)
    return vit.norm_pre(vit.pos_drop(patches))


def num_kept_tokens(num_tokens: int, mask_ratio: float) -> int:
    """MAE's ``int(L * (1 - mask_ratio))``, robust to float error just below an integer."""
    if not 0.0 <= mask_ratio < 1.0:
        raise ValueError(f"mask_ratio must be in [0, 1), got {mask_ratio}")
    kept = int(math.floor(num_tokens * (1.0 - mask_ratio) + 1e-6))
    if kept < 1:
        raise ValueError(f"mask_ratio {mask_ratio} keeps no token of {num_tokens}; the largest "
                         f"ratio keeping one is {1 - 1 / num_tokens:.4f}")
    return kept


@dataclass
class MaskedTokens:
    """Output of :func:`random_masking` (MAE's conventions: ``mask`` 1 where removed)."""

    tokens: torch.Tensor
    mask: torch.Tensor
    ids_restore: torch.Tensor
    ids_keep: torch.Tensor


def random_masking(tokens: torch.Tensor, mask_ratio: float, *,
                   generator: torch.Generator | None = None) -> MaskedTokens:
    """Keep a random :func:`num_kept_tokens` subset of each sample's tokens (MAE's)."""
    batch, num, dim = tokens.shape
    kept = num_kept_tokens(num, mask_ratio)
    noise = torch.rand(batch, num, device=tokens.device, generator=generator)
    ids_shuffle = torch.argsort(noise, dim=1)
    ids_restore = torch.argsort(ids_shuffle, dim=1)
    ids_keep = ids_shuffle[:, :kept]
    kept_tokens = torch.gather(tokens, 1, ids_keep.unsqueeze(-1).expand(-1, -1, dim))
    mask = (ids_restore >= kept).to(tokens.dtype)  # removed: shuffled to a place past ``kept``
    return MaskedTokens(kept_tokens, mask, ids_restore, ids_keep)


def restore_order(kept: torch.Tensor, ids_restore: torch.Tensor,
                  fill: torch.Tensor) -> torch.Tensor:
    """Undo :func:`random_masking`'s shuffle, ``fill`` at the removed positions."""
    batch, k, dim = kept.shape
    num = ids_restore.shape[1]
    fill = fill.to(kept.dtype).reshape(-1, 1, dim).expand(batch, num - k, dim)
    shuffled = torch.cat([kept, fill], dim=1)
    return torch.gather(shuffled, 1, ids_restore.unsqueeze(-1).expand(-1, -1, dim))


def run_blocks(vit: nn.Module, tokens: torch.Tensor, start: int = 0,
               end: int | None = None) -> torch.Tensor:
    """Blocks ``start <= i < end`` on ``tokens`` (checkpointed when timm's is on)."""
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
    return vit.norm(tokens)


def pool_tokens(vit: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Normed tokens -> the pooled feature ``[B, D]`` (timm's ``forward_head(pre_logits=True)``)."""
    return vit.forward_head(tokens, pre_logits=True)


def sincos_pos_embed_2d(embed_dim: int, grid_size: int | Sequence[int],
                        num_prefix_tokens: int = 0) -> torch.Tensor:
    """MAE's fixed 2-D sine-cosine position embedding ``[1, P + H * W, D]``, prefix rows 0."""
    if embed_dim % 4:
        raise ValueError(f"embed_dim must be a multiple of 4 for a 2-D sin-cos embedding, got "
                         f"{embed_dim}")
    rows, cols = (grid_size, grid_size) if isinstance(grid_size, int) else tuple(grid_size)
    quarter = embed_dim // 4
    omega = 1.0 / 10000 ** (torch.arange(quarter, dtype=torch.float64) / quarter)
    r, c = torch.meshgrid(torch.arange(rows, dtype=torch.float64),
                          torch.arange(cols, dtype=torch.float64), indexing="ij")
    angles = [pos.reshape(-1, 1) * omega for pos in (c, r)]  # MAE's order: column, then row
    grid = torch.cat([t for a in angles for t in (a.sin(), a.cos())], dim=1)
    prefix = torch.zeros(num_prefix_tokens, embed_dim, dtype=torch.float64)
    return torch.cat([prefix, grid], dim=0).unsqueeze(0).float()


def install_sincos_pos_embed(vit: nn.Module) -> torch.Tensor:
    """Replace ``vit.pos_embed`` by the fixed sin-cos table (a buffer of the same name)."""
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
    vit._parameters.pop("pos_embed", None)
    vit.register_buffer("pos_embed", table)
    return vit.pos_embed


def replace_ffn(vit: nn.Module, block_indices: str | int | Iterable[int],
                factory: Callable[[int, nn.Module], nn.Module]) -> list[nn.Module]:
    """Replace ``vit.blocks[i].mlp`` by ``factory(i, old_mlp)`` for the block indices, ints or
    ``"8,10"`` (negative from the end), all checked first."""
    blocks = _blocks(vit)
    depth = len(blocks)
    if isinstance(block_indices, str):
        try:
            raw = [int(part) for part in block_indices.split(",") if part.strip()]
        except ValueError:
            raise ValueError(f"block indices {block_indices!r} must be comma-separated integers "
                             "such as '8,10'") from None
    else:
        raw = [block_indices] if isinstance(block_indices, int) else list(block_indices)
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
    if duplicates := sorted({i for i in resolved if resolved.count(i) > 1}):
        raise ValueError(f"block indices {raw} name block(s) {duplicates} more than once "
                         f"(depth {depth})")
    for i in resolved:
        if not isinstance(getattr(blocks[i], "mlp", None), nn.Module):
            raise TypeError(f"block {i} ({type(blocks[i]).__name__}) has no 'mlp' module")
    new_modules = []
    for i in resolved:
        new = factory(i, blocks[i].mlp)
        if not isinstance(new, nn.Module):
            raise TypeError(f"the FFN factory returned {type(new).__name__} for block {i}; it "
                            "must return an nn.Module")
        blocks[i].mlp = new
        new_modules.append(new)
    return new_modules


class ViTFeaturizer(StagedFeaturizer):
    """ERM's timm ViT featurizer, or DomainBed's DINOv2 recipe with ``dinov2``."""

    channel_dim = -1

    def __init__(self, input_shape: Sequence[int], hparams: Mapping):
        super().__init__()
        self.dinov2 = bool(hparams["dinov2"])
        arch = DINOV2_ARCH if self.dinov2 else hparams.get("vit_arch", "auto")
        self.network = create_vit(arch, input_shape, pretrained=hparams.get("pretrained", True),
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
        return self.dropout(torch.cat(class_tokens + [blocks[-1][0].mean(dim=1)], dim=-1))

