"""``python -m dg_plugins.scripts.sweep {launch,delete_incomplete,delete_all} ...``: DomainBed's
sweep over our train (:mod:`dg_plugins.sweep`)."""

import sys

from dg_plugins import runtime
try:
    from dg_plugins.sweep.cli import build_parser, main  # noqa: F401  (the command's surface)
except ModuleNotFoundError as err:  # a PYTHON without the package's requirements: one line
    if __name__ != "__main__":
        raise
    sys.exit(runtime.missing_requirement(err))

if __name__ == "__main__":
    runtime.pause_collector()  # until the sweep's launch (runtime.resume_collector)
    sys.exit(main())
