"""What train's flags mean, shared by train, sweep (which passes them to every job) and
alignment_eval: their names, the argument groups of the IP/OOP, UDG, compute and evaluation
flags, the range checks (:func:`check_ranges`: train runs them before it writes anything, sweep
before it enumerates), the module a job command runs and train's exit statuses. Torch-free."""

from __future__ import annotations

import argparse

from dg_plugins.runtime import AUGMENT_ON, COMPUTE_DEFAULTS, PRECISIONS, non_defaults
from dg_plugins.train.folder import DEFAULT_EVAL_SPLITS, EVAL_SPLITS

#: The module a job command runs (``python -m <module>``); sweep writes it in every command.
TRAIN_MODULE = "dg_plugins.scripts.train"

#: train's exit statuses (:func:`dg_plugins.train.run.main`); a stop signal exits 128 + signal.
EXIT_DONE, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2

#: The IP/OOP evaluation's flags: the score file, then the rule and the model it must fit.
ALIGNMENT_ARGS = ("alignment_scores", "alignment_threshold", "alignment_preset",
                  "alignment_model", "alignment_pretrained")
#: The UDG protocol's lengths and split, the same for every label fraction of a sweep.
UDG_PROTOCOL_ARGS = ("pretrain_steps", "udg_pretrain_epochs", "udg_ft_epochs", "udg_split")
#: The UDG flags that enter a job's args (and hence its folder's hash) when given.
UDG_ARGS = ("label_fraction", *UDG_PROTOCOL_ARGS)
#: The opt-in compute settings (:data:`dg_plugins.runtime.COMPUTE_DEFAULTS`): they enter a job's
#: args (its records, its sweep folder's hash) only at a value other than their default.
COMPUTE_ARGS = tuple(COMPUTE_DEFAULTS)
#: The evaluation flags and their defaults (DomainBed's: every split, batches of 64). Each
#: enters a record's ``args`` only when it is not its default, so that DomainBed's records and
#: job commands stay as they were. ``eval_splits`` never enters a sweep's job-folder hash (the
#: tables are the same either way, so the folders keep DomainBed's names); ``eval_batch_size``
#: does when not 64, since a batch-dependent model (GMoE at evaluation capacity 1.5) predicts
#: differently in other batches.
EVAL_DEFAULTS = {"eval_splits": DEFAULT_EVAL_SPLITS, "eval_batch_size": 64}


def add_evaluation_arguments(group) -> None:
    """``--eval_splits`` and ``--eval_batch_size`` (:data:`EVAL_DEFAULTS`): train's, and sweep's
    (passed to every job)."""
    group.add_argument("--eval_splits", choices=EVAL_SPLITS, default=DEFAULT_EVAL_SPLITS,
                       help="all (default, DomainBed's): evaluate every split at every record; "
                       "selection: only the splits model selection reads (every out-split and "
                       "the test environments' in- and uda splits; the training environments' "
                       "in-splits are skipped): the same tables for less evaluation. Records "
                       "list the splits they evaluated")
    group.add_argument("--eval_batch_size", type=int, default=EVAL_DEFAULTS["eval_batch_size"],
                       help="images per evaluation batch (default 64, DomainBed's); a model "
                       "whose predictions depend on their batch (GMoE evaluated at capacity "
                       "1.5) gives other accuracies with another value")


def non_default_evaluation(args) -> dict:
    """The evaluation flags of ``args`` that are not their defaults (:data:`EVAL_DEFAULTS`)."""
    return non_defaults(args, EVAL_DEFAULTS)


def add_rule_arguments(group) -> None:
    """``--alignment_threshold``, ``--alignment_preset`` (the rule splitting a score file's
    images into IP and OOP) and ``--alignment_model`` / ``--alignment_pretrained`` (the CLIP model
    the score file must come from): train's, sweep's (passed to every job) and alignment_eval's."""
    group.add_argument("--alignment_threshold", type=float, default=None,
                       help="IP if score >= threshold, else OOP (default 0.4)")
    group.add_argument("--alignment_preset", type=str, default=None,
                       help="a named split rule, e.g. teterwak2025 (cleaning cuts + threshold)")
    group.add_argument("--alignment_model", type=str, default=None,
                       help="the open_clip model the score file must have been made with (e.g. "
                       "ViT-B-16); a file scored by another one is an error")
    group.add_argument("--alignment_pretrained", type=str, default=None,
                       help="the pretrained tag the score file must have been made with (e.g. "
                       "laion400m_e32); a file scored with other weights is an error")


