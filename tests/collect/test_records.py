"""Loading results.jsonl records (dg_plugins.collect.records; ``domainbed/lib/reporting.py``)."""

import json
import math
import os
import shutil

import numpy as np
import pandas as pd
import pytest

from dg_plugins.collect import records as R
from dg_plugins.collect.tables import environment_count

FIXTURE = "domainbed_sweep_data"


@pytest.fixture
def sweep(shared_fixtures, tmp_path):
    """A writable copy of the fixture sweep (40 VLCS jobs, 200 records)."""
    target = tmp_path / "sweep"
    shutil.copytree(shared_fixtures / FIXTURE, target)
    return target


def job_dirs(sweep):
    return sorted(p for p in sweep.iterdir() if (p / "results.jsonl").is_file())


def test_fixture_columns_and_values(sweep):
    frame = R.load_records(str(sweep))
    assert len(frame) == 200
    for column in (*R.ARG_COLUMNS, "step", "hparams", "job", "line",
                   *(f"env{i}_{s}_acc" for i in range(4) for s in ("in", "out"))):
        assert column in frame.columns
    assert "loss" not in frame.columns and "epoch" not in frame.columns
    assert set(frame["args.dataset"]) == {"VLCS"}
    assert set(frame["step"]) == {0, 300, 600, 900, 1000}
    assert all(isinstance(envs, tuple) for envs in frame["args.test_envs"])
    # a row equals its line of the file
    row = frame.iloc[7]
    path = sweep / row["job"] / "results.jsonl"
    record = json.loads(path.read_text().splitlines()[row["line"] - 1])
    assert row["hparams"] == record["hparams"]
    assert row["args.test_envs"] == tuple(record["args"]["test_envs"])
    assert row["env2_out_acc"] == record["env2_out_acc"]


def test_parse_line_matches_json_loads():
    args = {"algorithm": "ERM", "hparams": '{"lr": 1}', "test_envs": [0], "trial_seed": 0}
    base = json.dumps({"args": args, "env0_in_acc": 0.5, "step": 1}, sort_keys=True)
    lines = [
        base,
        json.dumps({"args": dict(args, trial_seed=1), "step": 2}),
        base[:-1] + ', "args": {"x": 1}}',  # a repeated key: the last one wins, as in json
        '  {"args": {"a": 1}, "step": 0}  ',  # surrounding whitespace
        '{"args": {"a": 1}, "env0_in_acc": NaN, "step": 0}',  # NaN: orjson rejects, json reads
        '{"args": {"a": 1}, "env0_in_acc": Infinity, "step": 0}',
        '{"s": "\\ud800"}',  # a lone surrogate
        "[1, 2]",
        '"text"',
    ]
    for line in lines:
        value, expected = R.parse_line(line), json.loads(line)
        assert json.dumps(value) == json.dumps(expected)  # NaN != NaN, so compare the texts
    for bad in [base[:-1], base + "x", base + " {}", '{"args": {"a": 1}, "step"', ""]:
        with pytest.raises(ValueError):
            R.parse_line(bad)


def test_every_record_of_a_job_is_a_row(sweep):
    frame = R.load_records(str(sweep))
    first_job = frame[frame["job"] == frame["job"].iloc[0]]
    assert len(first_job) == 5


def test_truncated_and_malformed_lines_are_skipped_with_a_warning(sweep):
    jobs = job_dirs(sweep)
    killed = jobs[0] / "results.jsonl"
    lines = killed.read_text().splitlines(keepends=True)
    killed.write_text("".join(lines[:2]) + "not json\n" + "".join(lines[2:]) + lines[0][:300])
    no_args = jobs[1] / "results.jsonl"
    with open(no_args, "a") as handle:
        handle.write(json.dumps({"step": 5, "env0_in_acc": 0.1}) + "\n")
    warnings = []
    frame = R.load_records(str(sweep), warn=warnings.append)
    assert len(frame) == 200
    assert any(f"line 3 of {killed}" in w and "not valid JSON" in w for w in warnings)
    assert any(f"line 7 of {killed}" in w for w in warnings)  # the truncated last line
    assert any(f"line 6 of {no_args}" in w and "args" in w for w in warnings)
    assert len(warnings) == 3


