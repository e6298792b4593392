"""IP/OOP keys in train records, the evaluation-only command, and collect_results' IP/OOP tables,
on real train runs (ERM, tiny ViT, the 40 PACS images, 3 steps)."""

import json
import math
import os
import shutil

import pytest

from dg_plugins.alignment import reevaluate
from dg_plugins.scripts import alignment_eval, plot_alignment
from dg_plugins.scripts import train as train_cli
from support.helpers import read_records

THRESHOLD = "0.25"
HPARAMS = json.dumps({"backbone": "vit", "vit_arch": "dg_vit_test_patch32_224",
                      "pretrained": False, "batch_size": 4, "image_size": 32,
                      "data_augmentation": False})
TIMING = {"step_time", "mem_gb"}


def train(out, pacs_dir, test_env, trial_seed, *extra):
    argv = ["--dataset", "PACS", "--data_dir", pacs_dir, "--algorithm", "ERM",
            "--test_envs", str(test_env), "--trial_seed", str(trial_seed), "--steps", "3",
            "--checkpoint_freq", "1", "--hparams", HPARAMS, "--n_workers", "0",
            "--output_dir", str(out), *extra]
    assert train_cli.main(argv) == 0


@pytest.fixture(scope="module")
def runs(tmp_path_factory, pacs_dir, scores_file):
    """A sweep folder of 4 jobs trained with IP/OOP keys (test env 0 and 1, trials 0 and 1), and
    the job of test env 0 / trial 0 trained again without them."""
    root = tmp_path_factory.mktemp("alignment_runs")
    sweep = root / "sweep"
    alignment = ["--alignment_scores", scores_file, "--alignment_threshold", THRESHOLD]
    jobs = {}
    for trial in (0, 1):
        for env in (0, 1):
            jobs[(env, trial)] = sweep / f"erm_te{env}_tr{trial}"
            train(jobs[(env, trial)], pacs_dir, env, trial, *alignment,
                  *(["--save_model_every_checkpoint"] if (env, trial) == (0, 0) else []))
    plain = root / "plain"
    train(plain, pacs_dir, 0, 0, "--save_model_every_checkpoint")
    return {"sweep": sweep, "jobs": jobs, "plain": plain, "root": root}


def subset_keys(record):
    return {k: v for k, v in record.items() if reevaluate.SUBSET_KEY.match(k)}


def same(a, b):
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a)
                      and math.isnan(b))


def test_ip_oop_keys_only_for_test_envs(runs):
    for (env, _), job in runs["jobs"].items():
        for record in read_records(job):
            expected = {f"env{env}_{split}_{subset}_{kind}" for split in ("in", "out")
                        for subset in ("ip", "oop") for kind in ("acc", "count")}
            assert set(subset_keys(record)) == expected
            assert record["args"]["alignment_threshold"] == float(THRESHOLD)
    assert all(not subset_keys(r) for r in read_records(runs["plain"]))


def test_ip_and_oop_recombine_to_the_env_accuracy(runs, pacs):
    for (env, _), job in runs["jobs"].items():
        sizes = {"out": int(len(pacs[env]) * 0.2)}
        sizes["in"] = len(pacs[env]) - sizes["out"]
        for record in read_records(job):
            for split in ("in", "out"):
                counts = [record[f"env{env}_{split}_{s}_count"] for s in ("ip", "oop")]
                accs = [record[f"env{env}_{split}_{s}_acc"] for s in ("ip", "oop")]
                assert sum(counts) == sizes[split]  # nothing dropped by a plain threshold
                hits = sum(a * c for a, c in zip(accs, counts) if c)
                assert hits / sum(counts) == pytest.approx(record[f"env{env}_{split}_acc"],
                                                           abs=1e-12)
                for a, c in zip(accs, counts):
                    assert (c == 0) == math.isnan(a)
    # the split really is mixed somewhere (not all IP or all OOP)
    first = read_records(runs["jobs"][(0, 0)])[0]
    assert first["env0_in_ip_count"] > 0 and first["env0_in_oop_count"] > 0


def test_eval_only_matches_train_time_keys(runs, scores_file, tmp_path, capsys):
    job = runs["jobs"][(0, 0)]
    out = tmp_path / "keys.jsonl"
    assert alignment_eval.main([str(job), "--alignment_scores", scores_file,
                                "--alignment_threshold", THRESHOLD, "--out", str(out),
                                "--n_workers", "0"]) == 0
    keys = json.loads(out.read_text())
    final = read_records(job)[-1]
    assert keys["model"] == "model.pkl"
    train_keys = {k: v for k, v in final.items() if k.endswith(("_acc", "_count"))}
    assert set(train_keys) <= set(keys)
    for k, v in train_keys.items():
        assert same(keys[k], v), k
    assert "env0_in_ip_acc" in capsys.readouterr().out


