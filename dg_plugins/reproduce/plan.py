"""A paper setting's protocol -> the ``sweep launch`` calls, scoring commands and tables that run it
(epochs -> steps from the image counts; the sweep flags its table owns, :func:`check_extra`); the
cost of a call's jobs, enumerated as sweep does without launching (:mod:`dg_plugins.sweep.costs`);
what they need before the first starts (data, split lists, CLIP and pretrained weights, a writable
output folder), found at once and printed with each fix."""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass, field

from dg_plugins import catalog
from dg_plugins.download.prepare import domainnet20_problem, split_lists_status
from dg_plugins.download.sources import download_command
from dg_plugins.job import flags as job_flags
from dg_plugins.job.sizes import in_split_size
from dg_plugins.layouts import inside_dataset_folder
from dg_plugins.reference import paper_settings as ps
from dg_plugins.sweep import checks
from dg_plugins.sweep import cli as sweep_cli
from dg_plugins.sweep import jobs as sweep_lib
from dg_plugins.sweep.costs import JobsCost, jobs_cost
from dg_plugins.sweep.costs import UsageError, dataset_sizes, official_list_sizes

#: Sweep flags a setting's table owns (a changed value would run another protocol): the train
#: flags the job contract marks so (:data:`dg_plugins.job.flags.FLAGS`), and the sweep's own
#: enumeration flags.
OWNED_SWEEP_FLAGS = job_flags.names(paper=True) + (
    "single_test_envs", "single_source", "test_env_sets", "label_fractions", "n_hparams_from")


@dataclass
class SweepCall:
    """One ``sweep launch`` call of a setting."""
    argv: list[str]
    label: str
    folder: str


@dataclass
class Plan:
    setting: ps.Setting
    protocol: ps.Protocol
    prepare: list[list[str]] = field(default_factory=list)  # alignment_scores argv lists
    calls: list[SweepCall] = field(default_factory=list)
    collects: list[list[str]] = field(default_factory=list)  # collect_results argv lists
    notes: list[str] = field(default_factory=list)
    root: str = ""  # the protocol's output folder
    argv: list[str] = field(default_factory=list)  # reproduce's arguments (for the record)


def _test_env_sets(protocol: ps.Protocol, dataset: str) -> list[list[int]]:
    """Every test-environment set of ``protocol`` on ``dataset``, in the sweep's order."""
    spec = protocol.test_envs.value
    if not isinstance(spec, str):
        return [list(s) for s in spec]
    return sweep_lib.test_env_lists(len(catalog.DATASET_ENVIRONMENTS[dataset]),
                                    spec == "single_test_envs", spec == "single_source")


def training_in_sizes(dataset: str, sources: list[int], hparams: dict, holdout: float,
                      data_dir: str | None) -> tuple[list[int], str]:
    """The training in-split size of each source environment (the official train lists under
    ``data_split: "official"``, else DomainBed's random holdout), and where it comes from."""
    if hparams.get("data_split") == "official":
        lists, origin = official_list_sizes(dataset, data_dir)
        return [lists["train"][e] for e in sources], origin
    sizes = dataset_sizes(dataset, data_dir)
    return ([in_split_size(sizes.counts[e], holdout) for e in sources],
            f"{sizes.source}; in-split = images - int(images x {holdout:g})")


def parse_test_env_sets(texts: list[str]) -> list[list[int]]:
    """``["0", "1,2,3"]`` -> ``[[0], [1, 2, 3]]`` (the ``--test_envs`` / TEST_ENVS knob)."""
    try:
        return [sorted({int(e) for e in text.split(",") if e.strip()}) for text in texts]
    except ValueError:
        raise UsageError(f"--test_envs takes test-environment sets such as 0 or 1,2,3 (comma-"
                         f"separated indices); got {' '.join(texts)}") from None


