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


def test_readme_reproduction_tables_match_reproduce_list_forwards(capsys):
    """The table of scripts names every script; the cost table has one row per script and
    protocol, one value per cell: its jobs, and its image forwards with each EVAL_SPLITS value
    (``+ TerraInc`` where the TerraIncognita evaluation is left out)."""
    listed = listed_forwards(capsys)
    scripts = markdown_rows(README, "| script | paper table | protocols |")
    assert {row[0].strip("`") for row in scripts} == {script for script, _ in listed}
    for script, _, protocols, _ in scripts:
        names = [p.split(" (")[0].strip() for p in re.sub(r"\([^)]*\)", "", protocols).split(",")]
        assert {(script.strip("`"), n) for n in names} == {k for k in listed
                                                          if k[0] == script.strip("`")}
    rows = markdown_rows(README, "| script | protocol | jobs |")
    costs = {(script.strip("`"), protocol): (jobs, selection, every)
             for script, protocol, jobs, _, selection, every in rows}
    assert len(costs) == len(rows) and set(costs) == set(listed)
    for key, (jobs, selection, every) in costs.items():
        want_jobs, want_selection, want_all = listed[key]
        assert int(jobs) == want_jobs, key
        for cell, want in ((selection, want_selection), (every, want_all)):
            value = re.fullmatch(r"([\d,.]+M)( \+ TerraInc)?", cell)
            assert value, (key, cell)
            # the README rounds the parts where the evaluation is partly unknown
            assert abs(millions(value.group(1)) - want) <= 0.15, (key, cell)


def test_readme_command_2_is_what_ci_runs():
    ci = (REPO / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci in README
    assert re.search(r"^# 2\. .*\n" + re.escape(ci) + "$", README, re.M)
