"""``python -m benchmarks [algorithms]``: cost of registered algorithms
relative to a baseline algorithm (default ERM), measured in one process.

For the baseline and every algorithm matching ``--algorithms`` (a shell pattern or a
comma-separated list), on the same dataset shape and batch (``--batch_size`` per environment x
``--num_domains`` environments): the median wall time of a training step (``update``) over
``--steps`` steps after ``--warmup``; with ``--predict`` the median time of ``predict`` on one
batch in eval mode (all algorithms are built first and timed alternately, one step of each per
round, on one shared batch); the peak memory of a step (persistent tensors: parameters, buffers,
optimizer state; plus the peak of the step's own allocations: ``torch.cuda.max_memory_allocated``
on CUDA, the torch profiler's allocation events on CPU); and the parameter counts (all /
trainable). Ratios are against the baseline measured in the same run; the step ratio is the
median of the per-round ratios (each compares two steps made back to back) and is printed with
their quartiles; memory and predict ratios are ratios of the two values.

``--hparams`` (JSON) applies to the algorithms and, unless ``--baseline_hparams`` is given, to
the baseline too; ``--tiny`` first applies each algorithm's ``TINY_TEST_HPARAMS``.
Train's precision flag at bf16 or fp16 times every algorithm a second time per round, as a train
job with that precision steps it (autocast, fp16's gradient scaler:
:mod:`dg_plugins.train.compute`), on the same instance, and adds the paired ratio of that step
to the algorithm's float32 step ("x fp32"; a measured command in ``results/benchmarks.md``).
Example::

    # DMG vs ERM on the same ResNet-18, 224x224, with predict cost
    python -m benchmarks --dataset Debug224 --algorithms DMG --predict \
        --hparams '{"resnet18": true, "resnet50_augmix": false}' --batch_size 16

With ``--domainbed PATH`` it also times a whole train job (ERM, Debug28, 9 steps, batch 8) with
dg_plugins' train and with DomainBed's (a checkout at PATH), alternating, and prints the median
wall times and their ratio (the target is at most 0.35: the job is mostly start-up), with their
CPU seconds and the load average.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile

from dg_plugins.help_text import plain_text
from dg_plugins.job import borrow, option, train_argv


def _minibatches(dataset, batch_size, envs, device):
    import torch

    out = []
    for i in envs:
        env = dataset[i]
        idx = torch.randint(len(env), (batch_size,))
        items = [env[int(j)] for j in idx]
        out.append((torch.stack([x for x, _ in items]).to(device),
                    torch.as_tensor([y for _, y in items]).to(device)))
    return out


def build_algorithm(name: str, dataset, hparams: dict, num_domains: int, device):
    """The registered algorithm ``name`` for ``dataset``'s shape, seeded, on ``device``."""
    import torch

    from dg_plugins.registry import ALGORITHMS

    torch.manual_seed(0)
    algorithm = ALGORITHMS.get(name)(dataset.input_shape, dataset.num_classes, num_domains,
                                     hparams)
    return algorithm.to(device)


def measure_algorithms(algorithms: dict, batches, steps: int, warmup: int, device,
                       predict: bool = False, precision: str = "fp32") -> dict[str, dict]:
    """Time every ``algorithms[name].update(batches)`` (and with ``predict`` its ``predict`` on
    the first environment's images, in eval mode), **alternating** the algorithms step by step
    (``timing.alternating_times``): a change of machine load during the run hits all of them
    alike, so the ratios stay meaningful on a shared or noisy machine (timing one algorithm after
    the other had moved a ratio by 0.2 between runs on the same quiet machine). ``step_times``
    keeps every timed step, for ratios paired round by round. Then the peak memory of one step and
    the parameter counts of each. With ``precision`` bf16 or fp16, each algorithm is also timed
    under it (rows ``"<name>:<precision>"``, the same instance: :func:`reduced_step`)."""
    import torch

    from benchmarks.memory import persistent_bytes, step_peak_bytes
    from benchmarks.timing import alternating_medians, alternating_times
    from dg_plugins.train.compute import Compute

    compute = Compute(precision)
    steps_of, models = {}, {}
    for name, a in algorithms.items():
        steps_of[name], models[name] = (lambda a=a: a.update(batches, None)), a
        if compute.dtype is not None:
            key = f"{name}:{precision}"
            steps_of[key], models[key] = reduced_step(a, batches, compute, device), a
    step = alternating_times(steps_of, steps, warmup, device)
    rows = {name: {"step_s": statistics.median(step[name]), "step_times": step[name]}
            for name in steps_of}
    if predict:
        x = batches[0][0]
        for a in algorithms.values():
            a.eval()

        def predicting(name, a):
            def call():
                with (contextlib.nullcontext() if name in algorithms
                      else compute.autocast(device)):
                    a.predict(x)
            return call

        with torch.no_grad():
            times = alternating_medians({name: predicting(name, a)
                                         for name, a in models.items()},
                                        steps, max(1, warmup), device)
        for name, a in algorithms.items():
            a.train()
        for name in models:
            rows[name]["predict_s"] = times[name]
    for name, a in models.items():
        rows[name]["peak_bytes"] = persistent_bytes(a) + step_peak_bytes(a, batches, device,
                                                                           steps_of[name])
        rows[name]["params"] = sum(p.numel() for p in a.parameters())
        rows[name]["trainable"] = sum(p.numel() for p in a.parameters() if p.requires_grad)
    return rows


