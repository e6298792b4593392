"""``python -m benchmarks data_path [--domainbed PATH]``: the images per second
the data path delivers to the model, with the model left out (an infinitely fast GPU), on this
machine's cores: training batches and full evaluations, dg_plugins' against DomainBed's loaders,
measured in one run and printed as ratios.

* dg_plugins: a train job built in this process (:class:`dg_plugins.train.loop.Job`: PACS, ERM,
  test environment 0, its streams and its one worker pool), for each ``--workers`` count, reading
  the JPEGs (``DG_PLUGINS_DECODED_CACHE=off``) and with the decoded-image cache
  (:mod:`dg_plugins.datasets.decoded`, in a temporary ``DG_PLUGINS_CACHE``). Training: rounds of
  one batch from every source stream; evaluation: the batches of every split the job evaluates
  (:func:`dg_plugins.train.evaluate.eval_batches_of`, as a record makes them). Batches are the
  model's float input on the CPU (for the uint8 paths, converted here; on a GPU that runs on
  the device).
* DomainBed: the checkout at ``--domainbed`` (imported by :func:`dg_plugins.domainbed.bridge.
  locate_domainbed`, unchanged), its PACS class and transforms, its splits
  (``misc.split_dataset`` seeded as its ``train.py`` seeds them), an ``InfiniteDataLoader`` per
  training environment and a ``FastDataLoader`` per evaluated split, each with its
  ``N_WORKERS`` (8) workers.

The tree: :func:`benchmarks.data.make_pacs_tree` (JPEGs at PACS's 227x227). Each
configuration's loaders are started, warmed up (``--warmup`` rounds, one untimed evaluation: the
cache's augmented evaluation pixels are made then, once per sweep), timed, and ended before the
next starts. A timing runs from loaders whose prefetch is full to loaders whose prefetch is full
again (DomainBed's keep 16 batches per loader ready), so the batches consumed are paid in it; it
gives images per wall second and per CPU second (this process and its loader workers: the work
an image costs, whatever else runs on the machine; on a busy machine a loader of many processes
gets a larger share of the cores than one of few). The configurations take turns in every
repeat (the order rotating), and a ratio is the median of the per-repeat ratios (quartiles
beside), so a change of the machine's load hits both sides of a ratio alike. The first
evaluation with a cold cache and the job's build time (the cache built, then reused) are printed
too. Goals (the issue's, on a 2-core CPU): evaluation images/s at least 4x DomainBed's, training
images/s at least DomainBed's.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import sys
import tempfile
import time

from dg_plugins.help_text import plain_text
from dg_plugins.job import borrow, train_argv as flag_words

DOMAINBED = "DomainBed"
HPARAMS = {"resnet18": True, "resnet50_augmix": False, "pretrained": False}


def train_argv(args, data_dir: str, out: str, workers: int) -> list[str]:
    return flag_words(dataset="PACS", algorithm="ERM", data_dir=data_dir, test_envs=[0],
                      hparams={**HPARAMS, "batch_size": args.batch_size}, output_dir=out,
                      n_workers=workers, device="cpu", eval_splits=args.eval_splits,
                      eval_batch_size=args.eval_batch_size)


class Ours:
    """One dg_plugins configuration: a job's streams, pool and evaluation."""

    def __init__(self, args, data_dir: str, out: str, workers: int, cache: bool, phase: str):
        from dg_plugins.datasets.decoded import SWITCH_ENV
        from dg_plugins.train.cli import build_parser
        from dg_plugins.train.loop import Job

        import types

        os.environ[SWITCH_ENV] = "on" if cache else "off"
        job = Job(build_parser().parse_args(train_argv(args, data_dir, out, workers)),
                  types.SimpleNamespace(signum=None))
        text = io.StringIO()
        start = time.perf_counter()
        with contextlib.redirect_stdout(text), contextlib.redirect_stderr(io.StringIO()):
            job.build()
        self.build_s = time.perf_counter() - start
        self.cache_line = next((line for line in text.getvalue().splitlines()
                                if line.startswith("Decoded-image cache:")), "")
        job.start_workers()
        if phase == "evaluation" and job.pool is not None:
            job.pool.limit = 0  # no training round: the evaluation alone, as DomainBed's loaders
        self.job = job
        self.streams = job.streams[:job.n_train_streams]
        self.round_images = args.batch_size * len(self.streams)

    def training_round(self) -> int:
        for stream in self.streams:
            next(stream)
        return self.round_images

    def evaluation(self) -> int:
        from dg_plugins.train.evaluate import eval_batches_of, eval_seed

        job = self.job
        datasets = [(split, eval_seed(name)) for name, split, _ in job.splits.eval_named()
                    if name in job.eval_names]
        images = 0
        with contextlib.closing(eval_batches_of(datasets, job.args.eval_batch_size, job.workers,
                                                job.pool, device=job.device)) as batches:
            for _, x, _ in batches:
                images += len(x)
        return images

    def pids(self) -> list[int]:
        return [w.pid for w in self.job.pool.workers] if self.job.pool is not None else []

    def close(self) -> None:
        self.job.close()