def copy_job(runs, tmp_path, name):
    target = tmp_path / name
    shutil.copytree(runs["plain"], target)
    return target


def update(job, scores_file, *extra):
    return alignment_eval.main([str(job), "--alignment_scores", scores_file, "--n_workers", "0",
                                "--alignment_threshold", THRESHOLD, "--update_records", *extra])


def comparable(record):
    out = {k: v for k, v in record.items() if k not in TIMING}
    out["args"] = {k: v for k, v in record["args"].items() if k != "output_dir"}
    return out


def test_eval_only_adds_train_time_keys_to_every_scorable_record(runs, scores_file, tmp_path,
                                                                 capsys):
    job = copy_job(runs, tmp_path, "all_models")
    assert update(job, scores_file) == 0
    assert "updated the records of steps [0, 1, 2]" in capsys.readouterr().out
    trained = read_records(runs["jobs"][(0, 0)])
    updated = read_records(job)
    assert len(updated) == len(trained) == 3
    for a, b in zip(updated, trained):
        ca, cb = comparable(a), comparable(b)
        assert ca.keys() == cb.keys()
        for k in ca:
            assert same(ca[k], cb[k]), k
    assert "alignment_eval" in (job / "out.txt").read_text()
    # a second run finds nothing to do and leaves the file as it is
    before = (job / "results.jsonl").read_bytes()
    assert update(job, scores_file) == 0
    assert "already has these keys" in capsys.readouterr().out
    assert (job / "results.jsonl").read_bytes() == before
    # other keys already there: replaced only with --overwrite
    assert alignment_eval.main([str(job), "--alignment_scores", scores_file,
                                "--alignment_preset", "teterwak2025", "--update_records",
                                "--n_workers", "0"]) == 0
    assert (job / "results.jsonl").read_bytes() == before
    assert "use --overwrite" in capsys.readouterr().out
    assert alignment_eval.main([str(job), "--alignment_scores", scores_file,
                                "--alignment_preset", "teterwak2025", "--update_records",
                                "--overwrite", "--n_workers", "0"]) == 0
    record = read_records(job)[-1]
    assert record["args"]["alignment_preset"] == "teterwak2025"
    assert "alignment_threshold" not in record["args"]


def test_eval_only_never_touches_records_it_cannot_score(runs, scores_file, tmp_path, capsys):
    final_only = copy_job(runs, tmp_path, "final_only")
    for name in os.listdir(final_only):
        if name.startswith("model_step"):
            os.remove(final_only / name)
    lines = (final_only / "results.jsonl").read_bytes().split(b"\n")
    assert update(final_only, scores_file) == 0
    out = capsys.readouterr().out
    assert "updated the records of steps [2]" in out
    assert "step 0: no saved model of that step" in out
    after = (final_only / "results.jsonl").read_bytes().split(b"\n")
    assert after[:2] == lines[:2] and after[2] != lines[2] and b"env0_in_ip_acc" in after[2]

    tampered = copy_job(runs, tmp_path, "tampered")
    recs = read_records(tampered)
    recs[1]["env2_in_acc"] = 0.123
    text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in recs)
    (tampered / "results.jsonl").write_text(text)
    assert update(tampered, scores_file) == 0
    assert "step 1: re-evaluating model_step1.pkl gives other accuracies" in \
        capsys.readouterr().out
    assert (tampered / "results.jsonl").read_text().split("\n")[1] == text.split("\n")[1]

    running = copy_job(runs, tmp_path, "running")
    os.remove(running / "done")
    before = (running / "results.jsonl").read_bytes()
    assert update(running, scores_file) == 0
    assert "not done" in capsys.readouterr().out
    assert (running / "results.jsonl").read_bytes() == before


def test_collect_results_prints_ip_and_oop_tables(runs, capsys):
    from dg_plugins.collect.tables import Cell
    from dg_plugins.scripts import collect_results

    assert collect_results.main(["--input_dir", str(runs["sweep"]), "--selection", "oracle",
                                 "--no_save"]) == 0
    text = capsys.readouterr().out
    sections = text.split("-------- ")
    ip = [s for s in sections if s.startswith("Dataset: PACS") and "env{t}_in_ip_acc" in s]
    oop = [s for s in sections if s.startswith("Dataset: PACS") and "env{t}_in_oop_acc" in s]
    assert len(ip) == len(oop) == 1
    for section, subset in ((ip[0], "ip"), (oop[0], "oop")):
        row = next(line for line in section.splitlines() if line.startswith("ERM"))
        for env in (0, 1):  # oracle: the last checkpoint of each trial
            values = [read_records(runs["jobs"][(env, trial)])[-1][f"env{env}_in_{subset}_acc"]
                      for trial in (0, 1)]
            assert Cell.of(values).text() in row
    # the whole-domain figure: in and out splits' subset accuracies weighted by their sizes
    pooled = [s for s in sections if s.startswith("Dataset: PACS") and "env{t}_pooled_ip_acc" in s]
    row = next(line for line in pooled[0].splitlines() if line.startswith("ERM"))
    for env in (0, 1):
        values = []
        for trial in (0, 1):
            last = read_records(runs["jobs"][(env, trial)])[-1]
            n_in, n_out = last[f"env{env}_in_ip_count"], last[f"env{env}_out_ip_count"]
            hits = sum(last[f"env{env}_{split}_ip_acc"] * n for split, n in
                       (("in", n_in), ("out", n_out)) if n)
            values.append(hits / (n_in + n_out))
        assert Cell.of(values).text() in row


