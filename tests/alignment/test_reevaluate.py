"""The logic of alignment_eval (:mod:`dg_plugins.alignment.reevaluate`) on fakes, without train:
which records a saved model may complete (tolerance edge, args, overwrite, NaN keys), the bytes
of every other line, the job's model files, and per-image predictions from known outputs, scored
IP/OOP with a score exactly at the threshold. End to end on real jobs: test_train_eval.py."""

import json
import math
import os
import types

import pandas as pd
import pytest
import torch

from dg_plugins.alignment import SplitRule, reevaluate
from dg_plugins.alignment.plots import join_predictions

FILES = reevaluate.JobFiles(results="results.jsonl", done="done", out="out.txt",
                            model="model.pkl", step_model="model_step{step}.pkl")
ARGS = {"dataset": "PACS", "algorithm": "ERM", "test_envs": [0], "seed": 0, "steps": 3}
HPARAMS = {"lr": 1e-3}
RULE = {"alignment_scores": "s.csv", "alignment_threshold": 0.25, "alignment_preset": None,
        "alignment_model": None, "alignment_pretrained": None}
SUBSETS = {"env0_in_ip_acc": 1.0, "env0_in_ip_count": 2, "env0_in_oop_acc": float("nan"),
           "env0_in_oop_count": 0}


def record(step, acc, **extra):
    return {"step": step, "args": dict(ARGS, alignment_preset="old"), "hparams": HPARAMS,
            "env0_in_acc": acc, "env0_out_acc": 0.5, **extra}


def job_folder(tmp_path, records, models=("model.pkl",), done=True):
    job = tmp_path / "job"
    job.mkdir()
    lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
    (job / FILES.results).write_text("\n".join(lines) + "\n")
    for name in models:
        (job / name).write_bytes(b"")
    if done:
        (job / FILES.done).write_text("")
    return job


def loader(accs):
    """``load(name)``: a saved model of ARGS/HPARAMS whose evaluation gives ``accs[name]``."""
    calls = []

    def load(name):
        calls.append(name)
        return ({"args": ARGS, "model_hparams": HPARAMS},
                {"env0_in_acc": accs[name], "env0_out_acc": 0.5, **SUBSETS})
    return load, calls


def update(job, accs, final_step=2, **options):
    load, _ = loader(accs)
    return reevaluate.update_records(str(job), final_step, load, FILES, RULE, **options)


def test_a_record_is_completed_only_within_the_tolerance(tmp_path):
    # 0.75 - 0.5 is exactly 0.25 in binary floating point: the edge is inside; 0.8 is outside.
    job = job_folder(tmp_path, [record(0, 0.75), record(1, 0.8), record(2, 0.5)],
                     models=("model.pkl", "model_step0.pkl", "model_step1.pkl"))
    update(job, {"model.pkl": 0.5, "model_step0.pkl": 0.5, "model_step1.pkl": 0.5},
           tolerance=0.25)
    rows = [json.loads(line) for line in (job / FILES.results).read_text().splitlines()]
    assert [reevaluate.subset_keys(r) != {} for r in rows] == [True, False, True]
    assert rows[0]["args"]["alignment_threshold"] == 0.25
    assert "alignment_preset" not in rows[0]["args"]  # a None flag drops the record's own
    assert rows[1]["args"]["alignment_preset"] == "old"
    assert math.isnan(rows[2]["env0_in_oop_acc"]) and rows[2]["env0_in_ip_count"] == 2


def test_only_records_a_model_reproduces_change_and_other_lines_keep_their_bytes(tmp_path):
    other = dict(record(1, 0.5), args=dict(ARGS, seed=7))
    lines = [json.dumps(record(0, 0.5)), "{not json", json.dumps(other),
             json.dumps(record(2, 0.5))]
    job = job_folder(tmp_path, lines, models=("model.pkl", "model_step1.pkl"))
    before = (job / FILES.results).read_bytes().split(b"\n")
    messages = update(job, {"model.pkl": 0.5, "model_step1.pkl": 0.5})
    after = (job / FILES.results).read_bytes().split(b"\n")
    assert after[:3] == before[:3] and after[4:] == before[4:]  # only the final step's line
    assert reevaluate.subset_keys(json.loads(after[3])).keys() == SUBSETS.keys()
    text = "\n".join(messages)
    assert "updated the records of steps [2]" in text
    assert "step 0: no saved model of that step" in text
    assert "line 2: not valid JSON" in text
    assert "step 1: args.seed is 7 in the record, 0 in the model" in text
    assert "added IP/OOP keys to the records of steps [2]" in (job / FILES.out).read_text()


