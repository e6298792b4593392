"""The IP/OOP chain as a user runs it on an image-folder dataset, with default loader workers,
each command a subprocess under a timeout (a hang fails): alignment_scores (a tiny random CLIP
from a config file), train with --alignment_scores, then alignment_eval on the trained job.
No process may outlive its command."""

import json

import pandas as pd

from alignment_helpers import TINY_CONFIG
from image_tree import make_pacs_tree
from processes import command_env, run, survivors

TIMEOUT = 180
HPARAMS = json.dumps({"backbone": "vit", "vit_arch": "dg_vit_test_patch32_224",
                      "pretrained": False, "batch_size": 4})


def test_scores_train_and_eval_with_default_workers(tmp_path):
    data_dir = make_pacs_tree(tmp_path / "data")
    config = tmp_path / "dg-e2e-tiny-clip.json"
    config.write_text(json.dumps(TINY_CONFIG))
    scores, job, preds = tmp_path / "scores.csv", tmp_path / "job", tmp_path / "preds.csv"
    env = command_env()

    code, output = run("dg_plugins.scripts.alignment_scores", "--dataset", "PACS", "--data_dir",
                       data_dir, "--model_config", config, "--pretrained", "none",
                       "--cache_dir", tmp_path / "cache", "--out", scores, "--threshold", "0.1",
                       env=env, timeout=TIMEOUT)
    assert code == 0, output
    assert len(pd.read_csv(scores, comment="#")) == 72  # every image of the tree scored
    assert not survivors(env)

    code, output = run("dg_plugins.scripts.train", "--dataset", "PACS", "--data_dir", data_dir,
                       "--algorithm", "ERM", "--test_envs", "0", "--steps", "2",
                       "--hparams", HPARAMS, "--alignment_scores", scores,
                       "--alignment_threshold", "0.1", "--output_dir", job,
                       env=env, timeout=TIMEOUT)
    assert code == 0, output
    last = json.loads((job / "results.jsonl").read_text().splitlines()[-1])
    counts = last["env0_in_ip_count"] + last["env0_in_oop_count"]
    assert counts > 0 and "env0_in_ip_acc" in last
    assert not survivors(env)

    code, output = run("dg_plugins.scripts.alignment_eval", job, "--alignment_scores", scores,
                       "--alignment_threshold", "0.1", "--predictions", preds,
                       env=env, timeout=TIMEOUT)
    assert code == 0, output
    predictions = pd.read_csv(preds)
    assert set(predictions["env"]) == {0} and len(predictions) == 18  # env 0: in + out splits
    assert not survivors(env)
