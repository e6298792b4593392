"""Everything collect_results prints, put together (:func:`build_report`): per method the
standard tables, then IP/OOP, single-source and UDG ones, hparams, papers' numbers beside them
(``--paper KEY``), and the notes on stderr: cells that mix settings, why cells are X, what
averages are over, non-finite values, compute settings (docs/collect.md)."""

from __future__ import annotations

from collections import Counter

import pandas as pd

from dg_plugins.collect.ipoop import IPOOP_CHOICES, add_pooled_subsets
from dg_plugins.collect.records import ACC_KEY, SETTING_ARGS
from dg_plugins.collect.selection import (LOO, TEST_KEY, GroupedRecords, SelectionMethod,
                                          group_records, select)
from dg_plugins.collect.single_source import (SINGLE_SOURCE_KEY, single_source_runs,
                                              single_source_sections)
from dg_plugins.collect.tables import (PaperComparison, Report, Section, Table,
                                       environment_labels, selected_hparams, standard_sections)
from dg_plugins.collect.udg import UDG_KEY, is_udg, udg_sections
from dg_plugins.job.flags import ALIGNMENT_ARGS, COMPUTE_DEFAULTS, ROWS
from dg_plugins.reference.papers import AVG, PaperEntry, PaperValue


def build_report(records: pd.DataFrame, methods: list[SelectionMethod],
                 hparams_table: bool = False, single_source: str = "auto",
                 ipoop: str = "both", papers: list[PaperEntry] = (),
                 all_columns: bool = True) -> Report:
    """Select and tabulate every section, as the flags of the same names ask."""
    if single_source not in ("auto", "on", "off"):
        raise ValueError(f"single_source must be auto, on or off, not {single_source!r}")
    if ipoop not in IPOOP_CHOICES:
        raise ValueError(f"ipoop must be one of {IPOOP_CHOICES}, not {ipoop!r}")
    methods, udg = list(dict.fromkeys(methods)), is_udg(records)
    report = Report(len(records), methods)
    if not udg.all():  # UDG records get their own tables only
        standard = records[~udg].reset_index(drop=True) if udg.any() else records
        grouped = group_records(standard if ipoop == "in" else add_pooled_subsets(standard))
        runs = single_source_runs(grouped)
        report.sections += standard_sections(grouped, methods, ipoop)
        report.sections += single_source_sections(grouped, methods, single_source, runs)
        if hparams_table:
            report.hparams = selected_hparams(grouped, methods)
        report.notes += missing_cell_notes(grouped, report.sections, all_columns, runs)
        report.notes += averages_notes(report.sections, all_columns)
    if udg.any():
        report.sections += udg_sections(records[udg].reset_index(drop=True), methods)
    report.notes[:0] = [*mixed_settings_notes(records), *nonfinite_notes(records)]
    report.notes += add_paper_comparisons(report, list(papers))
    report.notes += compute_notes(records)
    return report


def _names(labels: list[str], indexes) -> str:
    return ", ".join(labels[i] if i < len(labels) else str(i) for i in sorted(indexes))


def _listing(items: list[str], limit: int = 8) -> str:
    """``a, b, c`` (at most ``limit`` items, then ``and N more``)."""
    if len(items) <= limit:
        return ", ".join(items)
    return f"{', '.join(items[:limit])} and {len(items) - limit} more"


def _envs(labels: list[str], indexes) -> str:
    """``test environment A`` / ``test environments A, C``."""
    return f"test environment{'s' * (len(indexes) > 1)} {_names(labels, indexes)}"


def _rows_by(found: dict, rows: int, every: str, each: str, name=str) -> str:
    """``found`` (key -> algorithms) as ``every`` (one key, for every one of ``rows`` rows) or
    ``<algorithms> <each>`` per key, ``name`` spelling the key."""
    if len(found) == 1 and len(next(iter(found.values()))) == rows:
        return every.format(name(next(iter(found))))
    return "; ".join(f"{_listing(algorithms)} {each.format(name(key))}"
                     for key, algorithms in found.items())


def _section_name(section: Section) -> tuple[str, str]:
    """``("iid", "")``, ``("oracle", "IP")``: a section's method key and subset label."""
    return section.method.key, section.subtitle.split(":")[0].replace(", ", " ")


