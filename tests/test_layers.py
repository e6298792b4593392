"""Imports go one way: scripts -> engine -> algorithms, alignment -> networks, datasets ->
registry, hparams and the other top-level helpers. Read from the source (every ``import`` and
``from ... import`` of a ``dg_plugins`` module, at module level or inside a function), so a lazy
import that runs upward is caught too. The bridge (it installs everything into DomainBed) and the
benchmarks sit beside the scripts, which use both."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "dg_plugins"

#: The layer of each subpackage or top-level module; a module may import its own layer and below.
LAYERS = {"bridge": 4, "bridge_pytest": 4, "scripts": 4, "benchmarks": 4, "engine": 3,
          "algorithms": 2, "alignment": 2, "networks": 1, "datasets": 1,
          "reference": 0}
TOP = 0  # registry, hparams, catalog, seeds, files, runtime, compat, the package itself


def layer_of(module: str) -> int:
    parts = module.split(".")
    return LAYERS.get(parts[1], TOP) if len(parts) > 1 else TOP


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "dg_plugins":  # from dg_plugins import hparams, ...
                names.update(f"dg_plugins.{alias.name}" for alias in node.names)
            elif node.module.startswith("dg_plugins."):
                names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names if a.name.startswith("dg_plugins."))
    return names


SOURCES = sorted(PACKAGE.rglob("*.py"))


def test_the_layers_cover_every_subpackage():
    subpackages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert subpackages <= set(LAYERS), f"give {sorted(subpackages - set(LAYERS))} a layer"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_import_runs_upward(path):
    module = module_name(path)
    upward = sorted(name for name in imported_modules(path)
                    if layer_of(name) > layer_of(module))
    assert not upward, f"{module} (layer {layer_of(module)}) imports {upward}"
