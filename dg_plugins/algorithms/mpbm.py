"""MPBM: Model-aware Parametric Batch-wise Mixup for single-source DG (Heidari & Guo, arXiv
2502.16064); no official code, the reconstructed parts are marked *(rec.)*. SGLD queries, the
C-modulated attention mixup generator, a feature discriminator, ``L_sup + lambda_mix L_mix^tr``
on the "phased" or "online" schedule: ``docs/methods/mpbm.md``."""

from __future__ import annotations

import contextlib
import math
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

from dg_plugins import hparams as hp_lib
from dg_plugins.algorithms.base import (FeatureClassifier, adam, float32, optimizer_step,
                                        register_algorithm, split_minibatches)
from dg_plugins.datasets.image_folder import IMAGENET_MEAN, IMAGENET_STD

#: Datasets whose inputs are [0, 1] pixels (the SGLD step default eta = 1.0 applies).
PIXEL_DATASETS = set(hp_lib.SMALL_IMAGE_DATASETS) | {"Digits", "DigitsOffline"}
CLAMP_MODES = ("batch", "unit", "imagenet", "none")
SCHEDULES = ("phased", "online")
#: Phase names; ``update``'s ``phase`` value is the index.
PHASES = ("erm", "corr", "query", "gen", "synth", "finetune", "online")
LOSS_KEYS = ("loss", "sup", "mix", "gen", "adv", "disc", "disc_acc")
DIAG_KEYS = ("diag_query_corr", "diag_query_clamped", "diag_source_clamped", "diag_query_acc",
             "diag_attn_top_share", "diag_synth_cos", "diag_synth_outside_hull", "diag_disc_acc")
UPDATE_KEYS = LOSS_KEYS + ("phase", "round") + DIAG_KEYS
#: The datasets' ``N_STEPS`` (DomainBed's 5001 elsewhere): the phased schedule's are fractions.
DEFAULT_STEPS = {"RotatedMNIST5k": 1001, "DigitsOffline": 2001, "Digits": 10001}
#: The diagnostics probe's generator is seeded ``PROBE_SEED + step``.
PROBE_SEED = 7919


