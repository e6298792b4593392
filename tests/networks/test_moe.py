"""The MoE FFN layer (dg_plugins.networks.moe), checked against independent computations: a
per-token Python reference of routing, capacity and combination, the closed forms of the router
and of the load/importance loss."""

import math

import pytest
import torch
import torch.nn as nn

from dg_plugins import compat  # noqa: F401  (before timm)
from dg_plugins.networks import moe as M


def dense_mlp(dim=8, hidden=16, seed=0):
    from timm.layers import Mlp

    torch.manual_seed(seed)
    return Mlp(dim, hidden).eval()


def layer_from(mlp, **kwargs):
    kwargs.setdefault("expert_dropout", 0.0)
    kwargs.setdefault("router_dim", 6)
    return M.MoEFFN.from_dense(mlp, **kwargs)


def reference_slots(experts, priority, num_experts):
    """Per-assignment loop: all first choices (tokens by decreasing priority, ties by index),
    then all second choices, each taking the next free slot of its expert."""
    num_tokens, top_k = experts.shape
    order = sorted(range(num_tokens), key=lambda t: (-float(priority[t]), t))
    fill = [0] * num_experts
    slots = torch.zeros_like(experts)
    for j in range(top_k):
        for t in order:
            e = int(experts[t, j])
            slots[t, j] = fill[e]
            fill[e] += 1
    return slots


def reference_forward(layer, x, logits, capacity):
    """Per-token reference of the layer's output for given (noise-free) router logits."""
    scores = torch.softmax(logits.float(), dim=1)
    top, experts = torch.topk(scores, layer.top_k, dim=1)
    gates = top / top.sum(1, keepdim=True) if layer.top_k > 1 else top
    slots = reference_slots(experts, top[:, 0], layer.num_experts)
    y = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(layer.top_k):
            if slots[t, j] < capacity:
                e = int(experts[t, j])
                h = torch.nn.functional.gelu(x[t] @ layer.w1[e].T + layer.b1[e])
                y[t] += gates[t, j] * (h @ layer.w2[e].T + layer.b2[e])
    return y, slots < capacity


# ------------------------------------------------------------------------------------------------
# capacity and slots

@pytest.mark.parametrize("tokens, experts, k, factor, expected", [
    (10, 3, 1, 1.5, 6),            # ceil(10/3)=4 -> floor(6.0)=6
    (394, 6, 1, 1.5, 99),          # 2 DeiT images: ceil(394/6)=66 -> 99
    (394, 6, 2, 1.5, 198),
    (7, 6, 1, 1.0, 2),             # ceil(7/6)=2
    (100, 6, 1, 0.1, 1),           # floor(0.1*17)=1
    (100, 6, 1, None, 100),        # no dropping
])
def test_expert_capacity_is_k_times_floor_factor_times_ceil_tokens_per_expert(
        tokens, experts, k, factor, expected):
    assert M.expert_capacity(tokens, experts, k, factor) == expected


def test_expert_capacity_rejects_a_non_positive_factor():
    with pytest.raises(ValueError, match="capacity_factor must be > 0"):
        M.expert_capacity(10, 2, 1, 0.0)


@pytest.mark.parametrize("top_k", [1, 2])
def test_slots_are_assigned_in_batch_priority_order(top_k):
    torch.manual_seed(0)
    num_tokens, num_experts = 40, 4
    scores = torch.rand(num_tokens, num_experts)
    experts = torch.topk(scores, top_k, dim=1).indices
    priority = scores.max(1).values
    got = M.assign_slots(experts, priority, num_experts)
    assert torch.equal(got, reference_slots(experts, priority, num_experts))


def test_capacity_drops_exactly_the_lowest_priority_tokens():
    """Six tokens all choose expert 0; capacity 2 keeps the two with the highest score."""
    experts = torch.zeros(6, 1, dtype=torch.long)
    priority = torch.tensor([0.3, 0.9, 0.1, 0.5, 0.95, 0.2])
    keep = M.assign_slots(experts, priority, 3) < 2
    assert keep.squeeze(1).tolist() == [False, True, False, False, True, False]


