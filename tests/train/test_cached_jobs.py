"""Image jobs with the decoded-image cache (on by default, ``dg_plugins.datasets.decoded``), run as
users run them (subprocesses): the records of a job that builds the cache, of jobs that reuse it
(and the augmented splits' evaluation pixels a first job kept), with any number of loader
workers, equal bit for bit the records of a job with the cache off; each job says what it did
with the cache, where it is and how to clear it."""

import json

from helpers import VOLATILE_KEYS, read_records
from image_tree import make_pacs_tree
from processes import command_env, run

TRAIN = "dg_plugins.scripts.train"
#: A tiny random-init ViT at 224x224; augmentation on (every image dataset's default), so the
#: training environments' splits are evaluated augmented.
HPARAMS = json.dumps({"backbone": "vit", "vit_arch": "dg_vit_test_patch32_224",
                      "pretrained": False, "batch_size": 4, "image_size": 32})
TIMEOUT = 180


def test_records_are_the_same_with_and_without_the_cache_and_any_workers(tmp_path):
    tree = make_pacs_tree(tmp_path / "tree", per_class=2, size=40)
    cache = tmp_path / "cache"
    # the cache built without workers (in the job's process: its RNGs untouched), then reused
    runs = (("off", 2, "off"), ("built", 0, "on"), ("reused", 2, "on"), ("reused", 1, "on"))
    records = []
    for k, (state, workers, switch) in enumerate(runs):
        out = tmp_path / f"job{k}"
        env = command_env(DG_PLUGINS_CACHE=str(cache), DG_PLUGINS_DECODED_CACHE=switch)
        code, output = run(TRAIN, "--dataset", "PACS", "--data_dir", tree, "--algorithm", "ERM",
                           "--test_envs", "0", "--steps", "5", "--checkpoint_freq", "2",
                           "--hparams", HPARAMS, "--n_workers", workers, "--output_dir", out,
                           env=env, timeout=TIMEOUT)
        assert code == 0, output
        (line,) = [x for x in (out / "out.txt").read_text().splitlines()
                   if x.startswith("Decoded-image cache:")]
        assert line.startswith(f"Decoded-image cache: {state}"), line
        if switch == "on":
            assert f"rm -r {cache / 'decoded'}" in line and "GB on disk" in line, line
        records.append(read_records(out, drop=VOLATILE_KEYS))
    assert len(records[0]) == 3
    for other in records[1:]:
        assert other == records[0]
    kept = [p.name for p in (cache / "decoded").rglob("*.eval-*.npy")]
    assert len(kept) == 6, kept  # the training environments' in- and out-splits, augmented