class DomainBed:
    """DomainBed's loaders on the same tree (module docstring)."""

    def __init__(self, args, data_dir: str, workers: int, phase: str):
        from domainbed import datasets
        from domainbed.lib import misc
        from domainbed.lib.fast_data_loader import FastDataLoader, InfiniteDataLoader

        test_envs = [0]
        dataset = datasets.PACS(data_dir, test_envs, {"data_augmentation": True})
        in_splits, out_splits = [], []
        for env_i, env in enumerate(dataset):
            out, in_ = misc.split_dataset(env, int(len(env) * 0.2), misc.seed_hash(0, env_i))
            if env_i in test_envs:
                _, in_ = misc.split_dataset(in_, 0, misc.seed_hash(0, env_i))
            in_splits.append(in_)
            out_splits.append(out)
        self.loaders = []
        if phase == "training":
            self.train = [InfiniteDataLoader(dataset=split, weights=None,
                                             batch_size=args.batch_size, num_workers=workers)
                          for i, split in enumerate(in_splits) if i not in test_envs]
            self.loaders = self.train
            self.minibatches = zip(*self.train)
            self.round_images = args.batch_size * len(self.train)
        else:
            names = [f"env{i}_in" for i in range(len(in_splits))] + [
                f"env{i}_out" for i in range(len(out_splits))]
            chosen = set(args.evaluated)
            self.eval = [FastDataLoader(dataset=split, batch_size=args.eval_batch_size,
                                        num_workers=workers)
                         for name, split in zip(names, in_splits + out_splits)
                         if name in chosen]
            self.loaders = self.eval

    def training_round(self) -> int:
        next(self.minibatches)
        return self.round_images

    def evaluation(self) -> int:
        images = 0
        for loader in self.eval:
            for x, _ in loader:
                images += len(x)
        return images

    def pids(self) -> list[int]:
        return [w.pid for loader in self.loaders
                for w in getattr(loader._infinite_iterator, "_workers", None) or []]

    def close(self) -> None:
        from dg_plugins.train.batches import shutdown_workers

        for loader in self.loaders:
            shutdown_workers(loader._infinite_iterator)