def _where(names: list[tuple], every: list[tuple]) -> str:
    """Which sections a note holds for: ``""`` for every one, else their names."""
    names, every = list(dict.fromkeys(names)), list(dict.fromkeys(every))
    if names == every:
        return ""
    methods = list(dict.fromkeys(m for m, _ in names))
    labels = list(dict.fromkeys(label for _, label in names))
    if len(names) == len(methods) * len(labels):  # a full grid
        if labels == [""]:
            return f" [{', '.join(methods)}]"
        if len(methods) == 1 and labels == list(dict.fromkeys(
                label for m, label in every if m == methods[0])):
            return f" [every {methods[0]} table]"
        return (f" [{', '.join(methods)}: "
                f"{', '.join(label or 'standard' for label in labels)} tables]")
    return f" [{'; '.join(f'{m} {label}'.strip() for m, label in names)}]"


def missing_cell_notes(grouped: GroupedRecords, sections: list[Section], all_columns: bool,
                       runs: pd.DataFrame) -> list[str]:
    """Why cells of the standard and IP/OOP dataset tables print ``X``: runs missing, or runs a
    method cannot score; ``all_columns``: the tables show the columns no run has; ``runs``: the
    single-source runs (:func:`single_source_runs`)."""
    scored = [s for s in sections if s.test_key not in (SINGLE_SOURCE_KEY, UDG_KEY)]
    ran: dict[tuple, set] = {}  # (dataset, algorithm) -> its single test environments
    for dataset, algorithm, env in scored[0].selection.scored[
            ["dataset", "algorithm", "test_env"]].itertuples(index=False) if scored else ():
        ran.setdefault((dataset, algorithm), set()).add(int(env))
    present = set(zip(grouped.records["args.dataset"], grouped.records["args.algorithm"]))
    single_source = set(zip(runs["dataset"], runs["algorithm"]))
    notes, explained = [], set()
    unscored: dict[tuple, list] = {}  # (dataset, reason, cells) -> [(section name, detail)]
    for section in scored:
        for table in [t for t in section.tables if t.dataset is not None]:
            labels = table.keys[:-1]
            full = {i for i, k in enumerate(labels) if all_columns or k not in table.not_run}
            not_run: dict[tuple, list[str]] = {}  # (envs with records, missing) -> algorithms
            cells_of: dict[frozenset, list[str]] = {}  # environments -> algorithms
            for algorithm, cells in table.rows.items():
                missing = {i for i in full if cells[i].mean is None}
                have = ran.get((table.dataset, algorithm), set()) & full
                if missing - have:
                    not_run.setdefault((frozenset(have), frozenset(missing - have)),
                                       []).append(algorithm)
                if missing & have:
                    cells_of.setdefault(frozenset(missing & have), []).append(algorithm)
            if cells_of:
                cells = _rows_by(cells_of, len(table.rows), "every algorithm at {}", "at {}",
                                 lambda envs: _names(labels, envs))
                reason, detail = _unscored_reason(grouped, section, table.dataset)
                unscored.setdefault((table.dataset, reason, cells), []).append(
                    (_section_name(section), detail))
            if table.dataset in explained:
                continue
            explained.add(table.dataset)
            avg = (" (so Avg is X too, as in DomainBed)"
                   if all_columns or not table.not_run else "")
            for (have, absent), algorithms in not_run.items():
                who = _listing(algorithms)
                if have:
                    why = (f"records exist only with {_envs(labels, have)}, none with "
                           f"{_names(labels, absent)}")
                elif not any((table.dataset, a) in present for a in algorithms):
                    why = "no record of theirs is on this dataset"
                elif all((table.dataset, a) in single_source for a in algorithms):
                    why = ("their runs on it are single-source (one training environment), "
                           "which these tables do not score: see the single-source tables")
                else:
                    why = "none of their records on it has a single test environment"
                notes.append(f"{table.dataset}: X for {who} in every table: {why}{avg}.")
    every = [_section_name(s) for s in scored]
    for (dataset, reason, cells), found in unscored.items():
        names = [name for name, _ in found]
        if reason == LOO.key:  # leave-one-domain-out's X cells get their own note
            why = ("leave-one-domain-out scores test environment t with the runs tested on "
                   "[t, j], for every other environment j, at the same hparams and steps, and the "
                   "sweep has none (sweep launches them unless --single_test_envs or "
                   "--test_env_sets leaves them out)")
        else:
            details = list(dict.fromkeys(detail for _, detail in found))
            why = f"the chosen records have {reason} {', '.join(details)}"
        notes.append(f"{dataset}{_where(names, every)}: X for {cells} although the runs "
                     f"exist: {why}.")
    return notes