def reduced_step(algorithm, batches, compute, device):
    """One ``update`` of ``algorithm`` as a train job with ``compute``'s precision makes it:
    under autocast, with fp16's gradient scaler."""
    from dg_plugins.algorithms.base import gradient_scaling

    scaler = compute.make_scaler(device)

    def step():
        with compute.autocast(device), gradient_scaling(scaler):
            algorithm.update(batches, None)
    return step


def cpu_flags() -> str:
    """Which bfloat16 and float16 instructions this CPU has (``/proc/cpuinfo``; "unknown"
    elsewhere)."""
    from dg_plugins.train.compute import cpu_features

    features = cpu_features()
    if features is None:
        return "unknown"
    wanted = ("avx512_bf16", "amx_bf16", "avx512_fp16", "amx_fp16")
    return ", ".join(f"{flag} {'yes' if flag in features else 'no'}" for flag in wanted)


def _names(pattern: str, baseline: str) -> list[str]:
    from dg_plugins.registry import ALGORITHMS

    if "," in pattern or pattern in ALGORITHMS:
        names = [n.strip() for n in pattern.split(",") if n.strip()]
        for n in names:
            ALGORITHMS.get(n)  # unknown names raise with the choices
    else:
        names = ALGORITHMS.list(pattern)
    ALGORITHMS.get(baseline)
    return [baseline] + [n for n in names if n != baseline]


def _device_label(device) -> str:
    import platform

    import torch

    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def benchmark_algorithms(args) -> list[dict]:
    from dg_plugins import hparams as hparams_lib
    from dg_plugins import plugins
    from dg_plugins.registry import ALGORITHMS, DATASETS
    from benchmarks.timing import paired_ratio
    from dg_plugins.runtime import pick_device

    import torch

    plugins.load()
    device = pick_device(args.device)
    torch.manual_seed(0)
    dataset = DATASETS.get(args.dataset)(args.data_dir, [], {})
    names = _names(args.algorithms, args.baseline)
    overrides = hparams_lib.parse_overrides(args.hparams)
    baseline_overrides = (overrides if args.baseline_hparams is None
                          else hparams_lib.parse_overrides(args.baseline_hparams))
    algorithms = {}
    for index, name in enumerate(names):
        changes = {"batch_size": args.batch_size, "pretrained": args.pretrained}
        if args.tiny:
            changes.update(ALGORITHMS.get(name).TINY_TEST_HPARAMS)
        changes.update(baseline_overrides if index == 0 else overrides)
        hp = hparams_lib.default_hparams(name, args.dataset)
        hp.update(hparams_lib.validate(name, args.dataset, changes))
        algorithms[name] = build_algorithm(name, dataset, hp, args.num_domains, device)
    torch.manual_seed(0)  # one batch for all: the same images in every algorithm's steps
    batches = _minibatches(dataset, args.batch_size,
                           [i % len(dataset) for i in range(args.num_domains)], device)
    measured = measure_algorithms(algorithms, batches, args.steps, args.warmup, device,
                                  args.predict, args.precision)
    reduced = args.precision != "fp32"
    rows = [{"algorithm": key, **measured[key]} for name in names
            for key in ([name, f"{name}:{args.precision}"] if reduced else [name])]
    base = rows[0]
    for row in rows:
        row["time_ratio_iqr"] = paired_ratio(row["step_times"], base["step_times"])
        row["time_ratio"] = row["time_ratio_iqr"][1]
        row["mem_ratio"] = row["peak_bytes"] / base["peak_bytes"]
        own = measured[row["algorithm"].split(":")[0]]
        row["fp32_ratio_iqr"] = paired_ratio(row["step_times"], own["step_times"])
        if args.predict:
            row["predict_ratio"] = row["predict_s"] / base["predict_s"]
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    print(f"Per-step cost relative to {args.baseline}: dataset {args.dataset} "
          f"{tuple(dataset.input_shape)}, batch {args.batch_size} per environment x "
          f"{args.num_domains} environments, device {_device_label(device)}, median of "
          f"{args.steps} steps after {args.warmup} warm-up steps, the algorithms alternating "
          f"step by step in one process; load average before {load}")
    if reduced:
        print(f"{' '.join(train_argv(precision=args.precision))}: each algorithm also stepped "
              f"under autocast to {args.precision} on the same instance in every round; 'x fp32' "
              "is the paired ratio to its float32 step"
              + (f"; CPU: {cpu_flags()}" if device.type == "cpu" else ""))
    print(f"hparams: {args.hparams or '{}'}; baseline hparams: "
          f"{args.baseline_hparams if args.baseline_hparams is not None else 'the same'}")
    header = f"{'algorithm':<14} {'step ms':>9} {'x base':>7} {'(quartiles)':>13}"
    if reduced:
        header += f" {'x fp32':>7} {'(quartiles)':>13}"
    if args.predict:
        header += f" {'predict ms':>10} {'x base':>7}"
    header += f" {'peak MiB':>9} {'x base':>7} {'params M':>9} {'trainable M':>11}"
    print(header)
    for row in rows:
        low, _, high = row["time_ratio_iqr"]
        line = (f"{row['algorithm']:<14} {1000 * row['step_s']:>9.1f} {row['time_ratio']:>7.2f}"
                f" {f'({low:.2f}-{high:.2f})':>13}")
        if reduced:
            low, mid, high = row["fp32_ratio_iqr"]
            line += f" {mid:>7.2f} {f'({low:.2f}-{high:.2f})':>13}"
        if args.predict:
            line += f" {1000 * row['predict_s']:>10.1f} {row['predict_ratio']:>7.2f}"
        line += (f" {row['peak_bytes'] / 2**20:>9.1f} {row['mem_ratio']:>7.2f}"
                 f" {row['params'] / 1e6:>9.3f} {row['trainable'] / 1e6:>11.3f}")
        print(line)
    return rows