def test_route_drops_beyond_capacity_per_expert_and_keeps_the_rest():
    torch.manual_seed(1)
    logits = torch.randn(30, 3) * 3
    r = M.route(logits, 1, 0.5, gate_noise=1.0, training=False)
    assert r.capacity == 5  # floor(0.5 * 10)
    for e in range(3):
        chosen = r.experts[:, 0] == e
        kept = chosen & r.keep[:, 0]
        assert kept.sum() == min(int(chosen.sum()), 5)
        if chosen.sum() > 5:  # every kept token outranks every dropped one of the same expert
            top = r.scores.max(1).values
            assert top[kept].min() >= top[chosen & ~r.keep[:, 0]].max()


@pytest.mark.parametrize("top_k, factor", [(1, 0.5), (2, 0.7), (2, None)])
def test_route_counts_every_assignment_per_expert_before_dropping(top_k, factor):
    torch.manual_seed(2)
    r = M.route(torch.randn(40, 5) * 2, top_k, factor, gate_noise=1.0, training=False)
    assert torch.equal(r.counts, torch.bincount(r.experts.flatten(), minlength=5))


def test_without_a_capacity_factor_every_assignment_is_kept():
    logits = torch.zeros(50, 4)
    logits[:, 0] = 5.0  # all tokens to expert 0
    r = M.route(logits, 2, None, gate_noise=1.0, training=False)
    assert r.slots is None and r.keep.all() and r.capacity == 50
    assert M.route(logits, 2, None, gate_noise=1.0, training=False, aux=False).aux_loss == 0


# ------------------------------------------------------------------------------------------------
# router

