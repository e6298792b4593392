"""``python -m dg_plugins.scripts.collect_results``: the tables of a sweep, as DomainBed's
collect_results prints them (:mod:`dg_plugins.collect`)."""

import sys

from dg_plugins.collect.cli import main, parse_args  # noqa: F401  (the command's surface)
from dg_plugins.help_text import short_usage_errors

if __name__ == "__main__":
    with short_usage_errors():  # its parser (dg_plugins.collect.cli) is argparse's
        sys.exit(main())
