"""train's flags as one table (:data:`FLAGS`, each row's policies: recorded, hashed, passed by the
sweep, changeable on resume, owned by a paper setting) read by train, sweep, the records, the
resume check and reproduce; and the range checks run before anything is written. Torch-free."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from dataclasses import dataclass
from typing import Any, Callable

from dg_plugins.help_text import EVERY_FLAG, CommandParser
from dg_plugins.job.selection import DEFAULT_EVAL_SPLITS, EVAL_SPLITS

#: The module a job command runs (``python -m <module>``); sweep writes it in every command.
TRAIN_MODULE = "dg_plugins.scripts.train"
#: train's exit statuses; a stop signal exits 128 + signal.
EXIT_DONE, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2

#: ``Flag.records``: always in the records' args (DomainBed's train flags); only when given (not
#: None); only when not the default (DomainBed's records and folder names stay as they were);
#: never (how a job runs, not what it computes).
ALWAYS, GIVEN, NOT_DEFAULT, NEVER = "always", "given", "not default", "never"
#: ``Flag.sweep``: the sweep sets it per job (its enumeration); passes its own flag of the same
#: name when given; passes it to every job (hashed or not: ``Flag.hashed``); does not pass it.
ENUMERATED, OPTIONAL, EVERY, NOT_PASSED = "enumerated", "optional", "every job", "no"

#: ``--precision``'s values: float32, or autocast to bfloat16, or to float16 with a scaler.
PRECISIONS = ("fp32", "bf16", "fp16")
#: ``--augment_on``'s values: where images are augmented (see its row's help).
AUGMENT_ON = ("loader", "device")


def boolean(text: str) -> bool:
    """``true``/``false`` (also yes/no, on/off, 1/0; any case) as a bool."""
    value = {**dict.fromkeys(("true", "yes", "on", "1"), True),
             **dict.fromkeys(("false", "no", "off", "0"), False)}.get(text.strip().lower())
    if value is None:
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return value


@dataclass(frozen=True)
class Flag:
    """One row of :data:`FLAGS`. ``setting``: stored as None when given at its default, so that
    a default given explicitly makes the same job (args, folder hash) as no flag."""
    name: str
    default: Any = None
    type: Callable | None = None
    help: str | None = None
    group: str = ""
    records: str = NEVER
    hashed: bool = False
    sweep: str = NOT_PASSED
    resumable: bool = False
    paper: bool = False
    choices: tuple | None = None
    nargs: str | None = None
    const: Any = None
    metavar: str | None = None
    store_true: bool = False
    setting: bool = False

    def add_to(self, parser, help: str | None = None, metavar: str | None = None) -> None:
        """Add ``--name`` to ``parser`` (or a group); ``help``, ``metavar``: the sweep's own."""
        options = {k: v for k, v in (("type", self.type), ("choices", self.choices),
                                     ("nargs", self.nargs), ("const", self.const),
                                     ("metavar", metavar or self.metavar)) if v is not None}
        if self.store_true or self.setting:
            options["action"] = "store_true" if self.store_true else _Setting
        parser.add_argument(f"--{self.name}", default=None if self.setting else self.default,
                            help=self.help if help is None else help, **options)


