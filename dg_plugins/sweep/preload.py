"""What the fork server imports once for the train jobs it forks (:data:`dg_plugins.sweep.fork.
PRELOAD`), with the cyclic garbage collector paused meanwhile, then everything alive frozen
(:mod:`dg_plugins.runtime`'s start-up; ``gc.freeze`` as the ``gc`` docs advise before forking
without exec): neither the server nor the collections of its jobs traverse those objects."""

from dg_plugins import runtime

runtime.pause_collector()
try:
    import dg_plugins.compat  # noqa: F401  (before torchvision and timm)
    import torch  # noqa: F401
    import torch._dynamo  # noqa: F401  (the first optimizer imports it)
    import dg_plugins.algorithms  # noqa: F401
    import dg_plugins.datasets  # noqa: F401
    import dg_plugins.networks.vit  # noqa: F401
    import dg_plugins.sweep.fork  # noqa: F401  (the job body it forks)
    import dg_plugins.train.run  # noqa: F401
finally:
    runtime.resume_collector()
