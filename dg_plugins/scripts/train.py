"""``python -m dg_plugins.scripts.train``: one DomainBed-compatible training job. The flags are
:mod:`dg_plugins.train.cli`'s (``--help``); the job, and its exit statuses, are
:mod:`dg_plugins.train`'s."""

import sys

from dg_plugins.train.cli import build_parser, main  # noqa: F401  (the command's surface)

if __name__ == "__main__":
    sys.exit(main())
