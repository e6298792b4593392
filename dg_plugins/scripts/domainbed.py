"""``python -m dg_plugins.scripts.domainbed [--import MODULES] SCRIPT [ARGS ...]``: run one of
DomainBed's own scripts (``train``, ``sweep``, ``collect_results``, ...) unchanged, with
dg_plugins installed into ``domainbed`` first (:mod:`dg_plugins.domainbed.bridge`); ``info``
prints what is installed. A sweep's jobs run through this entry; ``--import`` modules reach them
through ``$DG_PLUGINS_IMPORT``. DomainBed is found on the Python path or at ``$DOMAINBED_ROOT``."""

from __future__ import annotations

import argparse
import pkgutil
import runpy
import sys


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m dg_plugins.scripts.domainbed",
        description="Run a DomainBed script (train, sweep, collect_results, ...) with "
                    "dg_plugins' algorithms, datasets, hparams and launchers installed.",
        epilog="Example: python -m dg_plugins.scripts.domainbed sweep launch --datasets "
               "RotatedMNIST5k --algorithms ERM --data_dir ./data --output_dir ./sweep "
               "--command_launcher local. DomainBed is imported from the Python path or "
               "$DOMAINBED_ROOT.")
    p.add_argument("--import", dest="plugins", action="append", default=[], metavar="MODULES",
                   help="comma-separated plugin modules to import first (repeatable); also read "
                        "from $DG_PLUGINS_IMPORT")
    p.add_argument("script", help="a module of domainbed.scripts (train, sweep, "
                                  "collect_results, list_top_hparams, ...), or 'info'")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    return p


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    from dg_plugins.domainbed import bridge

    plugins = [m.strip() for text in args.plugins for m in text.split(",") if m.strip()]
    bridge.add_plugin_modules(plugins)
    try:
        report = bridge.install()
    except bridge.DomainBedImportError as err:
        sys.exit(f"error: {err}")
    if args.script == "info":
        print(report.summary())
        return
    import domainbed.scripts

    scripts = sorted(m.name for m in pkgutil.iter_modules(domainbed.scripts.__path__))
    if args.script not in scripts:
        sys.exit(f"error: unknown DomainBed script {args.script!r}; choose one of: "
                 f"{', '.join(scripts)}, or info")
    try:  # dg_plugins' dataset hparams that DomainBed's own dataset classes would ignore
        bridge.check_script_args(args.script, args.args)
    except ValueError as err:
        sys.exit(f"error: {err}")
    if args.script == "sweep":
        bridge.route_launchers_through_entry()
    sys.argv = [f"domainbed.scripts.{args.script}", *args.args]
    runpy.run_module(f"domainbed.scripts.{args.script}", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
