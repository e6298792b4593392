"""Print the results tables of a sweep, as DomainBed's collect_results does
(``domainbed/scripts/collect_results.py``).

    python -m dg_plugins.scripts.collect_results --input_dir SWEEP [--latex | --format FMT]

The output (stdout) is DomainBed's collect_results' on the same folder, byte for byte where every
test environment was run: ``Total records: N``, then for each model-selection method
(training-domain validation, leave-one-domain-out cross-validation, test-domain oracle) a table
per dataset and an Averages table. A test environment no run has is left out of the tables (Avg
too), with a line under the table naming it; ``--all_columns`` prints DomainBed's layout. As
DomainBed does, the same text is written into the sweep folder, overwriting: ``results.txt``,
``results.tex`` (``--latex``), ``results.md`` or ``results.csv`` (``--format``, see
:mod:`dg_plugins.collect.formats`); ``--no_save`` only prints (a folder that cannot be written:
a warning). After them: the IP/OOP, single-source and UDG tables where records call for them.
Notes go to stderr (jobs not done, job folders left out and why, cells that mix jobs of
different settings, why a cell is X, what an average is over), so stdout stays DomainBed's.
DomainBed's ``--auto_lr`` is not supported. What each table and figure shows: docs/collect.md.

Exit status: 0 on success; 1 when the folder holds no record (nothing written) or when
``--plot``'s figures cannot be written (the tables are printed and saved first); 2 for a bad
argument, including an ``--input_dir`` that does not exist."""

from __future__ import annotations

import argparse
import os
import sys

from dg_plugins import catalog, reference
from dg_plugins.collect import formats as table_formats
from dg_plugins.collect import ipoop, learning
from dg_plugins.collect.records import folder_notes, load_records
from dg_plugins.collect.report import build_report, matching_keys, nonfinite_notes
from dg_plugins.collect.selection import METHODS
from dg_plugins.collect.tables import Report, leave_out_unrun
from dg_plugins.help_text import plain_text
from dg_plugins.job.folder import is_done


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m dg_plugins.scripts.collect_results",
        description=plain_text(__doc__.split("\n\n", 2)[2]),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input_dir", required=True,
                        help="sweep folder holding <job>/results.jsonl (one level)")
    parser.add_argument("--latex", action="store_true", help="same as --format latex")
    parser.add_argument("--format", choices=table_formats.FORMATS, default=None,
                        help="text (default, DomainBed's), latex (DomainBed's --latex), markdown, "
                             "or csv (one tidy row per cell)")
    parser.add_argument("--selection", nargs="+", choices=list(METHODS),
                        default=list(METHODS), metavar="METHOD",
                        help="model-selection methods, in print order: iid (training-domain "
                             "validation: each run's best checkpoint by mean source validation "
                             "accuracy, also the DMG release's best-epoch rule), loo (leave-one-"
                             "domain-out), oracle (test-domain); default: all three, DomainBed's")
    parser.add_argument("--hparams_table", action="store_true",
                        help="also print the selected run (hparams_seed, step, accuracies, "
                             "hparams) of every group, and write it to selected_hparams.csv")
    parser.add_argument("--single_source", choices=("auto", "on", "off"), default="auto",
                        help="tables for single-source runs (sweep --single_source: trained on "
                             "one environment, tested on the others): auto (default) shows them "
                             "where unambiguous (datasets with >= 4 environments, or a 3-"
                             "environment dataset without single-test-env runs), on, off")
    parser.add_argument("--ipoop", choices=ipoop.IPOOP_CHOICES, default="both",
                        help="IP/OOP tables (records with env{i}_in_ip_acc keys): 'in' reports "
                             "each subset on the test environment's in split, 'pooled' over the "
                             "whole test environment (in and out splits pooled, weighted by "
                             "subset size, as the IP/OOP authors report), 'both' (default); each "
                             "table's header names its key")
    parser.add_argument("--learning_check", action="store_true",
                        help="instead of the tables, one row per job: source-validation and "
                             "target accuracy at its first and last checkpoint, chance, and "
                             "whether it learned (dg_plugins.collect.learning); printed only")
    parser.add_argument("--paper", nargs="+", default=[], metavar="KEY",
                        help="print a paper's published numbers under each table they match, "
                             "with ours minus the paper's for every algorithm that corresponds "
                             "to a paper row; keys: " + ", ".join(reference.keys()))
    parser.add_argument("--plot", metavar="DIR", default=None,
                        help="also write figures (PNG) into DIR, created if needed: per dataset "
                             "table, the selected accuracies with standard-error bars (n trials "
                             "each), chance and the --paper numbers as markers; per dataset and "
                             "algorithm, the selected runs against the step: per selection "
                             "method the signal it selects with and the target accuracy, the "
                             "selected checkpoints marked; the written paths go to stderr")
    parser.add_argument("--all_columns", action="store_true",
                        help="DomainBed's layout: every environment column, X where no run has "
                             "that test environment (default: such columns, and then Avg, are "
                             "left out of the text, LaTeX and Markdown tables and the figures, "
                             "with a line under each table naming them)")
    parser.add_argument("--no_save", action="store_true",
                        help="print only; do not write results files into --input_dir")
    args = parser.parse_args(argv)
    if args.latex and args.format not in (None, "latex"):
        parser.error(f"--latex conflicts with --format {args.format}")
    args.format = "latex" if args.latex else (args.format or "text")
    if not os.path.isdir(args.input_dir):
        why = "is not a directory" if os.path.exists(args.input_dir) else "does not exist"
        parser.error(f"--input_dir {args.input_dir!r} {why}")
    args.selection = list(dict.fromkeys(args.selection))
    known = reference.keys()
    for key in [key for key in args.paper if key not in known]:
        parser.error(f"--paper: {reference.unknown_key_message(key, known)}")
    for flag, given, does in (("--paper", args.paper, "compares"),
                              ("--plot", args.plot is not None, "draws")):
        if given and args.learning_check:
            parser.error(f"{flag} {does} the result tables, which --learning_check does not "
                         "print; drop one of them")
    args.paper = list(dict.fromkeys(args.paper))
    if args.plot is not None:
        if os.path.exists(args.plot) and not os.path.isdir(args.plot):
            parser.error(f"--plot {args.plot!r} is a file; give a folder for the figures")
        try:
            os.makedirs(args.plot, exist_ok=True)
        except OSError as error:
            parser.error(f"--plot {args.plot!r}: cannot create the folder ({error.strerror})")
        if not os.access(args.plot, os.W_OK):
            parser.error(f"--plot {args.plot!r} is not writable; give another folder")
    return args