def _pick(flag: str, wanted, available: list, among: str, text=" ".join, listing=", ".join,
          key=str) -> list:
    """The ``available`` items (in order) that ``wanted`` names (None: all), compared by ``key``."""
    if wanted is None:
        return available
    if unknown := [w for w in wanted if key(w) not in map(key, available)]:
        raise UsageError(f"--{flag} {text(unknown)}: not {among} ({listing(available)}); give a "
                         "subset of them")
    return [a for a in available if key(a) in map(key, wanted)]


def _sets_text(sets) -> str:
    return " ".join(",".join(map(str, s)) for s in sets)


def plan_setting(setting: ps.Setting, protocol: ps.Protocol, *, data_dir: str,
                 output_dir: str, launcher: str | None = None, datasets=None, algorithms=None,
                 epochs: float | None = None, pretrain_epochs: float | None = None,
                 steps: int | None = None, test_envs: list[list[int]] | None = None,
                 clip_checkpoint: str | None = None, hparams: dict | None = None,
                 extra: list[str] = (), count_dir: str | None = None,
                 eval_splits: str = "selection") -> Plan:
    """The sweep calls, scoring commands and tables of one protocol (docs/reproduce.md);
    ``count_dir``: where image counts are looked for (default ``data_dir``)."""
    count_dir = data_dir if count_dir is None else count_dir
    plan = Plan(setting, protocol, root=output_dir)
    all_datasets = list(protocol.datasets.value)
    use_datasets = _pick("datasets", datasets, all_datasets, f"in {setting.name}'s datasets")
    all_algorithms = list(dict.fromkeys(a for run in protocol.runs for a in run.algorithms))
    use_algorithms = _pick("algorithms", algorithms, all_algorithms,
                           f"in {setting.name}'s algorithms")
    sweep_flags = {k: v.value for k, v in protocol.sweep_flags.items()}
    n_epochs = protocol.epochs.value if protocol.epochs is not None else None
    for flag, value in (("epochs", epochs), ("pretrain_epochs", pretrain_epochs)):
        if value is not None and not (value > 0 and math.isfinite(value)):
            raise UsageError(f"--{flag} ({flag.upper()}) must be a positive number of epochs, "
                             f"got {value:g}")
    if epochs is not None:
        if n_epochs is not None:
            n_epochs = epochs
        elif "udg_ft_epochs" in sweep_flags:
            sweep_flags["udg_ft_epochs"] = epochs
        else:
            raise UsageError(f"--epochs: {setting.name} ({protocol.name}) is not epoch-based; its "
                             "lengths are steps")
        plan.notes.append(f"--epochs {epochs:g} replaces the table's length")
    if pretrain_epochs is not None:
        if "udg_pretrain_epochs" not in sweep_flags:
            raise UsageError(f"--pretrain_epochs: {setting.name} has no pretraining")
        sweep_flags["udg_pretrain_epochs"] = pretrain_epochs
        plan.notes.append(f"--pretrain_epochs {pretrain_epochs:g} replaces the table's length")
    if steps is not None:
        if n_epochs is not None or "udg_ft_epochs" in sweep_flags:
            raise UsageError(f"--steps: {setting.name} ({protocol.name}) counts its lengths in "
                             "epochs; give --epochs (EPOCHS) instead")
        if steps < 1:
            raise UsageError(f"--steps must be a positive integer, got {steps}")
        plan.notes.append(f"--steps {steps} replaces the table's length")
    if test_envs is not None:
        plan.notes.append(f"--test_envs {_sets_text(test_envs)}: only these of the table's "
                          "test-environment sets")
    if clip_checkpoint is not None:
        if not protocol.alignment:
            raise UsageError(f"--clip_checkpoint: {setting.name} scores no images (no IP/OOP "
                             "evaluation)")
        plan.notes.append(f"CLIP weights for scoring read from {clip_checkpoint}, declared as "
                          f"the table's {protocol.alignment['pretrained'].value}")
    too_short = []  # (steps per epoch, call) of the calls whose --epochs round to 0 steps
    holdout = protocol.holdout_fraction.value if protocol.holdout_fraction is not None else 0.2
    tail = ["--resume", "--skip_confirmation", *job_flags.train_argv(eval_splits=eval_splits),
            *(["--command_launcher", launcher] if launcher else []), *extra]

    if protocol.alignment:
        scores_dir = os.path.join(output_dir, "alignment_scores")
        options = {k: v.value for k, v in protocol.alignment.items()}
        preset = options.pop("preset")
        if clip_checkpoint is not None:  # a local file of the table's weights (offline)
            options["pretrained_tag"] = options["pretrained"]
            options["pretrained"] = clip_checkpoint
        for dataset in use_datasets:
            plan.prepare.append([
                "--dataset", dataset, "--data_dir", data_dir,
                "--out", os.path.join(scores_dir, f"{dataset}.csv"),
                *(word for name, value in options.items() for word in (f"--{name}", str(value))),
                # the summary and the model check it prints are those of the jobs' rule
                "--alignment_preset", str(preset)])
        plan.notes.append(f"IP/OOP: scores in {scores_dir}, split rule {preset}")

    for group in protocol.groups:
        folder = os.path.join(output_dir, group.folder) if group.folder else output_dir
        group_has_calls = False
        for run in protocol.runs:
            algs = [a for a in run.algorithms if a in use_algorithms]
            if not algs:
                continue
            run_hp = ps.run_hparams(protocol, group, run)
            run_hp.update(hparams or {})
            for dataset in use_datasets:
                argv = ["launch", "--datasets", dataset, "--algorithms", *algs,
                        "--data_dir", data_dir, "--output_dir", folder,
                        "--n_trials", str(protocol.n_trials.value),
                        "--n_hparams", str(protocol.n_hparams.value)]
                if run_hp:
                    argv += ["--hparams", json.dumps(run_hp, sort_keys=True)]
                if protocol.holdout_fraction is not None:
                    argv += ["--holdout_fraction", str(holdout)]
                for flag, value in sweep_flags.items():
                    values = value if isinstance(value, (list, tuple)) else [value]
                    argv += [f"--{flag}", *map(str, values)]
                if protocol.alignment:
                    argv += ["--alignment_scores", os.path.join(scores_dir, f"{dataset}.csv"),
                             "--alignment_preset", str(preset)]
                name = f"{'/'.join(algs)} on {dataset}" + (f" ({group.title})" if
                                                           group.title else "")
                test_sets = _pick("test_envs", test_envs, _test_env_sets(protocol, dataset),
                                  f"among {setting.name}'s test-environment sets on {dataset}",
                                  _sets_text, _sets_text, sorted)
                if n_epochs is not None:
                    for test_set in test_sets:
                        n_envs = len(catalog.DATASET_ENVIRONMENTS[dataset])
                        sources = [e for e in range(n_envs) if e not in test_set]
                        sizes, origin = training_in_sizes(dataset, sources, run_hp, holdout,
                                                          count_dir)
                        per_epoch = ps.steps_per_epoch(sizes, run_hp["batch_size"],
                                                       run_hp.get("batch_sampling", "per_domain"))
                        steps = int(round(n_epochs * per_epoch))
                        if steps < 1:
                            too_short.append((per_epoch, f"{name}, test envs {test_set}"))
                        label = (f"{name}, test envs {test_set}: {sum(sizes)} training images "
                                 f"({'+'.join(map(str, sizes))}; {origin}) / batch "
                                 f"{run_hp['batch_size']} = {per_epoch} steps per epoch x "
                                 f"{n_epochs:g} epochs = {steps} steps, a checkpoint every epoch")
                        plan.calls.append(SweepCall(
                            argv + ["--test_env_sets", ",".join(map(str, test_set)),
                                    "--steps", str(steps), "--checkpoint_freq", str(per_epoch)]
                            + tail, label, folder))
                else:
                    spec = protocol.test_envs.value
                    if test_envs is not None or not isinstance(spec, str):
                        argv += ["--test_env_sets", *(",".join(map(str, s)) for s in test_sets)]
                    else:  # "single_test_envs" or "single_source": the sweep flag of that name
                        argv.append(f"--{spec}")
                    if steps is not None:
                        argv += ["--steps", str(steps)]
                    elif dataset in protocol.steps:
                        argv += ["--steps", str(protocol.steps[dataset].value)]
                    if dataset in protocol.checkpoint_freq:
                        argv += ["--checkpoint_freq", str(protocol.checkpoint_freq[dataset].value)]
                    plan.calls.append(SweepCall(argv + tail, name, folder))
                group_has_calls = True
        if group_has_calls:
            paper = ["--paper", *group.paper_keys] if group.paper_keys else []
            plan.collects.append(["--input_dir", folder, "--selection",
                                  *protocol.selections.value, *paper, *protocol.collect_flags,
                                  "--format", "markdown"])
    if too_short:
        per_epoch, where = min(too_short)
        raise UsageError(
            f"EPOCHS {n_epochs:g} x {per_epoch} steps per epoch rounds to 0 steps for "
            f"{setting.name} ({protocol.name}), {where}: the smallest EPOCHS that gives one step "
            f"is {smallest_epochs(per_epoch):g} (reproduce: --epochs)")
    return plan


