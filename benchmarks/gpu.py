"""``python -m benchmarks gpu [--out results/gpu_benchmarks.md]``: what a GPU
does with the paper algorithms, in one command of a few minutes, as a markdown table.

Per algorithm at 224x224 (random init, nothing downloaded), in fp32 and bf16 taking turns step by
step: the median time of the train job's own training step (:meth:`dg_plugins.train.loop.Job.
train_step` on Debug224), its peak memory (:mod:`~benchmarks.memory`) and images per
second; the training loader's and the evaluation's images per second on a PACS-shaped JPEG tree
(:mod:`~benchmarks.data`); the step under train's compute settings
(``--deterministic``, ``--channels_last``); and the settings it recommends for this machine
(:func:`recommendations`). Without CUDA it runs a reduced version that says so in its title (and
leaves out bf16 where torch emulates it)."""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import itertools
import os
import platform
import shlex
import statistics
import sys
import tempfile
import types

from dg_plugins.help_text import plain_text
from dg_plugins.job import train_argv as flag_words
from dg_plugins.train.progress import plural

#: The rows of the algorithm table: label, algorithm, hparams (random init for all).
RESNET18 = {"resnet18": True, "resnet50_augmix": False}
RESNET50 = {"resnet18": False, "resnet50_augmix": False}
ALGORITHM_ROWS = (
    ("ERM ResNet-18", "ERM", RESNET18),
    ("ERM ResNet-50", "ERM", RESNET50),
    ("DMG ResNet-18", "DMG", RESNET18),
    ("DMG ResNet-50", "DMG", RESNET50),
    ("ERM_ViT DeiT-S/16", "ERM_ViT", {}),
    ("GMoE-S/16", "GMoE", {}),
    ("DisMAE ViT-B/16", "DisMAE", {"vit_arch": "vit_base_patch16_224"}),
    ("MPBM ResNet-18", "MPBM", RESNET18),
)
#: The rows a CPU runs (the reduced version).
CPU_ROWS = ("ERM ResNet-18", "ERM_ViT DeiT-S/16")
#: The rows of the compute-settings table on a GPU (a CPU: :data:`CPU_ROWS`).
DETERMINISM_ROWS = ("ERM ResNet-50", "ERM_ViT DeiT-S/16", "GMoE-S/16")
#: The compute settings that table compares with train's defaults: name -> train flags.
SETTINGS = {"default": [], "fast": ["--deterministic", "false"],
            "channels_last": ["--channels_last"],
            "fast + channels_last": ["--deterministic", "false", "--channels_last"]}
#: A reduced precision or a setting is recommended when its step takes at most this share of
#: the default's (smaller gains are within what a shared machine's noise moves).
GAIN = 0.9
PRECISIONS = ("fp32", "bf16")


def rate(per_s: float) -> str:
    """Images per second as printed: whole from 10 up, else two significant digits."""
    return f"{per_s:.0f}" if per_s >= 10 else f"{per_s:.2g}"


def cpu_precisions() -> list[str]:
    """A CPU run's default precisions: bf16 too unless the CPU lacks bfloat16 instructions."""
    from dg_plugins.train.compute import native_cpu_bf16

    return list(PRECISIONS) if native_cpu_bf16() is not False else ["fp32"]


