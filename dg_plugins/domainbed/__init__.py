"""DomainBed interop, both ways (docs/bridge.md): ``bridge`` installs our algorithms, datasets
and launchers into a DomainBed checkout's modules (``python -m dg_plugins.scripts.domainbed``);
``host`` runs DomainBed's own algorithms on our train, sweep and tables; ``pytest_plugin`` runs
DomainBed's tests with ours installed (``pytest -p dg_plugins.domainbed.pytest_plugin``). Only
``bridge`` imports ``domainbed``, and only when called; this package imports no torch."""