def test_cosine_router_is_scaled_cosine_similarity_in_float32():
    torch.manual_seed(0)
    router = M.CosineRouter(8, 5, proj_dim=6)
    x = torch.randn(11, 8)
    z = x @ router.proj.weight.T + router.proj.bias
    expected = 2.0 * torch.stack([
        torch.stack([torch.dot(z[t] / z[t].norm(), router.codebook[:, e] /
                               router.codebook[:, e].norm()) for e in range(5)])
        for t in range(11)])
    torch.testing.assert_close(router(x), expected)
    assert math.isclose(router.scale().item(), 2.0, rel_tol=1e-6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert router(x).dtype == torch.float32
    with torch.no_grad():
        router.temperature.fill_(10.0)
    assert math.isclose(router.scale().item(), 100.0, rel_tol=1e-5)  # clamped at ln 100


def test_router_init_codebook_normal_001_and_projection_trunc_normal_002():
    """timm's trunc_normal_(std=0.02) (bounds +-2, as the official ViT init calls it)."""
    torch.manual_seed(0)
    router = M.CosineRouter(384, 6, proj_dim=256)
    assert abs(router.codebook.std().item() - 0.01) < 0.001
    assert abs(router.proj.weight.std().item() - 0.02) < 0.002
    assert torch.all(router.proj.bias == 0)
    assert math.isclose(router.temperature.item(), math.log(2.0), rel_tol=1e-6)
    # timm's own draws, as in the official code (torch 2.13's trunc_normal_ draws other values)
    from timm.layers import trunc_normal_

    torch.manual_seed(0)
    torch.testing.assert_close(router.proj.weight,
                               trunc_normal_(nn.Linear(384, 256).weight.detach(), std=0.02),
                               rtol=0, atol=0)


def test_gate_noise_is_added_only_in_training_with_std_gate_noise_over_e():
    torch.manual_seed(0)
    logits = torch.randn(2000, 4)
    clean = M.route(logits, 1, None, gate_noise=2.0, training=False)
    torch.testing.assert_close(clean.scores, torch.softmax(logits, 1))
    torch.manual_seed(5)
    noisy = M.route(logits, 1, None, gate_noise=2.0, training=True)
    torch.manual_seed(5)
    expected = torch.softmax(logits + 0.5 * torch.randn_like(logits), 1)  # std 2.0 / 4
    torch.testing.assert_close(noisy.scores, expected)


# ------------------------------------------------------------------------------------------------
# layer output

def test_dense_to_expert_initialisation_copies_the_weights():
    mlp = dense_mlp()
    layer = layer_from(mlp, num_experts=4)
    for e in range(4):
        assert torch.equal(layer.w1[e], mlp.fc1.weight) and torch.equal(layer.b1[e], mlp.fc1.bias)
        assert torch.equal(layer.w2[e], mlp.fc2.weight) and torch.equal(layer.b2[e], mlp.fc2.bias)
    layer.w1.data[0].add_(1.0)  # copies, not views
    assert not torch.equal(layer.w1[1], layer.w1[0]) and torch.equal(layer.w1[1], mlp.fc1.weight)


def test_identical_experts_give_gate_times_dense_ffn_for_kept_tokens_and_zero_for_dropped():
    mlp = dense_mlp()
    layer = layer_from(mlp, num_experts=3, eval_capacity_factor=0.6).eval()
    torch.manual_seed(2)
    with torch.no_grad():
        layer.router.codebook.normal_()  # spread the routing
    x = torch.randn(4, 9, 8)
    with torch.no_grad():
        y = layer(x).reshape(-1, 8)
        tokens = x.reshape(-1, 8)
        scores = torch.softmax(layer.router(tokens), 1)
        gate = scores.max(1).values
        capacity = M.expert_capacity(36, 3, 1, 0.6)  # floor(0.6 * 12) = 7 per expert
        _, keep = reference_forward(layer, tokens, layer.router(tokens), capacity)
        keep = keep.squeeze(1)
        assert 0 < keep.sum() < 36  # some dropped, some kept
        torch.testing.assert_close(y[keep], gate[keep, None] * mlp(tokens[keep]))
        assert torch.all(y[~keep] == 0)
        stats = layer.pop_routing()
    assert math.isclose(stats.drop_frac.item(), 1 - keep.float().mean().item(), rel_tol=1e-6)
    assert layer.last_routing is None


@pytest.mark.parametrize("top_k, factor", [(1, 1.0), (2, 0.7), (2, None)])
def test_distinct_experts_match_a_per_token_reference(top_k, factor):
    mlp = dense_mlp()
    layer = layer_from(mlp, num_experts=4, top_k=top_k, eval_capacity_factor=factor).eval()
    torch.manual_seed(3)
    with torch.no_grad():
        for p in (layer.w1, layer.b1, layer.w2, layer.b2, layer.router.codebook):
            p.normal_(0, 0.3)
    x = torch.randn(24, 8)
    with torch.no_grad():
        y = layer(x)
        capacity = M.expert_capacity(24, 4, top_k, factor)
        expected, keep = reference_forward(layer, x, layer.router(x), capacity)
        torch.testing.assert_close(y, expected)
        stats = layer.pop_routing()
    experts = torch.topk(layer.router(x), top_k, dim=1).indices.flatten()
    p = torch.bincount(experts, minlength=4).float() / experts.numel()
    entropy = -(p[p > 0] * p[p > 0].log()).sum()
    assert math.isclose(stats.load_entropy.item(), entropy.item(), rel_tol=1e-5)
    assert math.isclose(stats.drop_frac.item(), 1 - keep.float().mean().item(), abs_tol=1e-6)


def test_top2_with_identical_experts_and_no_dropping_is_the_dense_ffn():
    """k=2 gates are renormalised to sum to 1, so identical experts reproduce the dense FFN."""
    mlp = dense_mlp()
    layer = layer_from(mlp, num_experts=4, top_k=2, eval_capacity_factor=None).eval()
    x = torch.randn(3, 5, 8)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), mlp(x))