def _unscored_reason(grouped: GroupedRecords, section: Section, dataset) -> tuple[str, str]:
    """Why ``section`` cannot score runs that exist on ``dataset``: leave-one-domain-out's pair
    runs missing, or no test key, or NaN as test key in the records it chose."""
    if section.method.key == LOO.key:
        return LOO.key, ""
    key, records, nan = section.test_key.format(t="<t>"), grouped.records, []
    if "nonfinite" in records and not records["nonfinite"].isna().all():
        chosen = select(grouped, section.method, section.test_key)
        chosen = chosen[(chosen["dataset"] == dataset) & chosen["test_acc"].isna()]
        for row, env in zip(chosen["record"], chosen["test_env"]):
            bad = records["nonfinite"].iat[row]
            if isinstance(bad, tuple) and section.test_key.format(t=env) in dict(bad):
                nan.append(f"job {records['job'].iat[row]} at step {records['step'].iat[row]}")
    return ("NaN as", f"{key} ({_listing(nan, 3)})") if nan else ("no", key)


def averages_notes(sections: list[Section], all_columns: bool = True) -> list[str]:
    """Averages cells over other test environments than their dataset's columns or another
    row's, one note per dataset and pattern."""
    bodies: dict[str, list[str]] = {}
    every = []  # the sections with an Averages table
    for section in sections:
        labels_of = {t.dataset: t.keys[:-1] for t in section.tables if t.dataset is not None}
        for table in [t for t in section.tables if t.coverage is not None]:
            every.append(_section_name(section))
            for dataset in table.keys[:-1]:
                labels, groups = labels_of[dataset], {}  # text -> the rows it describes
                for algorithm in table.rows:
                    trials = table.coverage.get((algorithm, dataset))
                    if not trials:
                        continue
                    sets = sorted(set(trials.values()))
                    seeds = [sorted(t for t, e in trials.items() if e == envs) for envs in sets]
                    text = _names(labels, sets[0]) if len(sets) == 1 else (
                        " and ".join(part for _, part in sorted(
                            (trial, f"{_names(labels, envs)} (trial {', '.join(map(str, trial))})")
                            for envs, trial in zip(sets, seeds))))
                    groups.setdefault(text, []).append(algorithm)
                whole = _names(labels, range(len(labels)))
                if all(text == whole for text in groups):
                    continue
                body = (f"Averages table, {dataset} column: each trial is averaged over the test "
                        f"environments it has (DomainBed's rule), here "
                        f"{_rows_by(groups, len(table.rows), '{} for every row', 'over {}')}")
                if len(groups) > 1:
                    body += ": these rows average different domains"
                elif groups and all_columns:
                    body += ", so it can show a number where the dataset's table prints X"
                body += f"; {dataset} has {whole}"
                bodies.setdefault(body, []).append(_section_name(section))
    return [f"{body}{_where(names, every)}." for body, names in bodies.items()]


def nonfinite_by_job(records: pd.DataFrame) -> dict[str, dict[str, str]]:
    """job -> {``"NaN loss"``: ``"steps 300, 400"``, ...}, an empty subset's NaN left out."""
    per_job: dict[str, dict[str, list]] = {}
    for row, (job, found) in enumerate(zip(records["job"], records.get("nonfinite", ()))):
        if not isinstance(found, tuple):
            continue
        for key, value in found:
            count = key.removesuffix("_acc") + "_count"
            if value == "NaN" and count in records and records[count].iat[row] == 0:
                continue  # an empty subset
            what = f"{value} {key}" if value == "NaN" else f"{key}={value}"
            per_job.setdefault(job, {}).setdefault(what, []).append(records["step"].iat[row])
    return {job: {what: _steps(steps) for what, steps in found.items()}
            for job, found in per_job.items()}