@contextlib.contextmanager
def quiet():
    """Keep a job's build messages out of the report."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        yield


@contextlib.contextmanager
def built_jobs(argvs: dict):
    """Train jobs built in this process from train's command lines (``key -> argv``) as the train
    command builds them (nothing written until they record); closed after the block."""
    from dg_plugins.train.cli import build_parser
    from dg_plugins.train.loop import Job

    jobs = {}
    try:
        for key, argv in argvs.items():
            job = Job(build_parser().parse_args(argv), types.SimpleNamespace(signum=None))
            job.compute.check(job.device)  # train checks it in its validation
            with quiet():
                job.build()
            jobs[key] = job
        yield jobs
    finally:
        for job in jobs.values():
            job.close()


def compute_flags(args) -> list[str]:
    return ((["--channels_last"] if args.channels_last else [])
            + (["--deterministic", "false"] if args.deterministic == "false" else []))


def train_argv(args, out: str, algorithm: str, hparams: dict, precision: str, **extra) -> list:
    return [*flag_words(dataset=extra.get("dataset", "Debug224"), algorithm=algorithm,
                        data_dir=extra.get("data_dir", "builtin"), test_envs=[0],
                        hparams={**hparams, "pretrained": False, "batch_size": args.batch_size},
                        output_dir=out, precision=precision),
            *extra.get("compute", compute_flags(args)),
            *flag_words(device=args.device or None, n_workers=extra.get("n_workers"))]


def _counted(fn):
    """A call of ``fn(0)``, then ``fn(1)``, ... (a job's next training step or record)."""
    counter = itertools.count()
    return lambda: fn(next(counter))


def measure_algorithms(args, device, out: str) -> list[dict]:
    """The algorithm table's rows (module docstring)."""
    import torch

    from benchmarks.memory import persistent_bytes, step_peak_bytes
    from benchmarks.timing import alternating_times

    rows = []
    for label, algorithm, hparams in ALGORITHM_ROWS:
        if label not in args.algorithms:
            continue
        with built_jobs({p: train_argv(args, os.path.join(out, f"{algorithm}_{p}"), algorithm,
                                       hparams, p) for p in args.precisions}) as jobs:
            first = next(iter(jobs.values()))
            images = args.batch_size * first.n_train_streams
            with first.compute.active(device):  # the jobs' shared settings (deterministic)
                times = alternating_times({p: _counted(job.train_step) for p, job in jobs.items()},
                                          args.steps, args.warmup, device)
                for precision, job in jobs.items():
                    step = statistics.median(times[precision])
                    peak = (persistent_bytes(job.algorithm) + step_peak_bytes(
                        job.algorithm, None, device, _counted(job.train_step)))
                    rows.append({"label": label, "precision": precision, "step_s": step,
                                 "peak_bytes": peak, "images_per_s": images / step})
        del jobs, first  # their memory freed before the cache is emptied
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def measure_determinism(args, device, out: str) -> list[dict]:
    """The compute-settings table's rows: each row's fp32 step under each of :data:`SETTINGS` that
    applies (channels_last to convolutional networks), the jobs taking turns."""
    from benchmarks.timing import alternating_times, paired_ratio

    def step(job):
        steps = _counted(job.train_step)

        def run():
            job.compute.configure_backends()
            with job.compute.active(device):
                steps()
        return run

    rows = []
    for label, algorithm, hparams in ALGORITHM_ROWS:
        if label not in args.determinism:
            continue
        names = [n for n in SETTINGS if "ViT" not in label and "MoE" not in label
                 or "channels_last" not in n]
        with built_jobs({name: train_argv(
                args, os.path.join(out, f"set_{algorithm}_{name.replace(' ', '')}"), algorithm,
                hparams, "fp32", compute=SETTINGS[name]) for name in names}) as jobs:
            times = alternating_times({name: step(job) for name, job in jobs.items()},
                                      args.steps, args.warmup, device)
        rows.append({"label": label, "default_s": statistics.median(times["default"]),
                     "ratios": {name: paired_ratio(times[name], times["default"])
                                for name in names[1:]}})
    return rows


def recommendations(args, device, algorithms, loader, settings) -> list[str]:
    """The settings this machine's measurements recommend, each line with its evidence."""
    import torch

    lines = []
    if loader:
        best = max(row["images_per_s"] for row in loader)
        enough = min((row for row in loader if row["images_per_s"] >= GAIN * best),
                     key=lambda row: row["workers"])
        lines.append(f"- Loader workers: {enough['workers']} deliver {enough['images_per_s']:.0f} "
                     f"images/s, within {1 - GAIN:.0%} of the most measured ({best:.0f}); train "
                     "uses one per core by default (--n_workers N sets it).")
    fp32 = {row["label"]: row for row in algorithms if row["precision"] == "fp32"}
    for row in algorithms:
        if row["precision"] == "fp32" or row["label"] not in fp32:
            continue
        ratio = row["step_s"] / fp32[row["label"]]["step_s"]
        flag = " ".join(flag_words(precision=row["precision"]))
        verdict = (f"{flag} ({ratio:.2f}x the fp32 step; opt-in: other numbers than fp32's)"
                   if ratio <= GAIN else f"fp32 ({flag} gives {ratio:.2f}x its step)")
        lines.append(f"- {row['label']}: {verdict}.")
    for row in settings:
        gains = {name: r[1] for name, r in row["ratios"].items() if r[1] <= GAIN}
        if gains:
            name = min(gains, key=gains.get)
            flags = " ".join(SETTINGS[name])
            lines.append(f"- {row['label']}: {flags} ({gains[name]:.2f}x the default step; "
                         "--deterministic false gives up bit-exact runs and resumes).")
        else:
            lines.append(f"- {row['label']}: train's defaults (no setting measured below "
                         f"{GAIN}x their step).")
    if device.type == "cuda" and algorithms:
        total = torch.cuda.get_device_properties(device).total_memory / 2 ** 30
        peak = max(row["peak_bytes"] for row in algorithms) / 2 ** 30
        from dg_plugins.sweep.launchers import ALLOCATOR_SLACK, CONTEXT_GB

        fit = int(total // (peak * ALLOCATOR_SLACK + CONTEXT_GB))
        lines.append(f"- Jobs per GPU: by memory, {fit} of the largest measured step "
                     f"({peak:.1f} GiB at its peak, of {total:.0f} GiB) fit (sweep --jobs_per_gpu "
                     f"N checks it again at launch); the cores left per job then set the loader's "
                     "speed: benchmark sweep_gpu measures a packed sweep.")
    return lines


def measure_loader(args, data_dir: str, out: str) -> list[dict]:
    """The training loader's images per second for each ``--workers`` count, after enough rounds
    for the workers to fill their prefetch."""
    from benchmarks.timing import alternating_times

    rows = []
    for workers in args.workers:
        with built_jobs({"loader": train_argv(
                args, os.path.join(out, f"loader{workers}"), "ERM", RESNET18, "fp32",
                dataset="PACS", data_dir=data_dir, n_workers=workers)}) as jobs:
            job = jobs["loader"]
            job.start_workers()
            streams = job.streams[:job.n_train_streams]
            warmup = 2 * max(1, job.workers)
            times = alternating_times({"round": lambda: [next(s) for s in streams]},
                                      args.loader_rounds, warmup, "cpu")["round"]
        images = args.batch_size * len(streams) * len(times)
        rows.append({"workers": job.workers, "images": images,
                     "images_per_s": images / sum(times)})
    return rows


def measure_evaluation(args, device, data_dir: str, out: str) -> list[dict]:
    """Images per second of one record of ERM ResNet-18 on the tree (every split, the job's worker
    pool, evaluation batch and precision), per precision."""
    from benchmarks.timing import alternating_times

    def record(job):
        def run(step):
            with job.compute.active(device), quiet():
                job.write_record(step)
        return _counted(run)

    rows = []
    with built_jobs({p: train_argv(args, os.path.join(out, f"eval_{p}"), "ERM", RESNET18, p,
                                   dataset="PACS", data_dir=data_dir)
                     for p in args.precisions}) as jobs:
        for job in jobs.values():
            os.makedirs(job.folder, exist_ok=True)
            job.start_workers()
        times = alternating_times({p: record(job) for p, job in jobs.items()},
                                  args.eval_repeats, 1, device)
        for precision, job in jobs.items():
            sizes = {name: len(split) for name, split, _ in job.splits.eval_named()}
            images = sum(sizes[name] for name in job.eval_names)
            rows.append({"precision": precision, "images": images, "workers": job.workers,
                         "images_per_s": images / statistics.median(times[precision])})
    return rows


def _table(head: list[str], rows: list[list]) -> list[str]:
    """A markdown table's lines."""
    lines = [f"| {' | '.join(map(str, cells))} |" for cells in (head, *rows)]
    return [lines[0], "|" + "---|" * len(head), *lines[1:]]


def device_name(device) -> str:
    import torch

    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda})"
    return f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"


