"""Timing for the benchmarks: alternating per-call timings whose ratios survive a shared
machine's changing load, and paired ratios. No torch import at module import."""

from __future__ import annotations

import time


def synchronize(device) -> None:
    """Wait for queued kernels on ``device`` (a no-op on CPU)."""
    import torch

    if getattr(device, "type", device) == "cuda":
        torch.cuda.synchronize()


def alternating_times(calls: dict, steps: int, warmup: int, device) -> dict[str, list[float]]:
    """Wall seconds of each ``calls[name]()`` per timed round, the calls taking turns (``warmup``
    untimed rounds, then ``steps`` timed), so that load changes hit every entry alike."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for round_index in range(warmup + steps):
        for name, fn in calls.items():
            synchronize(device)
            start = time.perf_counter()
            fn()
            synchronize(device)
            if round_index >= warmup:
                times[name].append(time.perf_counter() - start)
    return times


def alternating_medians(calls: dict, steps: int, warmup: int, device) -> dict[str, float]:
    """The median of each entry's :func:`alternating_times`."""
    import statistics

    return {name: statistics.median(values)
            for name, values in alternating_times(calls, steps, warmup, device).items()}


def paired_ratio(times: list[float], base: list[float]) -> tuple[float, float, float]:
    """Quartiles (low, median, high) of the per-round ratios ``times[i] / base[i]``: each compares
    two calls made back to back, so a slow spell of the machine cancels out."""
    import statistics

    ratios = [t / b for t, b in zip(times, base)]
    if len(ratios) < 2:
        return ratios[0], ratios[0], ratios[0]
    low, median, high = statistics.quantiles(ratios, n=4)  # the middle cut is the median
    return low, median, high


def loader_cpu_ms(image_path: str, augmentation: str = "domainbed", repeats: int = 200) -> dict:
    """CPU milliseconds per image (one thread, interleaved) of a loader worker's cases: decode,
    PIL transform, loader part, loader part on decoded pixels."""
    import numpy as np
    import torch
    from PIL import Image

    from dg_plugins.datasets.device_augment import split_transform
    from dg_plugins.datasets.image_folder import load_rgb_image, training_transform

    pil = training_transform(augmentation)
    loader, _ = split_transform(pil)
    pixels = np.asarray(load_rgb_image(image_path)).copy()
    cases = {
        "decode": lambda: load_rgb_image(image_path),
        "pil": lambda: pil(load_rgb_image(image_path)),
        "split": lambda: loader(load_rgb_image(image_path)),
        "split_cached": lambda: loader(Image.fromarray(pixels)),
    }
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        seconds = dict.fromkeys(cases, 0.0)
        for _ in range(repeats):
            for name, case in cases.items():
                start = time.thread_time()
                case()
                seconds[name] += time.thread_time() - start
    finally:
        torch.set_num_threads(threads)
    return {name: 1000 * s / repeats for name, s in seconds.items()}
