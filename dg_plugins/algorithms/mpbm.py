"""MPBM: Model-aware Parametric Batch-wise Mixup for single-source domain generalization (Heidari
& Guo, "Single Domain Generalization with Model-aware Parametric Batch-wise Mixup", arXiv
2502.16064). The first public implementation: no official code exists, and several parts of the
method are not pinned down by the paper's description. Each such choice is a reconstruction,
marked *(rec.)* below, and where the paper admits several readings the alternatives are hparams.

The method, per training step after ``mpbm_warmup_steps`` of plain ERM:

1. **Adversarial queries by SGLD** (the paper's query equation), with the prediction model
   ``h(f(.))`` frozen::

       x^{t+1} = clamp(x^t + eta * grad_x CE(h(f(x^t)), y) + sqrt(2 eta) * eps),  t = 0..T-1

   from ``x^0 = x`` (the real batch), ``eps ~ N(0, I)``; the query feature is ``q = f(x^T)``. The
   CE is summed over the batch, so each image moves along its own loss gradient whatever the batch
   size. f and h get no parameter gradient, and the query runs in eval mode (BatchNorm uses and
   keeps its running statistics; dropout is off); the previous train/eval flags of every submodule
   are restored after.
2. **Parametric batch-wise mixup generator** g: each synthetic sample mixes ``N_b = mpbm_nb``
   real features ``V`` (``[N_b, d]``, the rows of a random index set drawn with ``torch.randint``,
   one set per synthetic sample, so any batch size works), *per feature dimension* *(rec.)*::

       Q = W_Q q,  K_i = W_K v_i,  S_i = ((Q * K_i) C) / sqrt(d),
       A[:, j] = softmax_i(S[:, j]),  z_j = sum_i A_ij V_ij,  ytilde = sum_i abar_i y_i,

   with ``abar_i = mean_j A_ij`` (a soft label) and ``C`` the Pearson correlation matrix of the
   source features. Every ``z_j`` is a convex combination of the N_b values of dimension j.
3. **Generator / discriminator step** (f frozen): ``L_gen = L_mix^gen + lambda_adv L_adv`` with
   ``L_mix^gen = CE(h(z), ytilde)`` *(rec.; ``mpbm_gen_mix_label`` "query" uses the query's label
   and ``mpbm_gen_objective`` "max" maximises it instead)* and the non-saturating GAN loss
   ``L_adv = -log D(z)``; the discriminator D (an MLP d -> 512 -> 1 on features, *rec.*) minimises
   ``-log D(f(x)) - log(1 - D(z))``.
4. **Prediction-model step**: ``L_tr = CE(h(f(x)), y) + lambda_mix CE(h(z), ytilde)`` where the
   synthetic features are re-made by the updated generator with its mixing weights detached
   (no gradient into g) but on ``V = f(x)`` *with* gradient, so f also learns from the mixed
   features *(rec.)*.

``C`` *(rec.)* is estimated online, with no extra forward pass, from the real-batch features f(x)
of every update (warm-up included): a batched Welford / Chan merge of count, mean and co-moment
buffers, turned into ``corr`` every ``mpbm_corr_every`` steps (the paper's "compute C" per round).
``mpbm_corr_window`` "round" restarts the estimate after each refresh (C of the features of the
last round), "all" keeps accumulating. Before the first refresh ``corr`` is the identity.

Reconstructed choices not above: synthetic data are made on the fly, not stored (the paper's
"generate a synthetic dataset" step); the paper's alternation (pretrain, C, queries, g/D, fine-tune
f/h, repeat) becomes one g step, one D step and one f/h step per ``update``; f and h use the job's
Adam (``lr``, ``weight_decay``: DomainBed's convention), g and D Adam with ``betas=(0.5, 0.999)``
and their own learning rates ``mpbm_lr_g`` / ``mpbm_lr_d``.

The valid input range (the SGLD clamp): the algorithm never sees the dataset, so ``mpbm_clamp``
says where it comes from: "batch" (default) = the per-channel min and max of the real batch (a
subset of the valid range of any normalisation, so it never leaves it); "unit" = [0, 1] (raw
pixels, e.g. the MNIST datasets and Digits); "imagenet" = the per-channel range of
ImageNet-normalised [0, 1] pixels (the 224x224 image-folder datasets); "none" = no clamp.

SGLD scale: the paper couples noise and step (``sqrt(2 eta)``); ``mpbm_sgld_noise`` multiplies the
noise (1.0 = the paper; 0.0 = plain gradient ascent). Defaults for ``mpbm_eta`` *(rec.)*: 1.0 on
the small-image datasets ([0, 1] pixels) and 2/255 elsewhere (ImageNet-normalised). With eta = 1
the noise (std 1.41 per pixel) dominates the gradient step, as SGLD at temperature 1 does in high
dimension; the query then steers the attention mostly at random and the mixup itself remains.

Single source: MPBM is a single-source DG method (``--test_envs`` = all environments but one).
With several source environments it pools their batches (as ERM does) and warns once.

``update`` returns ``loss`` (L_tr), ``sup``, ``mix`` (lambda-free L_mix^tr), ``gen`` (L_mix^gen),
``adv`` (L_adv), ``disc`` (D's loss) and ``disc_acc`` (D's accuracy on real and synthetic
features), 0.0 for the terms that are off (warm-up, a zero lambda).
"""