def markdown(args, device, algorithms, loader, evaluation, determinism, n_images,
             seconds) -> str:
    import torch

    reduced = device.type != "cuda"
    title = ("# GPU benchmarks" if not reduced else
             "# GPU benchmarks: REDUCED CPU RUN (no CUDA device; the command's check, not a "
             "GPU's numbers)")
    lines = [title, "",
             f"Device: {device_name(device)}; torch {torch.__version__}; "
             f"{datetime.date.today().isoformat()}; {os.cpu_count()} CPU cores, load average "
             f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}.",
             f"Command: `python -m benchmarks gpu "
             f"{shlex.join(args.argv)}`".rstrip() + f" ({seconds:.0f} s).",
             "Compute flags: " + (" ".join(compute_flags(args))
                                  or "train's defaults (deterministic, no channels_last)") + ".",
             ""]
    if reduced:
        lines += ["Reduced: " + ", ".join(args.algorithms) + "; "
                  f"{plural(args.batch_size, 'image')} per domain; {args.steps} timed step(s) "
                  f"after {args.warmup}; loader workers {', '.join(map(str, args.workers))}; a "
                  f"{n_images}-image tree. A GPU machine runs every algorithm at batch 32 per "
                  "domain.", ""]
        if args.bf16_left_out:
            from dg_plugins.train.compute import BF16_EMULATED

            lines += [f"bf16 left out: {BF16_EMULATED}, at several times fp32's step; "
                      "--precisions fp32 bf16 times it anyway.", ""]
    lines += [f"## Training step at 224x224 ({plural(args.batch_size, 'image')} per domain x 2 "
              f"source domains, random init; median of {args.steps} steps after {args.warmup}"
              + (", " + " and ".join(args.precisions) + " taking turns)"
                 if len(args.precisions) > 1 else ")"), "",
              *_table(["algorithm", "precision", "step ms", "peak memory GiB", "images/s"],
                      [[r["label"], r["precision"], f"{1000 * r['step_s']:.1f}",
                        f"{r['peak_bytes'] / 2 ** 30:.2f}", rate(r["images_per_s"])]
                       for r in algorithms]),
              "", f"## Training loader (JPEGs at 227x227, decoded and augmented; batch "
              f"{args.batch_size} per domain x 3 source domains; {args.loader_rounds} rounds "
              "after the workers started)", "",
              *_table(["loader workers", "images/s"],
                      [[r["workers"], rate(r["images_per_s"])] for r in loader]),
              "", "## Evaluation (one record of ERM ResNet-18 on the tree: every split, "
              f"median of {args.eval_repeats})", "",
              *_table(["precision", "images", "loader workers", "images/s"],
                      [[r["precision"], r["images"], r["workers"], rate(r["images_per_s"])]
                       for r in evaluation])]
    if determinism:
        names = list(SETTINGS)[1:]
        lines += ["", "## Compute settings (fp32 step; each setting's step over the default's, "
                  f"paired, median (quartiles) of {args.steps} after {args.warmup}; fast: "
                  "--deterministic false)", "",
                  *_table(["algorithm", "default ms", *names], [
                      [r["label"], f"{1000 * r['default_s']:.1f}",
                       *("{1:.2f} ({0:.2f}-{2:.2f})".format(*r["ratios"][n])
                         if n in r["ratios"] else "-" for n in names)] for r in determinism])]
    advice = recommendations(args, device, algorithms, loader, determinism)
    if advice:
        lines += ["", "## Recommended for this machine (from the tables above)", "", *advice]
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks gpu",
                                description=plain_text(__doc__.split("\n\n")[0]))
    p.add_argument("--out", default=None, help="also write the table to this file")
    p.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    p.add_argument("--algorithms", nargs="+", default=None, metavar="LABEL",
                   help="rows to run, by label (default: all on a GPU; " + ", ".join(CPU_ROWS)
                   + " on a CPU)")
    p.add_argument("--precisions", nargs="+", choices=PRECISIONS, default=None,
                   help="default fp32 bf16 (on a CPU without bfloat16 instructions fp32 only)")
    p.add_argument("--batch_size", type=int, default=None,
                   help="images per domain (default 32 on a GPU, 2 on a CPU)")
    p.add_argument("--steps", type=int, default=None, help="timed steps (default 10; CPU 1)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps (default 3; CPU 1)")
    p.add_argument("--workers", type=int, nargs="+", default=None,
                   help="loader worker counts (default 4 8 16; CPU 1 2)")
    p.add_argument("--loader_rounds", type=int, default=None,
                   help="timed loader rounds (default 40; CPU 3)")
    p.add_argument("--per_class", type=int, default=None,
                   help="JPEGs per class and domain of the tree (default 10: 280 images; CPU 1)")
    p.add_argument("--eval_repeats", type=int, default=None, help="default 3; CPU 1")
    p.add_argument("--determinism", nargs="*", default=None, metavar="LABEL",
                   help="rows of the compute-settings table (default: "
                   + ", ".join(DETERMINISM_ROWS) + " on a GPU, " + ", ".join(CPU_ROWS)
                   + " on a CPU; none: skip it)")
    p.add_argument("--channels_last", action="store_true", help="train's --channels_last")
    p.add_argument("--deterministic", choices=("true", "false"), default="true",
                   help="train's --deterministic (false: cudnn.benchmark)")
    return p


