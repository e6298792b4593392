"""results/tools/mpbm_study_table.py, the table and figure of a single-source study whose
configurations live in separate sweep folders: each row's cells are the mean and standard error
over trials of the records it reads (``Avg (targets)`` of each trial's own mean over the targets),
and ``--plot`` draws exactly those numbers (read back from the figure's artists; pixels are not
compared)."""

import importlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from support.helpers import markdown_rows

TOOLS = Path(__file__).resolve().parents[2] / "results" / "tools"
ENVIRONMENTS = ["mnist", "svhn", "mnist_m", "syn", "usps"]  # DigitsOffline's, source mnist
CONFIGS = {"erm": "ERM", "no_mix": "MPBM"}


def accuracies(config: str, trial: int) -> list[float]:
    """A record's per-environment accuracy (out-split of the source, in-split of the targets)."""
    rng = np.random.default_rng([len(config), trial])
    return [float(np.round(x, 4)) for x in 0.2 + 0.75 * rng.random(len(ENVIRONMENTS))]


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """A study folder: one sweep folder per configuration, 3 trials, one record per job (so IID
    and oracle selection both read that record)."""
    root = tmp_path_factory.mktemp("study")
    for config, algorithm in CONFIGS.items():
        for trial in range(3):
            accs = accuracies(config, trial)
            record = {"args": {"dataset": "DigitsOffline", "algorithm": algorithm,
                               "test_envs": [1, 2, 3, 4], "trial_seed": trial, "hparams_seed": 0,
                               "output_dir": f"{config}_{trial}"},
                      "hparams": {}, "step": 1000}
            for env, acc in enumerate(accs):
                record[f"env{env}_in_acc"] = acc if env else 0.99
                record[f"env{env}_out_acc"] = 0.01 if env else acc
            job = root / config / f"job{trial}"
            job.mkdir(parents=True)
            (job / "results.jsonl").write_text(json.dumps(record) + "\n")
            (job / "done").write_text("")
    return root


def expected_cells(config: str) -> list[tuple[float, float]]:
    """(mean, standard error) in percent per column, computed here from the records' numbers."""
    table = np.array([accuracies(config, trial) for trial in range(3)])
    table = np.column_stack([table, table[:, 1:].mean(axis=1)])
    return [(100 * col.mean(), 100 * col.std() / np.sqrt(3)) for col in table.T]


@pytest.fixture(scope="module")
def tool():
    sys.path.insert(0, str(TOOLS))
    try:
        yield importlib.import_module("mpbm_study_table")
    finally:
        sys.path.remove(str(TOOLS))


def test_the_table_is_the_mean_and_standard_error_of_the_records(study, tool, capsys):
    assert tool.main([str(study), *CONFIGS, "--selection", "oracle"]) == 0
    rows = markdown_rows(capsys.readouterr().out, "| Algorithm")
    assert [row[0] for row in rows] == ["ERM", "MPBM (mpbm_lambda_mix = 0)"]
    for row, config in zip(rows, CONFIGS):
        assert row[1] == "3"
        assert row[2:] == [f"{m:.1f} ± {e:.1f}" for m, e in expected_cells(config)]


def test_plot_draws_the_table(study, tool, tmp_path):
    """Every bar and its error bar, in the png the CLI writes, are the table's cells."""
    kept = {}
    from dg_plugins.collect import plots

    save, plots.save_png = plots.save_png, lambda figure, path: kept.setdefault(path, figure)
    try:
        assert tool.main([str(study), *CONFIGS, "--plot", str(tmp_path / "s.png")]) == 0
    finally:
        plots.save_png = save
    (figure,) = kept.values()
    artists = {a.get_gid(): a for ax in figure.axes for a in [*ax.patches, *ax.collections]
               if a.get_gid()}
    columns = ["mnist (source, val)", *ENVIRONMENTS[1:], "Avg (targets)"]
    for config, row in zip(CONFIGS, ["ERM", "MPBM (mpbm_lambda_mix = 0)"]):
        segments = sorted(artists[f"{row}|err"].get_segments(), key=lambda s: s[0][0])
        assert len(segments) == len(columns)
        for column, (mean, err), segment in zip(columns, expected_cells(config), segments):
            bar = artists[f"{row}|{column}"]
            assert bar.get_height() == pytest.approx(mean)
            assert bar.get_x() + bar.get_width() / 2 == pytest.approx(segment[0][0])
            (low, high) = segment[0][1], segment[1][1]
            assert ((high - low) / 2, (high + low) / 2) == pytest.approx((err, mean))


def test_cli_writes_the_png_and_names_an_empty_folder(study, tmp_path):
    out = tmp_path / "study.png"
    done = subprocess.run([sys.executable, str(TOOLS / "mpbm_study_table.py"), str(study),
                           *CONFIGS, "--plot", str(out)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (study / "empty").mkdir()
    failed = subprocess.run([sys.executable, str(TOOLS / "mpbm_study_table.py"), str(study),
                             "erm", "empty"], capture_output=True, text=True, timeout=120)
    assert failed.returncode == 1
    assert "empty has no finished run" in failed.stderr and "leave 'empty' out" in failed.stderr