def test_the_layer_runs_under_autocast_with_the_router_in_float32():
    layer = layer_from(dense_mlp(), num_experts=3, capacity_factor=1.0)
    x = torch.randn(2, 5, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
    stats = layer.pop_routing()
    assert y.shape == x.shape and torch.isfinite(y.float()).all()
    assert y.dtype == torch.bfloat16  # the experts ran in autocast's dtype, as a Linear would
    assert stats.aux_loss.dtype == torch.float32
    assert layer(x).dtype == torch.float32 and M._autocast_dtype("cpu") is None


@pytest.mark.parametrize("p", [0.1, 0.5])
@pytest.mark.parametrize("dtype", [torch.bool, torch.float32])
def test_dropout_keep_mask_drops_at_rate_p_independently(p, dtype):
    torch.manual_seed(0)
    keep = M.dropout_keep_mask((400, 500), p, "cpu", dtype)
    assert keep.dtype == dtype and keep.shape == (400, 500)
    dropped = keep == 0
    assert set(keep.unique().tolist()) == {0, 1}
    assert abs(dropped.float().mean().item() - p) < 0.005  # 200,000 draws: 5 standard errors
    assert dropped[:, :250].float().mean().sub(dropped[:, 250:].float().mean()).abs() < 0.01
    assert dropped[:200].float().mean().sub(dropped[200:].float().mean()).abs() < 0.01
    assert not torch.equal(keep, M.dropout_keep_mask((400, 500), p, "cpu", dtype))


def test_softmax_rows_is_the_row_softmax():
    x = torch.randn(50, 6)
    torch.testing.assert_close(M.softmax_rows(x), torch.softmax(x, dim=1))


def test_experts_run_each_row_block_through_its_own_expert_with_rescaled_hidden_dropout():
    layer = layer_from(dense_mlp(), num_experts=3, expert_dropout=0.3)
    with torch.no_grad():
        for w in (layer.w1, layer.b1, layer.w2, layer.b2):
            w.normal_(0, 0.3)  # distinct experts
    x = torch.randn(20, 8)
    counts = [7, 0, 13]  # expert 1 gets no row
    torch.manual_seed(4)
    got = layer.experts(x, counts)
    torch.manual_seed(4)
    keep = M.dropout_keep_mask((20, 16), 0.3, "cpu", torch.float32)  # one mask for all rows
    assert 0 < keep.mean() < 1
    expected = []
    for e, rows in ((0, slice(0, 7)), (2, slice(7, 20))):
        h = torch.nn.functional.gelu(x[rows] @ layer.w1[e].T + layer.b1[e]) * keep[rows] / 0.7
        expected.append(h @ layer.w2[e].T + layer.b2[e])
    torch.testing.assert_close(got, torch.cat(expected))
    assert layer.experts(x[:0], [0, 0, 0]).shape == (0, 8)


@pytest.mark.parametrize("with_mask, x_grad", [(False, True), (True, True), (True, False)])
def test_expert_ffns_gradients_match_finite_differences(with_mask, x_grad):
    """The hand-written backward of the grouped experts, against torch's numerical Jacobian."""
    torch.manual_seed(0)
    num_experts, dim, hidden = 3, 4, 5
    def leaf(*shape, grad=True):
        return torch.randn(*shape, dtype=torch.double).requires_grad_(grad)
    x = leaf(9, dim, grad=x_grad)
    weights = (leaf(num_experts, hidden, dim), leaf(num_experts, hidden),
               leaf(num_experts, dim, hidden), leaf(num_experts, dim))
    keep = (torch.rand(9, hidden) > 0.3).double() if with_mask else None
    assert torch.autograd.gradcheck(
        lambda x, *w: M.expert_ffns(x, *w, [4, 0, 5], keep), (x, *weights))


def test_expert_ffns_rejects_counts_that_do_not_cover_the_rows():
    w = torch.zeros(2, 3, 3)
    with pytest.raises(ValueError, match="sum to the 5 rows"):
        M.expert_ffns(torch.zeros(5, 3), w, w[:, :, 0], w, w[:, :, 0], [2, 2])


def test_expert_gradients_land_in_their_own_slice_of_the_stacked_weights():
    layer = layer_from(dense_mlp(), num_experts=3)
    x = torch.randn(10, 8)
    layer.experts(x, [4, 0, 6]).sum().backward()
    for w in (layer.w1, layer.b1, layer.w2, layer.b2):
        assert w.grad[0].abs().sum() > 0 and w.grad[2].abs().sum() > 0
        assert torch.all(w.grad[1] == 0)  # no row went to expert 1
    # expert 0's fc2 bias gradient is the number of its rows, per output unit
    torch.testing.assert_close(layer.b2.grad[0], torch.full((8,), 4.0))


def test_the_layer_takes_the_expert_dropout_on_hidden_units_in_training_only():
    mlp = dense_mlp()
    layer = layer_from(mlp, num_experts=2, expert_dropout=0.5, capacity_factor=10.0)
    x = torch.randn(2, 5, 8)
    torch.manual_seed(0)
    a = layer(x)
    torch.manual_seed(1)
    b = layer(x)
    assert not torch.allclose(a, b)
    layer.eval()
    torch.testing.assert_close(layer(x), layer(x))


# ------------------------------------------------------------------------------------------------
# auxiliary loss

def reference_aux(clean_probs, kth, sigma):
    normal = torch.distributions.Normal(0.0, sigma)
    imp = clean_probs.sum(0)
    load = normal.cdf(clean_probs - kth[:, None]).sum(0)
    cv2 = [v.var(unbiased=True) / (v.mean() ** 2 + 1e-10) for v in (imp, load)]
    return (cv2[0] + cv2[1]) / 2


def test_load_importance_loss_matches_its_formula():
    torch.manual_seed(0)
    probs = torch.softmax(torch.randn(50, 6), 1)
    kth = torch.randn(50)
    torch.testing.assert_close(M.load_importance_loss(probs, kth, 1 / 6),
                               reference_aux(probs, kth, 1 / 6))


def test_aux_loss_is_at_its_floor_for_balanced_routing_and_larger_when_collapsed():
    num_experts, num_tokens = 6, 60
    # balanced: token t prefers expert t mod 6 by a margin, symmetrically
    balanced = torch.zeros(num_tokens, num_experts)
    balanced[torch.arange(num_tokens), torch.arange(num_tokens) % num_experts] = 2.0
    # collapsed: every token prefers expert 0
    collapsed = torch.zeros(num_tokens, num_experts)
    collapsed[:, 0] = 2.0
    low = M.route(balanced, 1, 1.5, gate_noise=1.0, training=False).aux_loss
    high = M.route(collapsed, 1, 1.5, gate_noise=1.0, training=False).aux_loss
    assert low.item() < 1e-6  # CV^2 of equal loads is 0
    assert high.item() > 0.5
    # collapsed importance alone: shares (p0, p, p, p, p, p) with p0 = e^2 / (e^2 + 5)
    p0 = math.exp(2) / (math.exp(2) + 5)
    imp = torch.tensor([p0] + [(1 - p0) / 5] * 5) * num_tokens
    # (Tutel's load term is ~0 here: clean probabilities never reach the top noisy logit 2.0)
    assert high.item() >= (imp.var() / imp.mean() ** 2).item() / 2 - 1e-5


def test_gradients_reach_the_router_projection_codebook_and_temperature():
    mlp = dense_mlp()
    layer = layer_from(mlp, num_experts=3).train()
    x = torch.randn(2, 7, 8)
    y = layer(x)
    stats = layer.pop_routing()
    (y.square().mean() + stats.aux_loss).backward()
    for name in ("router.proj.weight", "router.proj.bias", "router.codebook",
                 "router.temperature"):
        grad = dict(layer.named_parameters())[name].grad
        assert grad is not None and grad.abs().sum() > 0, name


@pytest.mark.parametrize("kwargs, match", [
    (dict(top_k=4), "top_k"), (dict(gate_noise=0.0), "gate_noise"),
    (dict(eval_capacity_factor=-1.0), "eval_capacity_factor"), (dict(num_experts=0), "num_experts"),
])
def test_bad_layer_arguments_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        M.MoEFFN(8, 16, **{"num_experts": 3, **kwargs})


def test_from_dense_rejects_a_module_without_fc1_fc2():
    with pytest.raises(TypeError, match="fc1/fc2"):
        M.MoEFFN.from_dense(nn.Linear(3, 3))
