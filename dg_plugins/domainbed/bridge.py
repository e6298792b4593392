"""Install dg_plugins' algorithms, datasets, hparams and launchers into a DomainBed checkout, in
this process only, never shadowing DomainBed's own names (design spec 4); the entry
``python -m dg_plugins.scripts.domainbed`` routes DomainBed's sweep jobs through it. The only
module that imports ``domainbed``, when called. What changes where: docs/bridge.md."""

from __future__ import annotations

import dataclasses
import functools
import importlib
import os
import re
import shlex
import sys
import warnings
import weakref
from types import ModuleType
from typing import Callable, Iterable

from dg_plugins import catalog
from dg_plugins import hparams as dg_hparams
from dg_plugins import plugins as plugins_lib
from dg_plugins.registry import ALGORITHMS, DATASETS, LAUNCHERS

#: Environment variable naming the root of a DomainBed checkout (the folder holding domainbed/).
DOMAINBED_ROOT_ENV = "DOMAINBED_ROOT"
#: Environment variable: comma-separated modules to import before installing (user plugins).
PLUGINS_ENV = plugins_lib.PLUGINS_ENV
plugin_modules_from_env = plugins_lib.modules_from_env
add_plugin_modules = plugins_lib.add_modules
#: The module run by ``python -m`` for every rewritten job.
ENTRY_MODULE = "dg_plugins.scripts.domainbed"
#: The DomainBed dataset whose hparams rules our small-image datasets borrow.
SMALL_IMAGE_PROXY = "Debug28"
DOMAINBED_URL = "https://github.com/facebookresearch/DomainBed"

# DomainBed's job command prefix (``domainbed/scripts/sweep.py``)
_TRAIN_COMMAND = re.compile(r"(?<![\w./-])python3?\s+-m\s+domainbed\.scripts\.train(?=\s|$)")

# Per target module: the objects we installed there, by name (decides "ours" vs DomainBed's).
_INSTALLED: "weakref.WeakKeyDictionary[ModuleType, dict]" = weakref.WeakKeyDictionary()


@dataclasses.dataclass
class InstallReport:
    """What :func:`install` did; ``skipped_*``: our names DomainBed defines (its own stay)."""

    domainbed_path: str = ""
    algorithms: list[str] = dataclasses.field(default_factory=list)
    datasets: list[str] = dataclasses.field(default_factory=list)
    launchers: list[str] = dataclasses.field(default_factory=list)
    skipped_algorithms: list[str] = dataclasses.field(default_factory=list)
    skipped_datasets: list[str] = dataclasses.field(default_factory=list)
    skipped_launchers: list[str] = dataclasses.field(default_factory=list)
    plugins: list[str] = dataclasses.field(default_factory=list)

    def summary(self) -> str:
        def names(items):
            return ", ".join(items) or "(none)"

        return "\n".join([
            f"DomainBed: {self.domainbed_path}",
            f"plugin modules: {names(self.plugins)}",
            f"installed algorithms: {names(self.algorithms)}",
            f"installed datasets: {names(self.datasets)}",
            f"installed launchers: {names(self.launchers)}",
            f"DomainBed's own (not replaced): algorithms {names(self.skipped_algorithms)}; "
            f"datasets {names(self.skipped_datasets)}; launchers {names(self.skipped_launchers)}",
        ])


class DomainBedImportError(ImportError):
    """DomainBed cannot be imported; the message says how to fix it."""