def main(argv=None) -> int:
    import time

    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    import dg_plugins.compat  # noqa: F401
    import torch

    from dg_plugins.train.compute import Compute

    # before CUDA starts, as train does (cuBLAS's setting for deterministic jobs)
    Compute(deterministic=args.deterministic == "true").prepare_process()

    from dg_plugins import plugins
    from benchmarks.data import make_pacs_tree
    from dg_plugins.runtime import pick_device

    plugins.load()
    device = pick_device(args.device)
    gpu = device.type == "cuda"
    known = [label for label, _, _ in ALGORITHM_ROWS]
    wanted = args.algorithms or (known if gpu else list(CPU_ROWS))
    if args.determinism is None:
        args.determinism = list(DETERMINISM_ROWS if gpu else CPU_ROWS)
    for flag, rows in (("--algorithms", wanted), ("--determinism", args.determinism)):
        unknown = [w for w in rows if w not in known]
        if unknown:
            print(f"error: {flag} {' '.join(unknown)}: not among {', '.join(known)}",
                  file=sys.stderr)
            return 2
    args.algorithms = wanted

    asked = args.precisions is not None
    for name, on_gpu, on_cpu in (("precisions", list(PRECISIONS), cpu_precisions()),
                                 ("batch_size", 32, 2), ("steps", 10, 1), ("warmup", 3, 1),
                                 ("workers", [4, 8, 16], [1, 2]), ("loader_rounds", 40, 3),
                                 ("per_class", 10, 1), ("eval_repeats", 3, 1)):
        if getattr(args, name) is None:
            setattr(args, name, on_gpu if gpu else on_cpu)
    args.bf16_left_out = not asked and "bf16" not in args.precisions
    torch.manual_seed(0)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = os.path.join(tmp, "data")
        n_images = make_pacs_tree(data_dir, args.per_class, 227)
        out = os.path.join(tmp, "jobs")
        algorithms = measure_algorithms(args, device, out)
        loader = measure_loader(args, data_dir, out)
        evaluation = measure_evaluation(args, device, data_dir, out)
        determinism = measure_determinism(args, device, out)
    text = markdown(args, device, algorithms, loader, evaluation, determinism, n_images,
                    time.perf_counter() - start)
    print(text, end="")
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
