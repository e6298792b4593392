"""The notes collect_results prints on stderr after the tables (so that stdout stays DomainBed's):
why a dataset table's cell prints ``X`` (which test environments have records, or which runs the
method lacks), when an Averages cell is a mean over other test environments than its
dataset's columns or another row's, and which runs used train's compute settings at other values
than their defaults. Empty for a complete sweep, such as DomainBed's fixture."""

from __future__ import annotations

import pandas as pd

from dg_plugins.collect.selection import GroupedRecords
from dg_plugins.collect.single_source import SINGLE_SOURCE_KEY, single_source_runs
from dg_plugins.collect.tables import Section
from dg_plugins.collect.udg import UDG_KEY

LOO_KEY = "loo"  # the --selection key of leave-one-domain-out (its X cells get their own note)


def _names(labels: list[str], indexes) -> str:
    return ", ".join(labels[i] if i < len(labels) else str(i) for i in sorted(indexes))


def _listing(items: list[str], limit: int = 8) -> str:
    """``a, b, c`` (at most ``limit`` items, then ``and N more``)."""
    if len(items) <= limit:
        return ", ".join(items)
    return f"{', '.join(items[:limit])} and {len(items) - limit} more"


def _envs(labels: list[str], indexes) -> str:
    """``test environment A`` / ``test environments A, C``."""
    plural = "s" if len(indexes) > 1 else ""
    return f"test environment{plural} {_names(labels, indexes)}"


def missing_cell_notes(grouped: GroupedRecords, sections: list[Section]) -> list[str]:
    """Why cells of the standard and IP/OOP dataset tables print ``X``: per dataset, the
    algorithms without a single-test-environment record for some of its environments (every
    method's table shows X there, and Avg is X for that row); per section, the X cells whose runs
    exist but which the method cannot score (leave-one-domain-out without the pair runs, a chosen
    record without the section's test key)."""
    single = grouped.single()
    info = grouped.groups.iloc[single["group"].to_numpy()]
    ran: dict[tuple, set] = {}
    for dataset, algorithm, env in zip(info["dataset"], info["algorithm"], info["test_env"]):
        ran.setdefault((dataset, algorithm), set()).add(int(env))
    present = set(zip(grouped.records["args.dataset"], grouped.records["args.algorithm"]))
    runs = single_source_runs(grouped)
    single_source = set(zip(runs["dataset"], runs["algorithm"])) if not runs.empty else set()
    notes, explained = [], set()
    for section in sections:
        if section.test_key in (SINGLE_SOURCE_KEY, UDG_KEY):
            continue
        unscored: dict[str, list[str]] = {}  # dataset -> "<algorithm> at <envs>"
        for table in section.tables:
            if table.dataset is None:
                continue
            labels = table.keys[:-1]
            full = set(range(len(labels)))
            not_run: dict[tuple, list[str]] = {}  # (envs with records, missing) -> algorithms
            for algorithm, cells in table.rows.items():
                missing = {i for i in full if cells[i].mean is None}
                have = ran.get((table.dataset, algorithm), set()) & full
                if missing - have:
                    not_run.setdefault((frozenset(have), frozenset(missing - have)),
                                       []).append(algorithm)
                if missing & have:
                    unscored.setdefault(table.dataset, []).append(
                        f"{algorithm} at {_names(labels, missing & have)}")
            if table.dataset in explained:
                continue
            explained.add(table.dataset)
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
                notes.append(f"{table.dataset}: X for {who} in every method's table: {why}. "
                             "A row with an X has Avg X, as in DomainBed.")
        for dataset, cells in unscored.items():
            if section.method.key == LOO_KEY:
                why = ("leave-one-domain-out scores test environment t with the runs whose test "
                       "environments are [t, j], for every other environment j, at the same "
                       "hparams and steps, and those are missing (sweep launches them unless "
                       "--single_test_envs or --test_env_sets leaves them out)")
            else:
                why = f"the chosen records have no {section.test_key.format(t='<t>')}"
            notes.append(f"{dataset}, {section.title[len('Model selection: '):]}: X for "
                         f"{'; '.join(cells)} although those runs exist: {why}.")
    return notes


def averages_notes(sections: list[Section], labels_of) -> list[str]:
    """When an Averages cell is a mean over other test environments than its dataset's columns,
    or than another row's (DomainBed averages each trial over the test environments it has):
    one note per dataset and pattern, naming the methods it holds for. ``labels_of(dataset)``
    gives a dataset's environment labels."""
    bodies: dict[str, list[str]] = {}
    for section in sections:
        for table in section.tables:
            if table.coverage is None:
                continue
            for dataset in table.keys[:-1]:
                labels = labels_of(dataset)
                full = tuple(range(len(labels)))
                described = {}
                for algorithm in table.rows:
                    trials = table.coverage.get((algorithm, dataset))
                    if not trials:
                        continue
                    sets = sorted(set(trials.values()))
                    if len(sets) == 1:
                        described[algorithm] = _names(labels, sets[0])
                        continue
                    parts = []
                    for envs in sets:
                        seeds = sorted(t for t, e in trials.items() if e == envs)
                        parts.append((seeds, f"{_names(labels, envs)} (trial "
                                             f"{', '.join(map(str, seeds))})"))
                    described[algorithm] = " and ".join(text for _, text in sorted(parts))
                whole = _names(labels, full)
                if all(text == whole for text in described.values()):
                    continue
                groups: dict[str, list[str]] = {}
                for algorithm, text in described.items():
                    groups.setdefault(text, []).append(algorithm)
                parts = [f"{_listing(algorithms)} over {text}" for text, algorithms in
                         groups.items()]
                body = (f"Averages table, {dataset} column: DomainBed averages each trial over the "
                        f"test environments it has, here {'; '.join(parts)} (the dataset has "
                        f"{whole})")
                if len(groups) > 1:
                    body += ": these rows average different domains"
                elif described:
                    body += ", so it can show a number where the dataset's table prints X"
                bodies.setdefault(body, []).append(section.title[len("Model selection: "):])
    return [f"{body} [{'; '.join(dict.fromkeys(methods))}]." for body, methods in bodies.items()]


def compute_notes(records: pd.DataFrame) -> list[str]:
    """How many runs (job folders) used train's compute settings at other values than their
    defaults (``--precision``, ``--channels_last``, ``--deterministic``; the records'
    ``args.compute``), per combination, so that tables never mix them silently; no note when
    every run used the defaults."""
    if "args.compute" not in records or records.empty:
        return []
    runs = dict(zip(records["job"], records["args.compute"]))
    counts: dict[tuple, int] = {}
    for settings in runs.values():
        settings = settings if isinstance(settings, tuple) else ()  # NaN: the defaults
        counts[settings] = counts.get(settings, 0) + 1
    if set(counts) == {()}:
        return []
    total, parts = len(runs), []
    for settings, count in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
        if settings:
            flags = " ".join(f"--{name} {str(value).lower() if isinstance(value, bool) else value}"
                             for name, value in settings)
            parts.append(f"{count} used {flags}")
    if () in counts:
        parts.append(f"{counts[()]} the defaults (--precision fp32, deterministic)")
    return [f"Compute settings: of the {total} runs (job folders) read, {'; '.join(parts)}. "
            "Reduced precision and non-deterministic kernels change accuracies by rounding."]
