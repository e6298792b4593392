"""``python -m dg_plugins.scripts.check_algorithm MODULE [MODULE ...]``: run the Algorithm contract
tests (:mod:`dg_plugins.contract`, the ones dg_plugins' own methods pass) on the algorithms your
plugin module registers, before a sweep spends GPU hours on them.

    python -m dg_plugins.scripts.check_algorithm my_module --algorithm FeatAlign -- -x -k update

MODULE is imported as a plugin; the algorithms it defines (or ``--algorithm``'s) are checked;
words after ``--`` go to pytest (needed: ``pip install pytest``). Exit status: pytest's; 2 bad
input (a module that does not import or registers no algorithm, an unknown name, no pytest)."""

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
    cut = argv.index("--") if "--" in argv else len(argv)
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
