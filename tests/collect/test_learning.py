"""collect_results --learning_check: per job, first vs last checkpoint against chance."""

import json

from dg_plugins.collect import learning
from dg_plugins.collect.records import load_records
from dg_plugins.scripts import collect_results


def write_job(sweep, name, algorithm, test_envs, accs_by_step, dataset="RotatedMNIST5k",
              label_fraction=None, done=True, num_classes=None):
    """A job folder whose records hold, per step, ``env{i}_in_acc = env{i}_out_acc = acc[i]``
    (and ``num_classes`` when given)."""
    job = sweep / name
    job.mkdir(parents=True)
    lines = []
    for step, accs in accs_by_step.items():
        args = {"algorithm": algorithm, "dataset": dataset, "test_envs": test_envs,
                "trial_seed": 0, "hparams_seed": 0, "output_dir": str(job)}
        if label_fraction is not None:
            args["label_fraction"] = label_fraction
        record = {"args": args, "step": step, "hparams": {}}
        if num_classes is not None:
            record["num_classes"] = num_classes
        for i, acc in enumerate(accs):
            record[f"env{i}_in_acc"] = record[f"env{i}_out_acc"] = acc
        lines.append(json.dumps(record))
    (job / "results.jsonl").write_text("\n".join(lines) + "\n")
    if done:
        (job / "done").write_text("done")


def test_rows_average_sources_and_targets_and_judge_against_chance(tmp_path):
    write_job(tmp_path, "a", "ERM", [2], {0: [0.1, 0.1, 0.1], 50: [0.3, 0.5, 0.2],
                                          100: [0.4, 0.6, 0.3]})
    # improves by 8 points but stays below chance + margin (chance 10%: needs 15%)
    write_job(tmp_path, "b", "MAE", [0], {0: [0.2, 0.02, 0.04], 100: [0.2, 0.1, 0.12]})
    # above chance but no better than its first checkpoint
    write_job(tmp_path, "c", "GMoE", [0], {100: [0.5, 0.5, 0.5], 0: [0.5, 0.48, 0.48]})
    rows = learning.learning_rows(load_records(str(tmp_path)), {"RotatedMNIST5k": 10})
    a, b, c = (rows.set_index("job").loc[name] for name in "abc")
    assert (a.source_first, a.source_last) == (0.1, 0.5)  # mean of envs 0 and 1
    assert (a.target_first, a.target_last) == (0.1, 0.3)
    assert (a.first_step, a.last_step, a.learns) == (0, 100, True)
    assert round(b.source_last, 6) == 0.11 and not b.learns
    assert (c.first_step, c.last_step) == (0, 100) and not c.learns
    assert a.chance == 0.1 and a.labels == ""


def test_chance_comes_from_the_records_class_count(tmp_path, capsys):
    """A PACS copy with 3 classes: 30% is below chance (33%), although it is far above the
    catalogue's 1/7; records without num_classes fall back to the catalogue and say so."""
    accs = {0: [0.1, 0.1, 0.1, 0.1], 100: [0.3, 0.3, 0.3, 0.3]}
    write_job(tmp_path, "three", "ERM", [0], accs, dataset="PACS", num_classes=3)
    write_job(tmp_path, "old", "DMG", [0], accs, dataset="PACS")
    rows = learning.learning_rows(load_records(str(tmp_path)), {"PACS": 7}).set_index("job")
    assert rows.loc["three", "chance"] == 1 / 3 and not rows.loc["three", "learns"]
    assert rows.loc["three", "chance_from"] == "record"
    assert rows.loc["old", "chance"] == 1 / 7 and rows.loc["old", "learns"]
    assert rows.loc["old", "chance_from"] == "catalogue"
    assert collect_results.main(["--input_dir", str(tmp_path), "--learning_check"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert next(line for line in lines if line.split()[:1] == ["ERM"]).split()[-3:-1] == [
        "33.3", "NO"]
    assert next(line for line in lines if line.split()[:1] == ["DMG"]).split()[-3:-1] == [
        "14.3*", "yes"]
    assert lines[-1].startswith("chance of 1 job (marked *) is from the dataset catalogue: "
                                "their records have no num_classes")


def test_unknown_dataset_is_judged_by_first_vs_last_only(tmp_path):
    write_job(tmp_path, "j", "ERM", [1], {0: [0.4, 0.4], 10: [0.5, 0.4]}, dataset="Mine")
    [row] = learning.learning_rows(load_records(str(tmp_path)), {}).itertuples()
    assert row.learns and row.chance != row.chance  # NaN


def test_collect_results_prints_the_check_and_a_summary(tmp_path, capsys):
    write_job(tmp_path, "good", "ERM", [1], {0: [0.1, 0.1], 100: [0.6, 0.3]})
    write_job(tmp_path, "udg", "DisMAE", [1], {0: [0.1, 0.1], 100: [0.1, 0.1]},
              label_fraction=0.1)
    assert collect_results.main(["--input_dir", str(tmp_path), "--learning_check"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("-------- Learning check")
    assert "Labels" in lines[1] and "Source val acc" in lines[1]
    erm = next(line for line in lines if line.split()[0] == "ERM")
    assert "10.0 -> 60.0" in erm and "10.0 -> 30.0" in erm and erm.split()[-2] == "yes"
    dismae = next(line for line in lines if line.split()[0] == "DisMAE")
    assert "10%" in dismae and dismae.split()[-2] == "NO"
    assert lines[-2].startswith("1 of 2 finished jobs do not learn")
    assert lines[-1].startswith("chance of 2 jobs (marked *) is from the dataset catalogue")
    assert not (tmp_path / "results.txt").exists()  # printed only


def test_a_running_job_is_shown_but_not_judged(tmp_path, capsys):
    write_job(tmp_path, "done", "ERM", [1], {0: [0.1, 0.1], 100: [0.6, 0.3]})
    write_job(tmp_path, "busy", "DMG", [1], {0: [0.1, 0.1]}, done=False)
    assert collect_results.main(["--input_dir", str(tmp_path), "--learning_check"]) == 0
    lines = capsys.readouterr().out.splitlines()
    dmg = next(line for line in lines if line.split()[0] == "DMG")
    assert dmg.split()[-2] == "running"
    assert lines[-2].startswith("1 finished job (1 still running, not judged); every one learns")


def test_the_summary_states_the_margin_the_rows_were_judged_with(tmp_path):
    """A 10-point gain learns with the default 5-point margin, not with a 20-point one, and each
    summary names the margin its verdict used."""
    write_job(tmp_path, "a", "ERM", [2], {0: [0.3, 0.3, 0.3], 100: [0.4, 0.4, 0.4]})
    records = load_records(str(tmp_path))
    default = learning.render(learning.learning_rows(records, {"RotatedMNIST5k": 10}))
    strict = learning.render(learning.learning_rows(records, {"RotatedMNIST5k": 10}, margin=0.2))
    assert "every one learns" in default and "at least 5 points above" in default
    assert "1 of 1 finished jobs do not learn" in strict and "less than 20 points above" in strict