def nonfinite_notes(records: pd.DataFrame, limit: int = 10) -> list[str]:
    """Per job with NaN or infinite values (at most ``limit``): which keys at which steps."""
    per_job = nonfinite_by_job(records)
    notes = []
    for job, found in list(per_job.items())[:limit]:
        parts = [f"{what} at {steps}" for what, steps in found.items()]
        accs = [bool(ACC_KEY.search(what)) for what in found]
        meaning = ["a NaN accuracy counts as missing in the tables and figures"] * any(accs) + [
            "a non-finite loss means the run diverged; its accuracies still count, as in "
            "DomainBed"] * (not all(accs))
        notes.append(f"job {job} has {'; '.join(parts)} ({'; '.join(meaning)}).")
    if len(per_job) > limit:
        notes.append(f"{len(per_job) - limit} more jobs have NaN or infinite values.")
    return notes


def _steps(steps: list) -> str:
    steps = sorted(set(steps))
    if len(steps) == 1:
        return f"step {steps[0]}"
    if len(steps) <= 3:
        return f"steps {', '.join(map(str, steps))}"
    return f"steps {steps[0]}-{steps[-1]} ({len(steps)} checkpoints)"


def _flag(name: str, value) -> str:
    return f"--{name} {str(value).lower() if isinstance(value, bool) else value}"


def compute_notes(records: pd.DataFrame) -> list[str]:
    """How many runs used which compute settings other than train's defaults."""
    if "args.compute" not in records or records.empty:
        return []
    runs = dict(zip(records["job"], records["args.compute"]))
    counts = Counter([s if isinstance(s, tuple) else () for s in runs.values()])  # NaN: defaults
    if set(counts) == {()}:
        return []
    parts = [f"{count} used {' '.join(_flag(name, value) for name, value in settings)}"
             for settings, count in sorted(counts.items(), key=lambda item: (-item[1], item[0]))
             if settings]
    if () in counts:
        defaults = ", ".join(_flag(name, value) for name, value in COMPUTE_DEFAULTS.items())
        parts.append(f"{counts[()]} the defaults ({defaults})")
    return [f"Compute settings: of the {len(runs)} runs (job folders) read, {'; '.join(parts)}. "
            "Reduced precision and non-deterministic kernels change accuracies by rounding."]


def _settings_text(names, values) -> str:
    """Settings as train's flags spell them; ``no --steps`` for a default of None."""
    return " ".join(_flag(name, f"'{value}'" if name == "hparams" else value)
                    if value is not None else f"no --{name}" if ROWS[name].default is None
                    else _flag(name, ROWS[name].default) for name, value in zip(names, values))


def _order(values: tuple) -> tuple:
    """Settings values' sort key: absent first, then numbers by value, then text."""
    return tuple((0, 0, "") if v is None else (1, v, "") if isinstance(v, (int, float))
                 else (2, 0, str(v)) for v in values)


def _runs(labels: list[str], sets) -> str:
    """Test environment sets as the tables name them: ``C, L and the runs tested on C+L``."""
    sets = sorted(sets, key=lambda envs: (len(envs), envs))
    single = [envs[0] for envs in sets if len(envs) == 1]
    several = ["+".join(labels[i] if i < len(labels) else str(i) for i in envs)
               for envs in sets if len(envs) > 1]
    parts = [_names(labels, single)] if single else []
    if several:
        parts.append(f"the runs tested on {', '.join(several)}")
    return " and ".join(parts)