def test_warnings_go_to_stderr_and_are_capped(sweep, capsys):
    path = job_dirs(sweep)[0] / "results.jsonl"
    with open(path, "a") as handle:
        handle.write("{broken\n" * (R.MAX_WARNINGS + 5))
    frame = R.load_records(str(sweep))
    assert len(frame) == 200
    err = capsys.readouterr().err
    assert err.count("warning: skipping line") == R.MAX_WARNINGS
    assert "5 more problems not shown" in err


def test_last_line_without_newline_is_parsed(sweep):
    path = job_dirs(sweep)[0] / "results.jsonl"
    path.write_text(path.read_text().rstrip("\n"))
    warnings = []
    frame = R.load_records(str(sweep), warn=warnings.append)
    assert len(frame) == 200 and warnings == []
    assert (frame["job"] == path.parent.name).sum() == 5


def test_blank_lines_and_non_job_entries_are_ignored(sweep):
    path = job_dirs(sweep)[0] / "results.jsonl"
    path.write_text("\n" + path.read_text().replace("\n", "\n\n  \n"))
    (sweep / "notes.txt").write_text("not a job")
    (sweep / "empty_job").mkdir()
    warnings = []
    assert len(R.load_records(str(sweep), warn=warnings.append)) == 200
    assert warnings == []


def test_incomplete_jobs_are_included(sweep):
    for job in job_dirs(sweep)[:3]:
        os.remove(job / "done")
    assert len(R.load_records(str(sweep))) == 200


def test_missing_input_dir_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        R.load_records(str(tmp_path / "nowhere"))
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError, match="file"):
        R.load_records(str(tmp_path / "file"))


def test_empty_dir_gives_an_empty_frame(tmp_path):
    frame = R.load_records(str(tmp_path))
    assert len(frame) == 0 and "args.dataset" in frame.columns


def write_job(root, name, lines):
    (root / name).mkdir(parents=True)
    (root / name / "results.jsonl").write_text("".join(line + "\n" for line in lines))


ARGS = {"trial_seed": 0, "dataset": "D", "algorithm": "A", "test_envs": [1], "hparams_seed": 0}


def test_extra_accuracy_keys_become_columns(tmp_path):
    write_job(tmp_path, "job", [
        json.dumps({"args": ARGS, "step": 0, "env0_in_acc": 0.5, "env1_in_ip_acc": 0.25,
                    "loss": 1.0}),
        json.dumps({"args": ARGS, "step": 1, "env0_in_acc": 0.75, "env0_out_acc": 1})])
    frame = R.load_records(str(tmp_path))
    assert frame["env1_in_ip_acc"].tolist()[0] == 0.25 and np.isnan(frame["env1_in_ip_acc"][1])
    assert frame["env0_out_acc"].tolist()[1] == 1.0
    assert [c for c in frame.columns if c.endswith("_acc")] == [
        "env0_in_acc", "env0_out_acc", "env1_in_ip_acc"]  # environment, then split order
    assert "loss" not in frame.columns
    assert environment_count(frame) == 1


def test_num_classes_is_kept_per_record(tmp_path):
    write_job(tmp_path, "new", [json.dumps({"args": ARGS, "step": s, "env0_in_acc": 0.5,
                                            "num_classes": 3}) for s in range(2)])
    write_job(tmp_path, "old", [json.dumps({"args": ARGS, "step": 0, "env0_in_acc": 0.5})])
    frame = R.load_records(str(tmp_path)).set_index("job")
    assert frame.loc["new", "num_classes"].tolist() == [3.0, 3.0]
    assert np.isnan(frame.loc["old", "num_classes"])
    assert R.acc_width(frame) == 1  # not an environment column


def test_job_progress_counts_job_folders_and_done(tmp_path):
    write_job(tmp_path, "named_by_hand", [json.dumps({"args": ARGS, "step": 0})])
    (tmp_path / "named_by_hand" / "done").write_text("")
    (tmp_path / ("a" * 32)).mkdir()  # launched by a sweep, not started
    (tmp_path / ("b" * 32)).mkdir()
    (tmp_path / ("b" * 32) / "done").write_text("")
    (tmp_path / "udg_pretrain").mkdir()  # shared pretraining, not a job
    (tmp_path / "results.txt").write_text("")
    progress = R.job_progress(str(tmp_path))
    assert (progress.total, progress.done, progress.not_done) == (3, 2, ["a" * 32])