def unpatched_script_command(script: str, args: list[str], root: str) -> tuple[list[str], dict]:
    """``(command, env)`` running DomainBed's own ``domainbed.scripts.<script>`` from ``root``,
    nothing installed (for comparisons)."""
    code = ("import dg_plugins.compat, runpy, sys; "
            f"sys.argv = [{script!r}] + sys.argv[1:]; "
            f"runpy.run_module('domainbed.scripts.{script}', run_name='__main__')")
    parts = [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return [sys.executable, "-c", code, *args], {**os.environ, "PYTHONPATH": os.pathsep.join(parts)}


def locate_domainbed() -> ModuleType:
    """``domainbed`` (``sys.path``, else ``$DOMAINBED_ROOT``) or :class:`DomainBedImportError`."""
    import dg_plugins.compat  # noqa: F401  (torchvision must import beside the CPU torch first)

    try:
        import domainbed
    except ModuleNotFoundError as err:
        if err.name != "domainbed":
            raise
        root = os.environ.get(DOMAINBED_ROOT_ENV)
        if not root:
            raise DomainBedImportError(
                "cannot import domainbed: DomainBed is not on the Python path and "
                f"${DOMAINBED_ROOT_ENV} is not set. Get a checkout (git clone {DOMAINBED_URL}) "
                f"and set {DOMAINBED_ROOT_ENV}=/path/to/DomainBed (the folder that contains "
                "domainbed/), or add that folder to PYTHONPATH."
            ) from None
        root = os.path.abspath(os.path.expanduser(root))
        if not os.path.isfile(os.path.join(root, "domainbed", "__init__.py")):
            raise DomainBedImportError(
                f"{DOMAINBED_ROOT_ENV}={root!r} is not a DomainBed checkout: "
                f"{os.path.join(root, 'domainbed', '__init__.py')} does not exist. Set "
                f"{DOMAINBED_ROOT_ENV} to the folder that contains domainbed/ "
                f"(git clone {DOMAINBED_URL})."
            ) from None
        sys.path.insert(0, root)
        import domainbed
    if not hasattr(domainbed, "__path__"):
        raise DomainBedImportError(
            f"'domainbed' resolves to {domainbed.__file__}, not DomainBed's package. Run the entry "
            "as `python -m dg_plugins.scripts.domainbed`, not as a file path."
        )
    # on PYTHONPATH, so that child processes import the same DomainBed
    root = os.path.dirname(os.path.dirname(os.path.abspath(domainbed.__file__)))
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in parts:
        os.environ["PYTHONPATH"] = os.pathsep.join([root, *parts])
    return domainbed


def domainbed_module(name: str) -> ModuleType:
    """``domainbed.<name>``; :class:`DomainBedImportError` naming what is missing."""
    domainbed = locate_domainbed()
    try:
        return importlib.import_module(f"domainbed.{name}")
    except ModuleNotFoundError as err:
        if err.name and err.name.startswith("domainbed"):
            raise DomainBedImportError(
                f"the domainbed package at {os.path.dirname(domainbed.__file__)} has no "
                f"module {err.name!r}; is it a DomainBed checkout? ({DOMAINBED_URL})"
            ) from err
        raise DomainBedImportError(
            f"DomainBed ({os.path.dirname(domainbed.__file__)}) needs the package "
            f"{err.name!r}, which is not installed: pip install {err.name} "
            "(DomainBed imports wilds, timm and torchvision at import time)"
        ) from err


def domainbed_modules() -> dict[str, ModuleType]:
    """DomainBed's ``algorithms``, ``datasets``, ``hparams_registry`` and ``command_launchers``."""
    return {name: domainbed_module(name)
            for name in ("algorithms", "datasets", "hparams_registry", "command_launchers")}


def import_plugins(modules: Iterable[str] = ()) -> list[str]:
    """Import dg_plugins' algorithms, datasets and launchers, then the plugin modules (returned)."""
    import dg_plugins.sweep.launchers  # noqa: F401  (registers the launchers)

    return plugins_lib.load(modules)


def is_installed(module: ModuleType, name: str) -> bool:
    """Whether ``module.<name>`` is an object this bridge installed (not DomainBed's own)."""
    installed = _INSTALLED.get(module, {})
    return name in installed and vars(module).get(name) is installed[name]


def _add_entries(module: ModuleType, list_name: str, entries: dict, known: Iterable[str],
                 kind: str) -> tuple[list[str], list[str]]:
    """Set and list in ``module.<list_name>`` each entry the module lacks; (installed, skipped)."""
    names_list = getattr(module, list_name)
    record = _INSTALLED.setdefault(module, {})
    installed, skipped = [], []
    for name, obj in entries.items():
        if name in vars(module) and not is_installed(module, name):
            skipped.append(name)
            if name not in known:
                warnings.warn(
                    f"dg_plugins {kind} {name!r} is not installed into {module.__name__}: that "
                    f"module already defines {name!r}, which stays authoritative. Register ours "
                    "under another name to use it with DomainBed.", stacklevel=3)
            continue
        setattr(module, name, obj)
        record[name] = obj
        if name not in names_list:
            names_list.append(name)
        installed.append(name)
    return installed, skipped


def register_algorithms(algorithms_module: ModuleType) -> tuple[list[str], list[str]]:
    """Install the registry's algorithm classes."""
    return _add_entries(algorithms_module, "ALGORITHMS", dict(ALGORITHMS.items()),
                        catalog.DOMAINBED_ALGORITHMS, "algorithm")


def domainbed_view(cls: type) -> type:
    """``cls`` as DomainBed gets it: ``N_WORKERS`` 0 when its data is in memory."""
    return cls if getattr(cls, "N_WORKERS", 0) == 0 else _view(cls)


@functools.cache  # one view per class, for idempotency
def _view(cls: type) -> type:
    attributes = {"__module__": cls.__module__, "__qualname__": cls.__qualname__}
    if getattr(cls, "IN_MEMORY", False):
        attributes["N_WORKERS"] = 0
        what = "in-memory, so loaded without worker processes (N_WORKERS = 0)"
    else:
        def __init__(self, *args, **kwargs):
            from torch.utils.data import TensorDataset

            cls.__init__(self, *args, **kwargs)
            environments = list(getattr(self, "datasets", None) or ())
            if getattr(self, "IN_MEMORY", False) or environments and all(
                    isinstance(e, TensorDataset) for e in environments):
                self.N_WORKERS = 0

        attributes["__init__"] = __init__
        what = ("N_WORKERS = 0 on an instance whose environments are in-memory tensors "
                f"(else the class's {cls.N_WORKERS})")
    attributes["__doc__"] = (f"{cls.__name__} for DomainBed's train loop: {what}.\n\n"
                             + (cls.__doc__ or ""))
    return type(cls.__name__, (cls,), attributes)


def register_datasets(datasets_module: ModuleType,
                      entries: dict | None = None) -> tuple[list[str], list[str]]:
    """Install dataset classes (default: the registry's with fixed ``ENVIRONMENTS``)."""
    if entries is None:
        entries = {name: cls for name, cls in DATASETS.items()
                   if getattr(cls, "ENVIRONMENTS", None)}
    entries = {name: domainbed_view(cls) for name, cls in entries.items()}
    return _add_entries(datasets_module, "DATASETS", entries, catalog.DOMAINBED_DATASETS, "dataset")


def patch_hparams(hparams_module: ModuleType, algorithms_module: ModuleType,
                  datasets_module: ModuleType) -> Callable:
    """Wrap ``hparams_module._hparams`` once: ours for installed algorithms, else DomainBed's
    (small-image datasets as :data:`SMALL_IMAGE_PROXY`)."""
    original = hparams_module._hparams
    if getattr(original, "dg_plugins_original", None) is not None:
        return original

    @functools.wraps(original)
    def _hparams(algorithm, dataset, random_seed):
        if is_installed(algorithms_module, algorithm):
            drawn = dg_hparams.draw(algorithm, dataset, random_seed)
            ignored = ignored_dataset_hparams(dataset, datasets_module)
            return {name: pair for name, pair in drawn.items() if name not in ignored}
        if (dataset in dg_hparams.SMALL_IMAGE_DATASETS
                and is_installed(datasets_module, dataset)):
            dataset = SMALL_IMAGE_PROXY
        return original(algorithm, dataset, random_seed)

    _hparams.dg_plugins_original = original
    hparams_module._hparams = _hparams
    return _hparams


def ignored_dataset_hparams(dataset: str, datasets_module: ModuleType) -> list[str]:
    """Our dataset hparams for ``dataset`` that the class DomainBed uses ignores."""
    if is_installed(datasets_module, dataset) or dataset not in vars(datasets_module):
        return []
    return list(catalog.dataset_hparam_space(dataset))


#: Base hparams that our train loop applies and DomainBed's does not (their defaults are its).
HOST_ONLY_HPARAMS = ("batch_sampling", "lr_schedule", "lr_decay", "lr_inv_gamma", "lr_inv_power")


def check_script_args(script: str, argv: list[str],
                      datasets_module: ModuleType | None = None) -> None:
    """Refuse a DomainBed ``train`` or ``sweep`` command line whose ``--hparams`` asks for what
    DomainBed would silently not do (docs/bridge.md); ValueError with the fix."""
    import argparse

    if script not in ("train", "sweep"):
        return
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--dataset", default="RotatedMNIST")  # DomainBed's train default
    parser.add_argument("--datasets", nargs="+", default=None)
    parser.add_argument("--hparams", default=None)
    known, _ = parser.parse_known_args(argv)
    if not known.hparams:
        return
    try:
        overrides = dg_hparams.parse_overrides(known.hparams)
    except ValueError:  # not JSON, or not an object: DomainBed's script reports it
        return
    space = dg_hparams.base_space(known.dataset)
    if host_only := [name for name in HOST_ONLY_HPARAMS  # set off their defaults
                     if name in overrides and overrides[name] != space[name][0]]:
        names = ", ".join(f"{n}={overrides[n]!r}" for n in host_only)
        raise ValueError(
            f"--hparams sets {names}, which DomainBed's own train loop ignores (only dg_plugins' "
            f"train applies {', '.join(HOST_ONLY_HPARAMS)}): run it with dg_plugins' own "
            f"{script}, python -m dg_plugins.scripts.{script}, or leave "
            f"{'it' if len(host_only) == 1 else 'them'} at the default")
    datasets_module = datasets_module or domainbed_modules()["datasets"]
    datasets = ([known.dataset] if script == "train"
                else known.datasets or list(getattr(datasets_module, "DATASETS", [])))
    for dataset in datasets:
        if ignored := [n for n in ignored_dataset_hparams(dataset, datasets_module)
                       if n in overrides]:
            it = "it" if len(ignored) == 1 else "them"
            raise ValueError(
                f"--hparams sets {', '.join(map(repr, ignored))}, which DomainBed's own "
                f"{dataset} ignores (only dg_plugins' {dataset} reads {it}): run it with "
                f"dg_plugins' own {script}, python -m dg_plugins.scripts.{script}, or drop {it}")


def rewrite_command(command: str, python: str | None = None,
                    plugins: Iterable[str] | None = None) -> str:
    """``python -m domainbed.scripts.train ARGS`` -> ``<python> -m dg_plugins.scripts.domainbed
    [--import M1,M2] train ARGS``; other commands unchanged."""
    python = sys.executable if python is None else python
    plugins = plugin_modules_from_env() if plugins is None else list(plugins)
    imports = f" --import {shlex.quote(','.join(plugins))}" if plugins else ""
    replacement = f"{shlex.quote(python)} -m {ENTRY_MODULE}{imports} train"
    return _TRAIN_COMMAND.sub(lambda _: replacement, command, count=1)


def rewriting_launcher(launcher: Callable) -> Callable:
    """``launcher`` with every command through :func:`rewrite_command` (no double wrap)."""
    if getattr(launcher, "dg_plugins_rewrites", False):
        return launcher

    @functools.wraps(launcher)
    def launch(commands):
        return launcher([rewrite_command(c) for c in commands])

    launch.dg_plugins_rewrites = True
    launch.dg_plugins_launcher = launcher
    return launch


def register_launchers(launchers_module: ModuleType) -> tuple[list[str], list[str]]:
    """Add the registry's launchers, rewriting, under names ``REGISTRY`` lacks."""
    registry = launchers_module.REGISTRY
    record = _INSTALLED.setdefault(launchers_module, {}).setdefault("REGISTRY", {})
    installed, skipped = [], []
    for name, launcher in LAUNCHERS.items():
        ours = name in record and registry.get(name) is record[name]
        if name in registry and not ours:
            skipped.append(name)
            continue
        if not ours or record[name].dg_plugins_launcher is not launcher:
            record[name] = registry[name] = rewriting_launcher(launcher)
        installed.append(name)
    return installed, skipped


def route_launchers_through_entry(launchers_module: ModuleType | None = None) -> list[str]:
    """Wrap every launcher of DomainBed's ``REGISTRY`` (its own too) for the sweep entry; names."""
    registry = (launchers_module or domainbed_modules()["command_launchers"]).REGISTRY
    registry.update({name: rewriting_launcher(launcher) for name, launcher in registry.items()})
    return list(registry)


def install_into(algorithms_module: ModuleType, datasets_module: ModuleType,
                 hparams_module: ModuleType, launchers_module: ModuleType,
                 report: InstallReport | None = None) -> InstallReport:
    """Register our algorithms, datasets and launchers into DomainBed-like modules (idempotent)."""
    report = report or InstallReport()
    report.algorithms, report.skipped_algorithms = register_algorithms(algorithms_module)
    report.datasets, report.skipped_datasets = register_datasets(datasets_module)
    patch_hparams(hparams_module, algorithms_module, datasets_module)
    report.launchers, report.skipped_launchers = register_launchers(launchers_module)
    return report


def install(plugins: Iterable[str] = ()) -> InstallReport:
    """Import dg_plugins and the plugins, locate DomainBed, register what it lacks (idempotent)."""
    modules = domainbed_modules()  # in install_into's order
    return install_into(*modules.values(), InstallReport(
        domainbed_path=os.path.dirname(os.path.abspath(modules["algorithms"].__file__)),
        plugins=import_plugins(plugins)))