from __future__ import annotations

import contextlib
import math
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

from dg_plugins import hparams as hp_lib
from dg_plugins.algorithms.base import (FeatureClassifier, adam, optimizer_step,
                                        register_algorithm, split_minibatches)
# Per-channel mean and std of ImageNet normalisation (``mpbm_clamp`` "imagenet").
from dg_plugins.datasets.image_folder import IMAGENET_MEAN, IMAGENET_STD

#: Datasets whose inputs are [0, 1] pixels (the SGLD step default eta = 1.0 applies).
PIXEL_DATASETS = set(hp_lib.SMALL_IMAGE_DATASETS) | {"Digits", "DigitsOffline"}
CLAMP_MODES = ("batch", "unit", "imagenet", "none")
UPDATE_KEYS = ("loss", "sup", "mix", "gen", "adv", "disc", "disc_acc")


def _int_choice(values):
    return lambda r: int(r.choice(values))


class MixupAttentionGenerator(nn.Module):
    """g_phi: per-feature attention of a query over N_b real features, modulated by the feature
    correlation matrix C *(rec.)*: ``S = ((W_Q q * W_K v_i) C) / sqrt(d)``, softmax over the N_b
    instances separately for every feature dimension."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim
        self.query = nn.Linear(dim, dim, bias=False)
        self.key = nn.Linear(dim, dim, bias=False)

    def attention(self, q: torch.Tensor, values: torch.Tensor, corr: torch.Tensor) -> torch.Tensor:
        """Weights ``A`` ``[B, N_b, d]`` (each ``A[b, :, j]`` sums to 1) of queries ``q`` ``[B, d]``
        over ``values`` ``[B, N_b, d]``."""
        scores = (self.query(q).unsqueeze(1) * self.key(values)) @ corr / math.sqrt(self.dim)
        return scores.softmax(dim=1)

    @staticmethod
    def mix(weights: torch.Tensor, values: torch.Tensor, labels: torch.Tensor):
        """``(z, ytilde)``: ``z_j = sum_i A_ij V_ij`` and the soft label ``sum_i abar_i y_i`` with
        ``abar_i = mean_j A_ij`` (``labels`` ``[B, N_b, classes]`` one-hot or soft)."""
        z = (weights * values).sum(dim=1)
        label_weights = weights.mean(dim=2)
        return z, (label_weights.unsqueeze(-1) * labels).sum(dim=1)

    def forward(self, q, values, corr, labels):
        weights = self.attention(q, values, corr)
        z, y_mix = self.mix(weights, values, labels)
        return z, y_mix, weights


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
    """Eval mode for ``module`` and every submodule inside the block (BatchNorm uses and keeps its
    running statistics, dropout is off); each submodule's own ``training`` flag is restored after
    (so e.g. a ResNet's frozen BatchNorm layers stay in eval)."""
    flags = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        yield
    finally:
        for m, flag in flags:
            m.training = flag


@register_algorithm("MPBM")
class MPBM(FeatureClassifier):
    """Model-aware Parametric Batch-wise Mixup (arXiv 2502.16064); see the module docstring for
    the equations and which parts are reconstructions. Three optimizers: ``optimizer`` (f, h),
    ``gen_optimizer`` (g), ``disc_optimizer`` (D)."""

    #: Warm-up of one step and 1 SGLD step: three updates reach every parameter on a CPU.
    TINY_TEST_HPARAMS: dict = {"mpbm_warmup_steps": 1, "mpbm_T": 1, "mpbm_corr_every": 2}

    @staticmethod
    def hparam_space(dataset: str) -> dict:
        """Defaults from the paper (N_b = 5, T = 5, lambda_adv = lambda_mix = 0.5) and *(rec.)*
        for the rest; random ranges around them for sweeps."""
        pixels = dataset in PIXEL_DATASETS
        eta = 1.0 if pixels else 2.0 / 255.0
        # warm-up: 10% of the CPU-sized MNIST datasets' runs, 1000 steps elsewhere (the 5001- and
        # 10001-step image and digits runs)
        warmup = 100 if dataset in hp_lib.SMALL_IMAGE_DATASETS else 1000
        return {
            "mpbm_nb": (5, _int_choice([3, 5, 8]), hp_lib.positive),
            "mpbm_T": (5, _int_choice([3, 5]), hp_lib.non_negative),
            "mpbm_eta": (eta, lambda r: eta * 10 ** r.uniform(-1, 0), hp_lib.non_negative),
            "mpbm_sgld_noise": (1.0, lambda r: 1.0, hp_lib.non_negative),
            "mpbm_sgld_init": ("data", lambda r: "data", hp_lib.one_of("data", "noise")),
            "mpbm_clamp": ("batch", lambda r: "batch", hp_lib.one_of(*CLAMP_MODES)),
            "mpbm_lambda_adv": (0.5, lambda r: float(r.choice([0.2, 0.5, 0.8])),
                                hp_lib.non_negative),
            "mpbm_lambda_mix": (0.5, lambda r: float(r.choice([0.25, 0.5, 1.0])),
                                hp_lib.non_negative),
            "mpbm_warmup_steps": (warmup, lambda r: warmup, hp_lib.non_negative),
            "mpbm_corr_every": (100 if pixels else 500, lambda r: 100 if pixels else 500,
                                hp_lib.positive),
            "mpbm_corr_window": ("round", lambda r: "round", hp_lib.one_of("round", "all")),
            "mpbm_lr_g": (1e-4, lambda r: 10 ** r.uniform(-4.5, -3.5), hp_lib.positive),
            "mpbm_lr_d": (1e-4, lambda r: 10 ** r.uniform(-4.5, -3.5), hp_lib.positive),
            "mpbm_gen_mix_label": ("mixed", lambda r: "mixed", hp_lib.one_of("mixed", "query")),
            "mpbm_gen_objective": ("min", lambda r: "min", hp_lib.one_of("min", "max")),
        }

    def __init__(self, input_shape, num_classes, num_domains, hparams):
        super().__init__(input_shape, num_classes, num_domains, hparams)
        clamp = hparams["mpbm_clamp"]
        if clamp == "imagenet" and self.input_shape[0] != 3:
            raise ValueError(f"mpbm_clamp 'imagenet' needs 3-channel inputs, got input shape "
                             f"{self.input_shape}; use 'batch' or 'unit'")
        if num_domains > 1:
            warnings.warn(f"MPBM is a single-source DG method; its {num_domains} source "
                          "environments are pooled into one source (train with --test_envs "
                          "listing all environments but one for the paper's setting)",
                          stacklevel=2)
        dim = self.featurizer.n_outputs
        self.generator = MixupAttentionGenerator(dim)
        self.discriminator = FeatureDiscriminator(dim)
        self.optimizer = adam(self.network.parameters(), hparams)
        self.gen_optimizer = torch.optim.Adam(self.generator.parameters(),
                                              lr=hparams["mpbm_lr_g"], betas=(0.5, 0.999))
        self.disc_optimizer = torch.optim.Adam(self.discriminator.parameters(),
                                               lr=hparams["mpbm_lr_d"], betas=(0.5, 0.999))
        self.register_buffer("step", torch.zeros((), dtype=torch.long))
        # Online feature statistics (batched Welford) and the correlation matrix C in use.
        self.register_buffer("corr", torch.eye(dim))
        self.register_buffer("corr_refreshed_at", torch.full((), -1, dtype=torch.long))
        self.register_buffer("feat_count", torch.zeros(()))
        self.register_buffer("feat_mean", torch.zeros(dim))
        self.register_buffer("feat_m2", torch.zeros(dim, dim))

    # -- correlation of the source features -------------------------------------------------------

    @torch.no_grad()
    def accumulate_features(self, features: torch.Tensor) -> None:
        """Merge a batch of features into (count, mean, co-moment) (Chan et al.'s parallel
        Welford update): afterwards ``feat_m2 = sum_n (f_n - mean)(f_n - mean)^T`` over every
        feature seen since the last reset."""
        features = features.detach().to(self.feat_mean.dtype)
        n_b = features.shape[0]
        if n_b == 0:
            return
        mean_b = features.mean(dim=0)
        centred = features - mean_b
        m2_b = centred.T @ centred
        n = self.feat_count
        total = n + n_b
        delta = mean_b - self.feat_mean
        self.feat_m2.add_(m2_b + torch.outer(delta, delta) * (n * n_b / total))
        self.feat_mean.add_(delta * (n_b / total))
        self.feat_count.copy_(total)

    @torch.no_grad()
    def correlation_estimate(self) -> torch.Tensor:
        """Pearson correlation of the accumulated features (numpy ``corrcoef`` of them); a
        dimension with zero variance (e.g. a dead ReLU) gets correlation 0 with the others and 1
        with itself."""
        var = self.feat_m2.diagonal()
        alive = var > 1e-12
        std = torch.where(alive, var, torch.ones_like(var)).sqrt()
        corr = self.feat_m2 / torch.outer(std, std)
        corr = corr * (alive.unsqueeze(0) & alive.unsqueeze(1))
        corr = corr.clamp(-1.0, 1.0)
        corr.diagonal().fill_(1.0)
        return corr

    @torch.no_grad()
    def maybe_refresh_correlation(self) -> None:
        """Copy the estimate into ``corr`` when ``mpbm_corr_every`` steps have passed since the
        last refresh (or none happened yet) and at least 2 features were seen; with
        ``mpbm_corr_window`` "round" the statistics then restart."""
        last = int(self.corr_refreshed_at)
        if last >= 0 and int(self.step) - last < self.hparams["mpbm_corr_every"]:
            return
        if self.feat_count < 2:
            return
        self.corr.copy_(self.correlation_estimate())
        self.corr_refreshed_at.copy_(self.step)
        if self.hparams["mpbm_corr_window"] == "round":
            self.feat_count.zero_()
            self.feat_mean.zero_()
            self.feat_m2.zero_()

    # -- SGLD queries -----------------------------------------------------------------------------

    def input_range(self, x: torch.Tensor):
        """``(lo, hi)`` broadcastable to ``x`` for the SGLD clamp (None: no clamp)."""
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

    def sgld_queries(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``x^T`` after ``mpbm_T`` SGLD steps of ascent on the summed CE (the paper's query
        equation), clamped to :meth:`input_range`; f and h frozen (eval mode, no parameter
        gradient: only the input's gradient is taken)."""
        eta = self.hparams["mpbm_eta"]
        noise = self.hparams["mpbm_sgld_noise"] * math.sqrt(2.0 * eta)
        bounds = self.input_range(x)
        x_t = x.detach().clone()
        if self.hparams["mpbm_sgld_init"] == "noise":
            lo, hi = bounds if bounds is not None else (x.min(), x.max())
            x_t = lo + (hi - lo) * torch.rand_like(x_t)
        with frozen_eval(self.network), torch.enable_grad():
            for _ in range(self.hparams["mpbm_T"]):
                x_t.requires_grad_(True)
                loss = F.cross_entropy(self.predict(x_t), y, reduction="sum")
                (grad,) = torch.autograd.grad(loss, x_t)
                x_t = x_t.detach() + eta * grad + noise * torch.randn_like(x_t)
                if bounds is not None:
                    x_t = torch.maximum(torch.minimum(x_t, bounds[1]), bounds[0])
        return x_t.detach()

    def query_features(self, x_query: torch.Tensor) -> torch.Tensor:
        """``q = f(x^T)`` in eval mode without gradient (BatchNorm statistics untouched)."""
        with frozen_eval(self.network), torch.no_grad():
            return self.featurizer(x_query)

    # -- the three steps --------------------------------------------------------------------------

    def draw_groups(self, batch: int, device) -> torch.Tensor:
        """``[batch, N_b]`` random row indices: the N_b real instances each synthetic sample
        mixes (drawn with replacement, so any batch size works)."""
        return torch.randint(0, batch, (batch, self.hparams["mpbm_nb"]), device=device)

    def generator_step(self, q, features, y_onehot, y, groups) -> tuple[torch.Tensor, dict]:
        """One Adam step of g on ``L_mix^gen + lambda_adv L_adv`` with f, h and D frozen (only
        g's parameters receive gradients). Returns the synthetic features (detached)."""
        values = features.detach()[groups]
        z, y_mix, _ = self.generator(q, values, self.corr, y_onehot[groups])
        logits = self.classifier(z)
        if self.hparams["mpbm_gen_mix_label"] == "query":
            gen = F.cross_entropy(logits, y)
        else:
            gen = soft_cross_entropy(logits, y_mix)
        loss = gen if self.hparams["mpbm_gen_objective"] == "min" else -gen
        lambda_adv = self.hparams["mpbm_lambda_adv"]
        adv = torch.zeros((), device=z.device)
        if lambda_adv > 0:
            adv = F.softplus(-self.discriminator(z)).mean()  # -log D(z), non-saturating
            loss = loss + lambda_adv * adv
        optimizer_step(self.gen_optimizer, loss, inputs=list(self.generator.parameters()))
        return z.detach(), {"gen": gen.item(), "adv": adv.item()}

    def discriminator_step(self, real, fake) -> dict:
        """One Adam step of D on ``-log D(f(x)) - log(1 - D(z))``; accuracy on both halves."""
        real_logits = self.discriminator(real.detach())
        fake_logits = self.discriminator(fake.detach())
        loss = F.softplus(-real_logits).mean() + F.softplus(fake_logits).mean()
        optimizer_step(self.disc_optimizer, loss)
        acc = torch.cat([real_logits > 0, fake_logits < 0]).float().mean()
        return {"disc": loss.item(), "disc_acc": acc.item()}

    def synthetic_features(self, q, features, y_onehot, groups):
        """The generator's mixup of ``features`` (with their gradient) under its current weights,
        the weights themselves detached (no gradient into g)."""
        with torch.no_grad():
            weights = self.generator.attention(q, features.detach()[groups], self.corr)
        return self.generator.mix(weights, features[groups], y_onehot[groups])

    def update(self, minibatches, unlabeled=None):
        x, y, _ = split_minibatches(minibatches)
        out = dict.fromkeys(UPDATE_KEYS, 0.0)
        if int(self.step) < self.hparams["mpbm_warmup_steps"]:
            features = self.featurizer(x)
            self.accumulate_features(features)
            loss = F.cross_entropy(self.classifier(features), y)
            optimizer_step(self.optimizer, loss)
            out["loss"] = out["sup"] = loss.item()
            self.step += 1
            return out

        self.maybe_refresh_correlation()
        q = self.query_features(self.sgld_queries(x, y))
        features = self.featurizer(x)
        self.accumulate_features(features)
        y_onehot = F.one_hot(y, self.num_classes).to(features.dtype)
        groups = self.draw_groups(len(x), x.device)
        z, gen_stats = self.generator_step(q, features, y_onehot, y, groups)
        out.update(gen_stats)
        if self.hparams["mpbm_lambda_adv"] > 0:
            out.update(self.discriminator_step(features, z))

        sup = F.cross_entropy(self.classifier(features), y)
        loss = sup
        lambda_mix = self.hparams["mpbm_lambda_mix"]
        if lambda_mix > 0:
            z_train, y_mix = self.synthetic_features(q, features, y_onehot, groups)
            mix = soft_cross_entropy(self.classifier(z_train), y_mix)
            loss = sup + lambda_mix * mix
            out["mix"] = mix.item()
        optimizer_step(self.optimizer, loss)
        out["loss"], out["sup"] = loss.item(), sup.item()
        self.step += 1
        return out
