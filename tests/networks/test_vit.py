"""Shared ViT building blocks: builder and presets, token helpers, masking, sin-cos position
embeddings, FFN replacement, ViTFeaturizer. CPU, random init, tiny models."""

import math
import time

import pytest
import torch
import torch.nn as nn

from dg_plugins.networks import pretrained as weights
from dg_plugins.networks import vit as V

TINY = V.VIT_TEST_224


def tiny_vit(**overrides):
    torch.manual_seed(0)
    return V.create_vit(TINY, (3, 224, 224), pretrained=False, **overrides).eval()


def coded_tokens(batch, num, dim=3):
    """tokens[b, n] = (1000 b + n, random...): a token's first value names it."""
    tokens = torch.randn(batch, num, dim)
    tokens[:, :, 0] = 1000 * torch.arange(batch).unsqueeze(1) + torch.arange(num)
    return tokens


# ---------------------------------------------------------------------------------------------
# masking

@pytest.mark.parametrize("num, ratio, kept", [
    (196, 0.8, 39), (196, 0.7, 58), (196, 0.75, 49), (49, 0.8, 9), (49, 0.0, 49), (10, 0.9, 1)])
def test_num_kept_tokens_floors_like_mae(num, ratio, kept):
    assert V.num_kept_tokens(num, ratio) == kept


@pytest.mark.parametrize("num, ratio, match", [
    (196, 1.0, r"\[0, 1\)"), (196, -0.1, r"\[0, 1\)"), (49, 0.99, "keeps no token")])
def test_num_kept_tokens_rejects_bad_ratios(num, ratio, match):
    with pytest.raises(ValueError, match=match):
        V.num_kept_tokens(num, ratio)


def test_random_masking_keeps_the_indexed_tokens_independently_per_sample():
    batch, num = 8, 49
    tokens = coded_tokens(batch, num)
    out = V.random_masking(tokens, 0.8, generator=torch.Generator().manual_seed(0))
    kept = V.num_kept_tokens(num, 0.8)
    assert out.tokens.shape == (batch, kept, 3) and out.ids_keep.shape == (batch, kept)
    assert out.mask.shape == (batch, num) and out.ids_restore.shape == (batch, num)
    # exactly `kept` tokens per sample, a different subset for every sample
    assert torch.equal(out.mask.sum(1), torch.full((batch,), float(num - kept)))
    assert len({tuple(row.tolist()) for row in out.mask}) == batch
    for b in range(batch):
        # the kept tokens are the ones ids_keep names, and the mask is 0 exactly there
        assert torch.equal(out.tokens[b, :, 0], 1000 * b + out.ids_keep[b].float())
        assert torch.equal(out.tokens[b], tokens[b, out.ids_keep[b]])
        zero = set(torch.nonzero(out.mask[b] == 0).flatten().tolist())
        assert zero == set(out.ids_keep[b].tolist())


def test_restore_order_inverts_the_shuffle():
    tokens = coded_tokens(4, 16)
    full = V.random_masking(tokens, 0.0)  # keeps everything, shuffled
    assert not torch.equal(full.tokens, tokens)
    assert torch.equal(V.restore_order(full.tokens, full.ids_restore, torch.zeros(3)), tokens)
    part = V.random_masking(tokens, 0.75)
    fill = torch.full((1, 1, 3), -7.0)
    restored = V.restore_order(part.tokens, part.ids_restore, fill)
    kept = part.mask == 0
    assert torch.equal(restored[kept], tokens[kept])
    assert torch.equal(restored[~kept], fill.squeeze(0).expand(int((~kept).sum()), 3))


def test_masking_generator_makes_draws_reproducible():
    tokens = coded_tokens(2, 49)
    a = V.random_masking(tokens, 0.8, generator=torch.Generator().manual_seed(3))
    b = V.random_masking(tokens, 0.8, generator=torch.Generator().manual_seed(3))
    c = V.random_masking(tokens, 0.8, generator=torch.Generator().manual_seed(4))
    assert torch.equal(a.ids_keep, b.ids_keep) and not torch.equal(a.ids_keep, c.ids_keep)


# ---------------------------------------------------------------------------------------------
# sin-cos position embeddings