def smallest_epochs(per_epoch: int) -> float:
    """The smallest number of epochs, at two significant digits, that :func:`plan_setting`'s
    ``round(epochs x per_epoch)`` turns into at least one step."""
    epochs = 0.5 / per_epoch
    digits = 1 - math.floor(math.log10(epochs))
    epochs = math.ceil(epochs * 10 ** digits) / 10 ** digits
    while round(epochs * per_epoch) < 1:  # 0.5 rounds to 0 (to even)
        epochs += 10 ** -digits
    return round(epochs, digits)


def check_extra(extra: list[str], protocol: ps.Protocol | None = None) -> None:
    """Refuse pass-through sweep flags the table owns (:data:`OWNED_SWEEP_FLAGS`, ``protocol``'s
    ``sweep_flags``, e.g. GMoE release's ``--eval_batch_size``); unknown ones fail as in sweep."""
    parser = sweep_cli.build_parser()
    base = ["launch", "--output_dir", "-", "--data_dir", "-"]
    defaults = vars(parser.parse_args(base))
    given = vars(parser.parse_args(base + list(extra)))
    owned = set(OWNED_SWEEP_FLAGS) | set(protocol.sweep_flags if protocol is not None else ())
    if changed := [name for name in defaults if name in owned and given[name] != defaults[name]]:
        raise UsageError(f"{', '.join('--' + n for n in changed)}: set by the setting's table "
                         "(reproduce SETTING --describe shows it); to run other values, run "
                         "python -m dg_plugins.scripts.sweep with the flags --dry_run prints")


