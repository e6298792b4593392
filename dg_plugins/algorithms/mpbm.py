"""MPBM: Model-aware Parametric Batch-wise Mixup for single-source domain generalization (Heidari
& Guo, "Single Domain Generalization with Model-aware Parametric Batch-wise Mixup", arXiv
2502.16064). The first public implementation: no official code exists, and several parts of the
method are not pinned down by the paper's description. Each such choice is a reconstruction,
marked *(rec.)* below, and where the paper admits several readings the alternatives are hparams.

The method's parts
------------------
1. **Adversarial queries by SGLD** (the paper's query equation), with the prediction model
   ``h(f(.))`` frozen::

       x^{t+1} = clamp(x^t + eta * grad_x CE(h(f(x^t)), y) + sqrt(2 eta) * s * eps),  t = 0..T-1

   from ``x^0 = x`` (the real batch), ``eps ~ N(0, I)``, ``s = mpbm_sgld_noise`` (1.0 = the
   paper; a smaller ``s`` keeps the queries recognisable, see below); the query feature is
   ``q = f(x^T)``. The CE is summed over the batch, so each image moves along its own loss
   gradient whatever the batch size. f and h get no parameter gradient, and the query runs in eval
   mode (BatchNorm uses and keeps its running statistics; dropout is off); the previous train/eval
   flags of every submodule are restored after.
2. **Parametric batch-wise mixup generator** g: each synthetic sample mixes ``N_b = mpbm_nb``
   real features ``V`` (``[N_b, d]``, the rows of a random index set drawn with ``torch.randint``,
   one set per synthetic sample, so any batch size works), *per feature dimension* *(rec.)*::

       Q = W_Q q,  K_i = W_K v_i,  S_i = ((Q * K_i) C) / sqrt(d),  A[:, j] = softmax_i(S[:, j]),
       z_j = sum_i A_ij (V W_V^T)_ij,  ytilde = sum_i abar_i y_i,

   with ``abar_i = mean_j A_ij`` (a soft label) and ``C`` the Pearson correlation matrix of the
   source features. The paper's synthetic feature is ``[a_1 v_1, ..., a_d v_d]`` with ``v_j`` the
   columns of "the value matrix": with ``mpbm_value_proj`` false that matrix is ``V`` itself
   (``W_V = I``), so every ``z_j`` is a convex combination of the N_b real values of dimension j
   (``z`` stays in the per-dimension hull of the real features); with ``mpbm_value_proj`` true
   ``W_V`` is a learned ``d x d`` value projection *(rec.: no bias, initialised to the identity,
   trained with g)*, so the mixes can leave that hull.
3. **Generator / discriminator step** (f and h frozen): ``L_gen = L_mix^gen + lambda_adv L_adv``
   with ``L_mix^gen = CE(h(z), ytilde)`` *(rec.; ``mpbm_gen_mix_label`` "query" uses the query's
   label and ``mpbm_gen_objective`` "max" maximises it instead)* and the non-saturating GAN loss
   ``L_adv = -log D(z)``; the discriminator D (an MLP d -> 512 -> 1 on features, *rec.*)
   minimises ``-log D(f(x)) - log(1 - D(z))``.
4. **Prediction-model step**: ``L_tr = L_sup + lambda_mix L_mix^tr`` with
   ``L_sup = CE(h(f(x)), y)`` and ``L_mix^tr = CE(h(z), ytilde)`` on synthetic features.

The schedule (``mpbm_schedule``)
--------------------------------
**"phased"**: the paper's alternation. The train job calls ``update`` once per step; the step
counter buffer ``step`` alone decides the phase (:func:`phase_at`, a pure function of the step and
the hparams), so a resumed job continues in the same phase at the same offset:

0. ``erm`` (``mpbm_pretrain_steps``): pretrain f, h with ``L_sup``.
   Then ``mpbm_rounds`` rounds of:
1. ``corr`` (``mpbm_corr_steps``): the frozen f (eval mode) featurises each batch; the features
   are merged into running statistics (restarted at the round's first step) and ``C`` is computed
   from them at the phase's last step (the paper's "compute C over the source set": *rec.*, over
   the ``corr_steps x batch`` images the phase sees; 0 steps keeps the previous C, the identity in
   the first round);
2. ``query`` (``mpbm_query_steps``): SGLD queries of each batch; their features ``q`` and labels
   fill the query bank (``query_bank``, ``query_labels``, restarted each round);
3. ``gen`` (``mpbm_gen_steps``): one g step and one D step per batch, f frozen (eval mode, no
   gradient): V = f(x) of the batch, queries drawn uniformly from the bank *(rec.: a query is not
   paired with the instances it mixes, as in the online schedule)*;
4. ``synth`` (``ceil(mpbm_synth_size / rows)`` steps, ``rows`` = the source rows of a step,
   ``batch_size x`` sources, or ``batch_size`` with pooled batch sampling): the generator makes the
   round's synthetic set ``(z, ytilde)`` (``synth_z``, ``synth_y``, ``mpbm_synth_size`` rows,
   ``rows`` per step from that step's batch, ``synth_round`` = the round), made once per round and
   replacing the previous one;
5. ``finetune`` (``mpbm_finetune_steps``): ``L_tr`` with the batch's real features and as many
   synthetic rows drawn uniformly, with replacement, from the stored set. The stored ``z`` are
   features of the frozen f of this round, so ``L_mix^tr`` trains h only *(rec.: the paper's
   "generate a synthetic dataset" read as a stored feature set)*. The last round's fine-tuning
   goes on until the job ends.

**"online"** (the default; the earlier reconstruction): ``mpbm_warmup_steps`` ERM steps, then
every step does SGLD on the batch, one g step, one D step and one f/h step; in the f/h step the
synthetic features are re-made by the updated generator with its weights (attention and ``W_V``)
detached but on ``V = f(x)`` *with* gradient, so f also learns from the mixed features *(rec.)*.
``C`` is estimated online, with no extra forward pass, from the real-batch features f(x) of every
update (warm-up included): a batched Welford / Chan merge of count, mean and co-moment buffers,
turned into ``corr`` every ``mpbm_corr_every`` steps; ``mpbm_corr_window`` "round" restarts the
estimate after each refresh, "all" keeps accumulating. Before the first refresh ``corr`` is the
identity.

Both: f and h use the job's Adam (``lr``, ``weight_decay``: DomainBed's convention), g and D Adam
with ``betas=(0.5, 0.999)`` and their own learning rates ``mpbm_lr_g`` / ``mpbm_lr_d`` *(rec.)*.

Defaults: "online", no value projection, ``mpbm_sgld_noise`` 1: of the four MPBM configurations of
the DigitsOffline study (results/digits_offline.md: online, phased, phased with the value
projection, phased with the noise scaled to 0.03), online had the best source-validation accuracy
(97.2 +- 0.3 % against 96.7-96.8 +- 0.3-0.4 %, training-domain validation selection, 3 trials,
the study's rerun; within two standard errors) and the three phased ones tie, so the value
projection and the noise scale keep the paper's reading. The choice is made on source validation, not on the targets.

Diagnostics (what tells a user whether the augmentation does anything)
----------------------------------------------------------------------
Every ``mpbm_diag_every`` steps (0: never), after the step's training, a probe measures the
pipeline on that step's batch as it stands, in eval mode, with its own random generator (seeded
by the step; the training's random streams are untouched, so a run's training is the same with or
without probes): SGLD queries ``x^T`` of the batch, ``q = f(x^T)``, ``V = f(x)``, one synthetic
feature per batch row from random groups of N_b rows. It sets:

* ``diag_query_corr``: mean over images of the Pearson correlation of ``x^T`` with its source
  ``x`` (1: the query is its image up to an affine change; about 0: unrelated noise);
* ``diag_query_clamped`` / ``diag_source_clamped``: share of the query's / the source's pixel
  values on the clamp bounds (MNIST's black background lies on the lower bound already);
* ``diag_query_acc``: the model's accuracy on the queries;
* ``diag_attn_top_share``: per synthetic sample, the share of feature dimensions whose largest
  attention weight goes to the most common such instance (``1/N_b`` at best spread, 1 when the
  per-feature mix is a whole-instance one), averaged;
* ``diag_synth_cos``: mean cosine of a synthetic feature with its nearest real feature of the batch;
* ``diag_synth_outside_hull``: share of synthetic coordinates outside the ``[min, max]`` of the
  N_b values it mixes (0 without a value projection);
* ``diag_disc_acc``: D's accuracy on the batch's real features and the probe's synthetic ones.

``update`` returns the last probe's values at every step (0.0 before the first probe), so a record,
which averages ``update`` values over the steps since the previous one, holds the mean over those
steps of the latest measurement. The probe costs about ``T + 2`` forward(-backward) passes of f on
one batch.

Other settings
--------------
The valid input range (the SGLD clamp): the algorithm never sees the dataset, so ``mpbm_clamp``
says where it comes from: "batch" (default) = the per-channel min and max of the real batch (a
subset of the valid range of any normalisation, so it never leaves it); "unit" = [0, 1] (raw
pixels, e.g. the MNIST datasets and Digits); "imagenet" = the per-channel range of
ImageNet-normalised [0, 1] pixels (the 224x224 image-folder datasets); "none" = no clamp.

SGLD scale: defaults for ``mpbm_eta`` *(rec.)*: 1.0 on the small-image datasets ([0, 1] pixels)
and 2/255 elsewhere (ImageNet-normalised). With eta = 1 and ``mpbm_sgld_noise`` 1 the noise (std
1.41 per pixel) dominates the gradient step, as SGLD at temperature 1 does in high dimension: the
queries are noise (``diag_query_corr`` near 0); ``mpbm_sgld_noise`` scales the noise down.

Single source: MPBM is a single-source DG method (``--test_envs`` = all environments but one).
With several source environments it pools their batches (as ERM does) and warns once.

``update`` returns (:data:`UPDATE_KEYS`) ``loss`` (L_tr or L_sup), ``sup``, ``mix`` (lambda-free
L_mix^tr), ``gen`` (L_mix^gen), ``adv`` (L_adv), ``disc`` (D's loss), ``disc_acc`` (D's accuracy
on the real and synthetic features of its step), 0.0 for the terms a step does not compute;
``phase`` (:data:`PHASES` index: 0 erm, 1 corr, 2 query, 3 gen, 4 synth, 5 finetune, 6 online; a
record holds the mean over its steps, whole when they lie in one phase), ``round`` (1-based, 0
outside the rounds) and the diagnostics.

Mixed precision (train's ``--precision``): the three optimizers step through
:func:`~dg_plugins.algorithms.base.optimizer_step`, hence fp16's gradient scaler. Two parts run in
float32 whatever the autocast: the feature statistics behind C (:meth:`MPBM.accumulate_features`,
sums of products over many batches), and under fp16 the SGLD queries, whose input gradients
(``torch.autograd.grad``) the scaler, which scales parameter gradients only, does not protect
from float16 underflow (bf16 has float32's range: its SGLD runs under autocast).
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
SCHEDULES = ("phased", "online")
#: Phase names; ``update``'s ``phase`` value is the index.
PHASES = ("erm", "corr", "query", "gen", "synth", "finetune", "online")
LOSS_KEYS = ("loss", "sup", "mix", "gen", "adv", "disc", "disc_acc")
DIAG_KEYS = ("diag_query_corr", "diag_query_clamped", "diag_source_clamped", "diag_query_acc",
             "diag_attn_top_share", "diag_synth_cos", "diag_synth_outside_hull", "diag_disc_acc")
UPDATE_KEYS = LOSS_KEYS + ("phase", "round") + DIAG_KEYS
#: Default step budgets of the datasets (their ``N_STEPS``; DomainBed's 5001 elsewhere): the
#: phased schedule's defaults are fractions of them.
DEFAULT_STEPS = {"RotatedMNIST5k": 1001, "DigitsOffline": 2001, "Digits": 10001}
#: Seed offset of the diagnostics probe's own random generator (seeded ``PROBE_SEED + step``).
PROBE_SEED = 7919


def _int_choice(values):
    return lambda r: int(r.choice(values))


def rows_per_step(hparams: dict, num_domains: int) -> int:
    """Source rows of one training step: ``batch_size`` per source environment, or
    ``batch_size`` in all with pooled batch sampling."""
    per_domain = hparams.get("batch_sampling", "per_domain") != "pooled"
    return hparams["batch_size"] * (num_domains if per_domain else 1)


def synth_phase_steps(hparams: dict, rows: int) -> int:
    """Steps of the ``synth`` phase: ``ceil(mpbm_synth_size / rows)``."""
    return -(-hparams["mpbm_synth_size"] // rows)


def round_phases(hparams: dict, rows: int) -> list[tuple[str, int]]:
    """``[(phase, steps), ...]`` of one round of the phased schedule."""
    return [("corr", hparams["mpbm_corr_steps"]), ("query", hparams["mpbm_query_steps"]),
            ("gen", hparams["mpbm_gen_steps"]), ("synth", synth_phase_steps(hparams, rows)),
            ("finetune", hparams["mpbm_finetune_steps"])]


def phase_at(step: int, hparams: dict, rows: int) -> tuple[str, int, int]:
    """``(phase, round, offset)`` of 0-based ``step``: the phase's name, the round (1-based; 0 in
    pre-training, warm-up and online steps) and the step's index inside the phase. A pure
    function of the step and the hparams (see the module docstring)."""
    if hparams["mpbm_schedule"] == "online":
        warmup = hparams["mpbm_warmup_steps"]
        return ("erm", 0, step) if step < warmup else ("online", 0, step - warmup)
    pretrain = hparams["mpbm_pretrain_steps"]
    if step < pretrain:
        return "erm", 0, step
    phases = round_phases(hparams, rows)
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
    """g_phi: per-feature attention of a query over N_b real features, modulated by the feature
    correlation matrix C *(rec.)*: ``S = ((W_Q q * W_K v_i) C) / sqrt(d)``, softmax over the N_b
    instances separately for every feature dimension; the values are ``V`` or, with
    ``value_projection``, ``V W_V^T`` (``W_V`` learned, initialised to the identity)."""

    def __init__(self, dim: int, value_projection: bool = False):
        super().__init__()
        self.dim = dim
        self.query = nn.Linear(dim, dim, bias=False)
        self.key = nn.Linear(dim, dim, bias=False)
        self.value = None
        if value_projection:
            self.value = nn.Linear(dim, dim, bias=False)
            with torch.no_grad():
                self.value.weight.copy_(torch.eye(dim))

    def attention(self, q: torch.Tensor, values: torch.Tensor, corr: torch.Tensor) -> torch.Tensor:
        """Weights ``A`` ``[B, N_b, d]`` (each ``A[b, :, j]`` sums to 1) of queries ``q`` ``[B, d]``
        over ``values`` ``[B, N_b, d]``."""
        scores = (self.query(q).unsqueeze(1) * self.key(values)) @ corr / math.sqrt(self.dim)
        return scores.softmax(dim=1)

    def project(self, values: torch.Tensor, detach: bool = False) -> torch.Tensor:
        """The value matrix: ``values`` themselves, or ``values W_V^T`` (``detach``: no gradient
        into ``W_V``)."""
        if self.value is None:
            return values
        weight = self.value.weight.detach() if detach else self.value.weight
        return F.linear(values, weight)

    def mix(self, weights: torch.Tensor, values: torch.Tensor, labels: torch.Tensor,
            detach_value: bool = False):
        """``(z, ytilde)``: ``z_j = sum_i A_ij (value matrix)_ij`` and the soft label
        ``sum_i abar_i y_i`` with ``abar_i = mean_j A_ij`` (``labels`` ``[B, N_b, classes]`` one-hot
        or soft)."""
        z = (weights * self.project(values, detach_value)).sum(dim=1)
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


def float32(device_type: str):
    """A block run in float32: autocast off on ``device_type`` (a no-op context when it is off
    already)."""
    if not torch.is_autocast_enabled(device_type):
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, enabled=False)


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


# -- diagnostics (pure functions of tensors) -------------------------------------------------------

def image_correlation(queries: torch.Tensor, sources: torch.Tensor) -> torch.Tensor:
    """``[N]``: Pearson correlation of each flattened query with its source image (0 where either
    is constant)."""
    a = queries.flatten(1).double()
    b = sources.flatten(1).double()
    a = a - a.mean(dim=1, keepdim=True)
    b = b - b.mean(dim=1, keepdim=True)
    denominator = a.norm(dim=1) * b.norm(dim=1)
    corr = (a * b).sum(dim=1) / denominator.clamp_min(1e-12)
    return torch.where(denominator > 0, corr, torch.zeros_like(corr)).float()


def clamped_share(x: torch.Tensor, bounds) -> float:
    """Share of the values of ``x`` on (or beyond) the clamp bounds; 0.0 without bounds."""
    if bounds is None or x.numel() == 0:
        return 0.0
    lo, hi = bounds
    return ((x <= lo) | (x >= hi)).float().mean().item()


def top_instance_share(weights: torch.Tensor) -> torch.Tensor:
    """``[B]``: for attention weights ``[B, N_b, d]``, the share of the d feature dimensions whose
    largest weight goes to the instance that is most often the largest."""
    top = weights.argmax(dim=1)  # [B, d]
    counts = F.one_hot(top, weights.shape[1]).sum(dim=1)  # [B, N_b]
    return counts.amax(dim=1).float() / weights.shape[2]


def nearest_cosine(synthetic: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """``[B]``: cosine of each synthetic feature with its nearest real feature."""
    return (F.normalize(synthetic, dim=1) @ F.normalize(real, dim=1).T).amax(dim=1)


def discriminator_accuracy(real_logits: torch.Tensor, fake_logits: torch.Tensor) -> float:
    """D's accuracy over real (logit > 0) and synthetic (logit < 0) features together."""
    return torch.cat([real_logits > 0, fake_logits < 0]).float().mean().item()


