"""Benchmark: dg_plugins' collect_results against DomainBed's on a large synthetic sweep.

    python -m benchmarks collect [--jobs 10000] [--out DIR] [--domainbed PATH]
        [--template SWEEP_DIR] [--keep]

1. Writes ``--jobs`` job folders in DomainBed's record format (``results.jsonl`` with one
   sorted-key JSON line per checkpoint, plus ``done``; ``domainbed/scripts/train.py``). The jobs replicate a template
   sweep (``--template``; default DomainBed's ``domainbed/misc/test_sweep_data`` when a DomainBed
   checkout is known, else a built-in VLCS-shaped template with the same structure: 2 hparams
   seeds x 2 trials x 10 test-environment sets x 5 checkpoints). Each replica gets another
   (dataset, algorithm) pair among datasets with the template's environment count and several
   algorithm names (DomainBed's and one unknown name), shifted hparams seeds, and accuracies
   jittered with a seeded RNG.
2. Times ``python -m dg_plugins.scripts.collect_results --input_dir DIR`` as a whole subprocess
   (interpreter start and imports included) and prints the wall time, the CPU time (user + system
   of the process and its children) and records/s.
3. With ``--domainbed PATH`` (or env ``DOMAINBED_ROOT``), also times DomainBed's own collect_results
   on the same folder in the same run (``python -c`` importing :mod:`dg_plugins.compat` first, so
   that torchvision imports beside a CPU torch, then running ``domainbed.scripts.collect_results``),
   prints the ratios, and checks that both printed the same tables (stdout; the results.txt files
   both write into the folder are ignored).

Wall times are printed, never asserted.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

from dg_plugins import catalog
from benchmarks.support import timed_command
from dg_plugins.help_text import plain_text
from dg_plugins.sweep.jobs import job_folder_name
from dg_plugins.job.folder import DONE_FILE, RESULTS_FILE

#: Algorithm names the replicas cycle through: DomainBed's (shuffled against its table order, so
#: that ordering is exercised) and one name DomainBed does not know.
ALGORITHMS = ["CORAL", "ERM", "Mixup", "IRM", "dgp_Unlisted", "GroupDRO", "MMD", "SagNet"]


def builtin_template(seed: int = 0) -> list[list[dict]]:
    """A VLCS-shaped sweep in DomainBed's record format: for each trial (2) and hparams seed (2),
    every single and pair test-environment set of 4 environments, 5 checkpoints each."""
    rng = np.random.default_rng(seed)
    envs = 4
    test_sets = [[e] for e in range(envs)] + [
        [a, b] for a in range(envs) for b in range(a + 1, envs)]
    jobs = []
    for trial in range(2):
        for hparams_seed in range(2):
            hparams = {"batch_size": int(rng.integers(8, 64)), "class_balanced": False,
                       "data_augmentation": True, "lr": float(10 ** rng.uniform(-5, -3.5)),
                       "nonlinear_classifier": False, "resnet18": False,
                       "resnet_dropout": float(rng.choice([0.0, 0.1, 0.5])),
                       "weight_decay": float(10 ** rng.uniform(-6, -2))}
            for test_envs in test_sets:
                args = {"algorithm": "ERM", "checkpoint_freq": None, "data_dir": "/data",
                        "dataset": "VLCS", "holdout_fraction": 0.2, "hparams": None,
                        "hparams_seed": hparams_seed, "output_dir": "",
                        "save_model_every_checkpoint": False, "seed": int(rng.integers(2**31)),
                        "skip_model_save": False,
                        "steps": 1001, "task": "domain_generalization", "test_envs": test_envs,
                        "trial_seed": trial, "uda_holdout_fraction": 0}
                level = rng.uniform(0.5, 0.9, size=envs)
                records = []
                for step in (0, 300, 600, 900, 1000):
                    record = {"args": args, "epoch": step / 29.0, "hparams": hparams,
                              "loss": float(rng.uniform(0, 2)), "step": step,
                              "step_time": float(rng.uniform(0.2, 1))}
                    for e in range(envs):
                        grown = level[e] * min(1.0, 0.3 + step / 600)
                        for split in ("in", "out"):
                            noisy = grown + rng.normal(0, 0.02)
                            record[f"env{e}_{split}_acc"] = float(np.clip(noisy, 0, 1))
                    records.append(record)
                jobs.append(records)
    return jobs


def read_template(sweep_dir: str) -> list[list[dict]]:
    """The records of every job of a sweep folder (one list per job, sorted by folder name)."""
    jobs = []
    for entry in sorted(os.listdir(sweep_dir)):
        path = os.path.join(sweep_dir, entry, RESULTS_FILE)
        if os.path.isfile(path):
            with open(path) as handle:
                jobs.append([json.loads(line) for line in handle if line.strip()])
    if not jobs:
        raise SystemExit(f"template sweep {sweep_dir!r} has no <job>/results.jsonl")
    return jobs


def write_sweep(template: list[list[dict]], n_jobs: int, out_dir: str, seed: int = 0) -> int:
    """Write ``n_jobs`` jobs replicating ``template`` into ``out_dir``; returns the record count."""
    n_envs = sum(1 for key in template[0][0] if key.startswith("env") and key.endswith("_out_acc"))
    datasets = [d for d, envs in catalog.DOMAINBED_DATASETS.items() if len(envs) == n_envs][:4]
    if not datasets:
        raise SystemExit(f"no catalog dataset has {n_envs} environments like the template")
    combos = [(d, a) for d in datasets for a in ALGORITHMS]
    seeds = sorted({job[0]["args"]["hparams_seed"] for job in template})
    rng = np.random.default_rng(seed)
    os.makedirs(out_dir, exist_ok=True)
    n_records = 0
    for index in range(n_jobs):
        replica, job = divmod(index, len(template))
        dataset, algorithm = combos[replica % len(combos)]
        shift = len(seeds) * (replica // len(combos))
        base_args = template[job][0]["args"]
        args = dict(base_args, dataset=dataset, algorithm=algorithm,
                    hparams_seed=seeds.index(base_args["hparams_seed"]) + shift)
        name = job_folder_name(args)
        args["output_dir"] = os.path.join(out_dir, name)
        os.makedirs(args["output_dir"], exist_ok=True)
        lines = []
        for record in template[job]:
            record = dict(record, args=args)
            for key, value in record.items():
                if key.startswith("env") and key.endswith("_acc"):
                    record[key] = float(min(1.0, max(0.0, value + rng.normal(0, 0.02))))
            lines.append(json.dumps(record, sort_keys=True) + "\n")
        with open(os.path.join(args["output_dir"], RESULTS_FILE), "w") as handle:
            handle.writelines(lines)
        with open(os.path.join(args["output_dir"], DONE_FILE), "w") as handle:
            handle.write("done")
        n_records += len(lines)
    return n_records


def folder_size(path: str) -> int:
    return sum(os.path.getsize(os.path.join(root, name))
               for root, _, names in os.walk(path) for name in names)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks collect",
        description=plain_text(__doc__.split("\n\n")[0]),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=10000, help="number of job folders (10000)")
    parser.add_argument("--out", help="where to write the sweep (default: a temporary folder, "
                        "deleted afterwards unless --keep); an existing non-empty folder is reused "
                        "as is")
    parser.add_argument("--domainbed", default=os.environ.get("DOMAINBED_ROOT"),
                        help="DomainBed checkout to compare with (default: env DOMAINBED_ROOT)")
    parser.add_argument("--template", help="sweep folder whose jobs are replicated")
    parser.add_argument("--keep", action="store_true", help="keep the temporary sweep folder")
    parser.add_argument("--repeats", type=int, default=3,
                        help="timed runs of each, alternating; medians are reported (3)")
    args = parser.parse_args(argv)

    out_dir = args.out or tempfile.mkdtemp(prefix="dgp_bench_collect_")
    try:
        if os.path.isdir(out_dir) and os.listdir(out_dir):
            print(f"reusing the sweep in {out_dir}")
        else:
            template_dir = args.template
            if template_dir is None and args.domainbed:
                candidate = os.path.join(args.domainbed, "domainbed", "misc", "test_sweep_data")
                template_dir = candidate if os.path.isdir(candidate) else None
            template = read_template(template_dir) if template_dir else builtin_template()
            start = time.perf_counter()
            n_records = write_sweep(template, args.jobs, out_dir)
            print(f"wrote {args.jobs} jobs, {n_records} records, "
                  f"{folder_size(out_dir) / 1e6:.1f} MB to {out_dir} in "
                  f"{time.perf_counter() - start:.1f} s (template: {template_dir or 'built-in'})")

        orjson = importlib.util.find_spec("orjson") is not None
        print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; orjson "
              f"{'installed' if orjson else 'not installed (collect_results parses with json)'}")
        ours_cmd = [sys.executable, "-m", "dg_plugins.scripts.collect_results", "--input_dir",
                    out_dir]
        if args.domainbed:
            from dg_plugins.domainbed.bridge import unpatched_script_command

            theirs_cmd, env = unpatched_script_command("collect_results",
                                                       ["--input_dir", out_dir], args.domainbed)
        ours_runs, theirs_runs = [], []
        for _ in range(args.repeats):  # alternate, so both see the same machine state
            ours_runs.append(timed_command(ours_cmd))
            if ours_runs[-1][2].returncode != 0:
                print(ours_runs[-1][2].stderr, file=sys.stderr)
                raise SystemExit("dg_plugins collect_results failed")
            if args.domainbed:
                theirs_runs.append(timed_command(theirs_cmd, env))
                if theirs_runs[-1][2].returncode != 0:
                    print(theirs_runs[-1][2].stderr[-3000:], file=sys.stderr)
                    raise SystemExit("DomainBed collect_results failed")
        ours = ours_runs[0][2]
        n_records = int(ours.stdout.split("\n", 1)[0].rsplit(" ", 1)[-1])
        ours_s = statistics.median(r[0] for r in ours_runs)
        ours_cpu = statistics.median(r[1] for r in ours_runs)
        print(f"dg_plugins collect_results: {ours_s:.2f} s wall ({ours_cpu:.2f} s CPU), "
              f"{n_records / ours_s:,.0f} records/s (median of {args.repeats}: "
              f"{', '.join(f'{r[0]:.2f}' for r in ours_runs)} s)")
        if not args.domainbed:
            print("DomainBed not compared (pass --domainbed PATH or set DOMAINBED_ROOT)")
            return 0
        theirs_s = statistics.median(r[0] for r in theirs_runs)
        theirs_cpu = statistics.median(r[1] for r in theirs_runs)
        print(f"DomainBed collect_results:  {theirs_s:.2f} s wall ({theirs_cpu:.2f} s CPU), "
              f"{n_records / theirs_s:,.0f} records/s (median of {args.repeats}: "
              f"{', '.join(f'{r[0]:.2f}' for r in theirs_runs)} s)")
        print(f"speed-up: {theirs_s / ours_s:.1f}x wall, {theirs_cpu / ours_cpu:.1f}x CPU "
              "(target: >= 10x wall)")
        same = all(r[2].stdout == theirs_runs[0][2].stdout for r in ours_runs + theirs_runs)
        print("printed tables identical:", "yes" if same else "NO")
        return 0 if same else 1
    finally:
        if not args.out and not args.keep:
            shutil.rmtree(out_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
