"""GMoE's sparse mixture-of-experts FFN layer with a cosine router, in pure PyTorch (Li et al.,
ICLR 2023, Eq. 3 and Sec. 4, run through Microsoft Tutel there; Tutel's behaviour reimplemented
from its description, no Tutel code). Routing, capacity, dropping, loss: docs/methods/gmoe.md."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

#: ``ln(100)``: the router's scale ``exp(t)`` is clamped at 100 (Tutel's ``clamp_max``).
MAX_LOG_SCALE = math.log(100.0)


class CosineRouter(nn.Module):
    """Cosine router: ``logits = exp(min(t, ln 100)) * cos(W x + b, C)``, in float32; ``t``
    starts at ``ln(1 / init_temperature)``."""

    def __init__(self, dim: int, num_experts: int, proj_dim: int = 256,
                 init_temperature: float = 0.5):
        super().__init__()
        if init_temperature <= 0:
            raise ValueError(f"init_temperature must be > 0, got {init_temperature}")
        from timm.layers import trunc_normal_  # the official code's (torch 2.13's draws others)

        self.proj = nn.Linear(dim, proj_dim)
        trunc_normal_(self.proj.weight, std=0.02)
        nn.init.zeros_(self.proj.bias)
        self.codebook = nn.Parameter(torch.empty(proj_dim, num_experts).normal_(0.0, 0.01))
        self.temperature = nn.Parameter(torch.tensor([math.log(1.0 / init_temperature)]))

    def scale(self) -> torch.Tensor:
        return torch.clamp(self.temperature.float(), max=MAX_LOG_SCALE).exp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type=x.device.type, enabled=False):
            z = F.linear(x.float(), self.proj.weight.float(), self.proj.bias.float())
            # normalize(z) @ normalize(C), dividing the [T, E] product by |z| instead of the
            # [T, proj_dim] projection (the same numbers, F.normalize's eps included)
            dots = z @ F.normalize(self.codebook.float(), dim=0)
            cos = dots / torch.linalg.vector_norm(z, dim=1, keepdim=True).clamp(min=1e-12)
            return cos * self.scale()


def dropout_keep_mask(shape: tuple, p: float, device, dtype: torch.dtype = torch.bool
                      ) -> torch.Tensor:
    """The units dropout keeps (1/0, each dropped with probability ``p``); on CPU from 16 random
    bits per element (faster than torch's Bernoulli)."""
    if torch.device(device).type != "cpu":
        return (torch.rand(shape, device=device) >= p).to(dtype)
    n = math.prod(shape)
    words = torch.randint(-2 ** 63, 2 ** 63 - 1, ((n + 3) // 4,), dtype=torch.int64,
                          device=device)
    bits = words.view(torch.int16)[:n].view(shape)
    threshold = -32768 + round((1.0 - p) * 65536)
    if dtype == torch.bool:
        return bits < threshold
    return torch.lt(bits, threshold, out=torch.empty(shape, dtype=dtype, device=device))


def _autocast_dtype(device_type: str) -> torch.dtype | None:
    """The dtype autocast runs matmuls in on ``device_type``, or None when it is off there."""
    enabled = torch.is_autocast_enabled(device_type)
    return torch.get_autocast_dtype(device_type) if enabled else None


class _ExpertFFNs(torch.autograd.Function):
    """Every expert's FFN over its block of rows, forward and backward written block by block."""

    @staticmethod
    def forward(ctx, x, w1, b1, w2, b2, keep, counts):
        out = x.new_empty(x.shape[0], w2.shape[1])
        saved = []  # per expert: fc1's output (for GELU's backward), the hidden units (for fc2's)
        start = 0
        for e, n in enumerate(counts):
            if n:
                rows = slice(start, start + n)
                pre = torch.addmm(b1[e], x[rows], w1[e].t())
                hidden = F.gelu(pre)
                if keep is not None:
                    hidden.mul_(keep[rows])
                torch.addmm(b2[e], hidden, w2[e].t(), out=out[rows])
                saved += [pre, hidden]
            start += n
        ctx.save_for_backward(x, w1, w2, keep, *saved)
        ctx.counts = counts
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        x, w1, w2, keep, *saved = ctx.saved_tensors
        need_x, need_w1, need_b1, need_w2, need_b2 = ctx.needs_input_grad[:5]
        grad_x = torch.empty_like(x) if need_x else None
        grad_w1, grad_b1, grad_w2, grad_b2 = (
            torch.zeros_like(t) if need else None for t, need in (
                (w1, need_w1), (w1[:, :, 0], need_b1), (w2, need_w2), (w2[:, :, 0], need_b2)))
        start = 0
        blocks = iter(saved)
        for e, n in enumerate(ctx.counts):
            if n:
                rows = slice(start, start + n)
                pre, hidden = next(blocks), next(blocks)
                g = grad_out[rows]
                if need_w2:
                    torch.mm(g.t(), hidden, out=grad_w2[e])
                if need_b2:
                    torch.sum(g, dim=0, out=grad_b2[e])
                grad_h = g @ w2[e]
                if keep is not None:
                    grad_h.mul_(keep[rows])
                grad_pre = torch.ops.aten.gelu_backward(grad_h, pre)
                if need_w1:
                    torch.mm(grad_pre.t(), x[rows], out=grad_w1[e])
                if need_b1:
                    torch.sum(grad_pre, dim=0, out=grad_b1[e])
                if need_x:
                    torch.mm(grad_pre, w1[e], out=grad_x[rows])
            start += n
        return grad_x, grad_w1, grad_b1, grad_w2, grad_b2, None, None


def expert_ffns(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor,
                b2: torch.Tensor, counts: list[int], keep: torch.Tensor | None = None
                ) -> torch.Tensor:
    """Rows ``[s_e, s_e + counts[e])`` of ``x`` through expert ``e``: ``(GELU(x w1[e]^T +
    b1[e]) * keep) w2[e]^T + b2[e]``; ``keep``: a 1/0 dropout mask or None."""
    if sum(counts) != x.shape[0] or len(counts) != w1.shape[0]:
        raise ValueError(f"counts {counts} must have one entry per expert ({w1.shape[0]}) and "
                         f"sum to the {x.shape[0]} rows of x")
    return _ExpertFFNs.apply(x, w1, b1, w2, b2, keep, counts)


def expert_capacity(num_tokens: int, num_experts: int, top_k: int,
                    capacity_factor: float | None) -> int:
    """``k * floor(capacity_factor * ceil(T / E))`` (Tutel's); ``None``: ``T``, no dropping."""
    if capacity_factor is None:
        return num_tokens
    if capacity_factor <= 0:
        raise ValueError(f"capacity_factor must be > 0 or None (no dropping), got "
                         f"{capacity_factor}")
    per_expert = -(-num_tokens // num_experts)
    return top_k * int(math.floor(capacity_factor * per_expert))


def _slots_and_counts(experts: torch.Tensor, order: torch.Tensor | None,
                      num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`assign_slots` with the tokens in ``order``, plus each expert's assignment count."""
    top_k = experts.shape[1]
    slots = torch.empty_like(experts)
    offset = torch.zeros(num_experts, dtype=torch.long, device=experts.device)
    order = slice(None) if order is None else order
    for j in range(top_k):  # k is 1 or 2: a loop over choices, never over tokens
        column = experts[order, j]
        onehot = F.one_hot(column, num_experts)  # [T, E], tokens in order
        before = torch.cumsum(onehot, dim=0) + (offset - 1)  # same-expert assignments up to t
        slots[order, j] = before.gather(1, column.unsqueeze(1)).squeeze(1)
        offset = offset + onehot.sum(dim=0)
    return slots, offset


def assign_slots(experts: torch.Tensor, priority: torch.Tensor, num_experts: int) -> torch.Tensor:
    """``[T, k]``: each assignment's slot in its expert's buffer; all first choices before all
    second ones, each column by decreasing ``priority`` (stable). Kept iff slot < capacity."""
    return _slots_and_counts(experts, torch.argsort(-priority, stable=True), num_experts)[0]


def softmax_rows(x: torch.Tensor) -> torch.Tensor:
    """``softmax(x, dim=1)`` for few columns, along dim 0 of the transpose (faster on CPU)."""
    return F.softmax(x.t(), dim=0).t()


def load_importance_loss(clean_probs: torch.Tensor, kth_noisy_logit: torch.Tensor,
                         noise_std: float) -> torch.Tensor:
    """Tutel's ``load_importance_loss``: ``(CV^2(Importance) + CV^2(Load)) / 2``."""
    if noise_std <= 0:
        raise ValueError(f"the load term needs gate noise > 0 (sigma = {noise_std}); set "
                         "gmoe_gate_noise > 0")
    probs = clean_probs.float()

    def cv_squared(v: torch.Tensor) -> torch.Tensor:
        return v.var() / (v.mean() ** 2 + 1e-10)

    importance = probs.sum(dim=0)
    z = (probs - kth_noisy_logit.float().unsqueeze(1)) / noise_std
    load = (0.5 * (1.0 + torch.erf(z / math.sqrt(2.0)))).sum(dim=0)  # Normal(0, sigma) CDF
    return (cv_squared(importance) + cv_squared(load)) / 2.0


@dataclass
class Routing:
    """The routing of ``T`` tokens (:func:`route`): per choice ``[T, k]`` experts, gates, slots
    (None: nothing can drop), keep; ``[T, E]`` scores; capacity, aux_loss, ``[E]`` counts."""

    experts: torch.Tensor
    gates: torch.Tensor
    slots: torch.Tensor | None
    keep: torch.Tensor
    scores: torch.Tensor
    capacity: int
    aux_loss: torch.Tensor
    counts: torch.Tensor


def route(logits: torch.Tensor, top_k: int, capacity_factor: float | None, *,
          gate_noise: float, training: bool, aux: bool = True) -> Routing:
    """Noisy top-k routing of ``logits [T, E]`` with capacity and batch-prioritised dropping;
    noise only when ``training``; ``aux=False`` skips the auxiliary loss."""
    num_tokens, num_experts = logits.shape
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k must be in [1, {num_experts}] (the number of experts), got "
                         f"{top_k}")
    logits = logits.float()
    noise_std = gate_noise / num_experts
    noisy = logits + noise_std * torch.randn_like(logits) if training and gate_noise > 0 \
        else logits
    scores = softmax_rows(noisy)
    if top_k == 1:  # the same choice as topk, about 2x faster on a [T, E] tensor with small E
        top_scores, experts = scores.max(dim=1, keepdim=True)
    else:
        top_scores, experts = torch.topk(scores, top_k, dim=1)
    gates = top_scores
    if top_k > 1:
        gates = gates / gates.sum(dim=1, keepdim=True).clamp(min=torch.finfo(gates.dtype).eps)
    capacity = expert_capacity(num_tokens, num_experts, top_k, capacity_factor)
    if capacity_factor is None:  # an expert gets a token at most once: nothing is dropped
        slots, keep = None, torch.ones_like(experts, dtype=torch.bool)
        counts = torch.bincount(experts.reshape(-1), minlength=num_experts)
    else:
        order = torch.argsort(-top_scores[:, 0].detach(), stable=True)
        slots, counts = _slots_and_counts(experts, order, num_experts)
        keep = slots < capacity
    loss = logits.new_zeros(())
    if aux and gate_noise > 0:
        kth = noisy.gather(1, experts[:, -1:]).squeeze(1)
        clean = scores if noisy is logits else softmax_rows(logits)
        loss = load_importance_loss(clean, kth, noise_std)
    return Routing(experts, gates, slots, keep, scores, capacity, loss, counts)


@dataclass
class RoutingStats:
    """One forward's routing (tensors: no device sync): aux_loss, drop_frac, load_entropy and,
    with :attr:`MoEFFN.record_experts`, top1 ``[B, N]``."""

    aux_loss: torch.Tensor
    drop_frac: torch.Tensor
    load_entropy: torch.Tensor
    top1: torch.Tensor | None = None


class MoEFFN(nn.Module):
    """Sparse mixture-of-experts FFN replacing a transformer block's ``mlp`` (``[B, N, D]`` in
    and out); ``eval_capacity_factor`` None: no dropping at evaluation."""

    def __init__(self, dim: int, hidden: int, num_experts: int = 6, top_k: int = 1,
                 capacity_factor: float = 1.5, eval_capacity_factor: float | None = None,
                 gate_noise: float = 1.0, router_dim: int = 256, expert_dropout: float = 0.1,
                 init_temperature: float = 0.5):
        super().__init__()
        if num_experts < 1:
            raise ValueError(f"num_experts must be >= 1, got {num_experts}")
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"top_k must be in [1, num_experts={num_experts}], got {top_k}")
        if gate_noise <= 0:
            raise ValueError(f"gate_noise must be > 0 (the load term of the auxiliary loss "
                             f"divides by gate_noise / E), got {gate_noise}")
        for name, value in (("capacity_factor", capacity_factor),
                            ("eval_capacity_factor", eval_capacity_factor)):
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be > 0 (None: no dropping), got {value}")
        self.dim, self.hidden = dim, hidden
        self.num_experts, self.top_k = num_experts, top_k
        self.capacity_factor = capacity_factor
        self.eval_capacity_factor = eval_capacity_factor
        self.gate_noise = gate_noise
        self.router = CosineRouter(dim, num_experts, router_dim, init_temperature)
        self.w1 = nn.Parameter(torch.empty(num_experts, hidden, dim))
        self.b1 = nn.Parameter(torch.zeros(num_experts, hidden))
        self.w2 = nn.Parameter(torch.empty(num_experts, dim, hidden))
        self.b2 = nn.Parameter(torch.zeros(num_experts, dim))
        from timm.layers import trunc_normal_  # as CosineRouter's

        for w in (self.w1, self.w2):
            trunc_normal_(w, std=0.02)
        if not 0.0 <= expert_dropout < 1.0:
            raise ValueError(f"expert_dropout must be in [0, 1), got {expert_dropout}")
        self.expert_dropout = float(expert_dropout)
        #: keep each token's first-choice expert in :attr:`last_routing` (plots)
        self.record_experts = False
        #: the last forward's routing (None after :meth:`pop_routing`)
        self.last_routing: RoutingStats | None = None

    @classmethod
    def from_dense(cls, mlp: nn.Module, **kwargs) -> "MoEFFN":
        """An MoE layer whose experts all copy the dense timm ``Mlp`` ``mlp``."""
        fc1, fc2 = getattr(mlp, "fc1", None), getattr(mlp, "fc2", None)
        if not isinstance(fc1, nn.Linear) or not isinstance(fc2, nn.Linear):
            raise TypeError(f"expected a timm Mlp with Linear fc1/fc2, got {type(mlp).__name__}")
        if not isinstance(getattr(mlp, "norm", nn.Identity()), nn.Identity):
            raise TypeError("the dense FFN has a norm layer between fc1 and fc2; the experts "
                            "(fc1, GELU, dropout, fc2) cannot copy it")
        layer = cls(fc1.in_features, fc1.out_features, **kwargs)
        layer.to(device=fc1.weight.device, dtype=fc1.weight.dtype)
        with torch.no_grad():  # the biases start at 0
            for own, dense in ((layer.w1, fc1.weight), (layer.w2, fc2.weight),
                               (layer.b1, fc1.bias), (layer.b2, fc2.bias)):
                if dense is not None:
                    own.copy_(dense.unsqueeze(0).expand_as(own))
        return layer

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, hidden={self.hidden}, experts={self.num_experts}, "
                f"top_k={self.top_k}, capacity_factor={self.capacity_factor}, "
                f"eval_capacity_factor={self.eval_capacity_factor}, gate_noise={self.gate_noise}")

    def pop_routing(self) -> RoutingStats | None:
        """Return :attr:`last_routing` and forget it (no tensor outlives the step)."""
        stats, self.last_routing = self.last_routing, None
        return stats

    def experts(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """All experts on tokens grouped by expert (:func:`expert_ffns`), in the autocast dtype."""
        p = self.expert_dropout if self.training else 0.0
        w2 = self.w2 * (1.0 / (1.0 - p)) if p else self.w2
        device_type = x.device.type
        dtype = _autocast_dtype(device_type) or x.dtype
        keep = dropout_keep_mask((x.shape[0], self.hidden), p, x.device, dtype) if p else None
        with torch.autocast(device_type=device_type, enabled=False):
            return expert_ffns(*(t.to(dtype) for t in (x, self.w1, self.b1, w2, self.b2)),
                               counts, keep)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        tokens = x.reshape(-1, shape[-1])
        factor = self.capacity_factor if self.training else self.eval_capacity_factor
        r = route(self.router(tokens), self.top_k, factor, gate_noise=self.gate_noise,
                  training=self.training, aux=self.training)
        # lay the kept assignments out grouped by expert: position = offset of the expert's
        # block + the assignment's slot (the kept slots of an expert are 0 .. its kept count - 1)
        slots = r.slots
        if slots is None:  # nothing dropped: any order within an expert will do
            slots = _slots_and_counts(r.experts, None, self.num_experts)[0]
        kept_counts = r.counts.clamp(max=r.capacity)
        offsets = torch.cumsum(kept_counts, 0) - kept_counts
        assignments = torch.nonzero(r.keep.reshape(-1)).squeeze(1)  # flat index t * k + j
        position = (offsets[r.experts.reshape(-1)[assignments]]
                    + slots.reshape(-1)[assignments])
        grouped = torch.empty_like(assignments)
        grouped[position] = assignments  # the assignment at each position of the layout
        ids = torch.div(grouped, self.top_k, rounding_mode="floor")
        gates = r.gates.reshape(-1)[grouped]
        out = self.experts(tokens.index_select(0, ids), kept_counts.tolist())
        out = out * gates.to(out.dtype).unsqueeze(1)
        # out's dtype: under autocast the experts' matmuls may run in half precision
        y = out.new_zeros(tokens.shape[0], shape[-1]).index_add_(0, ids, out)

        with torch.no_grad():
            load = r.counts.float() / r.counts.sum()
            entropy = -(load * torch.log(load.clamp(min=1e-12))).sum()
            drop = 1.0 - kept_counts.sum().float() / r.experts.numel()
        top1 = r.experts[:, 0].reshape(shape[:-1]).detach() if self.record_experts else None
        self.last_routing = RoutingStats(r.aux_loss, drop, entropy, top1)
        return y.reshape(shape)
