"""collect_results --plot (dg_plugins.collect.plots): the numbers the figures draw, read back from
their artists, are the numbers the tables print (``--format csv``) and, for the training curves,
the records' own values of the runs the tables selected (``--hparams_table``). Pixels are not
compared."""

import csv
import io
import json
import subprocess
import sys
import zlib
from collections import defaultdict

import numpy as np
import pytest

from dg_plugins import reference
from dg_plugins.collect import plots
from dg_plugins.scripts import collect_results

PAPERS = ["dmg_pacs_resnet18", "mpbm_pacs"]
ARGS = ["--selection", "iid", "oracle", "--paper", *PAPERS]
STEPS = (0, 100, 200, 300)


def accuracy(*key) -> float:
    """A fixed pseudo-random accuracy in [0.2, 0.95) for a (job, step, key) tuple."""
    seed = zlib.crc32(json.dumps(key).encode())
    return float(np.round(0.2 + 0.75 * np.random.default_rng(seed).random(), 4))


def write_job(root, name, dataset, algorithm, test_envs, n_envs, trial, hparams_seed,
              label_fraction=None):
    """A job folder with a record per step of :data:`STEPS`; every accuracy differs."""
    records = []
    for step in STEPS:
        args = {"trial_seed": trial, "dataset": dataset, "algorithm": algorithm,
                "test_envs": list(test_envs), "hparams_seed": hparams_seed, "output_dir": name}
        if label_fraction is not None:
            args["label_fraction"] = label_fraction
        record = {"args": args, "step": step, "hparams": {"lr": 10.0 ** -hparams_seed}}
        for i in range(n_envs):
            for split in ("in", "out"):
                record[f"env{i}_{split}_acc"] = accuracy(name, step, i, split)
        records.append(record)
    (root / name).mkdir(parents=True)
    (root / name / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (root / name / "done").write_text("")


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """ERM and DMG on PACS (3 trials, 2 hparams seeds, every test environment but DMG's S, which
    prints X); MPBM single-source from A and C (2 trials); a UDG job pair on RotatedMNIST (DisMAE,
    targets 0 and 75, 10% and 100% of the labels, 2 trials)."""
    root = tmp_path_factory.mktemp("plots") / "sweep"
    for algorithm in ("ERM", "DMG"):
        for t in range(4 if algorithm == "ERM" else 3):
            for trial in range(3):
                for hp in range(2):
                    write_job(root, f"{algorithm}_{t}_{trial}_{hp}", "PACS", algorithm, [t], 4,
                              trial, hp)
    for source in (0, 1):
        for trial in range(2):
            write_job(root, f"MPBM_{source}_{trial}", "PACS", "MPBM",
                      [t for t in range(4) if t != source], 4, trial, 0)
    for fraction in (0.1, 1.0):
        for trial in range(2):
            write_job(root, f"DisMAE_{fraction}_{trial}", "RotatedMNIST", "DisMAE", [0, 5], 6,
                      trial, 0, label_fraction=fraction)
    return root


@pytest.fixture(scope="module")
def drawn(sweep, tmp_path_factory):
    """collect_results --plot in process, every figure kept as it is saved (the CLI's path), and
    the tables it printed as CSV, with the selected hparams."""
    out = tmp_path_factory.mktemp("figures")
    kept = {}
    save = plots.save_png
    plots.save_png = lambda figure, path: kept.setdefault(path.rsplit("/", 1)[1], figure)
    try:
        status = collect_results.main(["--input_dir", str(sweep), *ARGS, "--format", "csv",
                                       "--hparams_table", "--no_save", "--plot", str(out)])
    finally:
        plots.save_png = save
    assert status == 0
    return kept, out


@pytest.fixture(scope="module")
def printed(sweep):
    """The CSV tables and selected hparams collect_results prints for the sweep."""
    result = subprocess.run([sys.executable, "-m", "dg_plugins.scripts.collect_results",
                             "--input_dir", str(sweep), *ARGS, "--format", "csv",
                             "--hparams_table", "--no_save"],
                            capture_output=True, text=True, timeout=120, check=True)
    cells_text, hparams_text = result.stdout.split("\n\n")
    return (list(csv.DictReader(io.StringIO(cells_text))),
            list(csv.DictReader(io.StringIO(hparams_text))))


def gids(figure) -> dict:
    """gid -> artist, over every axes of the figure."""
    found = {}
    for ax in figure.axes:
        for artist in [*ax.patches, *ax.lines, *ax.collections]:
            if artist.get_gid():
                found[artist.get_gid()] = artist
    return found


def figure_of(table: str, selection: str, test_key: str) -> str:
    dataset, _, rest = table.partition(", ")
    if test_key == "single_source":
        return f"{dataset}_source-{rest.removeprefix('source ')}_accuracy_{selection}.png"
    if test_key == "udg":
        return f"{dataset}_udg-{rest.removeprefix('UDG targets ').replace(', ', '-')}" \
               f"_accuracy_{selection}.png"
    return f"{'averages' if table == 'Averages' else table}_accuracy_{selection}.png"


def test_bars_error_bars_and_paper_markers_are_the_tables_numbers(drawn, printed):
    kept, _ = drawn
    cells, _ = printed
    measured = [c for c in cells if c["kind"] == "measured"]
    averages = {(c["selection"], c["test_key"], c["algorithm"], c["column"]): c
                for c in measured if c["table"] == "Averages"}
    checked = defaultdict(int)
    for cell in measured:
        name = figure_of(cell["table"], cell["selection"], cell["test_key"])
        if cell["table"] == "Averages":
            assert name not in kept  # one dataset per kind here: no Averages figure
            continue
        artists = gids(kept[name])
        column = cell["column"].removesuffix(" (source)")
        bar = artists.get(f"{cell['algorithm']}|{column}")
        if cell["mean"] == "":  # X: no bar
            assert bar is None, (name, cell)
            continue
        assert bar.get_height() == pytest.approx(float(cell["mean"]), rel=1e-9), (name, cell)
        err = cell["err"]
        if column == "Avg" and err == "" and cell["test_key"] == "env{t}_in_acc":
            err = averages[(cell["selection"], cell["test_key"], cell["algorithm"],
                            cell["table"])]["err"]
        center = bar.get_x() + bar.get_width() / 2
        errors = artists.get(f"{cell['algorithm']}|err")
        at = [(s[0][1], s[1][1]) for s in (errors.get_segments() if errors else [])
              if s[0][0] == pytest.approx(center)]
        if err == "":  # the table prints no error: the bar has none
            assert not at, (name, cell)
            continue
        (low, high), = at
        assert (low + high) / 2 == pytest.approx(float(cell["mean"]), rel=1e-9)
        assert (high - low) / 2 == pytest.approx(float(err), rel=1e-9), (name, cell)
        checked[cell["test_key"]] += 1
    # every kind of table was drawn: PACS x 2 methods x (4 ERM + 3 DMG + ERM's Avg with the
    # Averages table's error), single-source (2 sources x 2 methods x 3 targets + source), UDG
    assert checked == {"env{t}_in_acc": 2 * 8, "single_source": 2 * 2 * 4, "udg": 2 * 2 * 3}
    # paper markers: the paper's number for the algorithm's paper row, on the algorithm's bars
    n_markers = 0
    for name, figure in kept.items():
        for gid, artist in gids(figure).items():
            if not gid.startswith("paper|"):
                continue
            _, key, algorithm = gid.split("|")
            entry = reference.get(key)
            values = entry.rows[entry.paper_row(algorithm)]
            columns = [c for c in ("A", "C", "P", "S", "Avg") if c in values]
            xs, ys = artist.get_data()
            assert list(ys) == [values[c].mean for c in columns]
            bars = gids(figure)
            for x, column in zip(xs, columns):
                bar = bars.get(f"{algorithm}|{column}")
                if bar is not None:
                    assert x == pytest.approx(bar.get_x() + bar.get_width() / 2)
            n_markers += 1
    # dmg_pacs_resnet18 (iid only): ERM and DMG; mpbm_pacs: MPBM under each source and method
    assert n_markers == 2 + 2 * 2


def test_curves_are_the_records_of_the_selected_runs(sweep, drawn, printed):
    kept, _ = drawn
    cells, selected = printed
    records = defaultdict(list)
    for path in sweep.glob("*/results.jsonl"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            args = record["args"]
            if len(args["test_envs"]) == 1 and "label_fraction" not in args:
                records[(args["algorithm"], args["test_envs"][0], args["trial_seed"],
                         args["hparams_seed"])].append(record)
    labels = ["A", "C", "P", "S"]
    checked = 0
    for method in ("iid", "oracle"):
        for algorithm in ("ERM", "DMG"):
            artists = gids(kept[f"PACS_{algorithm}_curves.png"])
            for t in range(4 if algorithm == "ERM" else 3):
                chosen = [row for row in selected if (row["selection"], row["algorithm"],
                                                      row["test_env"]) == (method, algorithm,
                                                                           str(t))]
                assert len(chosen) == 3
                runs = [records[(algorithm, t, int(row["trial_seed"]), int(row["hparams_seed"]))]
                        for row in chosen]
                val = np.array([[np.mean([r[f"env{i}_out_acc"] for i in range(4) if i != t])
                                 for r in run] for run in runs])
                target = np.array([[r[f"env{t}_in_acc"] for r in run] for run in runs])
                panel = f"{method}|target {labels[t]}"
                for key, values in (("val", val), ("target", target)):
                    xs, ys = artists[f"{panel}|{key}"].get_data()
                    assert list(xs) == list(STEPS)
                    np.testing.assert_allclose(ys, 100 * values.mean(axis=0), rtol=1e-12)
                    vertices = artists[f"{panel}|{key}_band"].get_paths()[0].vertices
                    for x, low, high in zip(STEPS, 100 * values.min(0), 100 * values.max(0)):
                        at = vertices[np.isclose(vertices[:, 0], x)][:, 1]
                        assert np.isclose(at, low).any() and np.isclose(at, high).any()
                # the stars: each trial's selected checkpoint, whose mean is the table's cell
                xs, ys = artists[f"{panel}|selected"].get_data()
                np.testing.assert_allclose(sorted(zip(xs, ys)), sorted(
                    (float(row["step"]), 100 * float(row["test_acc"])) for row in chosen),
                    rtol=1e-12)
                cell = next(c for c in cells if (c["selection"], c["table"], c["algorithm"],
                                                 c["column"], c["test_key"]) ==
                            (method, "PACS", algorithm, labels[t], "env{t}_in_acc"))
                assert np.mean(ys) == pytest.approx(float(cell["mean"]), rel=1e-9)
                checked += 1
    assert checked == 2 * 7
    # iid kept a checkpoint before the last somewhere (else iid and oracle could not differ)
    assert any(row["step"] != str(STEPS[-1]) for row in selected if row["selection"] == "iid")
    # single-source and UDG: the stars average to the table's Avg (the mean over the targets)
    for name, table, row, panel in (
            ("PACS_MPBM_single_source_curves.png", "PACS, source C", "MPBM", "source C"),
            ("RotatedMNIST_DisMAE_udg_curves.png", "RotatedMNIST, UDG targets 0, 75",
             "DisMAE 10%", "10% labels, targets 0, 75"),
            ("RotatedMNIST_DisMAE_udg_curves.png", "RotatedMNIST, UDG targets 0, 75",
             "DisMAE 100%", "100% labels, targets 0, 75")):
        artists = gids(kept[name])
        for method in ("iid", "oracle"):
            _, ys = artists[f"{method}|{panel}|selected"].get_data()
            cell = next(c for c in cells if (c["selection"], c["table"], c["algorithm"],
                                             c["column"]) == (method, table, row, "Avg"))
            assert len(ys) == 2 and np.mean(ys) == pytest.approx(float(cell["mean"]), rel=1e-9)


def test_cli_writes_and_names_the_figures(sweep, drawn, tmp_path, capsys):
    kept, _ = drawn
    out = tmp_path / "figures"
    argv = ["--input_dir", str(sweep), *ARGS, "--no_save"]
    assert collect_results.main(argv) == 0
    plain = capsys.readouterr().out
    result = subprocess.run([sys.executable, "-m", "dg_plugins.scripts.collect_results", *argv,
                             "--plot", str(out)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout == plain  # the tables are unchanged
    written = [line.removeprefix("figure: ") for line in result.stderr.splitlines()
               if line.startswith("figure: ")]
    assert sorted(written) == sorted(str(path) for path in out.iterdir())
    assert [w.rsplit("/", 1)[1] for w in written] == list(kept)  # stable names, one order
    assert {"PACS_accuracy_iid.png", "PACS_accuracy_oracle.png", "PACS_ERM_curves.png",
            "PACS_DMG_curves.png", "PACS_source-A_accuracy_iid.png",
            "PACS_MPBM_single_source_curves.png", "RotatedMNIST_udg-0-75_accuracy_oracle.png",
            "RotatedMNIST_DisMAE_udg_curves.png"} <= set(kept)
    for path in written:
        with open(path, "rb") as handle:
            assert handle.read(8) == b"\x89PNG\r\n\x1a\n"


def test_no_torch_and_no_matplotlib_without_plot(sweep, tmp_path):
    code = ("import sys; from dg_plugins.scripts.collect_results import main; "
            f"main(['--input_dir', {str(sweep)!r}, '--no_save']); "
            "assert 'matplotlib' not in sys.modules; "
            f"main(['--input_dir', {str(sweep)!r}, '--no_save', '--plot', {str(tmp_path)!r}]); "
            "heavy = {'torch', 'matplotlib.pyplot'} & set(sys.modules); assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=120)


def test_a_table_of_x_cells_gets_no_figure(sweep, tmp_path, capsys):
    """A single-source sweep: its standard tables (--single_source on prints them) are all X."""
    only = tmp_path / "single_source"
    only.mkdir()
    for job in sweep.glob("MPBM_*"):
        (only / job.name).symlink_to(job)
    assert collect_results.main(["--input_dir", str(only), "--single_source", "on", "--no_save",
                                 "--selection", "iid", "--plot", str(tmp_path / "f")]) == 0
    out, err = capsys.readouterr()
    assert "-------- Dataset: PACS, model selection method: training-domain" in out
    assert sorted(p.name for p in (tmp_path / "f").iterdir()) == [
        "PACS_MPBM_single_source_curves.png", "PACS_source-A_accuracy_iid.png",
        "PACS_source-C_accuracy_iid.png"]


def test_bad_plot_folders_and_conflicts_are_one_line_errors(sweep, tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("")
    for argv, message in (([str(afile)], "is a file; give a folder"),
                          ([str(afile / "sub")], "cannot create the folder"),
                          ([str(tmp_path), "--learning_check"], "drop one of them")):
        with pytest.raises(SystemExit) as exit_info:
            collect_results.main(["--input_dir", str(sweep), "--plot", *argv])
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and message in err.splitlines()[-1]


def test_help_is_plain_text(capsys):
    with pytest.raises(SystemExit):
        collect_results.main(["--help"])
    text = capsys.readouterr().out
    assert "--plot DIR" in text and "dg_plugins.collect.formats" in text
    for markup in (":mod:", ":func:", ":class:", ":meth:", ":data:", "``", "`"):
        assert markup not in text, markup