def mixed_settings_notes(records: pd.DataFrame) -> list[str]:
    """Per dataset and algorithm whose jobs differ in a setting DomainBed's grouping ignores
    (``args.settings``): the cells that mix settings, with values and job counts; or, where each
    cell is uniform, which cells have which values (the tables combine them)."""
    column = records["args.settings"].to_numpy() if "args.settings" in records else ()
    if len(set(column)) < 2:  # one setting for every job (or no job): nothing is mixed
        return []
    units: dict[tuple, dict] = {}  # (dataset, algorithm) -> {(job, test_envs, settings)}
    for job, dataset, algorithm, envs, settings in dict.fromkeys(zip(  # in record order
            records["job"], records["args.dataset"], records["args.algorithm"],
            records["args.test_envs"], column)):
        units.setdefault((dataset, algorithm), {})[
            (job, envs, settings if isinstance(settings, tuple) else ())] = None
    notes = []
    for (dataset, algorithm), found in units.items():
        values = [dict(settings) for _, _, settings in found]
        varying = [name for name in SETTING_ARGS if len({v.get(name) for v in values}) > 1]
        if not varying:
            continue
        cells: dict[tuple, dict[tuple, set]] = {}  # test_envs -> varying values -> jobs
        for (job, envs, _), settings in zip(found, values):
            combo = tuple(settings.get(name) for name in varying)
            cells.setdefault(envs, {}).setdefault(combo, set()).add(job)
        labels = environment_labels(records, dataset)
        mixed = {envs: combos for envs, combos in cells.items() if len(combos) > 1}
        if mixed:
            parts = []
            for envs in sorted(mixed, key=lambda e: (len(e), e)):
                counts = ", ".join(
                    f"{_settings_text(varying, combo)} ({len(jobs)} job{'s' * (len(jobs) != 1)})"
                    for combo, jobs in sorted(mixed[envs].items(), key=lambda c: _order(c[0])))
                parts.append(f"{_envs(labels, envs)}: {counts}")
            cell = "a cell mixes" if len(mixed) == 1 else f"{len(mixed)} cells mix"
            notes.append(f"{dataset}, {algorithm}: {cell} jobs of different settings, "
                         f"{'; '.join(parts)} (DomainBed groups runs by dataset, algorithm, test "
                         "environments, hparams_seed and trial_seed only); collect each setting "
                         "from a folder of its own to compare them.")
            continue
        # the IP/OOP flags change only the IP/OOP keys of their own test environments: the
        # standard tables' combinations of test environments do not depend on them
        kept = [i for i, name in enumerate(varying) if name not in ALIGNMENT_ARGS]
        where: dict[tuple, list] = {}  # varying values -> test environment sets
        for envs, combos in cells.items():
            where.setdefault(tuple(next(iter(combos))[i] for i in kept), []).append(envs)
        if len(where) < 2:
            continue
        parts = [f"{_settings_text([varying[i] for i in kept], combo)} at "
                 f"{_runs(labels, where[combo])}" for combo in sorted(where, key=_order)]
        notes.append(f"{dataset}, {algorithm}: its test environments ran with different "
                     "settings, which the tables combine (the Avg column, the Averages table, "
                     f"leave-one-domain-out's runs on pairs): {'; '.join(parts)}.")
    return notes


# Published numbers beside the tables (``--paper KEY``): each entry of dg_plugins.reference under
# every table it matches, with ours minus the paper's
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
    if (setting.get(section.test_key, "ipoop") != entry.setting
            or entry.selection not in (None, section.method.key)):
        return False
    if table.dataset is None:
        return (table.coverage is not None and not entry.per_dataset and entry.available
                and any(key in entry.columns for key in table.keys))
    return table.dataset in entry.datasets and entry.source in (None, table.source)


def paper_comparison(entry: PaperEntry, table: Table) -> PaperComparison:
    """The entry's rows under ``table``, with ours minus the paper's where a row corresponds."""
    rows = {row: _paper_values(entry, table, row) for row in entry.rows}
    mapping = {algorithm: row for algorithm in table.rows
               if (row := entry.paper_row(algorithm)) is not None}
    differences = {algorithm: [None if cell.mean is None or paper is None
                               else cell.mean - paper.mean
                               for cell, paper in zip(table.rows[algorithm], rows[row])]
                   for algorithm, row in mapping.items()}
    selection = entry.selection_note if entry.selection is None else (
        f"{entry.selection} ({entry.selection_note})")
    return PaperComparison(entry.key, f"paper [{entry.key}]: {entry.citation()}",
                           f"  backbone: {entry.backbone}; selection: {selection}; numbers read "
                           f"from {entry.read_from} ({entry.source_kind})", rows, mapping,
                           differences, None if entry.available else entry.claim)


def add_paper_comparisons(report: Report, entries: list[PaperEntry]) -> list[str]:
    """Put each entry under every table it matches (:func:`paper_matches`); returns a note for
    each entry that matches none, saying which tables it needs."""
    notes = []
    for entry in entries:
        matches = [table for section in report.sections for table in section.tables
                   if paper_matches(entry, section, table)]
        for table in matches:
            table.comparisons.append(paper_comparison(entry, table))
        if not matches:
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
