"""``python -m dg_plugins.scripts.reproduce SETTING [--protocol release|domainbed] ...``: run one
paper setting of :mod:`dg_plugins.reference.paper_settings` (its sweeps, then its tables beside
the paper's rows; ``--list``, ``--describe``, ``--dry_run``). Flags:
:mod:`dg_plugins.reproduce.cli`; what it does: docs/reproduce.md."""

import sys

from dg_plugins import runtime
try:
    from dg_plugins.reproduce.cli import build_parser, main  # noqa: F401  (the command's surface)
except ModuleNotFoundError as err:  # a PYTHON without the package's requirements: one line
    if __name__ != "__main__":
        raise
    sys.exit(runtime.missing_requirement(err))

if __name__ == "__main__":
    runtime.pause_collector()  # until the sweep's launch (runtime.resume_collector)
    sys.exit(main())
