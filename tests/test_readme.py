"""The README's numbers and commands against what the code prints and CI runs: the reproduction
table's jobs and image forwards equal ``reproduce --list --forwards`` (rounded as it prints them),
and quick-start command 2 is the command ``.ci/run`` runs."""

from __future__ import annotations

import re

from helpers import markdown_rows
from processes import REPO

from dg_plugins.scripts import reproduce

README = (REPO / "README.md").read_text()


def millions(text: str) -> float:
    return float(text.rstrip("M").replace(",", ""))


def listed_forwards(capsys) -> dict[tuple[str, str], tuple[int, float, float]]:
    """``{(script, protocol): (jobs, selection total, all total)}`` from ``--list --forwards``,
    each total in millions; where the evaluation is partly unknown, the training plus the known
    evaluation (the README says which part it leaves out)."""
    assert reproduce.main(["--list", "--forwards"]) == 0
    rows = markdown_rows(capsys.readouterr().out, "| setting | script | protocol |")
    listed = {}
    for _, script, protocol, jobs, train, selection, every, _, total in rows:
        if total == "unknown":
            known = [millions(part) for part in (selection.split(" + ")[0], every.split(" + ")[0])]
            totals = (millions(train) + known[0], millions(train) + known[1])
        else:
            match = re.fullmatch(r"([\d,.]+M) \(([\d,.]+M)\)", total)
            totals = (millions(match.group(1)), millions(match.group(2)))
        listed[(script, protocol)] = (int(jobs), *totals)
    return listed


def per_protocol(cell: str, protocols: list[str]) -> dict[str, str]:
    """``{protocol: text}`` of a cell written ``release: X; domainbed: Y``, or one value for
    every protocol (``X each``, or a single protocol's ``X``): the README never uses "/" for it."""
    parts = dict(part.split(": ", 1) for part in cell.split("; ")) if ": " in cell else {}
    if set(parts) == set(protocols):
        return parts
    assert not parts and (cell.split(",")[0].endswith("each") or " each" in cell
                          or len(protocols) == 1), cell
    return {name: cell for name in protocols}


def test_readme_reproduction_table_matches_reproduce_list_forwards(capsys):
    listed = listed_forwards(capsys)
    rows = markdown_rows(README, "| script | paper table | protocols |")
    assert {row[0].strip("`") for row in rows} == {script for script, _ in listed}
    checked = 0
    for script, _, protocols, jobs, _, forwards, _ in rows:
        script = script.strip("`")
        names = [p.split(" (")[0].strip() for p in re.sub(r"\([^)]*\)", "", protocols).split(",")]
        assert {(script, name) for name in names} == {key for key in listed if key[0] == script}
        n_jobs = int(jobs.split()[0])
        for name, text in per_protocol(forwards, names).items():
            selection, every = re.match(r"([\d,.]+M) \(([\d,.]+M)\)", text).groups()
            want_jobs, want_selection, want_all = listed[(script, name)]
            assert n_jobs == want_jobs, (script, name)
            # the README adds the rounded parts where the total is partly unknown
            assert abs(millions(selection) - want_selection) <= 0.15, (script, name, selection)
            assert abs(millions(every) - want_all) <= 0.15, (script, name, every)
            checked += 1
    assert checked == len(listed)


def test_readme_command_2_is_what_ci_runs():
    ci = (REPO / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci in README
    assert re.search(r"^# 2\. .*\n" + re.escape(ci) + "$", README, re.M)
