"""Imports go one way: scripts -> {train, sweep, collect} -> algorithms, alignment -> networks,
datasets -> job (the job contract), registry, hparams and the other top-level helpers. Between the
three rooms: sweep uses of the train path only train.cli (the command, to fork a job) and, for
its cost estimate, train.udg, train.compute and train.progress; none imports another room
otherwise, and none imports the scripts.
Read from the source (every ``import`` and ``from ... import`` of a ``dg_plugins`` module, at
module level or inside a function), so a lazy import that runs the wrong way is caught too. The
bridge and the benchmarks sit beside the scripts. Also: the torch-free modules import no torch
(collect_results on a sweep folder: ``tests/collect/test_collect_results.py``)."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "dg_plugins"

#: The layer of each subpackage or top-level module; a module may import its own layer and below.
LAYERS = {"domainbed": 4, "scripts": 4, "benchmarks": 4,
          "reproduce": 4, "contract": 4,
          "train": 3, "sweep": 3, "collect": 3, "plugins": 3,
          "algorithms": 2, "alignment": 2, "networks": 1, "datasets": 1, "download": 1,
          "reference": 0, "job": 0}
TOP = 0  # registry, hparams, catalog, seeds, signals, files, runtime, compat, the package itself
ROOMS = ("train", "sweep", "collect")
#: What each room may import of the other rooms.
#: sweep forks train's command (cli); its cost estimate counts UDG lengths as train does (udg)
#: and times steps in a child process with a job's compute settings (precision, progress).
DOORS = {"train": (), "sweep": ("dg_plugins.train", "dg_plugins.train.cli",
                                "dg_plugins.train.udg", "dg_plugins.train.compute",
                                "dg_plugins.train.progress"), "collect": ()}
#: Modules that import no torch (collect_results and the sweep's enumeration promise it).
TORCH_FREE = ["dg_plugins.train", "dg_plugins.train.cli", "dg_plugins.train.progress", "dg_plugins.signals", "dg_plugins.seeds",
              "dg_plugins.plugins", "dg_plugins.scripts.collect_results",
              "dg_plugins.layouts", "dg_plugins.download", "dg_plugins.scripts.download"] + [
    f"dg_plugins.{room}.{path.stem}".removesuffix(".__init__")
    for room in ("collect", "sweep", "job") for path in sorted((PACKAGE / room).glob("*.py"))]


def layer_of(module: str) -> int:
    parts = module.split(".")
    return LAYERS.get(parts[1], TOP) if len(parts) > 1 else TOP


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> set[str]:
    """The ``dg_plugins`` modules ``path`` imports: ``from package import name`` counts as the
    module ``package.name`` where that is one (``from dg_plugins.train import flags``), else as
    ``package`` (``from dg_plugins.registry import ALGORITHMS``)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "dg_plugins" or node.module.startswith("dg_plugins."):
                names.update(f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}"
                             in MODULES else node.module for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names if a.name.startswith("dg_plugins."))
    return names


SOURCES = sorted(PACKAGE.rglob("*.py"))
MODULES = {module_name(path): path for path in SOURCES}


def room_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ROOMS else None


def test_the_layers_cover_every_subpackage():
    subpackages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert subpackages <= set(LAYERS), f"give {sorted(subpackages - set(LAYERS))} a layer"
    assert not (PACKAGE / "engine").exists()


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_import_runs_upward(path):
    module = module_name(path)
    upward = sorted(name for name in imported_modules(path)
                    if layer_of(name) > layer_of(module))
    assert not upward, f"{module} (layer {layer_of(module)}) imports {upward}"


@pytest.mark.parametrize("path", [p for p in SOURCES if room_of(module_name(p))],
                         ids=lambda p: str(p.relative_to(PACKAGE)))
def test_rooms_enter_each_other_only_through_their_doors(path):
    module = module_name(path)
    room = room_of(module)
    other = sorted(name for name in imported_modules(path)
                   if room_of(name) not in (None, room) and name not in DOORS[room])
    assert not other, f"{module} imports {other}; {room} may use only {DOORS[room] or 'none'}"


def test_the_torch_free_modules_import_no_torch():
    code = (f"import importlib, sys\nfor name in {TORCH_FREE!r}:\n"
            "    importlib.import_module(name)\n"
            "heavy = sorted({'torch', 'torchvision', 'timm'} & set(sys.modules))\n"
            "assert not heavy, heavy")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_each_room_says_its_reading_order_in_its_init():
    """A room's ``__init__`` is its face: a docstring with its reading order, then at most one
    import line per module of its own (its public names), nothing else, under 40 lines."""
    for room in ROOMS:
        init = PACKAGE / room / "__init__.py"
        tree = ast.parse(init.read_text())
        assert ast.get_docstring(tree), init
        assert len(init.read_text().splitlines()) < 40, init
        imports = [n for n in tree.body[1:] if isinstance(n, (ast.Import, ast.ImportFrom))]
        assert len(imports) == len(tree.body) - 1, f"{init} defines more than imports"
        modules = [n.module for n in imports if isinstance(n, ast.ImportFrom)]
        assert len(modules) == len(imports), f"{init}: use from ... import"
        assert all(m.startswith(f"dg_plugins.{room}.") for m in modules), (init, modules)
        assert len(set(modules)) == len(modules), f"{init}: one line per module"


def test_no_import_circles_between_modules():
    """No two modules import each other, directly or around a longer circle (lazy imports
    counted): within a room too, each module is read after the ones it imports."""
    graph = {module: {name for name in imported_modules(path) if name in MODULES} - {module}
             for module, path in MODULES.items()}
    circles, state = [], {}  # state: 1 on the current path, 2 finished

    def visit(module, path):
        state[module] = 1
        for name in sorted(graph[module]):
            if state.get(name) == 1:
                circles.append(path[path.index(name):] + [name])
            elif name not in state:
                visit(name, path + [name])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not circles, "import circles: " + "; ".join(" -> ".join(c) for c in circles)
