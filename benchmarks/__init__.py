"""The developer benchmarks: comparisons run from a source checkout, never installed with the
package and never gating the tests. From the checkout's root::

    python -m benchmarks [KIND] ARGS      # KIND: see below; python -m benchmarks KIND --help
    python -m benchmarks.gpu_check        # a GPU machine: the suite on CUDA + benchmark gpu

One module per kind: :mod:`benchmarks.algorithms` (the default: per-step, predict and memory
cost of the registered algorithms against a baseline, and train's wall time against
DomainBed's), :mod:`benchmarks.collect` (collect_results against DomainBed's),
:mod:`benchmarks.alignment` (the CLIP scorer's throughput), :mod:`benchmarks.dismae` (DisMAE's
UDG pretraining step), :mod:`benchmarks.image_job` and :mod:`benchmarks.data_path` (a train job
and the data path's images/s against DomainBed's), :mod:`benchmarks.sweep_gpu` (a sweep's
GPU-hours four ways); and :mod:`benchmarks.gpu_check`. ``gpu`` (:mod:`benchmarks.gpu`) is the
one users run on their own GPU. Each benchmark prints ratios measured in one run; the numbers
committed under ``results/`` name the command that made them."""
