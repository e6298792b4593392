"""``python -m dg_plugins.scripts.collect_results``: the tables of a sweep, as DomainBed's
collect_results prints them. The flags and what they do are :mod:`dg_plugins.collect.cli`'s
(``--help``); the tables are :mod:`dg_plugins.collect`'s."""

import sys

from dg_plugins.collect.cli import main, parse_args  # noqa: F401  (the command's surface)
from dg_plugins.help_text import short_usage_errors

if __name__ == "__main__":
    with short_usage_errors():  # its parser (dg_plugins.collect.cli) is argparse's
        sys.exit(main())
