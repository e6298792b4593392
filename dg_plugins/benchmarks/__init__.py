"""``benchmark gpu``, the one benchmark that ships: users run ``python -m
dg_plugins.scripts.benchmark gpu`` on their own GPU for its step times, memory, loader throughput
and the settings it recommends (:mod:`~dg_plugins.benchmarks.gpu`), and its measurements are the
GPU-hours estimates' numbers (``dg_plugins/reference/gpu_step_times.json``). Beside it what it
needs: :mod:`~dg_plugins.benchmarks.timing` (alternating timings, paired ratios),
:mod:`~dg_plugins.benchmarks.memory` (a step's peak memory) and
:mod:`~dg_plugins.benchmarks.data` (a PACS-shaped JPEG tree). The developer benchmarks (against
DomainBed, per algorithm, collect, alignment, ...) and ``gpu_check`` live in the source
checkout's top-level ``benchmarks/`` (``python -m benchmarks --help``); nothing in the library
imports this package."""