def outside_hull_share(z: torch.Tensor, values: torch.Tensor, tol: float = 1e-5) -> float:
    """Share of the coordinates ``z[b, j]`` outside ``[min_i values[b, i, j], max_i ...]``."""
    lo, hi = values.amin(dim=1), values.amax(dim=1)
    scale = tol * (1 + values.abs().amax(dim=1))
    return ((z < lo - scale) | (z > hi + scale)).float().mean().item()


@register_algorithm("MPBM")
class MPBM(FeatureClassifier):
    """Model-aware Parametric Batch-wise Mixup (arXiv 2502.16064); see the module docstring for
    the equations, the two schedules and which parts are reconstructions. Three optimizers:
    ``optimizer`` (f, h), ``gen_optimizer`` (g), ``disc_optimizer`` (D)."""

    #: Phased schedule of one pre-training step, no C phase, one query step, one g/D step, one
    #: synthetic-set step, then fine-tuning: three updates reach every parameter on a CPU; a probe
    #: every second step. (The online schedule's warm-up and C refresh for tests that pick it.)
    TINY_TEST_HPARAMS: dict = {
        "mpbm_schedule": "phased", "mpbm_pretrain_steps": 1, "mpbm_corr_steps": 0,
        "mpbm_query_steps": 1, "mpbm_gen_steps": 1, "mpbm_synth_size": 8,
        "mpbm_finetune_steps": 1, "mpbm_rounds": 1, "mpbm_diag_every": 2,
        "mpbm_warmup_steps": 1, "mpbm_T": 1, "mpbm_corr_every": 2}

    @staticmethod
    def hparam_space(dataset: str) -> dict:
        """Defaults from the paper (N_b = 5, T = 5, lambda_adv = lambda_mix = 0.5) and *(rec.)*
        for the rest; random ranges around them for sweeps. The phased schedule's defaults, for a
        dataset's default step budget N (:data:`DEFAULT_STEPS`, 5001 elsewhere): pre-training
        N // 2 steps (ERM's source accuracy has levelled off by then on the datasets measured),
        2 rounds of 50 C steps, 10 query steps, N // 20 g/D steps, a synthetic set of 1,024
        features and N // 10 fine-tuning steps (the last round's fine-tuning lasts to the end)."""
        pixels = dataset in PIXEL_DATASETS
        eta = 1.0 if pixels else 2.0 / 255.0
        # online warm-up: 10% of the CPU-sized MNIST datasets' runs, 1000 steps elsewhere (the
        # 5001- and 10001-step image and digits runs)
        warmup = 100 if dataset in hp_lib.SMALL_IMAGE_DATASETS else 1000
        steps = DEFAULT_STEPS.get(dataset, 5001)

        def fixed(value, check=hp_lib.non_negative):
            return value, lambda r: value, check

        return {
            "mpbm_schedule": fixed("online", hp_lib.one_of(*SCHEDULES)),
            "mpbm_nb": (5, _int_choice([3, 5, 8]), hp_lib.positive),
            "mpbm_T": (5, _int_choice([3, 5]), hp_lib.non_negative),
            "mpbm_eta": (eta, lambda r: eta * 10 ** r.uniform(-1, 0), hp_lib.non_negative),
            "mpbm_sgld_noise": fixed(1.0),
            "mpbm_sgld_init": fixed("data", hp_lib.one_of("data", "noise")),
            "mpbm_clamp": fixed("batch", hp_lib.one_of(*CLAMP_MODES)),
            "mpbm_lambda_adv": (0.5, lambda r: float(r.choice([0.2, 0.5, 0.8])),
                                hp_lib.non_negative),
            "mpbm_lambda_mix": (0.5, lambda r: float(r.choice([0.25, 0.5, 1.0])),
                                hp_lib.non_negative),
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
        self.generator = MixupAttentionGenerator(dim, hparams["mpbm_value_proj"])
        self.discriminator = FeatureDiscriminator(dim)
        self.optimizer = adam(self.network.parameters(), hparams)
        self.gen_optimizer = torch.optim.Adam(self.generator.parameters(),
                                              lr=hparams["mpbm_lr_g"], betas=(0.5, 0.999))
        self.disc_optimizer = torch.optim.Adam(self.discriminator.parameters(),
                                               lr=hparams["mpbm_lr_d"], betas=(0.5, 0.999))
        self.rows = rows_per_step(hparams, num_domains)
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
        """:func:`phase_at` of ``step`` (default: the next update's)."""
        return phase_at(int(self.step) if step is None else step, self.hparams, self.rows)

    # -- correlation of the source features -------------------------------------------------------

    @torch.no_grad()
    def accumulate_features(self, features: torch.Tensor) -> None:
        """Merge a batch of features into (count, mean, co-moment) (Chan et al.'s parallel
        Welford update): afterwards ``feat_m2 = sum_n (f_n - mean)(f_n - mean)^T`` over every
        feature seen since the last reset."""
        with float32(features.device.type):
            self._accumulate(features.detach().to(self.feat_mean.dtype))

    def _accumulate(self, features: torch.Tensor) -> None:
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
    def reset_feature_statistics(self) -> None:
        self.feat_count.zero_()
        self.feat_mean.zero_()
        self.feat_m2.zero_()

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
    def refresh_correlation(self) -> None:
        """``corr`` = the estimate (when at least 2 features were seen), stamped with the step."""
        if self.feat_count < 2:
            return
        self.corr.copy_(self.correlation_estimate())
        self.corr_refreshed_at.copy_(self.step)

    @torch.no_grad()
    def maybe_refresh_correlation(self) -> None:
        """Online schedule: refresh ``corr`` when ``mpbm_corr_every`` steps have passed since the
        last refresh (or none happened yet) and at least 2 features were seen; with
        ``mpbm_corr_window`` "round" the statistics then restart."""
        last = int(self.corr_refreshed_at)
        if last >= 0 and int(self.step) - last < self.hparams["mpbm_corr_every"]:
            return
        if self.feat_count < 2:
            return
        self.refresh_correlation()
        if self.hparams["mpbm_corr_window"] == "round":
            self.reset_feature_statistics()

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

    def sgld_queries(self, x: torch.Tensor, y: torch.Tensor,
                     generator: torch.Generator | None = None) -> torch.Tensor:
        """``x^T`` after ``mpbm_T`` SGLD steps of ascent on the summed CE (the paper's query
        equation), clamped to :meth:`input_range`; f and h frozen (eval mode, no parameter
        gradient: only the input's gradient is taken). ``generator``: the noise's random
        generator (default: torch's global one)."""
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

    def query_features(self, x_query: torch.Tensor) -> torch.Tensor:
        """``q = f(x^T)`` in eval mode without gradient (BatchNorm statistics untouched)."""
        return self.frozen_features(x_query)

    def frozen_features(self, x: torch.Tensor) -> torch.Tensor:
        """``f(x)`` of the frozen extractor: eval mode, no gradient."""
        with frozen_eval(self.network), torch.no_grad():
            return self.featurizer(x)

    # -- the steps --------------------------------------------------------------------------------

    def draw_groups(self, batch: int, device, count: int | None = None,
                    generator: torch.Generator | None = None) -> torch.Tensor:
        """``[count, N_b]`` random row indices into a batch of ``batch`` rows (``count`` defaults
        to ``batch``): the N_b real instances each synthetic sample mixes (drawn with
        replacement, so any batch size works)."""
        count = batch if count is None else count
        return torch.randint(0, batch, (count, self.hparams["mpbm_nb"]), device=device,
                             generator=generator)

    def generator_step(self, q, features, y_onehot, y, groups) -> tuple[torch.Tensor, dict]:
        """One Adam step of g on ``L_mix^gen + lambda_adv L_adv`` with f, h and D frozen (only
        g's parameters receive gradients); ``y``: the queries' labels. Returns the synthetic
        features (detached)."""
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
        return {"disc": loss.item(), "disc_acc": discriminator_accuracy(real_logits, fake_logits)}

    def synthetic_features(self, q, features, y_onehot, groups):
        """The generator's mixup of ``features`` (with their gradient) under its current weights,
        the attention and the value projection detached (no gradient into g)."""
        with torch.no_grad():
            weights = self.generator.attention(q, features.detach()[groups], self.corr)
        return self.generator.mix(weights, features[groups], y_onehot[groups], detach_value=True)

    def one_hot(self, y: torch.Tensor) -> torch.Tensor:
        return F.one_hot(y, self.num_classes).to(self.corr.dtype)

    def erm_step(self, x, y, out) -> None:
        """Pre-training / warm-up: one Adam step of f, h on ``L_sup`` (the online schedule also
        feeds the features into its correlation statistics)."""
        features = self.featurizer(x)
        if self.hparams["mpbm_schedule"] == "online":
            self.accumulate_features(features)
        self.model_step(F.cross_entropy(self.classifier(features), y), None, out)

    def model_step(self, sup: torch.Tensor, mix: torch.Tensor | None, out: dict) -> None:
        """One Adam step of f, h on ``L_sup`` + ``lambda_mix L_mix^tr`` (``mix`` None: ``L_sup``
        alone); the terms into ``out``."""
        loss = sup
        if mix is not None:
            loss = sup + self.hparams["mpbm_lambda_mix"] * mix
            out["mix"] = mix.item()
        optimizer_step(self.optimizer, loss)
        out["loss"], out["sup"] = loss.item(), sup.item()

    def corr_step(self, x, offset: int) -> None:
        """Phase 1: the frozen f's features into the statistics; C at the phase's last step."""
        if offset == 0:
            self.reset_feature_statistics()
        self.accumulate_features(self.frozen_features(x))
        if offset == self.hparams["mpbm_corr_steps"] - 1:
            self.refresh_correlation()

    @torch.no_grad()
    def query_step(self, x, y, offset: int) -> None:
        """Phase 2: SGLD queries of the batch; their features and labels into the bank."""
        if offset == 0:
            self.bank_count.zero_()
        q = self.query_features(self.sgld_queries(x, y))
        start = int(self.bank_count)
        n = min(len(q), self.query_bank.shape[0] - start)
        self.query_bank[start:start + n] = q[:n]
        self.query_labels[start:start + n] = y[:n]
        self.bank_count += n

    def bank_draw(self, count: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """``count`` queries (features, labels) drawn uniformly with replacement from the bank."""
        if int(self.bank_count) == 0:
            raise RuntimeError("MPBM's query bank is empty (the query phase got no batch rows)")
        index = torch.randint(0, int(self.bank_count), (count,), device=device)
        return self.query_bank[index], self.query_labels[index]

    def gen_step(self, x, y, out) -> None:
        """Phase 3: one g step and one D step with f frozen, queries from the bank."""
        features = self.frozen_features(x)
        q, y_q = self.bank_draw(len(x), x.device)
        groups = self.draw_groups(len(x), x.device)
        z, stats = self.generator_step(q, features, self.one_hot(y), y_q, groups)
        out.update(stats)
        if self.hparams["mpbm_lambda_adv"] > 0:
            out.update(self.discriminator_step(features, z))

    @torch.no_grad()
    def synth_step(self, x, y, offset: int, round_index: int) -> None:
        """Phase 4: ``rows`` synthetic features of this batch into the round's synthetic set."""
        if offset == 0:
            self.synth_count.zero_()
            self.synth_round.fill_(round_index)
        start = int(self.synth_count)
        n = min(self.rows, self.synth_z.shape[0] - start)
        if n <= 0 or len(x) == 0:
            return
        features = self.frozen_features(x)
        q, _ = self.bank_draw(n, x.device)
        groups = self.draw_groups(len(x), x.device, count=n)
        z, y_mix, _ = self.generator(q, features[groups], self.corr, self.one_hot(y)[groups])
        self.synth_z[start:start + n] = z
        self.synth_y[start:start + n] = y_mix
        self.synth_count += n

    def finetune_step(self, x, y, out) -> None:
        """Phase 5: one Adam step of f, h on ``L_sup + lambda_mix L_mix^tr`` with as many stored
        synthetic rows as real ones."""
        sup = F.cross_entropy(self.predict(x), y)
        mix = None
        if self.hparams["mpbm_lambda_mix"] > 0 and int(self.synth_count) > 0:
            index = torch.randint(0, int(self.synth_count), (len(x),), device=x.device)
            mix = soft_cross_entropy(self.classifier(self.synth_z[index]), self.synth_y[index])
        self.model_step(sup, mix, out)

    def online_step(self, x, y, out) -> None:
        """The online schedule after its warm-up: SGLD, g step, D step, f/h step."""
        self.maybe_refresh_correlation()
        q = self.query_features(self.sgld_queries(x, y))
        features = self.featurizer(x)
        self.accumulate_features(features)
        y_onehot = self.one_hot(y)
        groups = self.draw_groups(len(x), x.device)
        z, gen_stats = self.generator_step(q, features, y_onehot, y, groups)
        out.update(gen_stats)
        if self.hparams["mpbm_lambda_adv"] > 0:
            out.update(self.discriminator_step(features, z))

        sup = F.cross_entropy(self.classifier(features), y)
        mix = None
        if self.hparams["mpbm_lambda_mix"] > 0:
            z_train, y_mix = self.synthetic_features(q, features, y_onehot, groups)
            mix = soft_cross_entropy(self.classifier(z_train), y_mix)
        self.model_step(sup, mix, out)

    # -- diagnostics ------------------------------------------------------------------------------

    def query_diagnostics(self, x: torch.Tensor, x_query: torch.Tensor, y: torch.Tensor,
                          q: torch.Tensor) -> dict:
        """The query half of the probe: ``x_query``'s correlation with ``x``, the clamped shares
        of both, and the model's accuracy on the queries (``q = f(x_query)``)."""
        bounds = self.input_range(x)
        with torch.no_grad():
            accuracy = (self.classifier(q).argmax(dim=1) == y).float().mean().item()
        return {"diag_query_corr": image_correlation(x_query, x).mean().item(),
                "diag_query_clamped": clamped_share(x_query, bounds),
                "diag_source_clamped": clamped_share(x, bounds),
                "diag_query_acc": accuracy}

    @torch.no_grad()
    def mix_diagnostics(self, q, features, y, generator=None) -> dict:
        """The mixing half of the probe: one synthetic feature per query from random groups of
        the batch's real ``features``; attention concentration, nearest-real cosine, share
        outside the hull, D's accuracy."""
        groups = self.draw_groups(len(features), features.device, count=len(q),
                                  generator=generator)
        values = features[groups]
        z, _, weights = self.generator(q, values, self.corr, self.one_hot(y)[groups])
        disc_acc = discriminator_accuracy(self.discriminator(features), self.discriminator(z))
        return {"diag_attn_top_share": top_instance_share(weights).mean().item(),
                "diag_synth_cos": nearest_cosine(z, features).mean().item(),
                "diag_synth_outside_hull": outside_hull_share(z, values),
                "diag_disc_acc": disc_acc}

    def probe(self, x: torch.Tensor, y: torch.Tensor) -> dict:
        """Measure every diagnostic on the batch (see the module docstring) with a random
        generator of its own, store them in ``diag`` and return them."""
        generator = torch.Generator(device=x.device)
        generator.manual_seed(PROBE_SEED + int(self.step))
        with frozen_eval(self):
            x_query = self.sgld_queries(x, y, generator=generator)
            q = self.query_features(x_query)
            values = self.query_diagnostics(x, x_query, y, q)
            values.update(self.mix_diagnostics(q, self.frozen_features(x), y, generator))
        self.diag.copy_(torch.tensor([values[k] for k in DIAG_KEYS]))
        self.diag_step.copy_(self.step)
        return values

    # -- update -----------------------------------------------------------------------------------

    def update(self, minibatches, unlabeled=None):
        x, y, _ = split_minibatches(minibatches)
        phase, round_index, offset = self.phase()
        out = dict.fromkeys(LOSS_KEYS, 0.0)
        if phase == "erm":
            self.erm_step(x, y, out)
        elif phase == "corr":
            self.corr_step(x, offset)
        elif phase == "query":
            self.query_step(x, y, offset)
        elif phase == "gen":
            self.gen_step(x, y, out)
        elif phase == "synth":
            self.synth_step(x, y, offset, round_index)
        elif phase == "finetune":
            self.finetune_step(x, y, out)
        else:
            self.online_step(x, y, out)
        every = self.hparams["mpbm_diag_every"]
        if every > 0 and int(self.step) % every == 0 and len(x) > 0:
            self.probe(x, y)
        out["phase"] = float(PHASES.index(phase))
        out["round"] = float(round_index)
        out.update(zip(DIAG_KEYS, self.diag.tolist()))
        self.step += 1
        return out
