"""Loading plugins: dg_plugins' own algorithms and datasets, then the modules named in
``$DG_PLUGINS_IMPORT`` (comma-separated; every process imports them and jobs inherit the
variable). DomainBed's algorithms are a built-in source of the algorithm registry."""

from __future__ import annotations

import importlib
import os
from typing import Iterable

PLUGINS_ENV = "DG_PLUGINS_IMPORT"
#: The built-in plugin that runs DomainBed's algorithms on our host.
DOMAINBED_HOST = "dg_plugins.domainbed_host"


def modules_from_env() -> list[str]:
    return [m.strip() for m in os.environ.get(PLUGINS_ENV, "").split(",") if m.strip()]


def add_modules(modules: Iterable[str]) -> list[str]:
    """Add modules to ``$DG_PLUGINS_IMPORT`` (so that child processes import them too)."""
    merged = modules_from_env()
    merged += [m for m in modules if m and m not in merged]
    if merged:
        os.environ[PLUGINS_ENV] = ",".join(merged)
    return merged


def load(modules: Iterable[str] = (), builtins: bool = True) -> list[str]:
    """Import our algorithms and datasets (unless not ``builtins``), then ``modules`` and
    ``$DG_PLUGINS_IMPORT``'s; returns the extra modules. ImportError says how to fix a missing
    one."""
    if builtins:
        import dg_plugins.algorithms  # noqa: F401  (each import registers)
        import dg_plugins.datasets  # noqa: F401

        importlib.import_module(DOMAINBED_HOST).register()

    names = list(dict.fromkeys([*modules, *modules_from_env()]))
    for name in names:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as err:
            if err.name != name and not name.startswith(f"{err.name}."):
                raise  # the plugin exists but one of its own imports failed
            raise ImportError(
                f"plugin module {name!r} (from --import or ${PLUGINS_ENV}) cannot be imported: "
                f"{err}. It must be importable by name, e.g. its folder on PYTHONPATH."
            ) from err
    return names


def build_dataset(name: str, data_dir: str, hparams: dict, modules: Iterable[str] = ()):
    """The registered dataset ``name`` built on ``data_dir`` with ``hparams``, after :func:`load`
    (so that a plugin's dataset is known)."""
    from dg_plugins.registry import DATASETS

    load(modules)
    return DATASETS.get(name)(data_dir, [], hparams)
