"""What a train job imports, imported once by the sweep's fork server before it forks jobs
(:data:`dg_plugins.sweep.fork.PRELOAD`), with the cyclic garbage collector paused meanwhile, then
everything alive frozen (:mod:`dg_plugins.runtime`'s start-up; ``gc.freeze`` as the ``gc`` docs
advise before forking without exec): neither the server nor its jobs' collections traverse those
objects. Imports only: no tensor is computed and no CUDA context made."""

from dg_plugins import runtime

runtime.pause_collector()
try:
    import dg_plugins.compat  # noqa: F401  (before torchvision and timm)
    import torch  # noqa: F401
    import torch._dynamo  # noqa: F401  (the first optimizer imports it)
    import timm  # noqa: F401  (the ViTs, DomainBed's default ResNet-50; with torchvision)
    import dg_plugins.algorithms  # noqa: F401
    import dg_plugins.datasets  # noqa: F401
    import dg_plugins.networks.vit  # noqa: F401
    import dg_plugins.train.run  # noqa: F401
finally:
    runtime.resume_collector()
