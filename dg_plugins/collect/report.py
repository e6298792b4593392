"""Everything collect_results prints, put together (:func:`build_report`): per method the
standard tables, then IP/OOP, single-source and UDG ones, hparams, papers, notes."""

from __future__ import annotations

from functools import partial

import pandas as pd

from dg_plugins.collect.ipoop import IPOOP_CHOICES, add_pooled_subsets, ipoop_sections
from dg_plugins.collect.notes import (averages_notes, compute_notes, missing_cell_notes,
                                      mixed_settings_notes, nonfinite_notes)
from dg_plugins.collect.papers import add_paper_comparisons
from dg_plugins.collect.selection import (TEST_KEY, GroupedRecords, SelectionMethod,
                                          group_records, standard_selection)
from dg_plugins.collect.single_source import single_source_sections
from dg_plugins.collect.tables import (Report, Section, environment_labels, results_tables,
                                       selected_hparams)
from dg_plugins.collect.udg import is_udg, udg_sections
from dg_plugins.reference import PaperEntry


def build_report(records: pd.DataFrame | GroupedRecords, methods: list[SelectionMethod],
                 hparams_table: bool = False, single_source: str = "auto",
                 ipoop: str = "both", papers: list[PaperEntry] = (),
                 all_columns: bool = True) -> Report:
    """Select and tabulate every section, as the flags of the same names ask."""
    if single_source not in ("auto", "on", "off"):
        raise ValueError(f"single_source must be auto, on or off, not {single_source!r}")
    if ipoop not in IPOOP_CHOICES:
        raise ValueError(f"ipoop must be one of {IPOOP_CHOICES}, not {ipoop!r}")
    methods = list(dict.fromkeys(methods))
    frame = records.records if isinstance(records, GroupedRecords) else records
    udg = is_udg(frame)
    report = Report(len(frame), methods)
    if not udg.all():  # UDG records get their own tables only
        standard = frame[~udg].reset_index(drop=True) if udg.any() else records
        if ipoop != "in":
            base = standard.records if isinstance(standard, GroupedRecords) else standard
            pooled = add_pooled_subsets(base)
            standard = standard if pooled is base else pooled
        grouped = group_records(standard)
        for method in methods:
            report.sections.append(Section(method, TEST_KEY, "", results_tables(grouped, method),
                                           partial(standard_selection, grouped, method)))
        report.sections += ipoop_sections(grouped, methods, ipoop)
        report.sections += single_source_sections(grouped, methods, single_source)
        if hparams_table:
            report.hparams = selected_hparams(grouped, methods)
        report.notes += missing_cell_notes(grouped, report.sections, all_columns)
        report.notes += averages_notes(
            report.sections, partial(environment_labels, grouped.records), all_columns)
    if udg.any():
        report.sections += udg_sections(frame[udg].reset_index(drop=True), methods)
    report.notes[:0] = [*mixed_settings_notes(frame, partial(environment_labels, frame)),
                        *nonfinite_notes(frame)]
    report.notes += add_paper_comparisons(report, list(papers))
    report.notes += compute_notes(frame)
    return report
