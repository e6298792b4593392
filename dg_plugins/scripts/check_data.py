"""``python -m dg_plugins.scripts.check_data --dataset NAME --data_dir DIR``: unreadable images.

Decodes every image of an image-folder dataset as training does, in parallel, and prints each
unreadable file, then one line per environment (:mod:`dg_plugins.datasets.check`). Exit status:
0 all readable; 1 some unreadable; 2 bad input (unknown dataset, bad plugin, bad layout)."""

import argparse
import sys

from dg_plugins.help_text import CommandParser


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="python -m dg_plugins.scripts.check_data",
        description="Decode every image of an image-folder dataset and list the unreadable "
                    "ones (truncated, garbage, empty or unreadable files), before a long run.")
    parser.add_argument("--dataset", required=True,
                        help="a registered image-folder dataset, e.g. PACS or ImageFolder")
    parser.add_argument("--data_dir", required=True,
                        help="the --data_dir given to train (e.g. the folder holding PACS/)")
    parser.add_argument("--workers", type=int, default=None,
                        help="decoding processes (default: the CPUs available to this process; "
                             "0: decode in this process)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.workers is not None and args.workers < 0:
        parser.error(f"--workers must be >= 0, got {args.workers}")
    from dg_plugins import plugins  # the datasets package (torch) only past the flags
    from dg_plugins.datasets.check import BadInput, available_cpus, load_dataset, run_check

    try:
        plugins.load()  # a plugin's image-folder dataset is known
        dataset = load_dataset(args.dataset, args.data_dir)
    except (BadInput, plugins.PluginImportError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    n_bad = run_check(dataset, available_cpus() if args.workers is None else args.workers,
                      progress=sys.stderr.isatty())
    return 1 if n_bad else 0


if __name__ == "__main__":
    sys.exit(main())
