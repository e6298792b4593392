"""The IP/OOP chain as a user runs it on an image-folder dataset, with default loader workers,
each command a subprocess under a timeout (a hang fails): alignment_scores (a tiny random CLIP
from a config file); train, a default image job (training environments evaluated with
augmentation); then alignment_eval on the trained job, adding the IP/OOP keys to its records.
No process may outlive its command."""

import json

import pandas as pd

from alignment_helpers import TINY_CONFIG
from support.image_tree import make_pacs_tree
from support.processes import command_env, run, survivors

TIMEOUT = 180
HPARAMS = json.dumps({"backbone": "vit", "vit_arch": "dg_vit_test_patch32_224",
                      "pretrained": False, "batch_size": 4, "image_size": 32})


def test_scores_train_and_update_records_with_default_workers(tmp_path):
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
                       "--algorithm", "ERM", "--test_envs", "0", "--steps", "3",
                       "--checkpoint_freq", "2", "--save_model_every_checkpoint",
                       "--hparams", HPARAMS, "--output_dir", job, env=env, timeout=TIMEOUT)
    assert code == 0, output
    before = [json.loads(line) for line in (job / "results.jsonl").read_text().splitlines()]
    assert len(before) == 2 and before[0]["hparams"]["data_augmentation"] is True
    assert not [k for k in before[-1] if "_ip_" in k]
    assert not survivors(env)

    # --update_records re-evaluates each saved model, gets exactly the recorded accuracies (also
    # of the augmented training environments: their evaluation batches are seeded by split and
    # batch index), and adds the IP/OOP keys to every record a saved model covers
    code, output = run("dg_plugins.scripts.alignment_eval", job, "--alignment_scores", scores,
                       "--alignment_threshold", "0.1", "--update_records", "--predictions", preds,
                       env=env, timeout=TIMEOUT)
    assert code == 0, output
    assert "updated the records of steps [0, 2]" in output, output
    after = [json.loads(line) for line in (job / "results.jsonl").read_text().splitlines()]
    for old, new in zip(before, after):
        assert set(new) - set(old) == {f"env0_{split}_{subset}_{kind}" for split in ("in", "out")
                                       for subset in ("ip", "oop") for kind in ("acc", "count")}
        assert all(new[k] == v for k, v in old.items() if k != "args")
        assert new["args"]["alignment_threshold"] == 0.1
        assert new["env0_in_ip_count"] + new["env0_in_oop_count"] > 0
    predictions = pd.read_csv(preds)
    assert set(predictions["env"]) == {0} and len(predictions) == 18  # env 0: in + out splits
    assert not survivors(env)
