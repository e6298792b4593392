"""A sparse mixture-of-experts FFN layer with a cosine router, in pure PyTorch.

This is the MoE layer of GMoE (Li et al., "Sparse Mixture-of-Experts are Domain Generalizable
Learners", ICLR 2023, Eq. 3 and the cosine router of Sec. 4) as the authors' code runs it through
Microsoft Tutel (``tutel.moe.moe_layer`` with ``gate_type cosine_top``, ``fp32_gate``,
``batch_prioritized_routing=True``, ``is_gshard_loss=False``). Tutel is not on PyPI, so the
behaviour is reimplemented here from its description; no Tutel code is used.

For a token ``x`` (the FFN input, ``D`` wide) and ``E`` experts:

Router (:class:`CosineRouter`)
    ``l_e = s * <normalize(W x + b), normalize(C[:, e])>`` with the projection ``W`` (``proj_dim x
    D``), the codebook ``C`` (``proj_dim x E``, initialised N(0, 0.01^2)) and the learnable scale
    ``s = exp(min(t, ln 100))``, ``t`` initialised to ``ln(1 / 0.5)`` (``s = 2``). The router runs
    in float32 whatever the autocast state (Tutel's ``fp32_gate``). The projection is initialised
    trunc-normal(std 0.02) with zero bias: what the official ViT's ``_init_vit_weights`` does to it.

Routing (:func:`route`)
    In training, Gaussian noise of std ``gate_noise / E`` is added to the logits (none in eval).
    Scores are ``softmax`` of the (noisy) logits; each token picks its ``k`` highest-scoring
    experts. The gate of a choice is its score, *not renormalised for k = 1*; for ``k > 1`` the
    ``k`` gates of a token are divided by their sum (Tutel's ``normalize_gate=True``, applied
    before any token is dropped, so a token whose second choice is dropped keeps a gate < 1 on
    its first).

Capacity and dropping (:func:`expert_capacity`, :func:`assign_slots`)
    Each expert takes at most ``capacity = k * floor(capacity_factor * ceil(T / E))`` assignments of
    the ``T`` tokens of the whole batch (all tokens of all images, class token included). Slots are
    given in *batch-prioritised* order: tokens sorted by their highest score, highest first (ties
    by token order); the first choices of all tokens fill the experts first, then the second
    choices (in the same priority order), and so on. An assignment past the capacity is dropped:
    it contributes 0, so a token whose choices are all dropped passes through the block's residual
    only. ``capacity_factor=None`` disables dropping.

Experts
    ``E`` FFNs ``fc2(Dropout(GELU(fc1 x)))`` (dropout on the hidden units only, as the official
    ``activation_fn``; :func:`hidden_dropout`), kept as stacked weights ``w1 [E, H, D]``,
    ``b1 [E, H]``, ``w2 [E, D, H]``, ``b2 [E, D]``. :meth:`MoEFFN.from_dense` copies a dense timm
    ``Mlp``'s ``fc1``/``fc2`` into every expert (the official ``load_pretrained``), so that at
    initialisation the layer computes ``gate * FFN(x)`` for every kept token.

Output
    ``y = sum_{kept choices j} g_j * Expert_{e_j}(x)`` (Eq. 3, "post-score"). Dispatch is batched:
    the kept assignments are sorted by expert and each expert runs one matmul pair over its
    contiguous block of tokens; results are scattered back with one ``index_add``.

Auxiliary loss (:func:`load_importance_loss`)
    Tutel's ``load_importance_loss`` (Shazeer et al. 2017): ``(CV^2(Importance) + CV^2(Load)) / 2``
    with ``Importance_e = sum_t softmax(l_t)_e`` (clean logits),
    ``Load_e = sum_t Phi((softmax(l_t)_e - l~_t,(k)) / sigma)`` where ``l~_t,(k)`` is the token's
    k-th largest *noisy* logit, ``sigma = gate_noise / E`` and ``Phi`` the standard normal CDF,
    and ``CV^2(v) = var(v) / (mean(v)^2 + 1e-10)`` (unbiased variance). Tutel's quirk is kept:
    the load term compares a clean *probability* with a noisy *logit*.

After each forward the layer keeps the routing of that call in :attr:`MoEFFN.last_routing`
(a :class:`RoutingStats`: aux loss, dropped fraction, load entropy, optionally the chosen experts);
it is transient output, not state: :meth:`MoEFFN.pop_routing` returns and clears it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

#: ``ln(100)``: the router's scale ``exp(t)`` is clamped at 100 (Tutel's ``clamp_max``).
MAX_LOG_SCALE = math.log(100.0)


class CosineRouter(nn.Module):
    """Cosine-similarity router: ``logits = exp(min(t, ln 100)) * cos(W x + b, C)``, in float32.

    Args:
        dim: token width ``D``.
        num_experts: ``E``.
        proj_dim: width of the projection ``W`` and of the codebook rows (256 in GMoE).
        init_temperature: ``tau`` at initialisation; the learnable ``t`` starts at ``ln(1/tau)``
            (0.5 -> scale 2, GMoE's value).
    """

    def __init__(self, dim: int, num_experts: int, proj_dim: int = 256,
                 init_temperature: float = 0.5):
        super().__init__()
        if init_temperature <= 0:
            raise ValueError(f"init_temperature must be > 0, got {init_temperature}")
        self.num_experts = num_experts
        self.proj = nn.Linear(dim, proj_dim)
        nn.init.trunc_normal_(self.proj.weight, std=0.02)
        nn.init.zeros_(self.proj.bias)
        self.codebook = nn.Parameter(torch.empty(proj_dim, num_experts).normal_(0.0, 0.01))
        self.temperature = nn.Parameter(torch.tensor([math.log(1.0 / init_temperature)]))

    def scale(self) -> torch.Tensor:
        """``exp(min(t, ln 100))``: the logit scale (1-element tensor)."""
        return torch.clamp(self.temperature.float(), max=MAX_LOG_SCALE).exp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [T, D]`` -> float32 logits ``[T, E]``."""
        with torch.autocast(device_type=x.device.type, enabled=False):
            z = F.linear(x.float(), self.proj.weight.float(), self.proj.bias.float())
            # normalize(z) @ normalize(C), dividing the [T, E] product by |z| instead of the
            # [T, proj_dim] projection (the same numbers, F.normalize's eps included)
            dots = z @ F.normalize(self.codebook.float(), dim=0)
            cos = dots / torch.linalg.vector_norm(z, dim=1, keepdim=True).clamp(min=1e-12)
            return cos * self.scale()


def hidden_dropout(h: torch.Tensor, p: float, training: bool, *,
                   rescale: bool = True) -> torch.Tensor:
    """Inverted dropout (``F.dropout``'s result distribution) on the experts' hidden units.

    On CPU the keep mask comes from 16 random bits per element, four elements per 64-bit draw
    (keep iff the bits, read as a signed int16, are below ``-2^15 + round((1 - p) * 2^16)``, so the
    drop rate is ``p`` to within ``2^-17``): torch's CPU Bernoulli sampler draws one random number
    per element and costs more than the experts' matmuls at small widths. Other devices use
    ``F.dropout``. ``rescale=False`` returns ``h * mask`` without the ``1 / (1 - p)`` factor, for a
    caller that folds it into the next layer's weights."""
    if not training or p == 0.0:
        return h
    if h.device.type != "cpu":
        out = F.dropout(h, p, training=True)
        return out if rescale else out * (1.0 - p)
    n = h.numel()
    words = torch.randint(-2 ** 63, 2 ** 63 - 1, ((n + 3) // 4,), dtype=torch.int64,
                          device=h.device)
    bits = words.view(torch.int16)[:n].view(h.shape)
    keep = bits < -32768 + round((1.0 - p) * 65536)
    return h * keep * (1.0 / (1.0 - p)) if rescale else h * keep


def expert_capacity(num_tokens: int, num_experts: int, top_k: int,
                    capacity_factor: float | None) -> int:
    """``k * floor(capacity_factor * ceil(T / E))`` (Tutel's rule); ``None``: ``T``, i.e. no
    assignment can ever be dropped (an expert gets each token at most once)."""
    if capacity_factor is None:
        return num_tokens
    if capacity_factor <= 0:
        raise ValueError(f"capacity_factor must be > 0 or None (no dropping), got "
                         f"{capacity_factor}")
    per_expert = -(-num_tokens // num_experts)
    return top_k * int(math.floor(capacity_factor * per_expert))


def assign_slots(experts: torch.Tensor, priority: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Slot of each assignment in its expert's buffer, batch-prioritised.

    Args:
        experts: ``[T, k]`` chosen experts (column ``j`` = each token's ``j``-th choice).
        priority: ``[T]``; higher goes first (GMoE/Tutel: the token's highest score).
        num_experts: ``E``.

    Returns ``[T, k]`` long: for choice ``j`` of token ``t``, the number of assignments to the same
    expert that come before it, where all first choices come before all second choices, and within
    one choice column tokens are ordered by decreasing ``priority`` (stable: ties by token index).
    An assignment is kept iff its slot is below the capacity.
    """
    num_tokens, top_k = experts.shape
    order = torch.argsort(-priority, stable=True)
    slots = torch.empty_like(experts)
    offset = torch.zeros(num_experts, dtype=torch.long, device=experts.device)
    for j in range(top_k):  # k is 1 or 2: a loop over choices, never over tokens
        onehot = F.one_hot(experts[order, j], num_experts)  # [T, E] in priority order
        before = torch.cumsum(onehot, dim=0) - onehot + offset  # same-expert assignments before
        slots[order, j] = (before * onehot).sum(dim=1)
        offset = offset + onehot.sum(dim=0)
    return slots


def softmax_rows(x: torch.Tensor) -> torch.Tensor:
    """``softmax(x, dim=1)`` for ``x [T, E]`` with few columns, computed along dim 0 of the
    transpose (on CPU a softmax over a last dimension of 6 is about 10x slower)."""
    return F.softmax(x.t(), dim=0).t()


def load_importance_loss(clean_probs: torch.Tensor, kth_noisy_logit: torch.Tensor,
                         noise_std: float) -> torch.Tensor:
    """Tutel's ``load_importance_loss``: ``(CV^2(Importance) + CV^2(Load)) / 2``.

    Args:
        clean_probs: ``[T, E]`` softmax of the noise-free logits.
        kth_noisy_logit: ``[T]`` each token's k-th largest noisy logit (the threshold an expert's
            score must beat to be chosen; Tutel's quirk: compared with a probability).
        noise_std: ``sigma = gate_noise / E`` (> 0).
    """
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
    """The routing of ``T`` tokens (see :func:`route`).

    experts, gates, slots, keep: ``[T, k]``: chosen experts (best first), their gate values
    (float32), their slots in the experts' buffers (None without a capacity factor: nothing can
    be dropped), and whether the slot is within capacity.
    scores: ``[T, E]`` the (noisy in training) softmax scores; capacity: the capacity used;
    aux_loss: the load/importance loss (scalar, float32; 0 when not computed).
    """

    experts: torch.Tensor
    gates: torch.Tensor
    slots: torch.Tensor | None
    keep: torch.Tensor
    scores: torch.Tensor
    capacity: int
    aux_loss: torch.Tensor


def route(logits: torch.Tensor, top_k: int, capacity_factor: float | None, *,
          gate_noise: float, training: bool, aux: bool = True) -> Routing:
    """Noisy top-k routing of ``logits [T, E]`` with capacity and batch-prioritised dropping
    (see the module docstring). Noise is drawn only when ``training``; ``aux=False`` skips the
    auxiliary loss (0)."""
    num_tokens, num_experts = logits.shape
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k must be in [1, {num_experts}] (the number of experts), got "
                         f"{top_k}")
    logits = logits.float()
    noise_std = gate_noise / num_experts
    noisy = logits + noise_std * torch.randn_like(logits) if training and gate_noise > 0 \
        else logits
    scores = softmax_rows(noisy)
    top_scores, experts = torch.topk(scores, top_k, dim=1)
    gates = top_scores
    if top_k > 1:
        gates = gates / gates.sum(dim=1, keepdim=True).clamp(min=torch.finfo(gates.dtype).eps)
    capacity = expert_capacity(num_tokens, num_experts, top_k, capacity_factor)
    if capacity_factor is None:  # an expert gets a token at most once: nothing is dropped
        slots, keep = None, torch.ones_like(experts, dtype=torch.bool)
    else:
        slots = assign_slots(experts, top_scores[:, 0].detach(), num_experts)
        keep = slots < capacity
    loss = logits.new_zeros(())
    if aux and gate_noise > 0:
        kth = noisy.gather(1, experts[:, -1:]).squeeze(1)
        clean = scores if noisy is logits else softmax_rows(logits)
        loss = load_importance_loss(clean, kth, noise_std)
    return Routing(experts, gates, slots, keep, scores, capacity, loss)


@dataclass
class RoutingStats:
    """What one forward of :class:`MoEFFN` reports (tensors, so no device sync is forced).

    aux_loss: scalar with gradient (computed in training mode only; 0 in eval mode);
    drop_frac: fraction of the ``k * T`` assignments dropped;
    load_entropy: entropy (nats) of the fraction of assignments routed to each expert, before
    dropping (``ln E`` when balanced, 0 when collapsed); top1: ``[B, N]`` each token's first-choice
    expert, kept only when :attr:`MoEFFN.record_experts` is set (for plots).
    """

    aux_loss: torch.Tensor
    drop_frac: torch.Tensor
    load_entropy: torch.Tensor
    top1: torch.Tensor | None = None


class MoEFFN(nn.Module):
    """Sparse mixture-of-experts FFN replacing a transformer block's ``mlp`` (input and output
    ``[B, N, D]``; see the module docstring for the maths).

    Args:
        dim, hidden: token width ``D`` and expert hidden width ``H``.
        num_experts: ``E`` (6 in GMoE); top_k: experts per token (1 in GMoE; 2 works).
        capacity_factor: training capacity factor (1.5).
        eval_capacity_factor: capacity factor in eval mode; ``None`` = no dropping at evaluation
            (each sample's output is then independent of its batch mates).
        gate_noise: training noise std is ``gate_noise / E`` (1.0); must be > 0 (the load term).
        router_dim: the router's projection width (256); expert_dropout: dropout on the hidden
            units of the experts (0.1).
    """

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
        for w in (self.w1, self.w2):
            nn.init.trunc_normal_(w, std=0.02)
        self.act = nn.GELU()
        if not 0.0 <= expert_dropout < 1.0:
            raise ValueError(f"expert_dropout must be in [0, 1), got {expert_dropout}")
        self.expert_dropout = float(expert_dropout)
        #: keep each token's first-choice expert in :attr:`last_routing` (plots)
        self.record_experts = False
        self._last_routing: RoutingStats | None = None

    @classmethod
    def from_dense(cls, mlp: nn.Module, **kwargs) -> "MoEFFN":
        """An MoE layer whose experts are all copies of the dense FFN ``mlp`` (a timm ``Mlp``:
        ``fc1``, GELU, ``fc2``, no norm), on ``mlp``'s device and dtype."""
        fc1, fc2 = getattr(mlp, "fc1", None), getattr(mlp, "fc2", None)
        if not isinstance(fc1, nn.Linear) or not isinstance(fc2, nn.Linear):
            raise TypeError(f"expected a timm Mlp with Linear fc1/fc2, got {type(mlp).__name__}")
        if not isinstance(getattr(mlp, "norm", nn.Identity()), nn.Identity):
            raise TypeError("the dense FFN has a norm layer between fc1 and fc2; the experts "
                            "(fc1, GELU, dropout, fc2) cannot copy it")
        layer = cls(fc1.in_features, fc1.out_features, **kwargs)
        layer.to(device=fc1.weight.device, dtype=fc1.weight.dtype)
        with torch.no_grad():
            layer.w1.copy_(fc1.weight.unsqueeze(0).expand_as(layer.w1))
            layer.w2.copy_(fc2.weight.unsqueeze(0).expand_as(layer.w2))
            layer.b1.copy_(fc1.bias.unsqueeze(0).expand_as(layer.b1) if fc1.bias is not None
                           else torch.zeros_like(layer.b1))
            layer.b2.copy_(fc2.bias.unsqueeze(0).expand_as(layer.b2) if fc2.bias is not None
                           else torch.zeros_like(layer.b2))
        return layer

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, hidden={self.hidden}, experts={self.num_experts}, "
                f"top_k={self.top_k}, capacity_factor={self.capacity_factor}, "
                f"eval_capacity_factor={self.eval_capacity_factor}, gate_noise={self.gate_noise}")

    @property
    def last_routing(self) -> RoutingStats | None:
        """The routing statistics of the last forward (None before any)."""
        return self._last_routing

    def pop_routing(self) -> RoutingStats | None:
        """Return :attr:`last_routing` and forget it (so no graph or tensor outlives the step)."""
        stats, self._last_routing = self._last_routing, None
        return stats

    def expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """Expert ``e`` on tokens ``x [n, D]``: ``fc2(Dropout(GELU(fc1 x)))``."""
        p = self.expert_dropout if self.training else 0.0
        h = hidden_dropout(self.act(F.linear(x, self.w1[e], self.b1[e])), p, self.training,
                           rescale=False)
        w2 = self.w2[e] * (1.0 / (1.0 - p)) if p else self.w2[e]  # the dropout's rescaling
        return F.linear(h, w2, self.b2[e])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        tokens = x.reshape(-1, shape[-1])
        num_tokens = tokens.shape[0]
        factor = self.capacity_factor if self.training else self.eval_capacity_factor
        r = route(self.router(tokens), self.top_k, factor, gate_noise=self.gate_noise,
                  training=self.training, aux=self.training)
        # kept assignments, grouped by expert
        token_ids = torch.arange(num_tokens, device=x.device).unsqueeze(1).expand_as(r.experts)
        kept = r.keep.reshape(-1)
        experts = r.experts.reshape(-1)[kept]
        order = torch.argsort(experts, stable=True)
        ids = token_ids.reshape(-1)[kept][order]
        gates = r.gates.reshape(-1)[kept][order]
        counts = torch.bincount(experts, minlength=self.num_experts).tolist()
        chunks = tokens.index_select(0, ids).split(counts)
        outputs = [self.expert(e, chunk) for e, chunk in enumerate(chunks) if chunk.shape[0]]
        out = torch.cat(outputs) if outputs else tokens.new_zeros(0, shape[-1])
        out = out * gates.to(out.dtype).unsqueeze(1)
        # out's dtype: under autocast the experts' matmuls may run in half precision
        y = out.new_zeros(num_tokens, shape[-1]).index_add_(0, ids, out)

        with torch.no_grad():
            load = torch.bincount(r.experts.reshape(-1), minlength=self.num_experts).float()
            p = load / load.sum()
            entropy = -(p * torch.log(p.clamp(min=1e-12))).sum()
            drop = 1.0 - r.keep.float().mean()
        top1 = r.experts[:, 0].reshape(shape[:-1]).detach() if self.record_experts else None
        self._last_routing = RoutingStats(r.aux_loss, drop, entropy, top1)
        return y.reshape(shape)


__all__ = ["CosineRouter", "MAX_LOG_SCALE", "MoEFFN", "Routing", "RoutingStats",
           "assign_slots", "expert_capacity", "hidden_dropout", "load_importance_loss", "route",
           "softmax_rows"]
