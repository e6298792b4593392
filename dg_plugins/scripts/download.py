"""``python -m dg_plugins.scripts.download --data_dir DIR DATASET [DATASET ...]``: put DomainBed's
datasets in DomainBed's layout under ``--data_dir`` (the logic: :mod:`dg_plugins.download`;
docs/download.md). Torch-free; a second Ctrl-C ends it at once. Exit status: 0 every dataset
present; 1 a download, check or extraction failed (one message per dataset); 2 bad command line."""

from __future__ import annotations

import argparse
import re
import signal
import sys

from dg_plugins.help_text import CommandParser


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="python -m dg_plugins.scripts.download",
        description="Download DomainBed's datasets into DomainBed's layout under --data_dir "
                    "(skips what is already there; resumes partial downloads; verifies sizes "
                    "and checksums where known; extracts atomically).")
    parser.add_argument("datasets", nargs="*", metavar="DATASET",
                        help="PACS, PACS_splits (PACS's official split lists, for "
                             "--hparams '{\"data_split\": \"official\"}'; they need PACS), "
                             "VLCS, OfficeHome, TerraIncognita, DomainNet, DomainNet20, MNIST "
                             "(ColoredMNIST, RotatedMNIST), or all")
    parser.add_argument("--data_dir", help="the folder that train's --data_dir will name")
    parser.add_argument("--list", action="store_true",
                        help="print the table of files (sources, sizes, checksums, target "
                             "folders) and exit")
    parser.add_argument("--url", action="append", default=[], metavar="NAME=URL",
                        help="fetch file NAME (a file name of --list, e.g. PACS.zip) from URL "
                             "instead (a mirror: http://, https://, or file:///path for a local "
                             "copy); repeatable")
    parser.add_argument("--sha256", action="append", default=[], metavar="NAME=HEX",
                        help="expect this sha256 for file NAME instead of the table's size and "
                             "checksums (a mirror's own copy); HEX 'none' checks no checksum; "
                             "repeatable")
    parser.add_argument("--keep_archives", action="store_true",
                        help="keep the downloaded archives (and lists) in <data_dir>/downloads/ "
                             "(default: deleted once the dataset checks out)")
    parser.add_argument("--retries", type=int, default=3,
                        help="attempts to continue a cut transfer before giving up (default 3; "
                             "a rerun continues too)")
    return parser


def parse_pairs(parser: argparse.ArgumentParser, values: list[str], flag: str) -> dict[str, str]:
    pairs = {}
    for value in values:
        name, sep, rest = value.partition("=")
        if not sep or not name or not rest:
            parser.error(f"{flag} expects NAME=VALUE (e.g. {flag} PACS.zip=...), got {value!r}")
        pairs[name] = rest
    return pairs


def main(argv: list[str] | None = None) -> int:
    from dg_plugins import download as lib

    parser = build_parser()
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(lib.table_lines()))
        return 0
    if not args.datasets:
        parser.error("name at least one dataset (or all); --list shows them")
    if not args.data_dir:
        parser.error("--data_dir is required")
    if args.retries < 0:
        parser.error(f"--retries must be >= 0, got {args.retries}")
    sha256 = parse_pairs(parser, args.sha256, "--sha256")
    for name, value in sha256.items():
        if not re.fullmatch(r"none|[0-9a-f]{64}", value, re.IGNORECASE):
            parser.error(f"--sha256 {name}=...: expected 64 hex digits or 'none', got {value!r}")
        sha256[name] = None if value.lower() == "none" else value.lower()
    options = lib.Options(urls=parse_pairs(parser, args.url, "--url"), sha256=sha256,
                          keep_archives=args.keep_archives, retries=args.retries)
    report = lib.Reporter(progress=sys.stderr.isatty())
    try:
        results = lib.download(args.datasets, args.data_dir, options, report)
    except lib.UsageError as err:
        parser.error(str(err))
    except lib.DownloadFailed as err:
        for message in err.failures.values():
            print(f"error: {message}", file=sys.stderr)
        attempted = [name for name, state in err.results if state != "built in"]
        if len(err.failures) + len(attempted) > 1:
            ready = f"; ready: {', '.join(attempted)}" if attempted else ""
            print(f"error: not downloaded: {', '.join(err.failures)} (the reasons above){ready}",
                  file=sys.stderr)
        return 1
    except lib.DownloadError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except OSError as err:  # e.g. --data_dir not writable, or a file
        print(f"error: {err} (check --data_dir {args.data_dir}); rerun when fixed: what was "
              "already downloaded is kept", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # a second Ctrl-C ends it at once
        print("interrupted: partial downloads are kept; rerun the same command to continue",
              file=sys.stderr)
        return 130
    if done := [name for name, state in results if state != "built in"]:
        print(f"Ready under {args.data_dir}: {', '.join(done)}. To decode every image before a "
              "long run: python -m dg_plugins.scripts.check_data --dataset NAME --data_dir "
              f"{args.data_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
