"""results/*.md against the records they name: a table under ``<!-- recheck: TOOL ARGS -->`` is
what TOOL prints today on the committed records (``results/records/``), verbatim; TOOL is
``collect_results`` (run in-process, ``--no_save`` added) or ``mpbm_study_table``
(``results/tools/mpbm_study_table.py``). A table whose run's records are not committed sits under
``<!-- no recheck: REASON -->``. A marker covers the tables up to the next marker; every table of
every results file must be covered by one, so a table cannot escape the check unmarked."""

import contextlib
import functools
import importlib
import io
import os
import re
import shlex
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "results"
MARKER = re.compile(r"<!--\s*(recheck|no recheck):\s*(.*?)\s*-->$")  # a line of its own
TOOLS = ("collect_results", "mpbm_study_table")


def regions(path: Path) -> list[tuple[str | None, str, list[str]]]:
    """``(kind, text, tables)`` per marker of ``path`` in order, ``kind`` None for the tables
    before the first marker; a table is a block of consecutive lines starting with ``|``
    outside code fences, joined by newlines."""
    out, table, fenced = [(None, "", [])], [], False
    for line in path.read_text().splitlines() + [""]:
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if line.startswith("|") and not fenced:
            table.append(line)
            continue
        if table:
            out[-1][2].append("\n".join(table))
            table = []
        match = MARKER.match(line)
        if match and not fenced:
            out.append((match.group(1), match.group(2), []))
    return out


def result_files() -> list[Path]:
    return sorted(RESULTS.glob("*.md"))


def rechecks() -> list[tuple[str, int, str, list[str]]]:
    return [(path.name, i, text, tables) for path in result_files()
            for i, (kind, text, tables) in enumerate(regions(path)) if kind == "recheck"]


@functools.lru_cache(maxsize=None)
def output(command: str) -> str:
    """What ``command`` (``TOOL ARGS``, paths relative to the repository) prints on stdout."""
    tool, *argv = shlex.split(command)
    assert tool in TOOLS, f"recheck marker names {tool!r}; known tools: {', '.join(TOOLS)}"
    if tool == "collect_results":
        from dg_plugins.collect.cli import main
        argv = [*argv, "--no_save"]
    else:
        sys.path.insert(0, str(RESULTS / "tools"))
        try:
            main = importlib.import_module("mpbm_study_table").main
        finally:
            sys.path.remove(str(RESULTS / "tools"))
    cwd, stdout = os.getcwd(), io.StringIO()
    os.chdir(REPO)
    try:
        with contextlib.redirect_stdout(stdout):
            assert main(argv) == 0, f"{command} failed"
    finally:
        os.chdir(cwd)
    return stdout.getvalue()


def missing_tables(command: str, tables: list[str]) -> list[str]:
    printed = output(command)
    return [table for table in tables if table not in printed]


def test_every_table_is_rechecked_or_says_why_not():
    unmarked = {path.name: len(regions(path)[0][2]) for path in result_files()
                if regions(path)[0][2]}
    assert not unmarked, f"tables before any recheck / no recheck marker: {unmarked}"
    for path in result_files():
        for kind, text, tables in regions(path)[1:]:
            assert text, f"{path.name}: a '{kind}' marker without a command or reason"
    assert rechecks(), "no results file names committed records"


@pytest.mark.parametrize("name, index, command, tables", rechecks(),
                         ids=[f"{name}-{index}" for name, index, _, _ in rechecks()])
def test_tables_are_what_the_committed_records_give(name, index, command, tables):
    assert tables, f"{name}: recheck marker {index} ({command}) has no table under it"
    words = shlex.split(command)
    folder = words[words.index("--input_dir") + 1] if "--input_dir" in words else words[1]
    assert list((REPO / folder).rglob("results.jsonl")), f"{name}: no records in {folder}"
    missing = missing_tables(command, tables)
    assert not missing, (f"{name}: tables not printed by `{command}` on the committed records:\n"
                         + "\n\n".join(missing) + "\n\nit prints:\n" + output(command))


def test_a_changed_cell_is_caught():
    """The check is not vacuous: one digit of a rechecked table changed, it no longer matches."""
    name, _, command, tables = rechecks()[0]
    lines = tables[0].splitlines()
    lines[2] = re.sub(r"\d(?= ±)", lambda m: str((int(m.group()) + 1) % 10), lines[2], count=1)
    changed = "\n".join(lines)
    assert changed != tables[0]
    assert missing_tables(command, tables[:1]) == []
    assert missing_tables(command, [changed]) == [changed]