def test_plot_from_eval_only_predictions(runs, scores_file, tmp_path, capsys):
    predictions = tmp_path / "preds.csv"
    jobs = [str(runs["jobs"][(0, t)]) for t in (0, 1)]
    assert alignment_eval.main([*jobs, "--alignment_scores", scores_file, "--alignment_threshold",
                                THRESHOLD, "--predictions", str(predictions),
                                "--n_workers", "0"]) == 0
    import pandas as pd

    preds = pd.read_csv(predictions)
    assert len(preds) == 2 * 10 and set(preds["split"]) == {"in", "out"}
    final = read_records(runs["jobs"][(0, 0)])[-1]
    mine = preds[(preds["job"] == "erm_te0_tr0") & (preds["split"] == "in")]
    assert mine["correct"].mean() == pytest.approx(final["env0_in_acc"])
    png = tmp_path / "plot.png"
    table = tmp_path / "binned.csv"
    assert plot_alignment.main(["--scores", scores_file, "--predictions", str(predictions),
                                "--out", str(png), "--threshold", THRESHOLD, "--table",
                                str(table)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    binned = pd.read_csv(table)
    assert binned["count"].sum() == len(preds)
    hits = (binned["accuracy"].fillna(0) * binned["count"]).sum()
    assert hits == pytest.approx(preds["correct"].sum())


def test_train_checks_the_score_file_against_the_expected_clip_model(pacs, pacs_dir, scores_file,
                                                                     tmp_path, capsys):
    """--alignment_model / --alignment_pretrained: a score file of another CLIP model is refused
    (one line, exit 2, no record); the file's own model trains, with both flags in the records'
    args. The job's expectation is its own: alignment_eval judges a file by its own flags."""
    from alignment_helpers import fake_table

    from dg_plugins.alignment import write_scores

    expected = ["--alignment_scores", scores_file, "--alignment_threshold", THRESHOLD,
                "--alignment_model", "ViT-B-16"]
    refused = tmp_path / "refused"
    argv = ["--dataset", "PACS", "--data_dir", pacs_dir, "--algorithm", "ERM", "--steps", "1",
            "--hparams", HPARAMS, "--n_workers", "0"]
    assert train_cli.main(argv + ["--output_dir", str(refused), *expected,
                                  "--alignment_pretrained", "openai"]) == 2
    err = "".join(capsys.readouterr())  # through the job's Tee: stdout and err.txt
    assert "does not fit the expected model (--alignment_model / --alignment_pretrained), " \
           "which needs scores of ViT-B-16 / openai: it was scored by ViT-B-16 / laion400m_e32" \
           in err
    assert not (refused / "results.jsonl").exists()
    assert train_cli.main(argv + ["--output_dir", str(tmp_path / "alone"),
                                  "--alignment_model", "ViT-B-16"]) == 2
    assert "--alignment_model need --alignment_scores FILE" in "".join(capsys.readouterr())

    job = tmp_path / "job"
    assert train_cli.main(argv + ["--output_dir", str(job), *expected,
                                  "--alignment_pretrained", "laion400m_e32"]) == 0
    record = read_records(job)[-1]
    assert record["args"]["alignment_model"] == "ViT-B-16"
    assert record["args"]["alignment_pretrained"] == "laion400m_e32"
    assert "env0_in_ip_acc" in record

    other = fake_table(pacs, pacs_dir, model="RN50", pretrained="openai")
    other_file = tmp_path / "rn50_scores.csv"
    write_scores(str(other_file), other.frame, other.meta)
    assert alignment_eval.main([str(job), "--alignment_scores", str(other_file),
                                "--alignment_threshold", THRESHOLD, "--n_workers", "0"]) == 0
    assert alignment_eval.main([str(job), "--alignment_scores", str(other_file),
                                "--alignment_model", "ViT-B-16", "--n_workers", "0"]) == 2
    assert "which needs scores of ViT-B-16: it was scored by RN50 / openai" in \
        capsys.readouterr().err