@dataclass
class CallCost(JobsCost):
    """The jobs of one sweep call and their cost (steps and forwards per job)."""
    jobs: list = field(default_factory=list)
    selected: list = field(default_factory=list)  # what a launch starts (+ Incomplete if resume)
    resume: bool = False


def call_cost(argv: list[str], pretrainings: set | None = None, forwards: bool = True) -> CallCost:
    """The jobs of a ``sweep launch`` argv, their steps and (``forwards``) image forwards; a UDG
    pretraining counts once per listing (``pretrainings``: the identities counted)."""
    args, jobs = sweep_cli.sweep_jobs(argv, dry_run=True, defer_scores=True)
    selected = sweep_lib.select_jobs(jobs, "launch", resume=args.resume)
    counted = jobs_cost([job.train_args for job in jobs], pretrainings, forwards=forwards)
    return CallCost(**vars(counted), jobs=jobs, selected=selected, resume=args.resume)


#: Datasets whose ``data_split: "official"`` reads split lists, and the downloader's name of them.
OFFICIAL_SPLIT_LISTS = {"PACS": "PACS_splits"}


def prerequisites(plan: Plan, data_dir: str, costs: list[CallCost]) -> list[str]:
    """What the jobs of every sweep call need before the first one starts (module docstring), one
    line each naming the fix; [] when nothing is missing."""
    jobs = [job for cost in costs for job in cost.selected]
    if not jobs and not plan.prepare:
        return []
    problems = []
    datasets = list(dict.fromkeys(job.train_args["dataset"] for job in jobs))
    data = checks.data_problems(jobs)  # none for built-in datasets ("--data_dir builtin")
    if data and not os.path.isdir(data_dir):  # one line for all of them
        command = download_command(datasets, data_dir)
        problems.append(f"the data folder {data_dir} (--data_dir, DATA_DIR) does not exist: "
                        "point it at the folder that holds the datasets"
                        + (f", or download them there: {command}" if command else ""))
    else:
        problems += data
        if "DomainNet20" in datasets and os.path.isdir(os.path.join(data_dir, "domain_net")):
            if missing := domainnet20_problem(data_dir):
                problems.append(f"DomainNet20: {missing}; DomainNet20 reads the 20 classes of "
                                f"DomainNet's folders: {download_command('DomainNet', data_dir)}")
    for dataset, lists in OFFICIAL_SPLIT_LISTS.items():
        if not any(job.train_args["dataset"] == dataset
                   and json.loads(job.train_args.get("hparams") or "{}").get("data_split")
                   == "official" for job in jobs):
            continue
        if os.path.isdir(data_dir) and inside_dataset_folder(
                dataset, data_dir, catalog.IMAGE_FOLDER_DATASETS[dataset]):
            continue  # its data line names the --data_dir meant, where the lists go too
        status, detail = ("absent", "") if not os.path.isdir(data_dir) else \
            split_lists_status(lists, data_dir)
        if status != "ok":
            problems.append(f"{dataset}'s official split lists (data_split 'official'): "
                            f"{detail or 'not there'}; to download them (after {dataset}): "
                            f"{download_command(lists, data_dir)}")
    for argv in plan.prepare:
        if os.path.isfile(argv[argv.index("--out") + 1]):
            continue  # scored before: alignment_scores reads its cache
        from dg_plugins.alignment import scoring  # imports torch and open_clip

        model, pretrained = argv[argv.index("--model") + 1], argv[argv.index("--pretrained") + 1]
        try:
            scoring.check_weights_available(model, pretrained)
        except (OSError, ValueError, RuntimeError) as err:
            line = " ".join(str(err).split())
            problem = (f"scoring images for IP/OOP ({model} {pretrained}): {line} With "
                       "reproduce: --clip_checkpoint FILE (sweeps/*.sh: CLIP_CHECKPOINT=FILE).")
            if problem not in problems:
                problems.append(problem)
    problems += checks.output_problems(jobs)
    by_error: dict[str, list[str]] = {}
    for line in checks.weight_problems(jobs):  # "<algorithm> on <dataset>: <error>"
        what, _, error = line.partition(": ")
        by_error.setdefault(error, []).append(what)
    shared = ("" if len(plan.protocol.groups) < 2 else
              f" Here one pretrained_path would go to every backbone of {plan.setting.name} "
              "(one folder each): put each backbone's file at its cache path instead.")
    problems += [f"{', '.join(whats)}: {error}{shared}" for error, whats in by_error.items()]
    return problems


def report_prerequisites(plan: Plan, problems: list[str], dry: bool) -> None:
    """Print the missing prerequisites: errors before a real run, warnings after a dry run."""
    what = f"{len(problems)} prerequisite(s) of {plan.setting.name} ({plan.protocol.name})"
    for problem in problems:
        print(f"{'warning' if dry else 'error'}: {problem}", file=sys.stderr)
    print(f"warning: {what} missing (above): a real run would launch nothing until they are "
          "there." if dry else f"Nothing was launched: {what} missing (above); fix them and "
          "rerun the same command.", file=sys.stderr)