def _write(path: str, text: str) -> None:
    try:
        with open(path, "w") as handle:
            handle.write(text)
    except OSError as error:
        print(f"warning: could not write {path}: {error}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    records = load_records(args.input_dir)
    progress, left_out = folder_notes(args.input_dir, set(records["job"]))
    if not len(records):
        sys.stderr.write("".join(f"note: {note}\n" for note in left_out))
        print(f"error: no records in {args.input_dir!r}: expected "
              f"{os.path.join(args.input_dir, '<job>', 'results.jsonl')} files (one folder level)",
              file=sys.stderr)
        return 1
    if args.learning_check:
        running = {job for job in set(records["job"])
                   if not is_done(os.path.join(args.input_dir, job))}
        sys.stdout.write(learning.render(learning.learning_rows(records, catalog.DATASET_CLASSES,
                                                                running=running)))
        left_out += nonfinite_notes(records)
        sys.stderr.write("".join(f"note: {note}\n" for note in left_out))
        return 0
    every_column = args.all_columns or args.format == "csv"
    report = build_report(records, [METHODS[key] for key in args.selection],
                          hparams_table=args.hparams_table, single_source=args.single_source,
                          ipoop=args.ipoop, papers=[reference.get(key) for key in args.paper],
                          all_columns=every_column)
    shown = report if args.all_columns else leave_out_unrun(report)
    text = table_formats.render(report if every_column else shown, args.format)
    sys.stdout.write(text)
    sys.stdout.flush()
    sys.stderr.write("".join(f"note: {note}\n" for note in [*progress, *left_out, *report.notes]))
    if not args.no_save:
        _write(os.path.join(args.input_dir, table_formats.RESULTS_FILES[args.format]), text)
        if report.hparams is not None:
            _write(os.path.join(args.input_dir, table_formats.HPARAMS_FILE),
                   table_formats.hparams_csv(report))
    return 0 if args.plot is None else _plot(records, shown, args)


def _plot(records, report: Report, args: argparse.Namespace) -> int:
    """Write the figures, print their paths (and which --paper keys would add markers)."""
    from dg_plugins.collect import plots  # imports matplotlib when it draws

    try:
        paths = plots.write_figures(records, report, args.plot)
    except OSError as error:
        print(f"error: could not write the figures into {args.plot!r}: {error}", file=sys.stderr)
        return 1
    sys.stderr.write("".join(f"figure: {path}\n" for path in paths))
    if not args.paper:
        matching = matching_keys(report, reference.load().values())
        if matching:
            print(f"note: the figures show no paper numbers; --paper {' '.join(matching)} adds "
                  "the matching ones as markers", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
