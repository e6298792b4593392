"""IP/OOP over the whole test environment counts each image once, also where the target's out
split lies inside its in split: PACS's official split (in = the test list, every image; out = the
crossval list). Records of a real train job (a subprocess with default loader workers) on a PACS
tree with official lists and an IP/OOP score file; then collect_results' tables."""

import json
import math

import numpy as np
import pandas as pd

from alignment_helpers import fake_table
from support.helpers import read_records
from support.image_tree import make_pacs_tree, write_pacs_split_lists
from support.processes import command_env, run, survivors

THRESHOLD = 0.25
HPARAMS = json.dumps({"backbone": "vit", "vit_arch": "dg_vit_test_patch32_224",
                      "pretrained": False, "batch_size": 4, "image_size": 32,
                      "data_split": "official"})


def test_pooled_ip_oop_counts_each_image_of_an_official_split_once(tmp_path, capsys):
    from dg_plugins.alignment import write_scores
    from dg_plugins.collect.ipoop import add_pooled_subsets
    from dg_plugins.collect.tables import Cell
    from dg_plugins.datasets.image_folder import PACS
    from dg_plugins.scripts import collect_results

    data_dir = make_pacs_tree(tmp_path / "data")
    lists = write_pacs_split_lists(data_dir)
    table = fake_table(PACS(str(data_dir), [], {"data_augmentation": False}), str(data_dir))
    scores = tmp_path / "scores.csv"
    write_scores(str(scores), table.frame, table.meta)
    job, env = tmp_path / "sweep" / "job", command_env()
    code, output = run("dg_plugins.scripts.train", "--dataset", "PACS", "--data_dir", data_dir,
                       "--algorithm", "ERM", "--test_envs", "0", "--steps", "3",
                       "--checkpoint_freq", "1", "--hparams", HPARAMS, "--alignment_scores",
                       scores, "--alignment_threshold", THRESHOLD, "--output_dir", job,
                       env=env, timeout=180)
    assert code == 0, output
    assert not survivors(env)

    target = lists["art_painting"]
    assert set(target["crossval"]) < set(target["test"])  # the out split inside the in split
    frame = table.frame
    ip_images = int((frame[frame["env"] == 0]["score"] >= THRESHOLD).sum())
    records = read_records(job)
    assert len(records) == 3
    for record in records:
        # the whole domain once: the in split (every image) holds the IP images, and the out
        # split's images outside the in split are none
        assert record["env0_in_ip_count"] == ip_images
        assert record["env0_in_ip_count"] + record["env0_in_oop_count"] == len(target["test"])
        assert record["env0_out_ip_count"] + record["env0_out_oop_count"] == len(
            target["crossval"])
        for subset in ("ip", "oop"):
            assert record[f"env0_out_{subset}_outside_in_count"] == 0
            assert math.isnan(record[f"env0_out_{subset}_outside_in_acc"])
        # training environments' splits are disjoint: no such keys, as for any ordinary job
        assert not [k for k in record if "outside_in" in k and not k.startswith("env0_")]

    pooled = add_pooled_subsets(pd.DataFrame(records))
    for subset in ("ip", "oop"):
        np.testing.assert_array_equal(pooled[f"env0_pooled_{subset}_acc"],
                                      pooled[f"env0_in_{subset}_acc"])
    # adding the out split again (the count of an image twice) would give another figure here
    assert any(r[f"env0_out_{s}_acc"] != r[f"env0_in_{s}_acc"] for r in records
               for s in ("ip", "oop"))

    assert collect_results.main(["--input_dir", str(tmp_path / "sweep"), "--no_save",
                                 "--selection", "iid", "--ipoop", "both"]) == 0
    sections = capsys.readouterr().out.split("-------- ")

    def erm_row(key):
        section = next(s for s in sections if s.startswith("Dataset: PACS") and key in s)
        return next(line for line in section.splitlines() if line.startswith("ERM"))

    for subset in ("ip", "oop"):
        in_split, whole = erm_row(f"env{{t}}_in_{subset}_acc"), erm_row(
            f"env{{t}}_pooled_{subset}_acc")
        assert whole == in_split
        selected = max(records, key=lambda r: np.mean([r[f"env{i}_out_acc"] for i in (1, 2, 3)]))
        assert Cell.of([selected[f"env0_in_{subset}_acc"]]).text() in whole


def test_pooling_uses_the_out_split_outside_the_in_split_where_a_record_has_it():
    """A partial overlap: the in split's subset plus the out split's images outside it; a record
    without the keys (disjoint splits) pools its whole out split."""
    from dg_plugins.collect.ipoop import add_pooled_subsets

    records = pd.DataFrame({
        "env0_in_acc": [0.5, 0.5],
        "env0_in_ip_acc": [0.5, 0.5], "env0_in_ip_count": [4, 4],
        "env0_out_ip_acc": [1.0, 1.0], "env0_out_ip_count": [4, 4],
        "env0_out_ip_outside_in_acc": [1.0, np.nan],
        "env0_out_ip_outside_in_count": [1, np.nan],
    })
    pooled = add_pooled_subsets(records)["env0_pooled_ip_acc"].tolist()
    assert pooled == [(0.5 * 4 + 1.0 * 1) / 5, (0.5 * 4 + 1.0 * 4) / 8]