TRAIN_JOB = train_argv(dataset="Debug28", algorithm="ERM", steps=9, hparams={"batch_size": 8},
                       test_envs=[0])
#: The most the train job's wall time may take of DomainBed's.
TRAIN_JOB_TARGET = 0.35


def _timed(cmd, env) -> tuple[float, float]:
    """Wall and CPU seconds (with its children) of ``cmd``."""
    from benchmarks.support import timed_command

    wall, cpu, proc = timed_command(cmd, env)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed:\n{proc.stderr[-2000:]}")
    return wall, cpu


def benchmark_train_vs_domainbed(domainbed_root: str, repeats: int) -> float:
    """Median wall time of the same small train job, ours vs DomainBed's, alternating; also their
    CPU seconds (less moved by other processes on a shared machine) and the load average."""
    from dg_plugins.domainbed.bridge import unpatched_script_command

    ours, theirs = [], []
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(repeats):
            ours.append(_timed([sys.executable, "-m", "dg_plugins.scripts.train", *TRAIN_JOB,
                                *train_argv(output_dir=os.path.join(tmp, f"ours{i}"))], None))
            theirs.append(_timed(*unpatched_script_command(
                "train", [*TRAIN_JOB, *train_argv(output_dir=os.path.join(tmp, f"domainbed{i}"))],
                domainbed_root)))
    wall, cpu = ([statistics.median(t[k] for t in side) for side in (ours, theirs)]
                 for k in (0, 1))
    ratio = wall[0] / wall[1]
    print(f"\nTrain job wall time (ERM, Debug28, 9 steps, batch 8, {os.cpu_count()} cpus, median "
          f"of {repeats}, alternating; load average {load} at the start): dg_plugins "
          f"{wall[0]:.2f} s, DomainBed {wall[1]:.2f} s, ratio {ratio:.2f} (target <= "
          f"{TRAIN_JOB_TARGET:.2f}); CPU seconds {cpu[0]:.2f} and {cpu[1]:.2f}, ratio "
          f"{cpu[0] / cpu[1]:.2f}")
    return ratio


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks [algorithms]",
        description=plain_text(__doc__.split("\n\n")[0]))
    p.add_argument("--dataset", default="Debug28")
    p.add_argument("--data_dir", default=None)
    p.add_argument("--algorithms", default="*",
                   help="shell pattern over registered names, or a comma-separated list")
    p.add_argument("--baseline", default="ERM", help="the algorithm ratios are taken against")
    p.add_argument("--batch_size", type=int, default=8, help="per environment")
    p.add_argument("--num_domains", type=int, default=2, help="source environments per step")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--predict", action="store_true", help="also time predict() on one batch")
    p.add_argument("--hparams", default=None, help="JSON overrides for every algorithm")
    p.add_argument("--baseline_hparams", default=None,
                   help="JSON overrides for the baseline (default: --hparams)")
    p.add_argument("--tiny", action="store_true",
                   help="apply each algorithm's TINY_TEST_HPARAMS first (smoke runs)")
    p.add_argument("--pretrained", action="store_true",
                   help="use pretrained backbones (default: random init, no download)")
    p.add_argument("--device", default=None)
    borrow(p, "precision", help="also time every algorithm's step under this precision (as "
           f"train's {option('precision')} runs it) and print its paired ratio to the float32 step")
    p.add_argument("--domainbed", default=os.environ.get("DOMAINBED_ROOT"),
                   help="DomainBed checkout: also time its train against ours")
    p.add_argument("--train_repeats", type=int, default=3)
    args = p.parse_args(argv)
    if args.precision != "fp32":
        from dg_plugins.runtime import pick_device
        from dg_plugins.train.compute import Compute

        try:
            Compute(args.precision).check(pick_device(args.device))
        except ValueError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    benchmark_algorithms(args)
    if args.domainbed:
        benchmark_train_vs_domainbed(args.domainbed, args.train_repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