def boolean(text: str) -> bool:
    """``true``/``false`` (also yes/no, on/off, 1/0; any case) as a bool."""
    value = {"true": True, "yes": True, "on": True, "1": True,
             "false": False, "no": False, "off": False, "0": False}.get(text.strip().lower())
    if value is None:
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return value


class _Setting(argparse.Action):
    """Store a compute setting, or None when the value given is its default: a default value
    given explicitly makes the same job (same args, same folder hash) as no flag."""

    def __call__(self, parser, namespace, values, option_string=None):
        value = self.const if values is None else values
        setattr(namespace, self.dest, None if value == COMPUTE_DEFAULTS[self.dest] else value)


def add_compute_arguments(group) -> None:
    """``--precision``, ``--channels_last``, ``--deterministic``, ``--augment_on``
    (:data:`COMPUTE_ARGS`): train's and sweep's (passed to every job). Each is None unless given
    at another value than its default."""
    group.add_argument("--precision", choices=PRECISIONS, default=None, action=_Setting,
                       help="fp32 (default): float32 throughout, as DomainBed; bf16: autocast "
                       "to bfloat16 in training and evaluation (CUDA, or a CPU; fast on CPUs "
                       "with AVX512-BF16 or AMX); fp16: autocast to float16 with a gradient "
                       "scaler (CUDA only; every built-in algorithm steps its optimizers "
                       "through the scaler)")
    group.add_argument("--channels_last", type=boolean, nargs="?", const=True, default=None,
                       action=_Setting, metavar="true|false",
                       help="convolutional backbones (ResNets, the MNIST CNN) and their input "
                       "batches in torch.channels_last (faster convolutions on GPUs with tensor "
                       "cores; the same predictions up to rounding); a ViT keeps the default "
                       "memory format, with a note (its one convolution is the patch embedding)")
    group.add_argument("--deterministic", type=boolean, default=None, action=_Setting,
                       metavar="true|false",
                       help="true (default): torch's deterministic algorithms, deterministic "
                       "cuDNN and cuBLAS, and on CUDA attention by the math kernel, so two runs "
                       "and a resumed job write the same records bit for bit; false: the fastest "
                       "kernels (cudnn.benchmark, fused attention), giving up that: runs and "
                       "resumes then differ in their last digits, and so may their accuracies "
                       "(docs/determinism.md: what each setting costs)")
    group.add_argument("--augment_on", choices=AUGMENT_ON, default=None, action=_Setting,
                       help="where training images are augmented: loader (default: the PIL "
                       "transforms in the loader workers, DomainBed's numbers) or device "
                       "(workers decode and crop to 224x224 uint8; flip, colour jitter, "
                       "grayscale and normalization run batched on --device with per-image "
                       "random draws seeded by the batch: the same distributions as the PIL "
                       "path, not the same pixels; the training environments' augmented "
                       "out-splits are evaluated so too; image-folder datasets with "
                       "data_augmentation only; needs kornia: pip install 'dg_plugins[gpu]')")


def add_protocol_arguments(group, pretrain_steps_help: str) -> None:
    """The UDG protocol's :data:`UDG_PROTOCOL_ARGS`: train's, and sweep's (passed to every job;
    hence the help of ``--pretrain_steps``, ``pretrain_steps_help``, differs)."""
    group.add_argument("--pretrain_steps", type=int, default=None, help=pretrain_steps_help)
    group.add_argument("--udg_pretrain_epochs", type=float, default=None,
                       help="pretrain for this many epochs of the unlabelled source data instead "
                       "of --pretrain_steps: steps = ceil(E x pretraining images / (batch per "
                       "domain x domains)), printed (DisMAE's release: 501)")
    group.add_argument("--udg_ft_epochs", type=float, default=None,
                       help="fine-tune for this many epochs of the labelled data instead of "
                       "--steps: steps = ceil(E x labelled images of the source environments / "
                       "(batch per domain x domains)), printed (DisMAE's release: 51)")
    group.add_argument("--udg_split", choices=("domainbed", "release"), default=None,
                       help="domainbed (default): pretrain on the source in-splits, label a "
                       "fraction of them; release (DisMAE's dataloader.py): pretrain on 99%% of "
                       "each source environment and label a fraction of its 90%% in-split "
                       "(needs --holdout_fraction 0.1; the 10%% out-split stays the validation "
                       "data of model selection)")


