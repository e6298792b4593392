"""``python -m dg_plugins.scripts.check_algorithm MODULE [MODULE ...]``: run the Algorithm contract
tests (:mod:`dg_plugins.contract`, the ones dg_plugins' own methods pass) on the algorithms your
plugin module registers, before a sweep spends GPU hours on them.

    PYTHONPATH=/path/to/folder python -m dg_plugins.scripts.check_algorithm my_module
    python -m dg_plugins.scripts.check_algorithm my_module --algorithm FeatAlign -- -x -k update

MODULE is imported as train imports a plugin (and added to ``$DG_PLUGINS_IMPORT``); the
algorithms whose classes it defines are checked, or with ``--algorithm`` the ones named (any
registered algorithm). Each is built on Debug28 and Debug224 with its ``TINY_TEST_HPARAMS``, on
CPU and on CUDA when a GPU is visible: optimizers, gradients, update keys and values, predict's
logits (shape ``[batch, num_classes]``, finite, deterministic), 1 and 3 source domains, the lr
schedule, and a resumed train job's records. Words after ``--`` go to pytest. The same tests
without this command: ``DG_PLUGINS_IMPORT=my_module python -m pytest --pyargs
dg_plugins.contract``. Needs pytest (``pip install pytest``).

Exit status: pytest's (0 every check passed, 1 some check failed); 2 bad input (a module that
does not import or registers no algorithm, an unknown ``--algorithm``, no pytest)."""

from __future__ import annotations

import importlib.util
import os
import sys

from dg_plugins.help_text import CommandParser, plain_text

PROG = "python -m dg_plugins.scripts.check_algorithm"


def build_parser() -> CommandParser:
    parser = CommandParser(prog=PROG, usage=f"{PROG} MODULE [MODULE ...] [--algorithm NAME ...] "
                           "[-- PYTEST_ARGS]", description=plain_text(__doc__.split("\n\n")[0]))
    parser.add_argument("modules", nargs="+", metavar="MODULE",
                        help="plugin module(s) registering algorithms, importable by name (its "
                             "folder on PYTHONPATH)")
    parser.add_argument("--algorithm", nargs="+", default=None, metavar="NAME",
                        help="check these registered algorithms (default: those whose classes "
                             "MODULE defines)")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    pytest_args: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, pytest_args = argv[:cut], argv[cut + 1:]
    args = build_parser().parse_args(argv)
    try:
        import pytest
    except ImportError:
        print("error: the contract tests run with pytest, which this Python cannot import: pip "
              "install pytest (or pip install 'dg_plugins[test]')", file=sys.stderr)
        return 2
    from dg_plugins import plugins
    from dg_plugins.registry import ALGORITHMS, UnknownNameError

    plugins.add_modules(args.modules)  # the train jobs of the resume test import them too
    try:
        plugins.load(args.modules)
        names = ([ALGORITHMS.resolve(name, say="--algorithm") for name in args.algorithm]
                 if args.algorithm else plugins.algorithms_of(args.modules))
    except (plugins.PluginImportError, UnknownNameError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if not names:
        print(f"error: {', '.join(args.modules)} defines no registered algorithm: decorate its "
              "class with @register_algorithm(\"Name\") (from dg_plugins.algorithms import "
              "register_algorithm), or name one with --algorithm", file=sys.stderr)
        return 2
    print(f"The Algorithm contract on {', '.join(names)} (dg_plugins.contract):", flush=True)
    os.environ[plugins.CONTRACT_ENV] = ",".join(names)
    # the file, not the imported module: pytest imports it itself, rewriting its asserts
    contract = importlib.util.find_spec("dg_plugins.contract").origin
    return int(pytest.main([contract, "-p", "no:cacheprovider", "-o", "addopts=",
                            *pytest_args]))


if __name__ == "__main__":
    sys.exit(main())
