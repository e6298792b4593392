"""``python -m dg_plugins.scripts.collect_results``: the tables of a sweep, as DomainBed's
collect_results prints them. The flags and what they do are :mod:`dg_plugins.collect.cli`'s
(``--help``); the tables are :mod:`dg_plugins.collect`'s."""

import sys

from dg_plugins.collect.cli import main, parse_args  # noqa: F401  (the command's surface)

if __name__ == "__main__":
    sys.exit(main())
