"""``python -m benchmarks sweep_gpu --domainbed PATH``: one small sweep on the
visible GPUs, run four ways, and the GPU-hours of each (its wall time x the GPUs it held) as
ratios to DomainBed's:

* DomainBed: its own ``sweep launch --command_launcher multi_gpu`` (one job per GPU), its
  ``train.py``, unchanged (the checkout at PATH);
* ours, one job per GPU: ``sweep launch --command_launcher multi_gpu`` with train's defaults;
* ours packed, exact: the same with ``--jobs_per_gpu N`` (the records must equal the previous
  run's, which the benchmark checks and prints);
* ours packed with the opt-in settings (``--opt_in``, default ``--channels_last --deterministic
  false --augment_on device``): other numbers, the fastest.

The sweep: ERM with torchvision's ResNet-50 (random weights under ``TORCH_HOME``, as
``benchmark image_job``), PACS's four test environments x ``--n_trials`` on a PACS-shaped tree
(``--per_class 357``: 9,996 JPEGs, PACS's size), ``--steps`` steps. Our sweeps run with
``--eval_splits selection`` (the same tables for less evaluation). On a machine without a GPU
the launcher's GPU names (``--gpus``) are only names and every job runs on the CPU: a check of
the command, not a GPU's numbers, and the title says so. ``--train_size`` (ours only) trains at
another size than DomainBed's 224x224, as a quick check.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time

from benchmarks.image_job import sized, train_size_error
from dg_plugins.catalog import IMAGE_SIZE
from dg_plugins.help_text import plain_text
from dg_plugins.job import train_argv

#: The opt-in settings of the fastest run (train flags passed by sweep to every job).
OPT_IN = "--channels_last --deterministic false --augment_on device"
#: The network's hparams per ``--model`` (for both hosts: torchvision's ResNets).
HPARAMS = {"resnet50": {"resnet18": False, "resnet50_augmix": False},
           "resnet18": {"resnet18": True, "resnet50_augmix": False}}


def sweep_args(args, data_dir: str, out: str) -> list[str]:
    """The sweep flags both hosts accept."""
    envs = (["--test_env_sets", *map(str, args.test_envs)] if args.test_envs else
            ["--single_test_envs"])
    return ["launch", "--datasets", "PACS", "--algorithms", "ERM", "--data_dir", data_dir,
            "--output_dir", out, "--n_hparams", "1", "--n_trials", str(args.n_trials), *envs,
            "--steps", str(args.steps), "--hparams",
            json.dumps({**HPARAMS[args.model], "batch_size": args.batch_size,
                        **sized(args.train_size)}),
            "--command_launcher", "multi_gpu", "--skip_confirmation"]


def runs(args, data_dir: str, tmp: str, env: dict) -> dict[str, tuple[list[str], dict]]:
    """``{label: (command, env)}`` of the four sweeps (module docstring)."""
    ours = [sys.executable, "-m", "dg_plugins.scripts.sweep"]
    out = {}
    if args.domainbed:
        # DomainBed's sweep starts `python -m domainbed.scripts.train`: this interpreter first
        # on PATH; a sitecustomize imports dg_plugins.compat (torchvision beside a CPU torch)
        site = os.path.join(tmp, "site")
        os.makedirs(site, exist_ok=True)
        with open(os.path.join(site, "sitecustomize.py"), "w") as handle:
            handle.write("import dg_plugins.compat\n")
        bin_dir = os.path.join(tmp, "bin")
        os.makedirs(bin_dir, exist_ok=True)
        python = os.path.join(bin_dir, "python")
        if not os.path.exists(python):
            os.symlink(sys.executable, python)
        path = os.pathsep.join([site, os.path.abspath(args.domainbed),
                                *filter(None, [env.get("PYTHONPATH")])])
        out["DomainBed"] = ([python, "-m", "domainbed.scripts.sweep",
                             *sweep_args(args, data_dir, os.path.join(tmp, "domainbed"))],
                            {**env, "PYTHONPATH": path,
                             "PATH": bin_dir + os.pathsep + env.get("PATH", "")})
    common = train_argv(eval_splits="selection")
    out["ours, 1 per GPU"] = ([*ours, *sweep_args(args, data_dir, os.path.join(tmp, "ours")),
                               *common], env)
    packed = ["--jobs_per_gpu", str(args.jobs_per_gpu)]
    out[f"ours, {args.jobs_per_gpu} per GPU"] = (
        [*ours, *sweep_args(args, data_dir, os.path.join(tmp, "packed")), *common, *packed], env)
    out[f"ours, {args.jobs_per_gpu} per GPU, opt-in"] = (
        [*ours, *sweep_args(args, data_dir, os.path.join(tmp, "opt_in")), *common, *packed,
         *shlex.split(args.opt_in)], env)
    return out


def records(folder: str) -> dict[str, list[dict]]:
    """Every job's records in a sweep folder, without their wall-clock fields and with their args
    but the output folder."""
    out = {}
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name, "results.jsonl")
        if os.path.isfile(path):
            with open(path) as handle:
                out[name] = [{k: v for k, v in json.loads(line).items()
                              if k not in ("step_time", "mem_gb", "args")} for line in handle]
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks sweep_gpu",
                                description=plain_text(__doc__.split("\n\n")[0]))
    p.add_argument("--domainbed", default=os.environ.get("DOMAINBED_ROOT"),
                   help="DomainBed checkout (default $DOMAINBED_ROOT; it needs wilds); without "
                        "it only ours run")
    p.add_argument("--gpus", default=None,
                   help="the launchers' GPUs (default: CUDA_VISIBLE_DEVICES, else every visible)")
    p.add_argument("--n_trials", type=int, default=2, help="x 4 test environments (default 8 "
                   "jobs)")
    p.add_argument("--test_envs", type=int, nargs="+", default=None,
                   help="ours only: only these test environments (default: each of the four "
                   "in turn; DomainBed's sweep has no such flag)")
    p.add_argument("--model", choices=tuple(HPARAMS), default="resnet50")
    p.add_argument("--steps", type=int, default=201)
    p.add_argument("--batch_size", type=int, default=32, help="per domain (DomainBed's 32)")
    p.add_argument("--per_class", type=int, default=357,
                   help="JPEGs per class and domain (357: 9,996, PACS's size)")
    p.add_argument("--image_size", type=int, default=227, help="the JPEGs' size")
    p.add_argument("--train_size", type=int, default=IMAGE_SIZE,
                   help=f"ours only: the size the jobs train at (default {IMAGE_SIZE}, "
                   "DomainBed's only size)")
    p.add_argument("--jobs_per_gpu", type=int, default=4)
    p.add_argument("--opt_in", default=OPT_IN, help=f"the fastest run's flags (default {OPT_IN})")
    p.add_argument("--timeout", type=float, default=None, help="seconds per sweep")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from benchmarks.support import random_torchvision_weights
    from benchmarks.data import make_pacs_tree
    from dg_plugins.sweep.launchers import visible_gpus

    if args.domainbed and args.test_envs:
        print("error: --test_envs: DomainBed's sweep runs every test environment; leave it out, "
              "or run without --domainbed", file=sys.stderr)
        return 2
    problem = train_size_error(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    gpus = args.gpus.split(",") if args.gpus else visible_gpus()
    if not gpus:
        print("error: no GPU visible; sweep_gpu measures the multi_gpu launcher (on a CPU "
              "machine --gpus 0 runs its check, the jobs on the CPU)", file=sys.stderr)
        return 2
    import torch

    on_gpu = torch.cuda.is_available()
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = os.path.join(tmp, "data")
        n_images = make_pacs_tree(data_dir, args.per_class, args.image_size)
        random_torchvision_weights(os.path.join(tmp, "torch"), args.model)
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(gpus),
               "TORCH_HOME": os.path.join(tmp, "torch"), "HF_HUB_OFFLINE": "1",
               "DG_PLUGINS_OFFLINE": "1"}
        title = "Sweep on GPUs" if on_gpu else "Sweep on GPUs: A CPU CHECK (no CUDA device)"
        n_jobs = len(args.test_envs or range(4)) * args.n_trials
        print(f"{title}: ERM {args.model}, PACS tree of {n_images} JPEGs, {n_jobs} jobs "
              f"of {args.steps} steps, batch {args.batch_size} per domain; GPUs {','.join(gpus)}"
              f"; {os.cpu_count()} CPUs", flush=True)
        hours = {}
        for label, (command, run_env) in runs(args, data_dir, tmp, env).items():
            start = time.perf_counter()
            done = subprocess.run(command, env=run_env, cwd=tmp, capture_output=True, text=True,
                                  timeout=args.timeout)
            wall = time.perf_counter() - start
            if done.returncode != 0:
                print(f"error: {label} exited {done.returncode}:\n{done.stdout[-2000:]}"
                      f"{done.stderr[-2000:]}", file=sys.stderr)
                return 1
            hours[label] = wall * len(gpus) / 3600
            print(f"{label:<32} wall {wall:8.1f} s, {hours[label]:.3f} GPU-hours", flush=True)
        same = records(os.path.join(tmp, "ours")) == records(os.path.join(tmp, "packed"))
        print(f"records of the packed sweep equal the one-per-GPU sweep's: {'yes' if same else 'NO'}")
        base = "DomainBed" if "DomainBed" in hours else "ours, 1 per GPU"
        print(f"GPU-hours over {base}'s:")
        for label, value in hours.items():
            if label != base:
                print(f"  {label}: {value / hours[base]:.2f}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