def reference_frame(root):
    """The records DataFrame built the plain way: json per line, one dict per row."""
    rows = []
    for entry in os.listdir(root):
        path = root / entry / "results.jsonl"
        if not path.is_file():
            continue
        for number, line in enumerate(path.read_text().split("\n"), 1):
            try:
                record = json.loads(line)
            except ValueError:
                continue
            args = record.get("args") if isinstance(record, dict) else None
            if (not isinstance(args, dict) or "step" not in record
                    or any(k not in args for k in R.REQUIRED_ARGS)
                    or not all(type(e) is int for e in args["test_envs"])):
                continue
            row = {f"args.{k}": args.get(k) for k in (*R.REQUIRED_ARGS, "output_dir")}
            row["args.test_envs"] = tuple(args["test_envs"])
            row.update(step=record["step"], hparams=record.get("hparams"), job=entry,
                       line=number)
            labels = record.get("environments")
            row["environments"] = (tuple(labels) if isinstance(labels, list) and labels
                                   and all(isinstance(v, str) for v in labels) else None)
            for key, value in record.items():
                if R.ACC_KEY.fullmatch(key):
                    row[key] = float(value) if isinstance(value, (int, float)) else np.nan
            row["nonfinite"] = tuple((k, "NaN" if v != v else str(v)) for k, v in record.items()
                                     if type(v) is float and not math.isfinite(v)) or np.nan
            rows.append(row)
    return rows


def test_column_store_matches_a_plain_loader_on_mixed_records(tmp_path):
    """Jobs whose records change keys, args, or hold bad values go record by record; the frame
    is the one a plain per-record loader gives (values, order, NaN for absent keys)."""
    other = dict(ARGS, test_envs=[0, 2], output_dir="out")
    write_job(tmp_path, "uniform", [json.dumps({"args": ARGS, "step": s, "env0_in_acc": s / 10,
                                                "env1_in_acc": 0.5, "hparams": {"lr": s},
                                                "environments": ["a", "b"]})
                                    for s in range(3)])
    write_job(tmp_path, "mixed", [
        json.dumps({"args": ARGS, "step": 0, "env0_in_acc": 0.1, "environments": ["x", 1]}),
        json.dumps({"args": ARGS, "step": 0, "env0_in_acc": 0.1, "environments": ["x", "y"]}),
        json.dumps({"args": other, "step": 1, "env0_in_acc": 0.2, "env2_out_acc": 0.3}),
        json.dumps({"args": other, "step": 2, "env0_in_acc": "high", "env2_out_acc": True}),
        '{"args": {"trial_seed": 0}, "step": 3}',
        "[1, 2]",
        json.dumps({"args": ARGS, "step": 4, "env0_in_acc": float("nan"), "env3_in_acc": 1e400}),
        json.dumps({"args": dict(ARGS, test_envs=["0"]), "step": 5}),
        json.dumps({"args": ARGS, "env0_in_acc": 0.9}),  # no step
    ])
    write_job(tmp_path, "resumed", [json.dumps({"args": ARGS, "step": 0, "env0_in_acc": 0.4})]
              * 2 + [json.dumps({"args": other, "step": 0, "env0_in_acc": 0.6})])
    warnings = []
    frame = R.load_records(str(tmp_path), warn=warnings.append)
    expected = reference_frame(tmp_path)
    assert len(frame) == len(expected) == 11 and len(warnings) == 4
    for i, row in enumerate(expected):
        got = frame.iloc[i]
        for key in frame.columns:
            value = row.get(key, np.nan)
            if isinstance(value, float) and np.isnan(value):
                assert pd.isna(got[key]), (i, key)
            else:
                assert got[key] == value, (i, key)
        assert all(key in frame.columns for key in row)


def test_no_torch_at_import():
    import subprocess
    import sys

    code = ("import sys, dg_plugins.collect.records; "
            "assert not {'torch', 'torchvision'} & set(sys.modules), sys.modules.keys()")
    subprocess.run([sys.executable, "-c", code], check=True)
