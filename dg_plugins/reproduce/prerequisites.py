"""What the jobs of a setting need before the first one starts (data, split lists, CLIP and
pretrained weights, a writable output folder), found at once and printed with each fix."""

from __future__ import annotations

import json
import os
import sys

from dg_plugins import catalog
from dg_plugins.download.prepare import domainnet20_problem, split_lists_status
from dg_plugins.download.sources import download_command
from dg_plugins.layouts import inside_dataset_folder
from dg_plugins.reproduce.plan import CallCost, Plan
from dg_plugins.sweep import checks as sweep_lib

#: Datasets whose ``data_split: "official"`` reads split lists, and the downloader's name of them.
OFFICIAL_SPLIT_LISTS = {"PACS": "PACS_splits"}


def prerequisites(plan: Plan, data_dir: str, costs: list[CallCost]) -> list[str]:
    """What the jobs of every sweep call of the setting need before the first one starts (module
    docstring; :func:`dg_plugins.sweep.checks.data_problems`, ``weight_problems``), one line each
    naming the fix; [] when nothing is missing."""
    jobs = [job for cost in costs for job in cost.selected]
    if not jobs and not plan.prepare:
        return []
    problems = []
    datasets = list(dict.fromkeys(job.train_args["dataset"] for job in jobs))
    data = sweep_lib.data_problems(jobs)  # none for built-in datasets ("--data_dir builtin")
    if data and not os.path.isdir(data_dir):  # one line for all of them
        command = download_command(datasets, data_dir)
        problems.append(f"the data folder {data_dir} (--data_dir, DATA_DIR) does not exist: "
                        "point it at the folder that holds the datasets"
                        + (f", or download them there: {command}" if command else ""))
    else:
        problems += data
        if "DomainNet20" in datasets and os.path.isdir(os.path.join(data_dir, "domain_net")):
            missing = domainnet20_problem(data_dir)
            if missing:
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
    problems += sweep_lib.output_problems(jobs)
    by_error: dict[str, list[str]] = {}
    for line in sweep_lib.weight_problems(jobs):  # "<algorithm> on <dataset>: <error>"
        what, _, error = line.partition(": ")
        by_error.setdefault(error, []).append(what)
    shared = ("" if len(plan.protocol.groups) < 2 else
              f" Here one pretrained_path would go to every backbone of {plan.setting.name} "
              "(one folder each): put each backbone's file at its cache path instead.")
    problems += [f"{', '.join(whats)}: {error}{shared}" for error, whats in by_error.items()]
    return problems


def report_prerequisites(plan: Plan, problems: list[str], dry: bool) -> None:
    """Print the missing prerequisites: as errors before a real run that launches nothing, as
    warnings after a dry run's listing."""
    what = f"{len(problems)} prerequisite(s) of {plan.setting.name} ({plan.protocol.name})"
    for problem in problems:
        print(f"{'warning' if dry else 'error'}: {problem}", file=sys.stderr)
    print(f"warning: {what} missing (above): a real run would launch nothing until they are "
          "there." if dry else f"Nothing was launched: {what} missing (above); fix them and "
          "rerun the same command.", file=sys.stderr)
