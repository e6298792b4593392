"""The alignment_scores command end to end, and the plot's binned accuracy."""

import json

import numpy as np
import pytest

from dg_plugins.alignment import read_scores
from dg_plugins.alignment.plots import bin_edges, binned_accuracy, plot_alignment
from dg_plugins.scripts import alignment_scores

from alignment_helpers import TINY_CONFIG


def test_cli_scores_writes_the_file_and_reports_counts(tmp_path, pacs_dir, capsys):
    config = tmp_path / "dg-cli-tiny.json"
    config.write_text(json.dumps(TINY_CONFIG))
    out = tmp_path / "scores.csv"
    argv = ["--dataset", "PACS", "--data_dir", pacs_dir, "--envs", "A", "sketch",
            "--model_config", str(config), "--pretrained", "none", "--batch_size", "16",
            "--num_workers", "0", "--cache_dir", str(tmp_path / "cache"), "--out", str(out),
            "--threshold", "0.1"]
    assert alignment_scores.main(argv) == 0
    captured = capsys.readouterr()
    table = read_scores(str(out))
    assert sorted(set(table.frame["env"])) == [0, 3]
    assert table.meta["model"] == "dg-cli-tiny" and table.meta["pretrained"] == "none"
    assert table.meta["prompt"] == "A photo of {}."
    assert list(table.frame.columns[:6]) == ["env", "env_name", "path", "label", "class", "score"]
    assert all(p.startswith("PACS/") for p in table.frame["path"])
    assert "computed 20" in captured.out and "IP if score >= 0.1" in captured.out
    for env in (0, 3):
        scores = table.frame[table.frame["env"] == env]["score"]
        ip = int((scores >= 0.1).sum())
        assert f"{ip} ({100 * ip / len(scores):.1f}%)" in captured.out
    assert "random weights" in captured.err
    # rerun: read from the cache, same file content
    assert alignment_scores.main(argv[:-2] + ["--alignment_preset", "teterwak2025"]) == 0
    captured = capsys.readouterr()
    again = captured.out
    assert "computed 0," in again and "read 20 from the cache" in again
    # the file is written, but the rule is defined for another model: said now, not at train time
    assert ("will reject this file with --alignment_preset teterwak2025" in captured.err
            and "needs scores of ViT-B-16 / laion400m_e32" in captured.err)
    assert "dropped: score < 0.15 or score > 0.4" in again
    np.testing.assert_array_equal(read_scores(str(out)).frame["score"], table.frame["score"])
    assert alignment_scores.main(argv[:2] + ["--data_dir", pacs_dir, "--envs", "Z"]) == 2
    assert "--envs 'Z' is not an environment" in capsys.readouterr().err


def test_binned_accuracy_counts_each_score_in_one_bin():
    edges = np.array([0.0, 0.1, 0.2, 0.3])
    scores = [0.0, 0.05, 0.1, 0.15, 0.2999, 0.3]  # 0.1 opens the second bin; 0.3 closes the last
    correct = [1, 0, 1, 1, 0, 1]
    table = binned_accuracy(scores, correct, edges)
    assert table["count"].tolist() == [2, 2, 2]
    assert table["accuracy"].tolist() == [0.5, 1.0, 0.5]
    empty = binned_accuracy([0.05], [1], edges)
    assert empty["count"].tolist() == [1, 0, 0] and np.isnan(empty["accuracy"][1])
    e = bin_edges([0.041, 0.183], 0.02)
    assert e[0] == pytest.approx(0.04) and e[-1] == pytest.approx(0.2) and len(e) == 9
    with pytest.raises(ValueError, match="positive"):
        bin_edges([0.1], 0)


def test_plot_of_scores_alone(tmp_path, scores_file):
    out = tmp_path / "hist.png"
    from dg_plugins.alignment import resolve_rule

    tables = plot_alignment(read_scores(scores_file).frame, str(out),
                            rule=resolve_rule(preset="teterwak2025"))
    assert tables == [] and out.read_bytes()[:4] == b"\x89PNG"
    assert out.stat().st_size < 300_000


def test_one_name_for_the_rule_everywhere(tmp_path, pacs_dir, scores_file, capsys):
    """--alignment_preset in alignment_scores and plot_alignment, as in train and alignment_eval;
    --preset still works there, hidden, with a deprecation warning; both naming two rules is a
    usage error."""
    from dg_plugins.scripts import plot_alignment

    for parser in (alignment_scores.build_parser(), plot_alignment.build_parser()):
        text = parser.format_help()
        assert "--alignment_preset" in text and "--preset" not in text.replace(
            "--alignment_preset", "")
    out = tmp_path / "hist.png"
    base = ["--scores", scores_file, "--out", str(out)]
    assert plot_alignment.main(base + ["--alignment_preset", "teterwak2025"]) == 0
    assert "deprecated" not in capsys.readouterr().err
    assert plot_alignment.main(base + ["--preset", "teterwak2025"]) == 0
    assert "warning: --preset is deprecated; use --alignment_preset" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        plot_alignment.main(base + ["--preset", "teterwak2025", "--alignment_preset", "default"])
    assert exit_.value.code == 2 and "name two rules" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        alignment_scores.main(["--dataset", "PACS", "--data_dir", pacs_dir, "--preset", "a=1",
                               "--alignment_preset", "default"])
    assert exit_.value.code == 2 and "give --alignment_preset only" in capsys.readouterr().err
