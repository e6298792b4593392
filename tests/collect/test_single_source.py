"""Single-source selection and tables: selection semantics on synthetic records, when the tables
appear, and a real ``sweep --single_source`` run through collect_results."""

import subprocess
import sys

import pytest

from dg_plugins.collect import formats
from dg_plugins.collect import report as report_lib
from dg_plugins.collect.selection import IID, LOO, ORACLE
from dg_plugins.collect.single_source import (select_single_source, single_source_datasets,
                                              single_source_tables)

from support.helpers import frame_of


def record(source, step, n_envs=4, hparams_seed=0, trial=0, dataset="D", accs=None):
    rec = {"args": {"trial_seed": trial, "dataset": dataset, "algorithm": "A",
                    "test_envs": [i for i in range(n_envs) if i != source],
                    "hparams_seed": hparams_seed, "output_dir": "o"},
           "step": step, "hparams": {}}
    for i in range(n_envs):
        rec[f"env{i}_in_acc"] = rec[f"env{i}_out_acc"] = 0.5
    rec.update(accs or {})
    return rec


def test_iid_keeps_the_best_source_validation_checkpoint():
    recs = [record(0, 0, accs={"env0_out_acc": 0.6, "env1_in_acc": 0.1}),
            record(0, 100, accs={"env0_out_acc": 0.9, "env1_in_acc": 0.3, "env2_in_acc": 0.4}),
            record(0, 200, accs={"env0_out_acc": 0.9, "env1_in_acc": 0.8})]  # tie: earliest wins
    row = select_single_source(frame_of(recs), IID).iloc[0]
    assert (row["source"], row["step"], row["val_acc"]) == (0, 100, 0.9)
    assert (row["acc0"], row["acc1"], row["acc2"]) == (0.9, 0.3, 0.4)  # source column: out acc


def test_oracle_takes_the_last_step_and_target_validation():
    recs = [record(1, 0, accs={"env0_out_acc": 1.0}), record(1, 50, accs={"env2_in_acc": 0.7})]
    row = select_single_source(frame_of(recs), ORACLE).iloc[0]
    assert row["step"] == 50 and row["acc2"] == 0.7
    assert row["val_acc"] == pytest.approx(0.5)  # mean of targets 0, 2, 3 out accs at step 50


def test_hparams_ties_go_to_the_largest_seed_and_best_wins():
    recs = [record(0, 0, hparams_seed=s, accs={"env0_out_acc": v, "env1_in_acc": s / 10})
            for s, v in [(0, 0.7), (1, 0.7), (2, 0.6)]]
    assert select_single_source(frame_of(recs), IID).iloc[0]["hparams_seed"] == 1


def test_iid_reports_the_best_source_validation_checkpoint_not_the_last():
    recs = [record(0, 0, accs={"env0_out_acc": 0.6, "env1_in_acc": 0.1}),
            record(0, 100, accs={"env0_out_acc": 0.9, "env1_in_acc": 0.3}),
            record(0, 200, accs={"env0_out_acc": 0.7, "env1_in_acc": 0.8})]
    row = select_single_source(frame_of(recs), IID).iloc[0]
    assert (row["step"], row["acc0"], row["acc1"]) == (100, 0.9, 0.3)
    [table] = single_source_tables(frame_of(recs), IID)
    assert table.rows["A"][1].text() == "30.0 +/- 0.0"  # the best checkpoint's target, not 80
    [table] = single_source_tables(frame_of(recs), ORACLE)
    assert table.rows["A"][1].text() == "80.0 +/- 0.0"  # the oracle's: the last checkpoint


def test_loo_does_not_apply():
    with pytest.raises(ValueError, match="single-source selection supports"):
        select_single_source(frame_of([record(0, 0)]), LOO)


def test_table_layout_and_trial_means():
    recs = [record(2, 0, trial=t, accs={"env0_in_acc": a, "env2_out_acc": 0.9})
            for t, a in [(0, 0.2), (1, 0.4)]]
    [table] = single_source_tables(frame_of(recs), IID)
    assert table.header == "Dataset: D, single source: 2, model selection method: " \
                           "training-domain validation set"
    assert table.col_labels == ["0", "1", "2 (source)", "3", "Avg"]
    cells = table.rows["A"]
    assert cells[0].text() == "30.0 +/- 7.1" and cells[0].n == 2
    assert cells[2].text() == "90.0 +/- 0.0"
    assert cells[4].mean == pytest.approx((30 + 50 + 50) / 3)  # Avg over the targets only


def test_tables_appear_only_where_unambiguous():
    # 3 environments: DomainBed's pair runs look like single-source runs; with single-test-env
    # records present (a standard sweep) nothing is added, so the output stays DomainBed's.
    standard = [record(0, 0, n_envs=3), {**record(0, 0, n_envs=3),
                                         "args": {**record(0, 0, n_envs=3)["args"],
                                                  "test_envs": [0]}}]
    assert single_source_datasets(frame_of(standard)) == []
    assert single_source_datasets(frame_of([record(0, 0, n_envs=3)])) == ["D"]
    assert single_source_datasets(frame_of([record(0, 0, n_envs=4)])) == ["D"]
    report = report_lib.build_report(frame_of(standard), [IID])
    assert "single source" not in formats.render(report)
    report = report_lib.build_report(frame_of(standard), [IID], single_source="on")
    assert "single source: 0" in formats.render(report)


def test_sweep_single_source_end_to_end(tmp_path, capsys):
    """The real sweep command; collect_results' main on its folder, in this process."""
    from dg_plugins.scripts import collect_results

    sweep = [sys.executable, "-m", "dg_plugins.scripts.sweep", "launch", "--datasets", "Debug28",
             "--algorithms", "ERM", "--data_dir", "unused", "--output_dir", str(tmp_path),
             "--command_launcher", "local", "--n_hparams", "1", "--n_trials", "1",
             "--single_source", "--steps", "2", "--hparams", '{"batch_size": 8}',
             "--skip_confirmation"]
    subprocess.run(sweep, check=True, capture_output=True, timeout=600)
    capsys.readouterr()
    assert collect_results.main(["--input_dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "Total records: 6" in out  # 3 sources x records at steps 0 and 1
    for source in "012":
        header = (f"-------- Dataset: Debug28, single source: {source}, model selection method: "
                  "training-domain validation set")
        assert header in out
        lines = out.splitlines()
        row = lines[lines.index(header) + 2]
        assert row.startswith("ERM ") and "X" not in row, out
