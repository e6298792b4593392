"""Published numbers beside our tables (``collect_results --paper KEY``): each entry of
:mod:`dg_plugins.reference` under every table it matches, with ours minus the paper's
(docs/collect.md)."""

from __future__ import annotations

from dg_plugins.collect.selection import TEST_KEY
from dg_plugins.collect.single_source import SINGLE_SOURCE_KEY
from dg_plugins.collect.tables import PaperComparison, Report, Section, Table
from dg_plugins.collect.udg import UDG_KEY
from dg_plugins.reference.papers import AVG, PaperEntry, PaperValue


def _paper_heading(entry: PaperEntry) -> tuple[str, str]:
    """The comparison's two header lines: key and citation; backbone, selection and source."""
    selection = entry.selection_note if entry.selection is None else (
        f"{entry.selection} ({entry.selection_note})")
    return (f"paper [{entry.key}]: {entry.citation()}",
            f"  backbone: {entry.backbone}; selection: {selection}; numbers read from "
            f"{entry.read_from} ({entry.source_kind})")


def _paper_values(entry: PaperEntry, table: Table, row: str) -> list[PaperValue | None]:
    """The row's values under the table's columns."""
    cells = entry.rows[row]
    if entry.per_dataset:
        return [cells.get(key) for key in table.keys]
    if table.dataset is None:  # the Averages table: one column per dataset
        return [None if key == AVG else cells.get(key) for key in table.keys]
    return [cells.get(table.dataset) if key == AVG else None for key in table.keys]


def paper_matches(entry: PaperEntry, section: Section, table: Table) -> bool:
    """Whether ``entry`` belongs under ``table`` (setting, selection, dataset, source)."""
    setting = {TEST_KEY: "multi_source", SINGLE_SOURCE_KEY: "single_source", UDG_KEY: "udg"}
    if setting.get(section.test_key, "ipoop") != entry.setting:
        return False
    if entry.selection is not None and entry.selection != section.method.key:
        return False
    if table.dataset is None:
        return (table.coverage is not None and not entry.per_dataset and entry.available
                and any(key in entry.columns for key in table.keys))
    if table.dataset not in entry.datasets:
        return False
    return entry.source is None or entry.source == table.source


def paper_comparison(entry: PaperEntry, table: Table) -> PaperComparison:
    """The entry's rows under ``table``, with ours minus the paper's where a row corresponds."""
    rows = {row: _paper_values(entry, table, row) for row in entry.rows}
    mapping, differences = {}, {}
    for algorithm, cells in table.rows.items():
        row = entry.paper_row(algorithm)
        if row is None:
            continue
        mapping[algorithm] = row
        differences[algorithm] = [
            None if cell.mean is None or paper is None else cell.mean - paper.mean
            for cell, paper in zip(cells, rows[row])]
    return PaperComparison(entry.key, *_paper_heading(entry), rows, mapping, differences,
                           None if entry.available else entry.claim)


def add_paper_comparisons(report: Report, entries: list[PaperEntry]) -> list[str]:
    """Put each entry under every table it matches (:func:`paper_matches`); returns a note for
    each entry that matches none, saying which tables it needs."""
    notes = []
    for entry in entries:
        matched = False
        for section in report.sections:
            for table in section.tables:
                if paper_matches(entry, section, table):
                    table.comparisons.append(paper_comparison(entry, table))
                    matched = True
        if not matched:
            where = {"multi_source": "multi-source", "single_source": "single-source",
                     "udg": "UDG", "ipoop": "IP/OOP"}[entry.setting]
            needs = [f"{where} tables of {', '.join(entry.datasets)}"]
            if entry.source is not None:
                needs.append(f"source {entry.source}")
            if entry.selection is not None:
                needs.append(f"selection {entry.selection} (--selection {entry.selection})")
            notes.append(f"paper [{entry.key}]: no table here matches; it needs "
                         f"{', '.join(needs)}.")
    return notes


def matching_keys(report: Report, entries) -> list[str]:
    """The keys of the available ``entries`` that match a table of ``report``."""
    return [entry.key for entry in entries if entry.available
            and any(paper_matches(entry, section, table)
                    for section in report.sections for table in section.tables)]
