"""Benchmarks behind ``python -m dg_plugins.scripts.benchmark [KIND] ...`` (one module per kind):
:mod:`~dg_plugins.benchmarks.algorithms` (the default: per-step, predict and memory cost of the
registered algorithms against a baseline, and train's wall time against DomainBed's),
:mod:`~dg_plugins.benchmarks.collect` (collect_results against DomainBed's),
:mod:`~dg_plugins.benchmarks.alignment` (the CLIP scorer's throughput),
:mod:`~dg_plugins.benchmarks.dismae` (DisMAE's UDG pretraining step),
:mod:`~dg_plugins.benchmarks.gpu`, :mod:`~dg_plugins.benchmarks.image_job` and
:mod:`~dg_plugins.benchmarks.data_path` (the data path's images/s against DomainBed's loaders);
and
:mod:`~dg_plugins.benchmarks.gpu_check` (``python -m dg_plugins.scripts.gpu_check``: the suite
on CUDA and ``benchmark gpu`` in one report). Each benchmark prints ratios measured in one run;
none is imported by the library."""
