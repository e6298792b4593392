"""Loading plugins: dg_plugins' own algorithms and datasets, then the modules named in
``$DG_PLUGINS_IMPORT`` (comma-separated; every process imports them and jobs inherit the
variable). DomainBed's algorithms are a built-in source of the algorithm registry."""

from __future__ import annotations

import importlib
import os
from typing import Iterable

PLUGINS_ENV = "DG_PLUGINS_IMPORT"
#: The algorithms the contract tests (:mod:`dg_plugins.contract`) run on, comma-separated (set by
#: ``python -m dg_plugins.scripts.check_algorithm``).
CONTRACT_ENV = "DG_PLUGINS_CONTRACT_ALGORITHMS"
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


class PluginImportError(ImportError, ValueError):
    """A plugin module (named by ``--import`` or ``$DG_PLUGINS_IMPORT``) that cannot be imported,
    or whose own import of a package failed: bad input, reported in one line naming the module,
    where it was named and the fix (a ValueError too, so that commands report it as one)."""


def load(modules: Iterable[str] = (), builtins: bool = True) -> list[str]:
    """Import our algorithms and datasets (unless not ``builtins``), then ``modules`` and
    ``$DG_PLUGINS_IMPORT``'s; returns the extra modules. A module that cannot be found, or whose
    own import of a package fails, raises :class:`PluginImportError` saying how to fix it (any
    other error of a plugin's code is raised as it is: its traceback is the plugin's to read)."""
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
    """The registered algorithms whose classes the modules ``modules`` (or modules inside them)
    define, in registry order."""
    from dg_plugins.registry import ALGORITHMS

    modules = list(modules)
    return [name for name, cls in ALGORITHMS.items()
            if any(cls.__module__ == m or cls.__module__.startswith(f"{m}.") for m in modules)]


def build_dataset(name: str, data_dir: str, hparams: dict, modules: Iterable[str] = ()):
    """The registered dataset ``name`` built on ``data_dir`` with ``hparams``, after :func:`load`
    (so that a plugin's dataset is known)."""
    from dg_plugins.registry import DATASETS

    load(modules)
    return DATASETS.get(name)(data_dir, [], hparams)