def test_differing_keys_need_overwrite_and_equal_ones_nan_included_are_kept(tmp_path):
    stale = dict(SUBSETS, env0_in_ip_acc=0.0)
    job = job_folder(tmp_path, [record(2, 0.5, **stale)])
    assert "has other IP/OOP keys (use --overwrite" in "\n".join(update(job, {"model.pkl": 0.5}))
    assert json.loads((job / FILES.results).read_text())["env0_in_ip_acc"] == 0.0
    update(job, {"model.pkl": 0.5}, overwrite=True)
    assert json.loads((job / FILES.results).read_text())["env0_in_ip_acc"] == 1.0
    # now equal, NaN for NaN: nothing to do, nothing written
    before = (job / FILES.results).read_bytes()
    assert "already has these keys" in "\n".join(update(job, {"model.pkl": 0.5}))
    assert (job / FILES.results).read_bytes() == before


def test_a_job_not_done_is_left_alone(tmp_path):
    job = job_folder(tmp_path, [record(2, 0.5)], done=False)
    before = (job / FILES.results).read_bytes()
    assert "not done" in update(job, {"model.pkl": 0.5})[0]
    assert (job / FILES.results).read_bytes() == before and not (job / FILES.out).exists()


def test_model_files_and_the_first_model(tmp_path):
    job = job_folder(tmp_path, [], models=("model_step10.pkl", "model_step2.pkl",
                                           "model_stepx.pkl"))
    models = reevaluate.model_files(str(job), FILES)
    assert list(models) == ["model_step10.pkl", "model_step2.pkl"]
    assert reevaluate.first_model(str(job), models, FILES) == models["model_step10.pkl"]
    (job / "model.pkl").write_bytes(b"")
    models = reevaluate.model_files(str(job), FILES)
    assert reevaluate.first_model(str(job), models, FILES) == str(job / "model.pkl")
    with pytest.raises(FileNotFoundError, match="no model.pkl or model_step\\*.pkl"):
        reevaluate.first_model(str(job), {}, FILES)


def test_job_args_take_the_data_dir_and_the_rule_of_this_command():
    args = reevaluate.job_args(dict(ARGS, data_dir="/old", alignment_threshold=0.9), "/new", RULE)
    assert args["data_dir"] == "/new" and args["alignment_threshold"] == 0.25
    assert args["task"] == "domain_generalization" and args["uda_holdout_fraction"] == 0


class Splits:
    def __init__(self, named):
        self.named = named

    def eval_named(self):
        return self.named


class Env:
    def __init__(self, root, n):
        self.root = root
        self.samples = [(os.path.join(root, "dog", f"{i}.jpg"), 0) for i in range(n)]


class Fixed(torch.nn.Module):
    """Predicts class ``x[:, 0]`` (one-hot logits over 3 classes)."""

    def predict(self, x):
        return torch.nn.functional.one_hot(x[:, 0].long(), 3).float()


def test_predictions_from_known_outputs_give_ip_oop_accuracy_at_the_threshold(tmp_path):
    data_dir = str(tmp_path)
    dataset = [Env(os.path.join(data_dir, "art"), 4), Env(os.path.join(data_dir, "photo"), 2)]
    # test env 0's in split holds its images 3 and 1, its out split image 0; env 1 trains
    splits = Splits([("env0_in", [3, 1], 0), ("env1_in", [0, 1], 1), ("env0_out", [0], 0),
                     ("env0_uda", [2], None)])
    outputs = {"env0_in": ([1, 0], [1, 2]), "env0_out": ([2], [0])}  # (predicted, label)

    def batches(name, split):
        predicted, labels = outputs[name]
        yield torch.tensor([[p] for p in predicted]), torch.tensor(labels)

    job = reevaluate.RebuiltJob(str(tmp_path / "job"), types.SimpleNamespace(
        test_envs=[0], data_dir=data_dir), dataset, splits, torch.device("cpu"), 2,
        evaluate=None, batches=batches, positions=lambda split: split)
    algorithm = Fixed()
    rows = reevaluate.predictions(job, algorithm, "model.pkl")
    assert algorithm.training
    assert rows[["path", "split", "label", "prediction", "correct"]].values.tolist() == [
        ["art/dog/3.jpg", "in", 1, 1, 1], ["art/dog/1.jpg", "in", 2, 0, 0],
        ["art/dog/0.jpg", "out", 0, 2, 0]]
    assert set(rows["job"]) == {"job"} and set(rows["env_name"]) == {"art"}
    # score 0.25 is exactly the threshold: IP (score >= threshold)
    scores = pd.DataFrame({"env": 0, "path": ["art/dog/0.jpg", "art/dog/1.jpg", "art/dog/3.jpg"],
                           "score": [0.1, 0.2499, 0.25]})
    joined = join_predictions(scores, rows)
    joined["subset"] = SplitRule(threshold=0.25).assign(joined["score"])
    assert joined.groupby("subset")["correct"].agg(["mean", "size"]).to_dict() == {
        "mean": {"ip": 1.0, "oop": 0.0}, "size": {"ip": 1, "oop": 2}}