def check_ranges(args, fractions=None, fraction_flag: str = "--label_fraction") -> None:
    """Raise ValueError, naming the flag and the fix, for a train flag of ``args`` out of its range
    or a combination that cannot run (the UDG flags without a label fraction, two lengths of one
    phase, the release split without its holdout, IP/OOP rule flags without a score file).
    ``fractions``: the label fractions (train's ``--label_fraction``, sweep's
    ``--label_fractions``, named ``fraction_flag``); None without the UDG protocol. Flags
    ``args`` lacks are not checked. Train runs it before it writes anything; sweep before it
    enumerates."""
    envs = getattr(args, "test_envs", None)
    duplicates = sorted({t for t in envs if envs.count(t) > 1}) if envs else []
    if duplicates:
        raise ValueError(f"--test_envs {' '.join(map(str, envs))} names environment(s) "
                         f"{duplicates} more than once; give each test environment once")
    eval_batch = getattr(args, "eval_batch_size", None)
    if eval_batch is not None and eval_batch < 1:
        raise ValueError(f"--eval_batch_size must be a positive integer, got {eval_batch} "
                         "(leave it out for DomainBed's 64)")
    for flag in ("steps", "checkpoint_freq"):
        value = getattr(args, flag, None)
        if value is not None and value < 1:
            raise ValueError(f"--{flag} must be a positive integer, got {value} (leave it out for "
                             "the dataset's default)")
    progress_every = getattr(args, "progress_every", None)
    if progress_every is not None and not progress_every >= 0:
        raise ValueError(f"--progress_every must be >= 0 seconds, got {progress_every}")
    for flag in ("holdout_fraction", "uda_holdout_fraction"):
        value = getattr(args, flag, None)
        if value is not None and not 0 <= value < 1:
            raise ValueError(f"--{flag} must be in [0, 1), got {value}")
    given = [name for name in UDG_PROTOCOL_ARGS if getattr(args, name, None) is not None]
    if fractions is None and given:
        raise ValueError(f"--{given[0]} is a UDG flag: give {fraction_flag} too (a fraction "
                         "in (0, 1] of the source labels to fine-tune on)")
    if fractions is not None:
        check_udg(args, fractions, fraction_flag)
    error = rule_without_scores(args)
    if error is not None:
        raise ValueError(error)


def check_udg(args, fractions, fraction_flag: str) -> None:
    """The UDG part of :func:`check_ranges`."""
    for fraction in fractions:
        if not 0 < fraction <= 1:
            raise ValueError(f"{fraction_flag} must be in (0, 1], got {fraction}")
    steps = getattr(args, "pretrain_steps", None)
    if steps is not None and steps < 1:
        raise ValueError(f"--pretrain_steps must be a positive integer, got {steps}")
    pretrain_epochs = getattr(args, "udg_pretrain_epochs", None)
    if pretrain_epochs is not None:
        if not pretrain_epochs > 0:
            raise ValueError(f"--udg_pretrain_epochs must be positive, got {pretrain_epochs}")
        if steps is not None:
            raise ValueError(f"--udg_pretrain_epochs {pretrain_epochs:g} and --pretrain_steps "
                             f"{steps} both set the pretraining length; give one of them")
    epochs = getattr(args, "udg_ft_epochs", None)
    if epochs is not None:
        if not epochs > 0:
            raise ValueError(f"--udg_ft_epochs must be positive, got {epochs}")
        if args.steps is not None:
            raise ValueError(f"--udg_ft_epochs {epochs:g} and --steps {args.steps} both set the "
                             "fine-tuning length; give one of them")
    if getattr(args, "udg_split", None) == "release" and abs(args.holdout_fraction - 0.1) > 1e-9:
        raise ValueError(
            f"--udg_split release labels a fraction of the 90% of each source environment that "
            f"the release trains on and keeps the other 10% for validation: pass "
            f"--holdout_fraction 0.1 (got {args.holdout_fraction:g})")
    if args.task != "domain_generalization":
        raise ValueError("the UDG protocol uses --task domain_generalization (its unlabelled "
                         "data are the source domains)")


def rule_without_scores(args) -> str | None:
    """The error of rule or model flags given without ``--alignment_scores`` (None when there is
    none to report); ``args``: a namespace holding any of :data:`ALIGNMENT_ARGS`."""
    given = [f"--{name}" for name in ALIGNMENT_ARGS[1:] if getattr(args, name, None) is not None]
    if getattr(args, "alignment_scores", None) is not None or not given:
        return None
    return (f"{' / '.join(given)} need --alignment_scores FILE (a score file from python -m "
            "dg_plugins.scripts.alignment_scores)")
