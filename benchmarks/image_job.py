"""``python -m benchmarks image_job --domainbed PATH``: one image job run by
dg_plugins' train (with ``--eval_splits all`` and with ``selection``) and by DomainBed's
``domainbed/scripts/train.py`` (the checkout at PATH, unchanged, in a subprocess with
``PYTHONPATH=PATH``), on the same data with the same arguments, the three taking turns in every
repeat (the order rotating), measured in one run.

The job: ERM with a ResNet-18 (``--model resnet50``: torchvision's ResNet-50) on a PACS-shaped
tree of 560 JPEGs at 227x227 (``--per_class 357``: 9,996, PACS's size;
:func:`benchmarks.data.make_pacs_tree`), test environment 0, 21 steps, a record every
5 steps, batch 8 per domain, each host's default loader workers. DomainBed always loads
torchvision's ImageNet weights (``domainbed/networks.py``: ``resnet18(pretrained=True)``), so both
hosts run with ``TORCH_HOME`` pointing at a temporary folder that holds random weights under that
file's name (:func:`benchmarks.support.random_torchvision_weights`): nothing is downloaded
and both start from the same weights. ``resnet50_augmix`` is false for both (DomainBed's default
true would replace the network by timm's ResNet-50). DomainBed trains at 224x224 only; a smaller
``--train_size`` runs ours alone, as a quick check (the benchmark's tests).

Given train's precision flag with ``fp32 bf16``, it adds our jobs under the opt-in bf16 autocast
(its numbers differ from fp32's, so it is a speed-up a user chooses, not the same job).

Printed per run and as medians over the repeats: the wall time of the job (the whole process);
a training step (the records' ``step_time``: drawing the batches and the update, the first record
left out); one evaluation (the time between two records' lines on the job's unbuffered stdout
less the steps between them at that record's ``step_time``); the job's time in training (every
step at its record's ``step_time``), in evaluation (every record at the median evaluation) and
the rest, its startup and end (imports, data, model, the first batches, the model's save); and
the ratios of dg_plugins to
DomainBed and of ``selection`` to ``all``, each the median of the per-repeat ratios (runs of one
repeat are back to back) with their quartiles. The targets on a 2-core CPU: a ``selection``
job at most 0.35x DomainBed's wall, and at most 0.75x an ``all`` job's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from dg_plugins.catalog import IMAGE_SIZE, IMAGE_SIZE_HPARAM
from dg_plugins.help_text import plain_text
from dg_plugins.job import borrow, option, train_argv
from dg_plugins.job.selection import EVAL_SPLITS

#: The job's hparams for both hosts per ``--model`` (DomainBed's ``resnet50_augmix`` default would
#: replace the network by timm's ResNet-50).
HPARAMS = {"resnet18": {"resnet18": True, "resnet50_augmix": False},
           "resnet50": {"resnet18": False, "resnet50_augmix": False}}
DOMAINBED = "DomainBed"


def job_arguments(args, data_dir: str, output_dir: str) -> list[str]:
    """Train arguments both hosts accept (DomainBed's train CLI)."""
    return train_argv(data_dir=data_dir, dataset="PACS", algorithm="ERM", test_envs=[0],
                      steps=args.steps, checkpoint_freq=args.checkpoint_freq,
                      hparams={**HPARAMS[args.model], "batch_size": args.batch_size,
                               **sized(args.train_size)}, output_dir=output_dir)


def sized(train_size: int) -> dict:
    """The jobs' ``image_size`` hparam: none at DomainBed's fixed 224 (its jobs' own arguments)."""
    return {} if train_size == IMAGE_SIZE else {IMAGE_SIZE_HPARAM: train_size}


def train_size_error(args) -> str | None:
    """Why the jobs cannot train at ``--train_size`` (None: they can)."""
    if args.train_size == IMAGE_SIZE:
        return None
    if args.domainbed:
        return (f"--train_size {args.train_size}: DomainBed trains at {IMAGE_SIZE} only; leave "
                "it out, or run without --domainbed")
    import dg_plugins.datasets  # noqa: F401  (declares PACS's hparams)
    from dg_plugins.hparams import validate

    try:
        validate("ERM", "PACS", sized(args.train_size))
    except ValueError as err:
        return f"--train_size {args.train_size}: {err}"
    return None


def commands(args, data_dir: str, out: str, env: dict) -> dict[str, tuple[list[str], dict]]:
    """``{label: (command, env)}``: ours per ``--eval_splits`` value, then DomainBed's (unbuffered
    stdout, ``-u``, so that every record's line arrives when it is printed)."""
    from dg_plugins.domainbed.bridge import unpatched_script_command

    runs = {}
    for precision in args.precision:
        for value in args.eval_splits:
            suffix = "" if precision == "fp32" else f", {precision}"
            runs[f"dg_plugins ({value}{suffix})"] = (
                [sys.executable, "-u", "-m", "dg_plugins.scripts.train",
                 *job_arguments(args, data_dir, os.path.join(out, f"ours_{value}_{precision}")),
                 *train_argv(eval_splits=value, precision=precision if suffix else None)], env)
    if args.domainbed:
        command, db_env = unpatched_script_command(
            "train", job_arguments(args, data_dir, os.path.join(out, "domainbed")),
            os.path.abspath(args.domainbed))
        runs[DOMAINBED] = ([command[0], "-u", *command[1:]], {**env, "PYTHONPATH":
                                                               db_env["PYTHONPATH"]})
    return runs


def value_rows(lines: list[tuple[float, str]]) -> list[float]:
    """The arrival times of the records' value rows among ``(seconds, line)`` of a job's stdout:
    lines of numbers only, as many as the last header row (the line naming ``step``) has names."""
    width, times = None, []
    for seconds, line in lines:
        cells = line.split()
        if "step" in cells and "step_time" in cells:
            width = len(cells)
            continue
        if width and len(cells) == width:
            try:
                [float(c) for c in cells]
            except ValueError:
                continue
            times.append(seconds)
    return times


def run_job(command: list[str], env: dict, output_dir: str, cwd: str) -> dict:
    """Run one job to completion and measure it (module docstring): ``wall``, ``step`` (median
    of the records' ``step_time`` after the first), ``evaluation`` (median over the records
    after the first), ``records``."""
    start = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, cwd=cwd)
    lines = [(time.perf_counter() - start, line) for line in proc.stdout]
    code = proc.wait()
    wall = time.perf_counter() - start
    if code != 0:
        tail = "".join(line for _, line in lines[-30:])
        raise RuntimeError(f"{' '.join(command[:5])} ... exited with {code}:\n{tail}")
    with open(os.path.join(output_dir, "results.jsonl")) as handle:
        records = [json.loads(line) for line in handle if line.strip()]
    rows = value_rows(lines)
    if len(rows) != len(records) or len(records) < 2:
        raise RuntimeError(f"{output_dir}: {len(records)} records but {len(rows)} record lines "
                           "on stdout; the evaluation time needs one line per record and two "
                           "records at least (--checkpoint_freq below --steps)")
    steps = [r["step_time"] for r in records[1:]]
    evaluations = [rows[k] - rows[k - 1] - (records[k]["step"] - records[k - 1]["step"])
                   * records[k]["step_time"] for k in range(1, len(records))]
    previous = [-1] + [r["step"] for r in records[:-1]]
    training = sum((r["step"] - p) * r["step_time"] for r, p in zip(records, previous))
    evaluating = statistics.median(evaluations) * len(records)
    return {"wall": wall, "step": statistics.median(steps),
            "evaluation": statistics.median(evaluations), "records": len(records),
            "training": training, "evaluating": evaluating,
            "startup": wall - training - evaluating}