class _Setting(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        value = self.const if values is None else values
        setattr(namespace, self.dest, None if value == ROWS[self.dest].default else value)


#: train's argument groups in its ``--help``: (title, description); "" is the parser itself.
GROUPS = {
    "": None,
    "compute": ("compute (opt-in speed for GPUs)", "each setting at another value than its default "
                "enters the records' args (and a sweep's job folder hash) and is noted under "
                "collect_results' tables; see dg_plugins.train.compute"),
    "evaluation": ("evaluation", "what each record evaluates (DomainBed's defaults: every split, "
                   "batches of 64)"),
    "alignment": ("IP/OOP evaluation", "split every test environment by CLIP alignment score and "
                  "record env{i}_{in,out}_{ip,oop}_acc / _count (see python -m dg_plugins.scripts."
                  "alignment_scores)"),
    "udg": ("unsupervised DG (UDG)", "self-supervised pretraining on the unlabelled source domains "
            "(shared by every label fraction), then fine-tuning on a labelled fraction; see "
            "dg_plugins.train.udg"),
}

_DB = {"records": ALWAYS, "hashed": True, "sweep": ENUMERATED}  # DomainBed's flags
_OPTIONAL = {"records": ALWAYS, "hashed": True, "sweep": OPTIONAL}  # DomainBed's, passed if given
_GIVEN = {"records": GIVEN, "hashed": True, "sweep": EVERY}  # in the records when given
_COMPUTE = {"setting": True, "group": "compute", "records": NOT_DEFAULT, "hashed": True,
            "sweep": EVERY}

#: Every train flag, in train's ``--help`` order.
FLAGS = (
    Flag("data_dir", type=str, **_DB, resumable=True),
    Flag("dataset", "RotatedMNIST", str, **_DB),
    Flag("algorithm", "ERM", str, **_DB),
    Flag("task", "domain_generalization", str, choices=("domain_generalization",
                                                        "domain_adaptation"), **_DB, paper=True),
    Flag("hparams", type=str, help="JSON-serialized hparams dict", **_OPTIONAL),
    Flag("hparams_seed", 0, int, "Seed for random hparams (0 means 'default hparams')", **_DB),
    Flag("trial_seed", 0, int, "Trial number (used for seeding split_dataset and random_hparams).",
         **_DB),
    Flag("seed", 0, int, "Seed for everything else", **_DB),
    Flag("steps", None, int, "Number of steps. Default is dataset-dependent.", **_OPTIONAL,
         paper=True),
    Flag("checkpoint_freq", None, int, "Checkpoint every N steps. Default is dataset-dependent.",
         **_OPTIONAL, paper=True),
    Flag("test_envs", [0], int, nargs="+", **_DB),
    Flag("output_dir", "train_output", str, records=ALWAYS, sweep=ENUMERATED, resumable=True),
    Flag("holdout_fraction", 0.2, float, **_DB, paper=True),
    Flag("uda_holdout_fraction", 0, float, "For domain adaptation, %% of test to use unlabeled "
         "for training.", **_OPTIONAL, paper=True),
    Flag("skip_model_save", False, store_true=True, records=ALWAYS),
    Flag("save_model_every_checkpoint", False, store_true=True, records=ALWAYS),
    # dg_plugins additions
    Flag("device", None, str, "torch device (default: cuda when available, else cpu)"),
    Flag("resume", False, store_true=True, help="continue an interrupted job from "
         "output_dir/checkpoint.pt (the same arguments and hparams are required)"),
    Flag("force", False, store_true=True, help="start the job over even if output_dir holds a "
         "finished or interrupted run (its done, records, models and checkpoint are removed "
         "first)"),
    Flag("progress_every", None, float, "when the output is not a terminal (a log file, a "
         "sweep's job), a progress line (step, steps/s, time left) every SECONDS (default 60; a "
         "terminal gets a progress bar)", metavar="SECONDS"),
    Flag("n_workers", None, int, "loader worker processes, shared by training and evaluation "
         "(default: one per core the job has: $DG_PLUGINS_CPUS, which the multi_gpu launcher "
         "sets, else Slurm's cpus-per-task, else the cores the process may run on; in-memory "
         "datasets always load in-process)", sweep=EVERY),
    Flag("precision", "fp32", choices=PRECISIONS, **_COMPUTE,
         help="fp32 (default): float32 throughout, as DomainBed; bf16: autocast to bfloat16 in "
         "training and evaluation (CUDA, or a CPU; fast on CPUs with AVX512-BF16 or AMX); fp16: "
         "autocast to float16 with a gradient scaler (CUDA only; every built-in algorithm steps "
         "its optimizers through the scaler)"),
    Flag("channels_last", False, boolean, nargs="?", const=True, metavar="true|false", **_COMPUTE,
         help="convolutional backbones (ResNets, the MNIST CNN) and their input batches in "
         "torch.channels_last (faster convolutions on GPUs with tensor cores; the same "
         "predictions up to rounding); a ViT keeps the default memory format, with a note (its "
         "one convolution is the patch embedding)"),
    Flag("deterministic", True, boolean, metavar="true|false", **_COMPUTE,
         help="true (default): torch's deterministic algorithms, deterministic cuDNN and cuBLAS, "
         "and on CUDA attention by the math kernel, so two runs and a resumed job write the same "
         "records bit for bit; false: the fastest kernels (cudnn.benchmark, fused attention), "
         "giving up that: runs and resumes then differ in their last digits, and so may their "
         "accuracies (docs/determinism.md: what each setting costs)"),
    Flag("augment_on", "loader", choices=AUGMENT_ON, **_COMPUTE,
         help="where training images are augmented: loader (default: the PIL transforms in the "
         "loader workers, DomainBed's numbers) or device (workers decode and crop to 224x224 "
         "uint8; flip, colour jitter, grayscale and normalization run batched on --device with "
         "per-image random draws seeded by the batch: the same distributions as the PIL path, "
         "not the same pixels; the training environments' augmented out-splits are evaluated so "
         "too; image-folder datasets with data_augmentation only; needs kornia: pip install "
         "'dg_plugins[gpu]')"),
    # never hashed: the tables are the same either way, so folders keep DomainBed's names
    Flag("eval_splits", DEFAULT_EVAL_SPLITS, choices=EVAL_SPLITS, group="evaluation",
         records=NOT_DEFAULT, sweep=EVERY,
         help="all (default, DomainBed's): evaluate every split at every record; selection: "
         "only the splits model selection reads (every out-split and the test environments' in- "
         "and uda splits; the training environments' in-splits are skipped): the same tables for "
         "less evaluation. Records list the splits they evaluated"),
    # hashed: a batch-dependent model (GMoE at evaluation capacity 1.5) predicts differently
    Flag("eval_batch_size", 64, int, group="evaluation", records=NOT_DEFAULT, hashed=True,
         sweep=EVERY, help="images per evaluation batch (default 64, DomainBed's); a model whose "
         "predictions depend on their batch (GMoE evaluated at capacity 1.5) gives other "
         "accuracies with another value"),
    Flag("alignment_scores", None, str, "score file (CSV) written by "
         "dg_plugins.scripts.alignment_scores", group="alignment", **_GIVEN, paper=True),
    Flag("alignment_threshold", None, float, "IP if score >= threshold, else OOP (default 0.4)",
         group="alignment", **_GIVEN, paper=True),
    Flag("alignment_preset", None, str, "a named split rule, e.g. teterwak2025 (cleaning cuts + "
         "threshold)", group="alignment", **_GIVEN, paper=True),
    Flag("alignment_model", None, str, "the open_clip model the score file must have been made "
         "with (e.g. ViT-B-16); a file scored by another one is an error", group="alignment",
         **_GIVEN),
    Flag("alignment_pretrained", None, str, "the pretrained tag the score file must have been "
         "made with (e.g. laion400m_e32); a file scored with other weights is an error",
         group="alignment", **_GIVEN),
    Flag("label_fraction", None, float, "fine-tune on this fraction (0, 1] of each source "
         "in-split's labels (UDG job); algorithms without pretraining (ERM) train from scratch "
         "on it", group="udg", records=GIVEN, hashed=True, sweep=ENUMERATED),
    Flag("pretrain_steps", None, int, "self-supervised pretraining steps (default: the "
         "dataset's N_STEPS)", group="udg", **_GIVEN, paper=True),
    Flag("udg_pretrain_epochs", None, float, "pretrain for this many epochs of the unlabelled "
         "source data instead of --pretrain_steps: steps = ceil(E x pretraining images / (batch "
         "per domain x domains)), printed (DisMAE's release: 501)", group="udg", **_GIVEN,
         paper=True),
    Flag("udg_ft_epochs", None, float, "fine-tune for this many epochs of the labelled data "
         "instead of --steps: steps = ceil(E x labelled images of the source environments / "
         "(batch per domain x domains)), printed (DisMAE's release: 51)", group="udg",
         **_GIVEN, paper=True),
    Flag("udg_split", None, choices=("domainbed", "release"), group="udg", **_GIVEN, paper=True,
         help="domainbed (default): pretrain on the source in-splits, label a fraction of them; "
         "release (DisMAE's dataloader.py): pretrain on 99%% of each source environment and "
         "label a fraction of its 90%% in-split (needs --holdout_fraction 0.1; the 10%% "
         "out-split stays the validation data of model selection)"),
    Flag("udg_pretrain_dir", None, str, "where pretrainings are kept, one folder per (dataset, "
         "test_envs, algorithm, hparams, trial, seed, steps) hash (default: <parent of "
         "output_dir>/udg_pretrain)", group="udg", resumable=True),
    Flag("udg_pretrain", "run", choices=("run", "require"), group="udg", help="run: pretrain "
         "when missing (or wait for the job doing it); require: fail with a message if the "
         "pretraining is not done"),
)
ROWS = {flag.name: flag for flag in FLAGS}


def names(**criteria) -> tuple[str, ...]:
    """The names of the rows whose fields equal every criterion given (not None), in order."""
    return tuple(f.name for f in FLAGS
                 if all(v is None or getattr(f, k) == v for k, v in criteria.items()))


#: The compute settings (applied by :mod:`dg_plugins.train.compute`) and their defaults.
COMPUTE_DEFAULTS = {name: ROWS[name].default for name in names(group="compute")}
#: The evaluation flags and their defaults (DomainBed's: every split, batches of 64).
EVAL_DEFAULTS = {name: ROWS[name].default for name in names(group="evaluation")}
#: The IP/OOP evaluation's flags: the score file, then the rule and the model it must fit.
ALIGNMENT_ARGS = names(group="alignment")
#: The UDG protocol's lengths and split, the same for every label fraction of a sweep.
UDG_PROTOCOL_ARGS = names(group="udg", sweep=EVERY)


def add_flags(parser, group: str, skip=(), help: dict | None = None,
              metavar: dict | None = None) -> None:
    """Add the rows of ``group`` but ``skip`` to ``parser``; ``help``, ``metavar``: the sweep's."""
    for name in names(group=group):
        if name not in skip:
            ROWS[name].add_to(parser, (help or {}).get(name), (metavar or {}).get(name))


def build_train_parser() -> argparse.ArgumentParser:
    """train's parser: every row, its groups in :data:`GROUPS`' order."""
    p = CommandParser(prog="train.py", description="Train one domain-generalization job "
                      "(DomainBed-compatible output folder).", short_usage=(
                          f"python -m {TRAIN_MODULE} --dataset NAME --data_dir DIR --output_dir "
                          f"DIR [--algorithm NAME] [--hparams JSON] {EVERY_FLAG}"))
    for group, titles in GROUPS.items():
        add_flags(p if titles is None else p.add_argument_group(*titles), group)
    return p


def option(name: str) -> str:
    """train's flag ``name`` as a command line spells it; a name that is not a row is refused."""
    if name not in ROWS:
        raise ValueError(f"train has no flag --{name} (its flags: dg_plugins/job/flags.py)")
    return f"--{name}"


def borrow(parser, name: str, **options) -> None:
    """Add train's flag ``name`` to another command's parser (one that hands its values to train
    jobs): type, choices, default and help from the row but those in ``options`` (None: none)."""
    spelled, row = option(name), ROWS[name]
    given = {"type": row.type, "choices": row.choices, "default": row.default, "help": row.help,
             **options}
    parser.add_argument(spelled, **{k: v for k, v in given.items() if v is not None})


def train_argv(**values) -> list[str]:
    """train's command-line words for ``values`` (row name: value), in the order given; a name
    that is not a row is refused (:func:`option`)."""
    words = []
    for name, given in values.items():
        spelled = option(name)
        if given is None or (ROWS[name].store_true and given is False):
            continue
        words.append(spelled)
        if isinstance(given, (list, tuple)):
            words += [str(item) for item in given]
        elif not ROWS[name].store_true:
            words.append(json.dumps(given) if isinstance(given, dict) else str(given))
    return words


def train_command(args: dict, module: str = TRAIN_MODULE, python: str | None = None) -> str:
    """``<python> -m <module> --name value ...``, names sorted (DomainBed's ``sweep.Job``), each
    word quoted for a shell; ``python``: default this interpreter (DomainBed's is the bare
    ``python`` from PATH, a wrong one when the venv is not activated)."""
    return shlex.join([python or sys.executable, "-m", module,
                       *train_argv(**dict(sorted(args.items())))])


def parse_command(command) -> tuple[list[str], dict[str, list[str]]]:
    """A command (a string or its words) read back: its words, and its ``--name value...``
    (``--name=value``) words by name; ``([], {})`` for a string that cannot be split."""
    if isinstance(command, str):
        try:
            command = shlex.split(command)
        except ValueError:
            return [], {}
    flags, current = {}, None
    for word in command:
        if word.startswith("--"):
            current, equals, given = word[2:].partition("=")
            flags[current] = [given] if equals else []
        elif current is not None:
            flags[current].append(word)
    return list(command), flags


def _get(args, name: str):
    return args.get(name) if isinstance(args, dict) else getattr(args, name, None)


def value(args, name: str):
    """Flag ``name`` of ``args`` (a namespace or a dict such as a record's ``args``) as the
    records hold it: None when absent, or at its default for a :data:`NOT_DEFAULT` row."""
    got, row = _get(args, name), ROWS.get(name)
    return None if row is not None and row.records == NOT_DEFAULT and got == row.default else got


def flag(args, name: str):
    """Flag ``name`` of ``args`` (a namespace or a dict), its default when absent or None."""
    got = _get(args, name)
    return ROWS[name].default if got is None else got


def compute_settings(args) -> dict:
    """The compute settings of ``args`` (namespace or dict) that differ from their defaults."""
    return {name: v for name in names(group="compute") if (v := value(args, name)) is not None}


def record_args(args) -> dict:
    """The ``args`` of every record of a train job: DomainBed's flags (sorted, as DomainBed), then
    ours when given, then those not at their defaults, each in table order."""
    out = {name: getattr(args, name) for name in sorted(names(records=ALWAYS))}
    for policy in (GIVEN, NOT_DEFAULT):
        out.update({name: v for name in names(records=policy)
                    if (v := value(args, name)) is not None})
    return out


def sweep_job_args(args, hashed: bool) -> dict:
    """What a sweep passes to every job from its ``args`` (each flag given and not its default):
    the hashed part (the job args, hence the folder name) or the unhashed (only the command)."""
    return {name: v for name in names(sweep=EVERY, hashed=hashed)
            if (v := value(args, name)) is not None}


# Range checks (train before it writes anything, sweep before it enumerates)


def _positive(fix: str) -> tuple:
    return (lambda v: v >= 1, "must be a positive integer, got {} (leave it out for " + fix + ")")


_FRACTION = (lambda v: 0 <= v < 1, "must be in [0, 1), got {}")
#: Per flag, in the order checked: (whether a given value is valid, the error after ``--name``).
RANGES = {
    "eval_batch_size": _positive("DomainBed's 64"),
    "steps": _positive("the dataset's default"),
    "checkpoint_freq": _positive("the dataset's default"),
    "n_workers": (lambda v: v >= 0, "must be >= 0, got {} (0: load in the job's process; leave "
                  "it out for one worker per core)"),
    "data_dir": (lambda v: not os.path.isfile(v), "{} is a file, not a folder; pass the folder "
                 "that holds the dataset (e.g. the one holding PACS/)"),
    "progress_every": (lambda v: v >= 0, "must be >= 0 seconds, got {}"),
    "holdout_fraction": _FRACTION,
    "uda_holdout_fraction": _FRACTION,
}


def check_ranges(args, fractions=None, fraction_flag: str = "--label_fraction") -> None:
    """Raise ValueError naming the flag and the fix for a flag of ``args`` out of range or flags
    that cannot run together; ``fractions``: the label fractions, None without the UDG protocol."""
    envs = _get(args, "test_envs")
    if duplicates := sorted({t for t in envs or () if envs.count(t) > 1}):
        raise ValueError(f"--test_envs {' '.join(map(str, envs))} names environment(s) "
                         f"{duplicates} more than once; give each test environment once")
    for name, (ok, rule) in RANGES.items():
        if (given := _get(args, name)) is not None and not ok(given):
            raise ValueError(f"--{name} " + rule.format(given))
    given = [name for name in UDG_PROTOCOL_ARGS if _get(args, name) is not None]
    if fractions is None and given:
        raise ValueError(f"--{given[0]} is a UDG flag: give {fraction_flag} too (a fraction "
                         "in (0, 1] of the source labels to fine-tune on)")
    if fractions is not None:
        for fraction in fractions:
            if not 0 < fraction <= 1:
                raise ValueError(f"{fraction_flag} must be in (0, 1], got {fraction}")
        if (pretrain := args.pretrain_steps) is not None and pretrain < 1:
            raise ValueError(f"--pretrain_steps must be a positive integer, got {pretrain}")
        for name, steps_flag, phase in (("udg_pretrain_epochs", "pretrain_steps", "pretraining"),
                                        ("udg_ft_epochs", "steps", "fine-tuning")):
            epochs, steps = _get(args, name), _get(args, steps_flag)
            if epochs is not None and not epochs > 0:
                raise ValueError(f"--{name} must be positive, got {epochs}")
            if epochs is not None and steps is not None:
                raise ValueError(f"--{name} {epochs:g} and --{steps_flag} {steps} both set the "
                                 f"{phase} length; give one of them")
        if args.udg_split == "release" and abs(args.holdout_fraction - 0.1) > 1e-9:
            raise ValueError(f"--udg_split release labels a fraction of the 90% of each source "
                             "environment that the release trains on and keeps the other 10% for "
                             "validation: pass --holdout_fraction 0.1 (got "
                             f"{args.holdout_fraction:g})")
        if args.task != "domain_generalization":
            raise ValueError("the UDG protocol uses --task domain_generalization (its unlabelled "
                             "data are the source domains)")
    given = [f"--{name}" for name in ALIGNMENT_ARGS[1:] if _get(args, name) is not None]
    if given and _get(args, "alignment_scores") is None:
        raise ValueError(f"{' / '.join(given)} need --alignment_scores FILE (a score file from "
                         "python -m dg_plugins.scripts.alignment_scores)")