def cpu_seconds(pids, own: bool = True) -> float:
    """CPU seconds (user + system) used so far by the live processes ``pids`` (loader workers;
    read from ``/proc``, so 0 elsewhere than on Linux) and, with ``own``, this process."""
    import resource

    total = 0.0
    if own:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        total = usage.ru_utime + usage.ru_stime
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    for pid in pids:
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(f"/proc/{pid}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def settle(loaders, interval: float = 0.1, timeout: float = 300.0) -> float:
    """Wait until ``loaders``' workers stop working (their prefetch is full: DomainBed's keep 16
    batches per loader ready, ours 2 requests per worker); returns when they stopped (the last
    poll that saw them work)."""
    pids = loaders.pids()
    before, stopped = cpu_seconds(pids, own=False), time.perf_counter()
    deadline = stopped + timeout
    while time.perf_counter() < deadline:
        time.sleep(interval)
        now = cpu_seconds(pids, own=False)
        if now - before < 0.02:
            return stopped
        before, stopped = now, time.perf_counter()
    return stopped


class Timer:
    """Wall and CPU seconds (this process and ``loaders``' workers) of a block, from loaders
    whose prefetch is full to loaders whose prefetch is full again (:func:`settle`): what the
    block consumed is paid in it, however many batches were ready before it."""

    def __init__(self, loaders):
        self.loaders = loaders

    def __enter__(self):
        settle(self.loaders)
        self.cpu = cpu_seconds(self.loaders.pids())
        self.wall = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.wall = settle(self.loaders) - self.wall
        self.cpu = cpu_seconds(self.loaders.pids()) - self.cpu


def measure(make, args) -> dict:
    """Time a configuration's training rounds (after ``--warmup``), then, on loaders started
    afresh, one evaluation (untimed: its first) and ``--evaluations`` timed ones, back to back;
    each set of loaders ended before the next starts, so neither phase competes with the other's
    workers. Wall and CPU seconds (:class:`Timer`)."""
    result = {}
    loaders = make("training")
    try:
        for _ in range(args.warmup):
            loaders.training_round()
        images = 0
        with Timer(loaders) as timer:
            for _ in range(args.rounds):
                images += loaders.training_round()
        result["training"] = images / timer.wall
        result["training_cpu"] = images / timer.cpu
        if isinstance(loaders, Ours):  # the first job of a configuration (the cache's build)
            result["build_s"], result["cache_line"] = loaders.build_s, loaders.cache_line
    finally:
        loaders.close()
    loaders = make("evaluation")
    try:
        start = time.perf_counter()
        images = loaders.evaluation()
        result["first_evaluation"] = images / (time.perf_counter() - start)
        with Timer(loaders) as timer:
            images = sum(loaders.evaluation() for _ in range(args.evaluations))
        result["evaluation"] = images / timer.wall
        result["evaluation_cpu"] = images / timer.cpu
        result["evaluation_images"] = images // args.evaluations
    finally:
        loaders.close()
    return result


def configurations(args, data_dir: str, out: str) -> dict:
    """``{label: make(phase)}`` for every configuration of the run."""
    runs = {}
    if args.domainbed:
        runs[f"{DOMAINBED} ({args.domainbed_workers} workers per loader)"] = (
            lambda phase: DomainBed(args, data_dir, args.domainbed_workers, phase))
    for cache in (False, True):
        for workers in args.workers:
            label = (f"dg_plugins {'cache' if cache else 'JPEG'}, {workers} "
                     f"worker{'s' * (workers != 1)}")
            folder = os.path.join(out, label.replace(" ", "_").replace(",", ""))
            runs[label] = (lambda phase, w=workers, c=cache, f=folder:
                           Ours(args, data_dir, f, w, c, phase))
    return runs


def report(measured: dict[str, list[dict]], args) -> dict[str, float]:
    """Print the medians and the ratios to DomainBed; returns the median ratios by name."""
    from benchmarks.timing import paired_ratio

    keys = ("training", "evaluation", "training_cpu", "evaluation_cpu")
    print(f"\n{'median of the repeats':<40} {'images/s':>21} {'images per CPU second':>23}")
    print(f"{'':<40} {'training':>9} {'evaluation':>11} {'training':>11} {'evaluation':>11}")
    for label, runs in measured.items():
        print(f"{label:<40} " + " ".join(
            f"{statistics.median(r[key] for r in runs):>{9 if k == 0 else 11}.0f}"
            for k, key in enumerate(keys)))
    base = next((label for label in measured if label.startswith(DOMAINBED)), None)
    ratios = {}
    if base is not None:
        print(f"ratios to {DOMAINBED}, median of the {args.repeats} per-repeat ratios "
              "(quartiles); per CPU second: the work each image costs, whatever else runs on "
              "the machine:")
        goals = {"training": 1.0, "evaluation": 4.0}
        for key in keys:
            for label, runs in measured.items():
                if label == base:
                    continue
                # paired_ratio takes times: images/s are their inverse
                low, mid, high = paired_ratio([1 / r[key] for r in measured[base]],
                                              [1 / r[key] for r in runs])
                name = key.replace("_cpu", " per CPU second")
                ratios[f"{name}, {label}"] = mid
                goal = (f" (goal >= {goals[key]:g})" if "cache" in label and key in goals
                        else "")
                print(f"  {name}, {label}: {mid:.2f} ({low:.2f}-{high:.2f}){goal}")
    cached = [label for label in measured if "cache" in label]
    if cached:
        cold = measured[cached[0]][0]  # the first cache configuration run: it built the cache
        warm = [r for label in cached for r in measured[label] if r is not cold]
        reused = f"{statistics.median(r['build_s'] for r in warm):.1f} s" if warm else "n/a"
        print(f"with a cold cache ({cached[0]}, repeat 1): job build {cold['build_s']:.1f} s "
              f"(every image decoded once), first evaluation {cold['first_evaluation']:.0f} "
              f"images/s (its augmented splits' pixels made and kept); job build with the "
              f"cache reused: {reused}")
        print(cold["cache_line"])
    return ratios


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks data_path",
                                description=plain_text(__doc__.split("\n\n")[0]))
    p.add_argument("--domainbed", default=os.environ.get("DOMAINBED_ROOT"),
                   help="DomainBed checkout (default $DOMAINBED_ROOT; DomainBed imports wilds); "
                   "without it only ours run")
    p.add_argument("--workers", type=int, nargs="+", default=None,
                   help="our loader workers (default: 1 and this machine's cores)")
    p.add_argument("--domainbed_workers", type=int, default=8,
                   help="workers per DomainBed loader (default its N_WORKERS, 8)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rounds", type=int, default=20, help="timed training rounds")
    p.add_argument("--warmup", type=int, default=4, help="untimed training rounds first")
    p.add_argument("--evaluations", type=int, default=3,
                   help="timed evaluations, back to back, after one untimed")
    p.add_argument("--batch_size", type=int, default=32, help="per domain (DomainBed's 32)")
    p.add_argument("--eval_batch_size", type=int, default=64)
    borrow(p, "eval_splits", help=None)
    p.add_argument("--per_class", type=int, default=20,
                   help="JPEGs per class and domain (4 domains x 7 classes; 20: 560 images)")
    p.add_argument("--image_size", type=int, default=227)
    p.add_argument("--work_dir", default=None,
                   help="where the tree, the cache and the jobs go (default: a temporary "
                   "folder, removed)")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if min(args.repeats, args.rounds, args.evaluations) < 1 or args.warmup < 0:
        print("error: --repeats, --rounds and --evaluations must be >= 1, --warmup >= 0",
              file=sys.stderr)
        return 2
    if args.domainbed:
        if not os.path.isfile(os.path.join(args.domainbed, "domainbed", "__init__.py")):
            print(f"error: --domainbed {args.domainbed}: no domainbed/__init__.py there; give a "
                  "DomainBed checkout", file=sys.stderr)
            return 2
        os.environ["DOMAINBED_ROOT"] = os.path.abspath(args.domainbed)
        from dg_plugins.domainbed.bridge import domainbed_modules

        domainbed_modules()  # import it now: a missing package fails here, named
    import dg_plugins.compat  # noqa: F401
    import torch

    from dg_plugins import plugins
    from benchmarks.data import make_pacs_tree
    from dg_plugins.runtime import job_cores
    from dg_plugins.job.selection import evaluated_splits

    plugins.load()
    import warnings

    warnings.filterwarnings("ignore", message="This DataLoader will create")  # DomainBed's 8
    torch.set_num_threads(1)  # the main process's conversions; workers use one thread each
    cores = job_cores()[0]
    args.workers = args.workers or sorted({1, cores})
    args.evaluated = evaluated_splits(args.eval_splits, [0], 4, 0)
    saved = {name: os.environ.get(name) for name in ("DG_PLUGINS_CACHE",
                                                     "DG_PLUGINS_DECODED_CACHE")}
    try:
        with tempfile.TemporaryDirectory(dir=args.work_dir) as tmp:
            os.environ["DG_PLUGINS_CACHE"] = os.path.join(tmp, "cache")
            data_dir = os.path.join(tmp, "data")
            n_images = make_pacs_tree(data_dir, args.per_class, args.image_size)
            print(f"Data path: a PACS-shaped tree of {n_images} JPEGs at {args.image_size}x"
                  f"{args.image_size}, test environment 0, training batches of "
                  f"{args.batch_size} per domain x 3 domains, evaluation of "
                  f"{', '.join(args.evaluated)} ({args.eval_splits}) in batches of "
                  f"{args.eval_batch_size}; the model left out, batches made the model's float "
                  f"input on the CPU; {os.cpu_count()} CPUs ({cores} for the job), load average "
                  f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} at the start; "
                  f"{args.repeats} repeats, the configurations taking turns", flush=True)
            runs = configurations(args, data_dir, os.path.join(tmp, "jobs"))
            labels = list(runs)
            measured: dict[str, list[dict]] = {label: [] for label in labels}
            for repeat in range(args.repeats):
                shift = repeat % len(labels)
                for label in labels[shift:] + labels[:shift]:
                    result = measure(runs[label], args)
                    measured[label].append(result)
                    print(f"repeat {repeat + 1} {label:<40} training {result['training']:6.0f}"
                          f" images/s ({result['training_cpu']:.0f} per CPU s), evaluation "
                          f"{result['evaluation']:6.0f} images/s ({result['evaluation_cpu']:.0f} "
                          f"per CPU s; the first {result['first_evaluation']:.0f} images/s), "
                          f"{result['evaluation_images']} images", flush=True)
            report(measured, args)
            print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return 0


if __name__ == "__main__":
    sys.exit(main())