def _ratio_text(times: list[float], base: list[float]) -> str:
    from benchmarks.timing import paired_ratio

    low, mid, high = paired_ratio(times, base)
    return f"{mid:.2f} ({low:.2f}-{high:.2f})"


def report(measured: dict[str, list[dict]], args) -> dict[str, float]:
    """Print the medians and the ratios; returns the median ratios by name."""
    keys = ("wall", "step", "evaluation", "training", "evaluating", "startup")
    print(f"\n{'':<30} {'wall s':>8} {'step s':>8} {'evaluation s':>13} {'records':>8} "
          f"{'training s':>11} {'evaluating s':>13} {'startup+end s':>14} {'eval share':>11}")
    for label, runs in measured.items():
        med = {k: statistics.median(r[k] for r in runs) for k in keys}
        print(f"{label:<30} {med['wall']:>8.1f} {med['step']:>8.2f} {med['evaluation']:>13.2f} "
              f"{runs[0]['records']:>8} {med['training']:>11.1f} {med['evaluating']:>13.1f} "
              f"{med['startup']:>14.1f} {med['evaluating'] / med['wall']:>11.0%}")
    ratios, lines = {}, []

    def ratio(name: str, label: str, base: str, key: str, goal: str = "") -> None:
        if label in measured and base in measured:
            from benchmarks.timing import paired_ratio

            times = [r[key] for r in measured[label]]
            base_times = [r[key] for r in measured[base]]
            ratios[name] = paired_ratio(times, base_times)[1]
            lines.append(f"  {name}: {_ratio_text(times, base_times)}{goal}")

    ours_all, ours_sel = "dg_plugins (all)", "dg_plugins (selection)"
    ratio("wall, all / DomainBed", ours_all, DOMAINBED, "wall")
    ratio("wall, selection / DomainBed", ours_sel, DOMAINBED, "wall", " (goal <= 0.35)")
    ratio("wall, selection / all", ours_sel, ours_all, "wall", " (goal <= 0.75)")
    ratio("step, dg_plugins (all) / DomainBed", ours_all, DOMAINBED, "step")
    ratio("evaluation, all / DomainBed", ours_all, DOMAINBED, "evaluation")
    ratio("evaluation, selection / DomainBed", ours_sel, DOMAINBED, "evaluation")
    ratio("evaluation, selection / all", ours_sel, ours_all, "evaluation")
    for precision in args.precision:
        if precision != "fp32":
            for value in args.eval_splits:
                label = f"dg_plugins ({value}, {precision})"
                ratio(f"wall, {value} {precision} / DomainBed", label, DOMAINBED, "wall")
                ratio(f"wall, {value} {precision} / {value} fp32", label,
                      f"dg_plugins ({value})", "wall")
    if lines:
        print(f"ratios, median of the {args.repeats} per-repeat ratios (quartiles):")
        print("\n".join(lines))
    return ratios


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks image_job",
                                description=plain_text(__doc__.split("\n\n")[0]))
    p.add_argument("--domainbed", default=os.environ.get("DOMAINBED_ROOT"),
                   help="DomainBed checkout (default $DOMAINBED_ROOT); without it only ours run")
    p.add_argument("--repeats", type=int, default=3, help="runs of each job, taking turns")
    borrow(p, "eval_splits", nargs="+", default=list(EVAL_SPLITS),
           help=f"our jobs' {option('eval_splits')} values (default: both)")
    borrow(p, "precision", nargs="+", choices=("fp32", "bf16"), default=["fp32"],
           help=f"our jobs' {option('precision')} values (default fp32, as DomainBed; bf16 adds "
           "runs with the opt-in autocast, whose numbers differ from fp32's)")
    p.add_argument("--model", choices=tuple(HPARAMS), default="resnet18",
                   help="torchvision's ResNet-18 (default) or ResNet-50, on both hosts")
    p.add_argument("--steps", type=int, default=21)
    p.add_argument("--checkpoint_freq", type=int, default=5)
    p.add_argument("--batch_size", type=int, default=8, help="per domain")
    p.add_argument("--per_class", type=int, default=20,
                   help="JPEGs per class and domain (4 domains x 7 classes; 20: 560 images; "
                   "357: 9,996, PACS's size)")
    p.add_argument("--image_size", type=int, default=227, help="the JPEGs' size")
    p.add_argument("--train_size", type=int, default=IMAGE_SIZE,
                   help=f"the size the jobs train and evaluate at (default {IMAGE_SIZE}, "
                   "DomainBed's only size; another runs ours alone, as a quick check)")
    p.add_argument("--work_dir", default=None,
                   help="where the tree and the jobs go (default: a temporary folder, removed)")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.repeats < 1 or args.checkpoint_freq >= args.steps:
        print("error: --repeats must be >= 1 and --checkpoint_freq below --steps (the evaluation "
              "time is measured between two records)", file=sys.stderr)
        return 2
    if args.domainbed and not os.path.isfile(os.path.join(args.domainbed, "domainbed",
                                                          "scripts", "train.py")):
        print(f"error: --domainbed {args.domainbed}: no domainbed/scripts/train.py there; give a "
              "DomainBed checkout", file=sys.stderr)
        return 2
    problem = train_size_error(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    from benchmarks.support import random_torchvision_weights
    from benchmarks.data import make_pacs_tree

    # absolute: the jobs run in it (a relative --work_dir would be taken from there again)
    with tempfile.TemporaryDirectory(dir=args.work_dir and os.path.abspath(args.work_dir)) as tmp:
        data_dir = os.path.join(tmp, "data")
        n_images = make_pacs_tree(data_dir, args.per_class, args.image_size)
        random_torchvision_weights(os.path.join(tmp, "torch"), args.model)
        env = {**os.environ, "TORCH_HOME": os.path.join(tmp, "torch"),
               "HF_HOME": os.path.join(tmp, "hf"), "XDG_CACHE_HOME": os.path.join(tmp, "cache"),
               "HF_HUB_OFFLINE": "1", "DG_PLUGINS_OFFLINE": "1"}
        model = {"resnet18": "ResNet-18", "resnet50": "ResNet-50"}[args.model]
        print(f"Image job: ERM, {model} (random weights from {env['TORCH_HOME']}), PACS-shaped "
              f"tree of {n_images} JPEGs at {args.image_size}x{args.image_size}"
              f"{'' if args.train_size == IMAGE_SIZE else f' trained at {args.train_size}'}"
              ", test env 0, "
              f"{args.steps} steps, a record every {args.checkpoint_freq}, batch "
              f"{args.batch_size} per domain, default loader workers; {os.cpu_count()} CPUs, "
              f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} at the start; "
              f"{args.repeats} repeats, the jobs taking turns")
        measured: dict[str, list[dict]] = {}
        for repeat in range(args.repeats):
            runs = commands(args, data_dir, os.path.join(tmp, f"run{repeat}"), env)
            labels = list(runs)
            shift = repeat % len(labels)
            for label in labels[shift:] + labels[:shift]:
                command, run_env = runs[label]
                result = run_job(command, run_env, command[command.index("--output_dir") + 1],
                                 tmp)
                measured.setdefault(label, []).append(result)
                print(f"repeat {repeat + 1} {label:<30} wall {result['wall']:6.1f} s (startup "
                      f"and end {result['startup']:.1f}, training {result['training']:.1f}, "
                      f"evaluation {result['evaluating']:.1f}), step {result['step']:.2f} s, "
                      f"one evaluation {result['evaluation']:.2f} s, {result['records']} records",
                      flush=True)
        measured = {label: measured[label] for label in labels}
        report(measured, args)
        print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
