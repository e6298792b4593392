"""Loading plugins: dg_plugins' algorithms and datasets, then the modules of
``$DG_PLUGINS_IMPORT`` (comma-separated; jobs inherit it). DomainBed's algorithms are a source."""

from __future__ import annotations

import importlib
import os
from typing import Iterable

from dg_plugins.registry import ALGORITHMS, DATASETS

PLUGINS_ENV = "DG_PLUGINS_IMPORT"
#: The algorithms the contract tests (:mod:`dg_plugins.contract`) run on, comma-separated (set by
#: ``python -m dg_plugins.scripts.check_algorithm``).
CONTRACT_ENV = "DG_PLUGINS_CONTRACT_ALGORITHMS"
#: The built-in plugin that runs DomainBed's algorithms on our host.
DOMAINBED_HOST = "dg_plugins.domainbed.host"


def modules_from_env() -> list[str]:
    return [m.strip() for m in os.environ.get(PLUGINS_ENV, "").split(",") if m.strip()]


def add_modules(modules: Iterable[str]) -> list[str]:
    """Add modules to ``$DG_PLUGINS_IMPORT`` (child processes import them too)."""
    merged = modules_from_env()
    merged += [m for m in modules if m and m not in merged]
    if merged:
        os.environ[PLUGINS_ENV] = ",".join(merged)
    return merged


class PluginImportError(ImportError, ValueError):
    """A plugin module that cannot be imported: bad input, one line naming the module, where it
    was named and the fix (a ValueError too, so that commands report it as one)."""


def load(modules: Iterable[str] = (), builtins: bool = True) -> list[str]:
    """Import our algorithms and datasets (with ``builtins``), then ``modules`` and
    ``$DG_PLUGINS_IMPORT``'s (returned); one missing raises :class:`PluginImportError`."""
    if builtins:
        import dg_plugins.algorithms  # noqa: F401  (each import registers)
        import dg_plugins.datasets  # noqa: F401

        importlib.import_module(DOMAINBED_HOST).register()

    modules = list(modules)
    names = list(dict.fromkeys([*modules, *modules_from_env()]))
    for name in names:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as err:
            where = "--import" if name in modules else f"${PLUGINS_ENV}"
            if err.name is None or (err.name != name and not name.startswith(f"{err.name}.")):
                fix = (f"install the package that provides {err.name!r} in this Python"
                       if err.name else "fix that import")
                raise PluginImportError(f"plugin module {name!r} (named in {where}) failed to "
                                        f"import: {err}; {fix}") from err
            top = name.split(".")[0]
            raise PluginImportError(
                f"plugin module {name!r} (named in {where}) cannot be found ({err}): put the "
                f"folder holding {top}.py (or {top}/) on PYTHONPATH, e.g. "
                f"PYTHONPATH=/path/to/folder, or fix the name in {where}") from err
    return names


def algorithms_of(modules: Iterable[str]) -> list[str]:
    """The registered algorithms whose classes ``modules`` (or modules in them) define."""
    modules = list(modules)
    return [name for name, cls in ALGORITHMS.items()
            if any(cls.__module__ == m or cls.__module__.startswith(f"{m}.") for m in modules)]


def build_dataset(name: str, data_dir: str, hparams: dict, modules: Iterable[str] = ()):
    """Dataset ``name`` built on ``data_dir`` with ``hparams``, after :func:`load`."""
    load(modules)
    return DATASETS.get(name)(data_dir, [], hparams)
