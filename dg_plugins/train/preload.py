"""What a train job imports, imported once by the sweep's fork server before it forks jobs, with
the garbage collector paused (the start-up then freezes it all, as the ``gc`` docs advise before
forking). Imports only: no tensor, no CUDA context."""

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