def phase_at(step: int, hparams: dict, rows: int) -> tuple[str, int, int]:
    """``(phase, round, offset)`` of 0-based ``step`` (round 1-based, 0 outside the rounds): a pure
    function of the step and the hparams, so a resume keeps the phase."""
    if hparams["mpbm_schedule"] == "online":
        warmup = hparams["mpbm_warmup_steps"]
        return ("erm", 0, step) if step < warmup else ("online", 0, step - warmup)
    pretrain = hparams["mpbm_pretrain_steps"]
    if step < pretrain:
        return "erm", 0, step
    phases = [("corr", hparams["mpbm_corr_steps"]), ("query", hparams["mpbm_query_steps"]),
              ("gen", hparams["mpbm_gen_steps"]), ("synth", -(-hparams["mpbm_synth_size"] // rows)),
              ("finetune", hparams["mpbm_finetune_steps"])]
    offset = step - pretrain
    round_length = sum(n for _, n in phases)
    index = min(offset // round_length, hparams["mpbm_rounds"] - 1)
    offset -= index * round_length
    for name, n in phases:
        if offset < n or name == "finetune":  # the last round's fine-tuning goes on
            return name, index + 1, offset
        offset -= n
    raise AssertionError("unreachable")


class MixupAttentionGenerator(nn.Module):
    """g_phi: per-feature attention of a query over N_b real features, modulated by C *(rec.)*;
    values ``V`` or ``V W_V^T`` (``value_projection``, ``W_V`` starts as the identity)."""

    def __init__(self, dim: int, value_projection: bool = False):
        super().__init__()
        self.dim = dim
        self.query = nn.Linear(dim, dim, bias=False)
        self.key = nn.Linear(dim, dim, bias=False)
        self.value = None
        if value_projection:
            self.value = nn.Linear(dim, dim, bias=False)
            nn.init.eye_(self.value.weight)

    def attention(self, q: torch.Tensor, values: torch.Tensor, corr: torch.Tensor) -> torch.Tensor:
        """Weights ``A [B, N_b, d]`` (each ``A[b, :, j]`` sums to 1)."""
        scores = (self.query(q).unsqueeze(1) * self.key(values)) @ corr / math.sqrt(self.dim)
        return scores.softmax(dim=1)

    def mix(self, weights: torch.Tensor, values: torch.Tensor, labels: torch.Tensor,
            detach_value: bool = False):
        """``(z, ytilde)``: ``z_j = sum_i A_ij V'_ij`` (``V' = V W_V^T`` with ``W_V``; no gradient
        into it with ``detach_value``), ``ytilde = sum_i abar_i y_i``."""
        if self.value is not None:
            weight = self.value.weight
            values = F.linear(values, weight.detach() if detach_value else weight)
        z = (weights * values).sum(dim=1)
        return z, (weights.mean(dim=2).unsqueeze(-1) * labels).sum(dim=1)

    def forward(self, q, values, corr, labels):
        weights = self.attention(q, values, corr)
        return (*self.mix(weights, values, labels), weights)


class FeatureDiscriminator(nn.Module):
    """D_omega *(rec.)*: an MLP d -> 512 -> 1 on features; returns logits (real > 0)."""

    def __init__(self, dim: int, hidden: int = 512):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, hidden), nn.LeakyReLU(0.2), nn.Linear(hidden, 1))

    def forward(self, features):
        return self.net(features).squeeze(-1)


def soft_cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean over the batch of ``-sum_c target_c log softmax(logits)_c`` (soft labels)."""
    return -(target * logits.log_softmax(dim=-1)).sum(dim=-1).mean()


@contextlib.contextmanager
def frozen_eval(module: nn.Module):
    """Eval mode inside the block; each submodule's own ``training`` flag restored after."""
    flags = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        yield
    finally:
        for m, flag in flags:
            m.training = flag


def image_correlation(queries: torch.Tensor, sources: torch.Tensor) -> torch.Tensor:
    """``[N]``: Pearson correlation of each query with its source image (0 if either is flat)."""
    a, b = (t.flatten(1).double() for t in (queries, sources))
    a, b = a - a.mean(dim=1, keepdim=True), b - b.mean(dim=1, keepdim=True)
    denominator = a.norm(dim=1) * b.norm(dim=1)
    corr = (a * b).sum(dim=1) / denominator.clamp_min(1e-12)
    return torch.where(denominator > 0, corr, torch.zeros_like(corr)).float()


def clamped_share(x: torch.Tensor, bounds) -> float:
    if bounds is None or x.numel() == 0:
        return 0.0
    lo, hi = bounds
    return ((x <= lo) | (x >= hi)).float().mean().item()


def top_instance_share(weights: torch.Tensor) -> torch.Tensor:
    """``[B]``: share of the d dimensions whose top weight goes to the most common instance."""
    top = weights.argmax(dim=1)  # [B, d]
    counts = F.one_hot(top, weights.shape[1]).sum(dim=1)  # [B, N_b]
    return counts.amax(dim=1).float() / weights.shape[2]


def nearest_cosine(synthetic: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    return (F.normalize(synthetic, dim=1) @ F.normalize(real, dim=1).T).amax(dim=1)


def discriminator_accuracy(real_logits: torch.Tensor, fake_logits: torch.Tensor) -> float:
    return torch.cat([real_logits > 0, fake_logits < 0]).float().mean().item()


def outside_hull_share(z: torch.Tensor, values: torch.Tensor, tol: float = 1e-5) -> float:
    lo, hi = values.amin(dim=1), values.amax(dim=1)
    scale = tol * (1 + values.abs().amax(dim=1))
    return ((z < lo - scale) | (z > hi + scale)).float().mean().item()


@register_algorithm("MPBM")
class MPBM(FeatureClassifier):
    """MPBM; optimizers ``optimizer`` (f, h), ``gen_optimizer`` (g), ``disc_optimizer`` (D)."""

    #: One step per phase (no C phase): three updates reach every parameter; a probe every second.
    TINY_TEST_HPARAMS: dict = {
        "mpbm_schedule": "phased", "mpbm_pretrain_steps": 1, "mpbm_corr_steps": 0,
        "mpbm_query_steps": 1, "mpbm_gen_steps": 1, "mpbm_synth_size": 8,
        "mpbm_finetune_steps": 1, "mpbm_rounds": 1, "mpbm_diag_every": 2,
        "mpbm_warmup_steps": 1, "mpbm_T": 1, "mpbm_corr_every": 2}

    @staticmethod
    def hparam_space(dataset: str) -> dict:
        """The paper's N_b = T = 5, lambda_adv = lambda_mix = 0.5; the rest *(rec.)*."""
        pixels = dataset in PIXEL_DATASETS
        eta = 1.0 if pixels else 2.0 / 255.0
        # online warm-up: 10% of the CPU-sized MNIST runs, else 1000 steps
        warmup = 100 if dataset in hp_lib.SMALL_IMAGE_DATASETS else 1000
        steps = DEFAULT_STEPS.get(dataset, 5001)

        def fixed(value, check=hp_lib.non_negative):
            return value, lambda r: value, check

        return {
            "mpbm_schedule": fixed("online", hp_lib.one_of(*SCHEDULES)),
            "mpbm_nb": (5, lambda r: int(r.choice([3, 5, 8])), hp_lib.positive),
            "mpbm_T": (5, lambda r: int(r.choice([3, 5])), hp_lib.non_negative),
            "mpbm_eta": (eta, lambda r: eta * 10 ** r.uniform(-1, 0), hp_lib.non_negative),
            "mpbm_sgld_noise": fixed(1.0),
            "mpbm_sgld_init": fixed("data", hp_lib.one_of("data", "noise")),
            "mpbm_clamp": fixed("batch", hp_lib.one_of(*CLAMP_MODES)),
            "mpbm_lambda_adv": (0.5, hp_lib._choice([0.2, 0.5, 0.8]), hp_lib.non_negative),
            "mpbm_lambda_mix": (0.5, hp_lib._choice([0.25, 0.5, 1.0]), hp_lib.non_negative),
            "mpbm_value_proj": fixed(False, None),
            "mpbm_lr_g": (1e-4, lambda r: 10 ** r.uniform(-4.5, -3.5), hp_lib.positive),
            "mpbm_lr_d": (1e-4, lambda r: 10 ** r.uniform(-4.5, -3.5), hp_lib.positive),
            "mpbm_gen_mix_label": fixed("mixed", hp_lib.one_of("mixed", "query")),
            "mpbm_gen_objective": fixed("min", hp_lib.one_of("min", "max")),
            "mpbm_diag_every": fixed(50),
            # phased schedule
            "mpbm_pretrain_steps": fixed(steps // 2),
            "mpbm_corr_steps": fixed(50),
            "mpbm_query_steps": fixed(10, hp_lib.positive),
            "mpbm_gen_steps": fixed(steps // 20),
            "mpbm_synth_size": fixed(1024, hp_lib.positive),
            "mpbm_finetune_steps": fixed(steps // 10, hp_lib.positive),
            "mpbm_rounds": fixed(2, hp_lib.positive),
            # online schedule
            "mpbm_warmup_steps": fixed(warmup),
            "mpbm_corr_every": fixed(100 if pixels else 500, hp_lib.positive),
            "mpbm_corr_window": fixed("round", hp_lib.one_of("round", "all")),
        }

    def __init__(self, input_shape, num_classes, num_domains, hparams):
        super().__init__(input_shape, num_classes, num_domains, hparams)
        if hparams["mpbm_clamp"] == "imagenet" and self.input_shape[0] != 3:
            raise ValueError(f"mpbm_clamp 'imagenet' needs 3-channel inputs, got input shape "
                             f"{self.input_shape}; use 'batch' or 'unit'")
        if num_domains > 1:
            warnings.warn(f"MPBM is a single-source DG method; its {num_domains} source "
                          "environments are pooled into one source (train with --test_envs "
                          "listing all environments but one for the paper's setting)",
                          stacklevel=2)
        dim = self.featurizer.n_outputs
        self.generator = MixupAttentionGenerator(dim, hparams["mpbm_value_proj"])
        self.discriminator = FeatureDiscriminator(dim)
        self.optimizer = adam(self.network.parameters(), hparams)
        self.gen_optimizer = torch.optim.Adam(self.generator.parameters(),
                                              lr=hparams["mpbm_lr_g"], betas=(0.5, 0.999))
        self.disc_optimizer = torch.optim.Adam(self.discriminator.parameters(),
                                               lr=hparams["mpbm_lr_d"], betas=(0.5, 0.999))
        per_domain = hparams.get("batch_sampling", "per_domain") != "pooled"
        self.rows = hparams["batch_size"] * (num_domains if per_domain else 1)  # rows of a step
        self.register_buffer("step", torch.zeros((), dtype=torch.long))
        # Feature statistics (batched Welford) and the correlation matrix C in use.
        self.register_buffer("corr", torch.eye(dim))
        self.register_buffer("corr_refreshed_at", torch.full((), -1, dtype=torch.long))
        self.register_buffer("feat_count", torch.zeros(()))
        self.register_buffer("feat_mean", torch.zeros(dim))
        self.register_buffer("feat_m2", torch.zeros(dim, dim))
        # Phased schedule: the round's query bank and synthetic set (empty for "online").
        phased = hparams["mpbm_schedule"] == "phased"
        bank = hparams["mpbm_query_steps"] * self.rows if phased else 0
        synth = hparams["mpbm_synth_size"] if phased else 0
        self.register_buffer("query_bank", torch.zeros(bank, dim))
        self.register_buffer("query_labels", torch.zeros(bank, dtype=torch.long))
        self.register_buffer("bank_count", torch.zeros((), dtype=torch.long))
        self.register_buffer("synth_z", torch.zeros(synth, dim))
        self.register_buffer("synth_y", torch.zeros(synth, num_classes))
        self.register_buffer("synth_count", torch.zeros((), dtype=torch.long))
        self.register_buffer("synth_round", torch.zeros((), dtype=torch.long))
        # The last probe's diagnostics (DIAG_KEYS order) and its step (-1: none yet).
        self.register_buffer("diag", torch.zeros(len(DIAG_KEYS)))
        self.register_buffer("diag_step", torch.full((), -1, dtype=torch.long))

    def phase(self, step: int | None = None) -> tuple[str, int, int]:
        return phase_at(int(self.step) if step is None else step, self.hparams, self.rows)

    @torch.no_grad()
    def accumulate_features(self, features: torch.Tensor) -> None:
        """Merge a batch into (count, mean, co-moment) in float32 (Chan et al.'s Welford)."""
        n_b = features.shape[0]
        if n_b == 0:
            return
        with float32(features.device.type):
            features = features.detach().to(self.feat_mean.dtype)
            mean_b = features.mean(dim=0)
            centred = features - mean_b
            n = self.feat_count
            total = n + n_b
            delta = mean_b - self.feat_mean
            self.feat_m2.add_(centred.T @ centred + torch.outer(delta, delta) * (n * n_b / total))
            self.feat_mean.add_(delta * (n_b / total))
            self.feat_count.copy_(total)

    @torch.no_grad()
    def reset_feature_statistics(self) -> None:
        for stat in (self.feat_count, self.feat_mean, self.feat_m2):
            stat.zero_()

    @torch.no_grad()
    def correlation_estimate(self) -> torch.Tensor:
        """Pearson correlation of the features; a zero-variance dimension: 0 off the diagonal."""
        var = self.feat_m2.diagonal()
        alive = var > 1e-12
        std = torch.where(alive, var, torch.ones_like(var)).sqrt()
        corr = self.feat_m2 / torch.outer(std, std) * (alive.unsqueeze(0) & alive.unsqueeze(1))
        corr = corr.clamp(-1.0, 1.0)
        corr.diagonal().fill_(1.0)
        return corr

    @torch.no_grad()
    def refresh_correlation(self) -> None:
        if self.feat_count < 2:
            return
        self.corr.copy_(self.correlation_estimate())
        self.corr_refreshed_at.copy_(self.step)

    def input_range(self, x: torch.Tensor):
        mode = self.hparams["mpbm_clamp"]
        shape = [1, -1] + [1] * (x.dim() - 2)
        if mode == "none":
            return None
        if mode == "unit":
            return torch.zeros((), device=x.device), torch.ones((), device=x.device)
        if mode == "imagenet":
            mean = torch.tensor(IMAGENET_MEAN, device=x.device, dtype=x.dtype).view(shape)
            std = torch.tensor(IMAGENET_STD, device=x.device, dtype=x.dtype).view(shape)
            return (0 - mean) / std, (1 - mean) / std
        dims = [d for d in range(x.dim()) if d != 1]
        return x.amin(dim=dims).view(shape), x.amax(dim=dims).view(shape)

    def sgld_queries(self, x: torch.Tensor, y: torch.Tensor,
                     generator: torch.Generator | None = None) -> torch.Tensor:
        """``x^T`` after ``mpbm_T`` SGLD ascent steps on the summed CE (f, h frozen), clamped."""
        eta = self.hparams["mpbm_eta"]
        noise = self.hparams["mpbm_sgld_noise"] * math.sqrt(2.0 * eta)
        bounds = self.input_range(x)
        x_t = x.detach().clone()

        def draw(fn):
            return fn(x_t.shape, generator=generator, device=x_t.device, dtype=x_t.dtype)

        if self.hparams["mpbm_sgld_init"] == "noise":
            lo, hi = bounds if bounds is not None else (x.min(), x.max())
            x_t = lo + (hi - lo) * draw(torch.rand)
        fp16 = (torch.is_autocast_enabled(x.device.type)
                and torch.get_autocast_dtype(x.device.type) == torch.float16)
        with (frozen_eval(self.network), torch.enable_grad(),
              float32(x.device.type) if fp16 else contextlib.nullcontext()):
            for _ in range(self.hparams["mpbm_T"]):
                x_t.requires_grad_(True)
                loss = F.cross_entropy(self.predict(x_t), y, reduction="sum")
                (grad,) = torch.autograd.grad(loss, x_t)
                x_t = x_t.detach() + eta * grad + noise * draw(torch.randn)
                if bounds is not None:
                    x_t = torch.maximum(torch.minimum(x_t, bounds[1]), bounds[0])
        return x_t.detach()

    def frozen_features(self, x: torch.Tensor) -> torch.Tensor:
        with frozen_eval(self.network), torch.no_grad():
            return self.featurizer(x)

    query_features = frozen_features

    def draw_groups(self, batch: int, device, count: int | None = None,
                    generator: torch.Generator | None = None) -> torch.Tensor:
        """``[count, N_b]`` row indices (with replacement) each synthetic sample mixes."""
        count = batch if count is None else count
        return torch.randint(0, batch, (count, self.hparams["mpbm_nb"]), device=device,
                             generator=generator)

    def generator_step(self, q, features, y_onehot, y, groups) -> tuple[torch.Tensor, dict]:
        """One step of g on ``L_mix^gen + lambda_adv L_adv`` (f, h, D frozen) -> detached z."""
        values = features.detach()[groups]
        z, y_mix, _ = self.generator(q, values, self.corr, y_onehot[groups])
        logits = self.classifier(z)
        query_label = self.hparams["mpbm_gen_mix_label"] == "query"
        gen = F.cross_entropy(logits, y) if query_label else soft_cross_entropy(logits, y_mix)
        loss = gen if self.hparams["mpbm_gen_objective"] == "min" else -gen
        lambda_adv = self.hparams["mpbm_lambda_adv"]
        adv = torch.zeros((), device=z.device)
        if lambda_adv > 0:
            adv = F.softplus(-self.discriminator(z)).mean()  # -log D(z), non-saturating
            loss = loss + lambda_adv * adv
        optimizer_step(self.gen_optimizer, loss, inputs=list(self.generator.parameters()))
        return z.detach(), {"gen": gen.item(), "adv": adv.item()}

    def discriminator_step(self, real, fake) -> dict:
        """One step of D on ``-log D(f(x)) - log(1 - D(z))``."""
        real_logits = self.discriminator(real.detach())
        fake_logits = self.discriminator(fake.detach())
        loss = F.softplus(-real_logits).mean() + F.softplus(fake_logits).mean()
        optimizer_step(self.disc_optimizer, loss)
        return {"disc": loss.item(), "disc_acc": discriminator_accuracy(real_logits, fake_logits)}

    def synthetic_features(self, q, features, y_onehot, groups):
        """Mixup of ``features`` (with their gradient) under g's current, detached weights."""
        with torch.no_grad():
            weights = self.generator.attention(q, features.detach()[groups], self.corr)
        return self.generator.mix(weights, features[groups], y_onehot[groups], detach_value=True)

    def one_hot(self, y: torch.Tensor) -> torch.Tensor:
        return F.one_hot(y, self.num_classes).to(self.corr.dtype)

    def model_step(self, sup: torch.Tensor, mix: torch.Tensor | None, out: dict) -> None:
        loss = sup if mix is None else sup + self.hparams["mpbm_lambda_mix"] * mix
        if mix is not None:
            out["mix"] = mix.item()
        optimizer_step(self.optimizer, loss)
        out["loss"], out["sup"] = loss.item(), sup.item()

    def bank_draw(self, count: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        if int(self.bank_count) == 0:
            raise RuntimeError("MPBM's query bank is empty (the query phase got no batch rows)")
        index = torch.randint(0, int(self.bank_count), (count,), device=device)
        return self.query_bank[index], self.query_labels[index]

    def query_diagnostics(self, x: torch.Tensor, x_query: torch.Tensor, y: torch.Tensor,
                          q: torch.Tensor) -> dict:
        bounds = self.input_range(x)
        with torch.no_grad():
            accuracy = (self.classifier(q).argmax(dim=1) == y).float().mean().item()
        return {"diag_query_corr": image_correlation(x_query, x).mean().item(),
                "diag_query_clamped": clamped_share(x_query, bounds),
                "diag_source_clamped": clamped_share(x, bounds),
                "diag_query_acc": accuracy}

    def probe(self, x: torch.Tensor, y: torch.Tensor) -> dict:
        """Every diagnostic on the batch, with a random generator of its own; kept in ``diag``."""
        generator = torch.Generator(device=x.device).manual_seed(PROBE_SEED + int(self.step))
        with frozen_eval(self):
            x_query = self.sgld_queries(x, y, generator=generator)
            q = self.query_features(x_query)
            values = self.query_diagnostics(x, x_query, y, q)
            with torch.no_grad():
                features = self.frozen_features(x)
                groups = self.draw_groups(len(x), x.device, count=len(q), generator=generator)
                z, _, weights = self.generator(q, features[groups], self.corr,
                                               self.one_hot(y)[groups])
                values.update(
                    diag_attn_top_share=top_instance_share(weights).mean().item(),
                    diag_synth_cos=nearest_cosine(z, features).mean().item(),
                    diag_synth_outside_hull=outside_hull_share(z, features[groups]),
                    diag_disc_acc=discriminator_accuracy(self.discriminator(features),
                                                         self.discriminator(z)))
        self.diag.copy_(torch.tensor([values[k] for k in DIAG_KEYS]))
        self.diag_step.copy_(self.step)
        return values

    def update(self, minibatches, unlabeled=None):
        x, y, _ = split_minibatches(minibatches)
        phase, round_index, offset = self.phase()
        out = dict.fromkeys(LOSS_KEYS, 0.0)
        if phase == "erm":  # L_sup (online: the features also feed C's statistics)
            features = self.featurizer(x)
            if self.hparams["mpbm_schedule"] == "online":
                self.accumulate_features(features)
            self.model_step(F.cross_entropy(self.classifier(features), y), None, out)
        elif phase == "corr":
            if offset == 0:
                self.reset_feature_statistics()
            self.accumulate_features(self.frozen_features(x))
            if offset == self.hparams["mpbm_corr_steps"] - 1:
                self.refresh_correlation()
        elif phase == "query":  # the round's bank of SGLD query features
            with torch.no_grad():
                if offset == 0:
                    self.bank_count.zero_()
                q = self.query_features(self.sgld_queries(x, y))
                start = int(self.bank_count)
                n = min(len(q), self.query_bank.shape[0] - start)
                self.query_bank[start:start + n] = q[:n]
                self.query_labels[start:start + n] = y[:n]
                self.bank_count += n
        elif phase == "gen":
            features = self.frozen_features(x)
            q, y_q = self.bank_draw(len(x), x.device)
            groups = self.draw_groups(len(x), x.device)
            z, stats = self.generator_step(q, features, self.one_hot(y), y_q, groups)
            out.update(stats)
            if self.hparams["mpbm_lambda_adv"] > 0:
                out.update(self.discriminator_step(features, z))
        elif phase == "synth":  # the round's synthetic set, mixed for the bank's queries
            with torch.no_grad():
                if offset == 0:
                    self.synth_count.zero_()
                    self.synth_round.fill_(round_index)
                start = int(self.synth_count)
                n = min(self.rows, self.synth_z.shape[0] - start)
                if n > 0 and len(x) > 0:
                    features = self.frozen_features(x)
                    q, _ = self.bank_draw(n, x.device)
                    groups = self.draw_groups(len(x), x.device, count=n)
                    z, y_mix, _ = self.generator(q, features[groups], self.corr,
                                                 self.one_hot(y)[groups])
                    self.synth_z[start:start + n] = z
                    self.synth_y[start:start + n] = y_mix
                    self.synth_count += n
        elif phase == "finetune":
            sup, mix = F.cross_entropy(self.predict(x), y), None
            if self.hparams["mpbm_lambda_mix"] > 0 and int(self.synth_count) > 0:
                index = torch.randint(0, int(self.synth_count), (len(x),), device=x.device)
                mix = soft_cross_entropy(self.classifier(self.synth_z[index]), self.synth_y[index])
            self.model_step(sup, mix, out)
        else:  # online: refresh C every mpbm_corr_every steps ("round": restart the statistics)
            last = int(self.corr_refreshed_at)
            if (last < 0 or int(self.step) - last >= self.hparams["mpbm_corr_every"]) and \
                    self.feat_count >= 2:
                self.refresh_correlation()
                if self.hparams["mpbm_corr_window"] == "round":
                    self.reset_feature_statistics()
            q = self.query_features(self.sgld_queries(x, y))
            features = self.featurizer(x)
            self.accumulate_features(features)
            y_onehot = self.one_hot(y)
            groups = self.draw_groups(len(x), x.device)
            z, gen_stats = self.generator_step(q, features, y_onehot, y, groups)
            out.update(gen_stats)
            if self.hparams["mpbm_lambda_adv"] > 0:
                out.update(self.discriminator_step(features, z))
            sup, mix = F.cross_entropy(self.classifier(features), y), None
            if self.hparams["mpbm_lambda_mix"] > 0:
                z_train, y_mix = self.synthetic_features(q, features, y_onehot, groups)
                mix = soft_cross_entropy(self.classifier(z_train), y_mix)
            self.model_step(sup, mix, out)
        every = self.hparams["mpbm_diag_every"]
        if every > 0 and int(self.step) % every == 0 and len(x) > 0:
            self.probe(x, y)
        out["phase"] = float(PHASES.index(phase))
        out["round"] = float(round_index)
        out.update(zip(DIAG_KEYS, self.diag.tolist()))
        self.step += 1
        return out
