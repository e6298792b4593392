"""Loading results.jsonl records (dg_plugins.engine.records; protocol spec 7.5, 9.1, 9.6)."""

import json
import os
import shutil
import time

import numpy as np
import pytest

from dg_plugins.engine import records as R

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
    frame = R.load_records(str(sweep), parallel=False)
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


@pytest.mark.parametrize("use_orjson", [True, False], ids=["orjson", "json"])
def test_parse_line_matches_json_loads(use_orjson, monkeypatch):
    if not use_orjson:
        monkeypatch.setattr(R, "_orjson", None)
    elif R._orjson is None:
        pytest.skip("orjson is not importable")
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


def test_records_of_one_job_share_args(sweep):
    frame = R.load_records(str(sweep), parallel=False)
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
    frame = R.load_records(str(sweep), warn=warnings.append, parallel=False)
    assert len(frame) == 200
    assert any(f"line 3 of {killed}" in w and "not valid JSON" in w for w in warnings)
    assert any(f"line 7 of {killed}" in w for w in warnings)  # the truncated last line
    assert any(f"line 6 of {no_args}" in w and "args" in w for w in warnings)
    assert len(warnings) == 3


def test_warnings_go_to_stderr_and_are_capped(sweep, capsys):
    path = job_dirs(sweep)[0] / "results.jsonl"
    with open(path, "a") as handle:
        handle.write("{broken\n" * (R.MAX_WARNINGS + 5))
    frame = R.load_records(str(sweep), parallel=False)
    assert len(frame) == 200
    err = capsys.readouterr().err
    assert err.count("warning: skipping line") == R.MAX_WARNINGS
    assert "5 more problems not shown" in err


def test_last_line_without_newline_is_parsed(sweep):
    path = job_dirs(sweep)[0] / "results.jsonl"
    path.write_text(path.read_text().rstrip("\n"))
    warnings = []
    frame = R.load_records(str(sweep), warn=warnings.append, parallel=False)
    assert len(frame) == 200 and warnings == []
    assert (frame["job"] == path.parent.name).sum() == 5


def test_blank_lines_and_non_job_entries_are_ignored(sweep):
    path = job_dirs(sweep)[0] / "results.jsonl"
    path.write_text("\n" + path.read_text().replace("\n", "\n\n  \n"))
    (sweep / "notes.txt").write_text("not a job")
    (sweep / "empty_job").mkdir()
    warnings = []
    assert len(R.load_records(str(sweep), warn=warnings.append, parallel=False)) == 200
    assert warnings == []


def test_incomplete_jobs_are_included(sweep):
    for job in job_dirs(sweep)[:3]:
        os.remove(job / "done")
    assert len(R.load_records(str(sweep), parallel=False)) == 200


def test_missing_input_dir_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        R.load_records(str(tmp_path / "nowhere"))
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError, match="file"):
        R.load_records(str(tmp_path / "file"))


def test_empty_dir_gives_an_empty_frame(tmp_path):
    frame = R.load_records(str(tmp_path))
    assert len(frame) == 0 and "args.dataset" in frame.columns


def test_forked_worker_gives_the_same_frame_and_warnings(sweep):
    path = job_dirs(sweep)[-1] / "results.jsonl"
    with open(path, "a") as handle:
        handle.write("{half a line\n")
    warned = {True: [], False: []}
    frames = {parallel: R.load_records(str(sweep), warn=warned[parallel].append,
                                       parallel=parallel) for parallel in (True, False)}
    assert frames[True].equals(frames[False])
    assert len(warned[True]) == 1 and warned[True] == warned[False]


