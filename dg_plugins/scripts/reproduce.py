"""``python -m dg_plugins.scripts.reproduce SETTING [--protocol release|domainbed] ...``: run one
paper setting of :mod:`dg_plugins.reference.paper_settings` (its sweeps, then its tables beside
the paper's rows). The flags are :mod:`dg_plugins.reproduce.cli`'s (``--help``); the planning,
checks, costs and listings are :mod:`dg_plugins.reproduce`'s; what it does: docs/reproduce.md.

    python -m dg_plugins.scripts.reproduce --list                      # settings, jobs, steps
    python -m dg_plugins.scripts.reproduce --list --forwards           # forwards, GPU-hours
    python -m dg_plugins.scripts.reproduce dmg_pacs --describe         # every value + source
    python -m dg_plugins.scripts.reproduce dmg_pacs --protocol release --data_dir D \\
        --output_dir O --command_launcher multi_gpu [--dry_run] [extra sweep flags]
    python -m dg_plugins.scripts.reproduce --dry_run_sweeps launch FLAGS [:: launch FLAGS ...]
"""

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