def test_sincos_values_match_the_formula():
    dim, grid = 16, 4
    table = V.sincos_pos_embed_2d(dim, grid, num_prefix_tokens=1)
    assert table.shape == (1, 1 + grid * grid, dim) and table.dtype == torch.float32
    assert torch.equal(table[0, 0], torch.zeros(dim))  # class-token row
    quarter = dim // 4

    def expected(row, col, j):  # MAE: first half encodes the column, second half the row
        pos = col if j < 2 * quarter else row
        i = j % quarter
        angle = pos / 10000 ** (i / quarter)
        return math.sin(angle) if (j // quarter) % 2 == 0 else math.cos(angle)

    for row, col in [(0, 0), (0, 3), (2, 1), (3, 3)]:
        for j in [0, 1, 3, 4, 6, 8, 9, 12, 15]:
            value = table[0, 1 + row * grid + col, j].item()
            assert value == pytest.approx(expected(row, col, j), abs=1e-6), (row, col, j)
    rect = V.sincos_pos_embed_2d(8, (2, 3))  # non-square grid, no prefix
    assert rect.shape == (1, 6, 8)
    assert rect[0, 4, 0].item() == pytest.approx(math.sin(1.0))  # row 1, column 1
    assert rect[0, 5, 4].item() == pytest.approx(math.sin(1.0))  # row 1: second half
    assert rect[0, 5, 0].item() == pytest.approx(math.sin(2.0))  # column 2: first half
    with pytest.raises(ValueError, match="multiple of 4"):
        V.sincos_pos_embed_2d(10, 4)


def test_installed_sincos_embedding_is_a_frozen_buffer():
    net = tiny_vit().train()
    buffer = V.install_sincos_pos_embed(net)
    assert net.pos_embed is buffer and not buffer.requires_grad
    assert "pos_embed" not in dict(net.named_parameters())
    assert torch.equal(net.state_dict()["pos_embed"], V.sincos_pos_embed_2d(64, 7, 1))
    before = buffer.clone()
    optimizer = torch.optim.SGD(net.parameters(), lr=1.0)
    net(torch.randn(2, 3, 224, 224)).pow(2).sum().backward()
    optimizer.step()
    assert torch.equal(net.pos_embed, before)
    # the key is unchanged, so the checkpoint still loads into a standard timm ViT
    tiny_vit().load_state_dict(net.state_dict())


# ---------------------------------------------------------------------------------------------
# token helpers

@pytest.mark.parametrize("overrides", [{}, {"global_pool": "avg"}, {"no_embed_class": True}])
def test_token_helpers_reproduce_timm_forward(overrides):
    net = tiny_vit(drop_path_rate=0.1, **overrides)
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        tokens = V.embed_tokens(net, x)
        assert tokens.shape == (2, 1 + 49, 64)
        whole = V.final_norm(net, V.run_blocks(net, tokens))
        split = V.final_norm(net, V.run_blocks(net, V.run_blocks(net, tokens, 0, 1), 1, None))
        reference = net.forward_features(x)
        assert torch.allclose(whole, reference, atol=1e-6)
        assert torch.allclose(split, reference, atol=1e-6)
        assert torch.allclose(V.pool_tokens(net, whole), net(x), atol=1e-6)


def test_mae_order_embedding_masks_position_embedded_patches():
    net = tiny_vit()
    x = torch.randn(3, 3, 224, 224)
    with torch.no_grad():
        out = V.random_masking(V.embed_patches(net, x), 0.8,
                               generator=torch.Generator().manual_seed(0))
        out.tokens = V.prepend_prefix_tokens(net, out.tokens)
        patches = net.patch_embed(x) + net.pos_embed[:, 1:]
        kept = V.num_kept_tokens(49, 0.8)
        assert out.tokens.shape == (3, 1 + kept, 64)
        cls = (net.cls_token[0, 0] + net.pos_embed[0, 0]).expand(3, 64)
        assert torch.allclose(out.tokens[:, 0], cls)
        for b in range(3):
            assert torch.allclose(out.tokens[b, 1:], patches[b, out.ids_keep[b]])
        # nothing masked: the same CLS feature as the unmasked forward (attention does not care
        # about token order once positions are embedded)
        full = V.prepend_prefix_tokens(net, V.random_masking(V.embed_patches(net, x), 0.0).tokens)
        cls = V.pool_tokens(net, V.final_norm(net, V.run_blocks(net, full)))
        assert torch.allclose(cls, net(x), atol=1e-5)


def test_run_blocks_rejects_bad_ranges():
    net = tiny_vit()
    tokens = torch.zeros(1, 50, 64)
    for start, end in [(-1, 2), (3, 2), (0, 5)]:
        with pytest.raises(ValueError, match="4 blocks"):
            V.run_blocks(net, tokens, start, end)


# ---------------------------------------------------------------------------------------------
# FFN replacement

class SameFFN(nn.Module):
    """A different module computing the dense FFN's function (its own copies of fc1/fc2)."""

    def __init__(self, dense):
        super().__init__()
        self.fc1 = nn.Linear(dense.fc1.in_features, dense.fc1.out_features)
        self.fc2 = nn.Linear(dense.fc2.in_features, dense.fc2.out_features)
        self.fc1.load_state_dict(dense.fc1.state_dict())
        self.fc2.load_state_dict(dense.fc2.state_dict())

    def forward(self, x):
        return self.fc2(nn.functional.gelu(self.fc1(x)))


def test_replace_ffn_puts_the_factorys_module_in_exactly_the_chosen_blocks():
    net = tiny_vit()
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        before = net(x)
    old = [block.mlp for block in net.blocks]
    calls = []

    def factory(index, dense):
        calls.append((index, dense))
        return SameFFN(dense)

    new = V.replace_ffn(net, "1,-1", factory)
    assert [i for i, _ in calls] == [1, 3]
    assert all(dense is old[i] for i, dense in calls)  # the factory got the dense module
    assert [net.blocks[1].mlp, net.blocks[3].mlp] == new
    assert all(isinstance(m, SameFFN) for m in new)
    assert net.blocks[0].mlp is old[0] and net.blocks[2].mlp is old[2]
    with torch.no_grad():
        assert torch.allclose(net(x), before, atol=1e-5)
        # and the new module is really used: a different function changes the output
        V.replace_ffn(net, [2], lambda i, dense: ZeroFFN())
        assert not torch.allclose(net(x), before, atol=1e-3)


class ZeroFFN(nn.Module):
    def forward(self, x):
        return torch.zeros_like(x)


@pytest.mark.parametrize("indices, error, match", [
    ([0, 4], ValueError, r"out of range for a ViT of depth 4 \(valid: 0\.\.3"),
    ("8,10", ValueError, "depth 4"),
    ([0, 1, -3], ValueError, r"block\(s\) \[1\] more than once"),
    ("1,x", ValueError, "comma-separated integers"),
    ([1.0], TypeError, "not an integer"),
    ([], ValueError, "no block index"),
])
def test_replace_ffn_rejects_bad_indices_before_changing_anything(indices, error, match):
    net = tiny_vit()
    old = [block.mlp for block in net.blocks]
    with pytest.raises(error, match=match):
        V.replace_ffn(net, indices, lambda i, dense: ZeroFFN())
    assert [block.mlp for block in net.blocks] == old  # block 0 is not replaced either


def test_vit_dims():
    dims = V.vit_dims(V.create_vit("auto", (1, 28, 28), pretrained=False))
    assert dims == V.ViTDims(depth=6, embed_dim=64, num_heads=4, mlp_hidden_dim=256,
                             patch_size=(4, 4), grid_size=(7, 7), num_patches=49,
                             num_prefix_tokens=1)
    assert V.vit_preset(TINY)["depth"] == 4 and V.VIT_PRESETS[TINY]["embed_dim"] == 64


# ---------------------------------------------------------------------------------------------
# building

@pytest.mark.parametrize("shape", [(1, 28, 28), (3, 28, 28)])
def test_auto_picks_the_28x28_preset(shape):
    net = V.create_vit("auto", shape, pretrained=True)  # presets have no weights: random init
    assert V.resolve_vit_arch("auto", shape) == V.VIT_28
    assert net.patch_embed.proj.in_channels == shape[0] and V.vit_dims(net).depth == 6
    assert net(torch.randn(2, *shape)).shape == (2, 64)


def test_auto_for_224_uses_the_given_timm_arch_and_other_shapes_raise():
    assert V.resolve_vit_arch("auto", (3, 224, 224)) == V.DEFAULT_ARCH_224
    assert V.resolve_vit_arch("auto", (3, 224, 224), arch_224="deit_small_patch16_224") == \
        "deit_small_patch16_224"
    assert V.resolve_vit_arch("vit_tiny_patch16_224", (3, 64, 64)) == "vit_tiny_patch16_224"
    net = V.create_vit("auto", (3, 224, 224), pretrained=False, arch_224=TINY, num_classes=5)
    assert net(torch.randn(1, 3, 224, 224)).shape == (1, 5)
    with pytest.raises(ValueError, match=r"'auto' has no rule for input shape \(3, 64, 64\).*"
                                         r"\(C, 28, 28\).*\(C, 224, 224\)"):
        V.create_vit("auto", (3, 64, 64), pretrained=False)


@pytest.mark.parametrize("shape, preset, grid", [((1, 28, 28), V.VIT_TINY_28, (7, 7)),
                                                 ((3, 224, 224), V.VIT_TINY_224, (7, 7))])
def test_tiny_is_the_two_block_preset_of_the_input_size(shape, preset, grid):
    assert V.resolve_vit_arch("tiny", shape) == preset
    assert V.resolve_vit_arch("tiny", shape, arch_224="deit_small_patch16_224") == preset
    net = V.create_vit("tiny", shape, pretrained=False)
    dims = V.vit_dims(net)
    assert (dims.depth, dims.embed_dim, dims.grid_size) == (2, 64, grid)
    with pytest.raises(ValueError, match=r"'tiny' has no rule for input shape \(3, 32, 32\)"):
        V.create_vit("tiny", (3, 32, 32), pretrained=False)


# Every model of the package that builds a ViT, and how to reach it: one hparam (vit_arch), one
# rule (resolve_vit_arch), each model's paper backbone for "auto" at 224x224.
VIT_MODELS = {
    "ERM": (dict(backbone="vit"), lambda a: a.featurizer.network, V.DEFAULT_ARCH_224, 384),
    "ERM_ViT": ({}, lambda a: a.network, "deit_small_patch16_224", 384),
    "GMoE": ({}, lambda a: a.network, "deit_small_patch16_224", 384),
    "DisMAE": ({}, lambda a: a.encoder, "vit_base_patch16_224", 768),
    "MAE": ({}, lambda a: a.encoder, "vit_base_patch16_224", 768),
}


@pytest.mark.parametrize("algorithm", sorted(VIT_MODELS))
def test_every_vit_model_follows_vit_arch(algorithm):
    import dg_plugins.algorithms  # noqa: F401  (registers the algorithms)
    import dg_plugins.datasets  # noqa: F401
    from support.helpers import tiny_hparams
    from dg_plugins.registry import ALGORITHMS

    extra, vit_of, _, _ = VIT_MODELS[algorithm]
    cls = ALGORITHMS.get(algorithm)
    tiny = cls((1, 28, 28), 10, 2, tiny_hparams(algorithm, "Debug28", vit_arch="tiny", **extra))
    assert V.vit_dims(vit_of(tiny)).depth == 2
    auto = cls((1, 28, 28), 10, 2, tiny_hparams(algorithm, "Debug28", vit_arch="auto", **extra))
    assert V.vit_dims(vit_of(auto)).depth == V.vit_preset(V.VIT_28)["depth"]


@pytest.mark.parametrize("algorithm", sorted(VIT_MODELS))
def test_auto_at_224_is_each_models_paper_backbone(algorithm, monkeypatch):
    import dg_plugins.algorithms  # noqa: F401
    from support.helpers import tiny_hparams
    from dg_plugins.registry import ALGORITHMS

    extra, vit_of, paper_arch, width = VIT_MODELS[algorithm]
    asked = []
    resolve = V.resolve_vit_arch
    monkeypatch.setattr(V, "resolve_vit_arch",
                        lambda *a, **k: asked.append(resolve(*a, **k)) or asked[-1])
    hp = tiny_hparams(algorithm, "PACS", vit_arch="auto", **extra)
    with torch.device("meta"):
        model = ALGORITHMS.get(algorithm)((3, 224, 224), 7, 3, hp)
    assert asked and set(asked) == {paper_arch}
    assert V.vit_dims(vit_of(model)).embed_dim == width


def test_timm_arch_by_name_at_the_input_size():
    net = V.create_vit("deit_tiny_patch16_224", (1, 224, 224), pretrained=False,
                       drop_path_rate=0.1)
    assert net.patch_embed.proj.in_channels == 1 and V.vit_dims(net).embed_dim == 192
    assert net.blocks[-1].drop_path1.drop_prob == pytest.approx(0.1)
    small = V.create_vit("vit_tiny_patch16_224", (3, 32, 32), pretrained=False)
    assert V.vit_dims(small).grid_size == (2, 2)


@pytest.mark.parametrize("arch, shape, match", [
    ("no_such_vit", (3, 224, 224), "unknown ViT architecture 'no_such_vit'"),
    ("resnet18", (3, 224, 224), "could not be built as a ViT"),
    ("vit_tiny_patch16_224", (3, 28, 28), "not a multiple of .* patch size"),
])
def test_bad_architectures_raise_clearly(arch, shape, match):
    with pytest.raises(ValueError, match=match):
        V.create_vit(arch, shape, pretrained=False)


def test_offline_pretrained_timm_weights_fail_fast_with_the_fixes():
    start = time.time()
    with pytest.raises(weights.PretrainedWeightsUnavailable) as err:
        V.create_vit("vit_tiny_patch16_224", (3, 224, 224), pretrained=True)
    assert time.time() - start < 30
    message = str(err.value)
    assert "timm vit_tiny_patch16_224" in message and "pretrained_path" in message
    assert '"pretrained": false' in message


def test_local_checkpoint_loads_head_keys_ignored(tmp_path):
    source = tiny_vit(num_classes=7)
    path = tmp_path / "vit.pth"
    torch.save({"model": source.state_dict()}, path)  # with head.weight / head.bias
    torch.manual_seed(1)
    loaded = V.create_vit(TINY, (3, 224, 224), pretrained=True, pretrained_path=str(path)).eval()
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        assert torch.equal(loaded(x), source.forward_head(source.forward_features(x),
                                                          pre_logits=True))
    # a 3-channel checkpoint into a 1-channel model: the RGB patch filters are summed (timm's rule)
    gray = V.create_vit(TINY, (1, 224, 224), pretrained=True, pretrained_path=str(path))
    assert torch.allclose(gray.patch_embed.proj.weight,
                          source.patch_embed.proj.weight.sum(1, keepdim=True))
    assert gray(torch.randn(1, 1, 224, 224)).shape == (1, 64)
    with pytest.raises(ValueError, match="does not fit"):
        V.create_vit(TINY, (3, 224, 224), pretrained=True, pretrained_path=str(path), depth=5)
    # pretrained false: the checkpoint is not used
    fresh = V.create_vit(TINY, (3, 224, 224), pretrained=False, pretrained_path=str(path))
    assert not torch.equal(fresh.patch_embed.proj.weight, source.patch_embed.proj.weight)


# ---------------------------------------------------------------------------------------------
# ViTFeaturizer

def featurizer_hparams(**overrides):
    hp = dict(vit=True, vit_arch=TINY, dinov2=False, vit_attn_tune=False, vit_dropout=0.0,
              pretrained=False, pretrained_path=None)
    hp.update(overrides)
    return hp


def test_vit_featurizer_returns_the_pooled_feature():
    torch.manual_seed(0)
    net = V.ViTFeaturizer((3, 224, 224), featurizer_hparams()).eval()
    x = torch.randn(2, 3, 224, 224)
    assert net.n_outputs == 64
    with torch.no_grad():
        vit = net.network
        tokens = V.final_norm(vit, V.run_blocks(vit, V.embed_tokens(vit, x)))
        assert torch.allclose(net(x), tokens[:, 0], atol=1e-6)  # the normed class token
    mnist = V.ViTFeaturizer((1, 28, 28), featurizer_hparams(vit_arch="auto", pretrained=True))
    assert mnist.n_outputs == 64 and mnist(torch.randn(2, 1, 28, 28)).shape == (2, 64)
    dropped = V.ViTFeaturizer((3, 224, 224), featurizer_hparams(vit_dropout=0.5)).train()
    assert (dropped(x) == 0).float().mean() > 0.3


def test_vit_featurizer_attention_only_tuning():
    net = V.ViTFeaturizer((3, 224, 224), featurizer_hparams(vit_attn_tune=True))
    trainable = {n for n, p in net.named_parameters() if p.requires_grad}
    assert trainable and all("attn" in n for n in trainable)
    assert {n for n, _ in net.named_parameters() if "attn" in n} == trainable
    net(torch.randn(2, 3, 224, 224)).sum().backward()
    assert all((p.grad is not None) == p.requires_grad for p in net.parameters())


def test_vit_featurizer_dinov2_recipe(monkeypatch):
    # DomainBed's DINOv2 feature on a tiny stand-in backbone (the recipe does not depend on size)
    monkeypatch.setattr(V, "DINOV2_ARCH", TINY)
    torch.manual_seed(0)
    net = V.ViTFeaturizer((3, 224, 224), featurizer_hparams(dinov2=True, vit_arch="ignored")).eval()
    assert net.n_outputs == 5 * 64
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        tokens, outs = V.embed_tokens(net.network, x), []
        for i in range(4):
            tokens = V.run_blocks(net.network, tokens, i, i + 1)
            outs.append(V.final_norm(net.network, tokens))
        expected = torch.cat([o[:, 0] for o in outs] + [outs[-1][:, 1:].mean(1)], dim=-1)
        assert torch.allclose(net(x), expected, atol=1e-5)
    with pytest.raises(weights.PretrainedWeightsUnavailable, match="timm vit_tiny_patch16_224"):
        V.ViTFeaturizer((3, 224, 224), featurizer_hparams(vit_arch="vit_tiny_patch16_224",
                                                          pretrained=True))
