"""The README's numbers and commands against what the code prints and CI runs: its scripts table
names every paper script and protocol; the cost table (docs/reproduce.md) has the jobs, image
forwards and GPU-hours of ``reproduce --list --forwards`` (rounded as it prints them) and its
GPU-hours sentence names the measurements' device, date and evaluation rate
(``dg_plugins/reference/gpu_step_times.json``); quick-start command 2 is the command ``.ci/run``
runs; the README stays a user's page (at most 200 lines)."""

from __future__ import annotations

import re

from support.helpers import markdown_rows
from support.processes import REPO

from dg_plugins import reproduce

README = (REPO / "README.md").read_text()
COSTS = (REPO / "docs" / "reproduce.md").read_text()


def millions(text: str) -> float:
    return float(text.rstrip("M").replace(",", ""))


def listed_forwards(capsys) -> dict[tuple[str, str], tuple]:
    """``{(script, protocol): (jobs, selection total, all total, GPU-hours with selection, with
    all)}`` from ``--list --forwards``, each total in millions; where the evaluation is partly
    unknown, the training plus the known evaluation (the README says which part it leaves out);
    the GPU-hours cells as printed."""
    assert reproduce.main(["--list", "--forwards"]) == 0
    rows = markdown_rows(capsys.readouterr().out, "| setting | script | protocol |")
    listed = {}
    for _, script, protocol, jobs, train, selection, every, _, total, *gpu in rows:
        if total == "unknown":
            known = [millions(part) for part in (selection.split(" + ")[0], every.split(" + ")[0])]
            totals = (millions(train) + known[0], millions(train) + known[1])
        else:
            match = re.fullmatch(r"([\d,.]+M) \(([\d,.]+M)\)", total)
            totals = (millions(match.group(1)), millions(match.group(2)))
        listed[(script, protocol)] = (int(jobs), *totals, *gpu)
    return listed


def test_readme_reproduction_tables_match_reproduce_list_forwards(capsys):
    """The table of scripts names every script; the cost table has one row per script and
    protocol, one value per cell: its jobs, its image forwards and its GPU-hours with each
    EVAL_SPLITS value (``+ TerraInc`` where the TerraIncognita evaluation is left out, the
    listing's ``+ unknown``; ``+ not measured`` where networks benchmark gpu did not time are)."""
    listed = listed_forwards(capsys)
    scripts = markdown_rows(README, "| script | paper table | protocols |")
    assert {row[0].strip("`") for row in scripts} == {script for script, _ in listed}
    for script, _, protocols, _ in scripts:
        names = [p.split(" (")[0].strip() for p in re.sub(r"\([^)]*\)", "", protocols).split(",")]
        assert {(script.strip("`"), n) for n in names} == {k for k in listed
                                                          if k[0] == script.strip("`")}
    rows = markdown_rows(COSTS, "| script | protocol | jobs |")
    costs = {(script.strip("`"), protocol): (jobs, selection, every, gpu)
             for script, protocol, jobs, _, selection, every, *gpu in rows}
    assert len(costs) == len(rows) and set(costs) == set(listed)
    for key, (jobs, selection, every, gpu) in costs.items():
        want_jobs, want_selection, want_all, *want_gpu = listed[key]
        assert int(jobs) == want_jobs, key
        assert gpu == [cell.replace("+ unknown", "+ TerraInc") for cell in want_gpu], key
        for cell in gpu:
            assert re.fullmatch(r"([\d,]+\.\d|not measured)( \+ (TerraInc|not measured))?",
                                cell), (key, cell)
        for cell, want in ((selection, want_selection), (every, want_all)):
            value = re.fullmatch(r"([\d,.]+M)( \+ TerraInc)?", cell)
            assert value, (key, cell)
            # the README rounds the parts where the evaluation is partly unknown
            assert abs(millions(value.group(1)) - want) <= 0.15, (key, cell)


def test_readme_gpu_hours_name_their_measurements():
    """The sentence under the cost table (docs/reproduce.md) names the device, the date and the evaluation rate of
    the measurements the GPU-hours come from, as the data file holds them."""
    from dg_plugins.reference import gpu_times

    times = gpu_times.load()
    text = " ".join(COSTS.split())
    sentence = text[text.index("GPU-hours: an estimate"):]
    assert sentence.startswith(f"GPU-hours: an estimate from what `benchmark gpu` measured on an "
                               f"{times.device} (`{times.file}`, {times.date};")
    assert f"at the measured {times.eval_images_per_second:g} images/s" in sentence
    assert f"steps of {times.batch_per_domain} images per domain x {times.source_domains} " \
        "domains" in sentence


def test_readme_command_2_is_what_ci_runs():
    (ci,) = [line for line in (REPO / ".ci" / "run").read_text().splitlines()
             if line.startswith("python3 -m venv .venv")]
    assert ci in README
    assert re.search(r"^# 2\. .*\n" + re.escape(ci) + "$", README, re.M)


def test_the_readme_is_a_users_page():
    assert len(README.splitlines()) <= 200
    assert not re.search(r"\b[0-9a-f]{7,40}\b", README), "a commit hash"
    for link in re.findall(r"\]\(([^)#]+)\)", README):
        assert link.startswith("http") or (REPO / link).exists(), link
