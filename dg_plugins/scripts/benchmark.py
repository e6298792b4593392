"""``python -m dg_plugins.scripts.benchmark``: cost of each registered algorithm relative to ERM.

For every registered algorithm (or those matching ``--algorithms``), on the same dataset shape,
backbone and batch, in one process: the median wall time of a training step (``update``) over
``--steps`` repeated steps after ``--warmup``, and the peak memory of a step — persistent tensors
(parameters, buffers, optimizer state) plus the peak of the step's own allocations. On CUDA the
peak is ``torch.cuda.max_memory_allocated``; on CPU it is computed from the torch profiler's
allocation events. Ratios are against ERM measured in the same run.

With ``--domainbed PATH`` it also times a whole train job (ERM, Debug28, 9 steps, batch 8) with
dg_plugins' train and with DomainBed's (a checkout at PATH), alternating, and prints the median
wall times and their ratio (the target is at most 0.5).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time


@contextlib.contextmanager
def _stderr_fd_silenced():
    """The profiler's C++ side prints start/stop lines on fd 2; keep them out of the report."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


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


def _persistent_bytes(algorithm) -> int:
    import torch

    seen, total = set(), 0
    tensors = list(algorithm.state_dict().values())
    for opt in algorithm.optimizers().values():
        for state in opt.state.values():
            tensors += [v for v in state.values() if torch.is_tensor(v)]
    for t in tensors:
        key = (t.untyped_storage().data_ptr(), t.device)
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total


def _step_peak_bytes(algorithm, batches, device) -> int:
    """Peak bytes allocated during one update, above what was allocated before it (frees of
    blocks allocated before, e.g. gradients released by ``zero_grad``, count negative)."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        algorithm.update(batches, None)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    from torch.profiler import ProfilerActivity, profile

    with _stderr_fd_silenced(), profile(activities=[ProfilerActivity.CPU],
                                        profile_memory=True) as prof:
        algorithm.update(batches, None)
    allocations = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                         if e.name() == "[memory]")
    live = peak = 0
    for _, nbytes in allocations:
        live += nbytes
        peak = max(peak, live)
    return peak


def measure_algorithm(name: str, dataset, hparams: dict, steps: int, warmup: int,
                      device) -> dict:
    import torch

    from dg_plugins.registry import ALGORITHMS

    torch.manual_seed(0)
    envs = list(range(min(2, len(dataset))))
    algorithm = ALGORITHMS.get(name)(dataset.input_shape, dataset.num_classes, len(envs), hparams)
    algorithm.to(device)
    batches = _minibatches(dataset, hparams["batch_size"], envs, device)
    for _ in range(warmup):
        algorithm.update(batches, None)
    times = []
    for _ in range(steps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        algorithm.update(batches, None)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    peak = _persistent_bytes(algorithm) + _step_peak_bytes(algorithm, batches, device)
    return {"step_s": statistics.median(times), "peak_bytes": peak}


def benchmark_algorithms(args) -> list[dict]:
    import torch

    import dg_plugins.algorithms  # noqa: F401
    import dg_plugins.datasets  # noqa: F401
    from dg_plugins import hparams as hparams_lib
    from dg_plugins.registry import ALGORITHMS, DATASETS

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    torch.manual_seed(0)
    dataset = DATASETS.get(args.dataset)(args.data_dir, [], {})
    names = ["ERM"] + [n for n in ALGORITHMS.list(args.algorithms) if n != "ERM"]
    rows = []
    for name in names:
        hp = hparams_lib.default_hparams(name, args.dataset)
        hp.update(batch_size=args.batch_size, pretrained=args.pretrained)
        hp.update(hparams_lib.parse_overrides(args.hparams))
        rows.append({"algorithm": name, **measure_algorithm(name, dataset, hp, args.steps,
                                                            args.warmup, device)})
    erm = rows[0]
    for row in rows:
        row["time_ratio"] = row["step_s"] / erm["step_s"]
        row["mem_ratio"] = row["peak_bytes"] / erm["peak_bytes"]
    print(f"Per-step cost relative to ERM: dataset {args.dataset}, batch {args.batch_size} per "
          f"environment x 2 environments, device {device}, median of {args.steps} steps after "
          f"{args.warmup} warm-up steps, one process")
    print(f"{'algorithm':<12} {'step ms':>9} {'x ERM':>7} {'peak MiB':>9} {'x ERM':>7}")
    for row in rows:
        print(f"{row['algorithm']:<12} {1000 * row['step_s']:>9.1f} {row['time_ratio']:>7.2f} "
              f"{row['peak_bytes'] / 2**20:>9.1f} {row['mem_ratio']:>7.2f}")
    return rows


TRAIN_JOB = ["--dataset", "Debug28", "--algorithm", "ERM", "--steps", "9",
             "--hparams", '{"batch_size": 8}', "--test_envs", "0"]


def _timed(cmd, env) -> float:
    from dg_plugins.runtime import timed_command

    wall, _, proc = timed_command(cmd, env)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed:\n{proc.stderr[-2000:]}")
    return wall


def benchmark_train_vs_domainbed(domainbed_root: str, repeats: int) -> float:
    """Median wall time of the same small train job, ours vs DomainBed's, alternating."""
    from dg_plugins.bridge import unpatched_script_command

    ours, theirs = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(repeats):
            ours.append(_timed([sys.executable, "-m", "dg_plugins.scripts.train", *TRAIN_JOB,
                                "--output_dir", os.path.join(tmp, f"ours{i}")], None))
            theirs.append(_timed(*unpatched_script_command(
                "train", [*TRAIN_JOB, "--output_dir", os.path.join(tmp, f"domainbed{i}")],
                domainbed_root)))
    ratio = statistics.median(ours) / statistics.median(theirs)
    print(f"\nTrain job wall time (ERM, Debug28, 9 steps, batch 8, {os.cpu_count()} cpus, median "
          f"of {repeats}, alternating): dg_plugins {statistics.median(ours):.2f} s, DomainBed "
          f"{statistics.median(theirs):.2f} s, ratio {ratio:.2f} (target <= 0.50)")
    return ratio


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default="Debug28")
    p.add_argument("--data_dir", default=None)
    p.add_argument("--algorithms", default="*", help="shell pattern over registered names")
    p.add_argument("--batch_size", type=int, default=8)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--hparams", default=None, help="JSON overrides for every algorithm")
    p.add_argument("--pretrained", action="store_true",
                   help="use pretrained backbones (default: random init, no download)")
    p.add_argument("--device", default=None)
    p.add_argument("--domainbed", default=os.environ.get("DOMAINBED_ROOT"),
                   help="DomainBed checkout: also time its train against ours")
    p.add_argument("--train_repeats", type=int, default=3)
    args = p.parse_args(argv)
    benchmark_algorithms(args)
    if args.domainbed:
        benchmark_train_vs_domainbed(args.domainbed, args.train_repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