def test_extra_accuracy_keys_become_columns():
    args = {"trial_seed": 0, "dataset": "D", "algorithm": "A", "test_envs": [1],
            "hparams_seed": 0}
    frame = R.records_frame([
        {"args": args, "step": 0, "env0_in_acc": 0.5, "env1_in_ip_acc": 0.25, "loss": 1.0},
        {"args": args, "step": 1, "env0_in_acc": 0.75, "env0_out_acc": 1},
    ])
    assert frame["env1_in_ip_acc"].tolist()[0] == 0.25 and np.isnan(frame["env1_in_ip_acc"][1])
    assert frame["env0_out_acc"].tolist()[1] == 1.0
    assert R.acc_columns(frame, "in") == ["env0_in_acc", "env1_in_acc"]
    assert R.environment_count(frame) == 1
    with pytest.raises(ValueError, match="record 1: missing args.dataset"):
        R.records_frame([{"args": {"trial_seed": 0}, "step": 0}])


def test_no_torch_or_pandas_at_import():
    import subprocess
    import sys

    code = ("import sys, dg_plugins.engine.records; "
            "assert not {'torch', 'pandas', 'numpy'} & set(sys.modules), sys.modules.keys()")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_claims_from_both_ends_are_disjoint_and_cover_every_file(monkeypatch):
    monkeypatch.setattr(R._Claims, "CHUNK", 3)
    claims = R._Claims(20)
    taken, from_front = [], True
    while (chunk := claims.take(from_front, lambda: True)) is not None:
        taken.append(chunk)
        from_front = not from_front
    claims.close()
    assert taken[:4] == [(0, 3), (17, 20), (3, 6), (14, 17)]
    covered = sorted(i for start, end in taken for i in range(start, end))
    assert covered == list(range(20))


def test_a_side_that_died_holding_the_claims_lock_does_not_block_the_other():
    claims = R._Claims(10)
    os.read(claims._lock_read, 1)  # the lock is held by a side that is gone
    assert claims.take(False, lambda: False) == (0, 10)
    claims.close()


@pytest.mark.parametrize("chunk", [1, 64])
def test_worker_and_parent_share_the_files_and_give_the_serial_frame(sweep, chunk,
                                                                      monkeypatch):
    monkeypatch.setattr(R._Claims, "CHUNK", chunk)
    expected = R.load_records(str(sweep), parallel=False)
    loading = R.start_loading(str(sweep), parallel=True)
    frame = loading.result()
    assert frame.equals(expected)


def test_files_claimed_by_a_worker_that_dies_are_read_by_this_process(sweep, monkeypatch):
    monkeypatch.setattr(R._Claims, "CHUNK", 2)
    expected = R.load_records(str(sweep), parallel=False)
    parent, scan = os.getpid(), R._scan

    def scan_then_die_in_the_worker(files, columns=None):
        out = scan(files, columns)
        if os.getpid() != parent:
            os._exit(3)  # the worker dies after its first chunk, its result never sent
        return out

    monkeypatch.setattr(R, "_scan", scan_then_die_in_the_worker)
    loading = R.start_loading(str(sweep), parallel=True)
    while loading._worker.alive():
        time.sleep(0.01)
    assert loading._claims.bounds()[0] == 2  # it had claimed the first two files
    assert loading.result().equals(expected)


def test_an_uncollected_worker_is_reaped(sweep):
    import gc

    loading = R.start_loading(str(sweep), parallel=True)
    pid = loading._worker.pid
    assert pid
    del loading
    gc.collect()
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def test_orjson_and_json_give_the_same_frame(sweep, monkeypatch):
    """Lines go through orjson; lines it rejects (NaN) fall back to json; without orjson, json
    reads everything: the frames are equal."""
    if R._orjson is None:
        pytest.skip("orjson is not importable")
    path = job_dirs(sweep)[0] / "results.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:-1] + [lines[-1].replace('"loss": ', '"loss": NaN, "x": ')])
                    + "\n")
    with_orjson = R.load_records(str(sweep), parallel=False)
    monkeypatch.setattr(R, "_orjson", None)
    assert R.load_records(str(sweep), parallel=False).equals(with_orjson)
