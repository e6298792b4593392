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


def imported(stderr: str) -> set:
    """The modules a process run with ``python -X importtime`` imported (its stderr)."""
    return {line.rsplit("|", 1)[1].strip() for line in stderr.splitlines()
            if line.startswith("import time:")}


@pytest.fixture(scope="module")
def printed_run(sweep):
    """The real command, without --plot: the CSV tables and selected hparams it prints for the
    sweep (run with ``-X importtime``, so that its imports are known too)."""
    return subprocess.run([sys.executable, "-X", "importtime", "-m",
                           "dg_plugins.scripts.collect_results", "--input_dir", str(sweep), *ARGS,
                           "--format", "csv", "--hparams_table", "--no_save"],
                          capture_output=True, text=True, timeout=120, check=True)


@pytest.fixture(scope="module")
def printed(printed_run):
    """The CSV tables and selected hparams collect_results prints for the sweep."""
    cells_text, hparams_text = printed_run.stdout.split("\n\n")
    return (list(csv.DictReader(io.StringIO(cells_text))),
            list(csv.DictReader(io.StringIO(hparams_text))))


@pytest.fixture(scope="module")
def plotted(sweep, tmp_path_factory):
    """The real command with --plot into a new folder (``-X importtime``): (its run, the folder)."""
    out = tmp_path_factory.mktemp("cli") / "figures"
    result = subprocess.run([sys.executable, "-X", "importtime", "-m",
                             "dg_plugins.scripts.collect_results", "--input_dir", str(sweep),
                             *ARGS, "--no_save", "--plot", str(out)],
                            capture_output=True, text=True, timeout=120)
    return result, out


def gids(figure) -> dict:
    """gid -> artist, over every axes of the figure."""
    found = {}
    for ax in figure.axes:
        for artist in [*ax.patches, *ax.lines, *ax.collections, *ax.texts]:
            if artist.get_gid():
                found[artist.get_gid()] = artist
    return found


def texts(figure) -> list:
    """Every visible, non-empty text of the figure (titles, labels, ticks, legends, captions)."""
    from matplotlib.text import Text

    return [t for t in figure.findobj(Text) if t.get_visible() and t.get_text().strip()]


def caption(figure) -> str:
    """The figure's caption (its lowest figure-level text), lines joined."""
    return min(figure.texts, key=lambda t: t.get_position()[1]).get_text().replace("\n", " ")


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
        n = artists.get(f"{cell['algorithm']}|{column}|n")
        if err == "":  # the table prints no error: the bar has none, nor a trial count
            assert not at and n is None, (name, cell)
            continue
        # the error bar is labelled with its trial count (the Averages table's, for Avg)
        trials = cell["n"] or averages[(cell["selection"], cell["test_key"], cell["algorithm"],
                                        cell["table"])]["n"]
        assert n.get_text() == f"n={trials}" and n.get_position()[0] == pytest.approx(center)
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


def test_bar_charts_label_their_axes_and_mark_chance(drawn):
    kept, _ = drawn
    figure = kept["PACS_accuracy_iid.png"]
    ax = figure.axes[0]
    assert ax.get_xlabel() == "test domain" and ax.get_ylabel() == "accuracy (%)"
    chance = gids(figure)["chance"]
    assert chance.get_linestyle() == "--" and chance.get_ydata()[0] == pytest.approx(100 / 7)
    assert "PACS_source-A_accuracy_iid.png" in kept
    assert kept["PACS_source-A_accuracy_iid.png"].axes[0].get_xlabel().startswith(
        "target domain")
    udg = gids(kept["RotatedMNIST_udg-0-75_accuracy_iid.png"])["chance"]
    assert udg.get_ydata()[0] == pytest.approx(10)  # the catalogue's 10 classes
    assert "n = trials in each bar" in caption(figure)


def test_text_is_readable_at_the_saved_size(drawn):
    """Every text is at least 8 pt (11 pixels at the saved 100 dpi), and no figure is wider
    than 1,200 pixels (it is shown at 100% on a laptop screen)."""
    kept, _ = drawn
    for name, figure in kept.items():
        assert figure.get_figwidth() * plots.DPI <= 1200, name
        small = [(t.get_text(), t.get_fontsize()) for t in texts(figure) if t.get_fontsize() < 8]
        assert not small, (name, small[:3])


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
                # each method's own signal: iid the training domains' mean out-split, the
                # oracle the target's out-split
                if method == "iid":
                    signal = np.array([[np.mean([r[f"env{i}_out_acc"] for i in range(4)
                                                 if i != t]) for r in run] for run in runs])
                else:
                    signal = np.array([[r[f"env{t}_out_acc"] for r in run] for run in runs])
                target = np.array([[r[f"env{t}_in_acc"] for r in run] for run in runs])
                panel = f"{method}|target {labels[t]}"
                for key, values in (("signal", signal), ("target", target)):
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
                # the circles: the signal each chosen checkpoint was compared by, on its curve
                score_xs, score_ys = artists[f"{panel}|score"].get_data()
                np.testing.assert_allclose(sorted(zip(score_xs, score_ys)), sorted(
                    (float(row["step"]), 100 * float(row["val_acc"])) for row in chosen),
                    rtol=1e-12)
                if method == "oracle":  # DomainBed's oracle: the last checkpoint of each run
                    assert set(xs) == {STEPS[-1]}
                    assert sorted(score_ys) == pytest.approx(sorted(
                        100 * run[-1][f"env{t}_out_acc"] for run in runs))
                cell = next(c for c in cells if (c["selection"], c["table"], c["algorithm"],
                                                 c["column"], c["test_key"]) ==
                            (method, "PACS", algorithm, labels[t], "env{t}_in_acc"))
                assert np.mean(ys) == pytest.approx(float(cell["mean"]), rel=1e-9)
                checked += 1
    assert checked == 2 * 7
    # iid kept a checkpoint before the last somewhere (else iid and oracle could not differ)
    assert any(row["step"] != str(STEPS[-1]) for row in selected if row["selection"] == "iid")
    # the legend and caption say what each method's curve is and how the oracle picks
    figure = kept["PACS_ERM_curves.png"]
    labels = figure.legends[0].get_texts()
    assert {"iid's signal: source validation (mean out-split of the training domains)",
            "oracle's signal: target out-split"} <= {t.get_text() for t in labels}
    assert ("oracle (DomainBed's OracleSelectionMethod): each run's last checkpoint, no early "
            "stopping; the run (hparams) whose last checkpoint has the best signal"
            in caption(figure))
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


def test_cli_writes_and_names_the_figures(sweep, drawn, plotted, capsys):
    kept, _ = drawn
    result, out = plotted
    argv = ["--input_dir", str(sweep), *ARGS, "--no_save"]
    assert collect_results.main(argv) == 0
    plain = capsys.readouterr().out
    assert result.returncode == 0, result.stderr[-3000:]
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


def test_no_torch_and_no_matplotlib_without_plot(printed_run, plotted):
    """The command imports neither torch nor matplotlib without --plot, and with it no torch
    and no pyplot (the two real runs above, their imports listed by ``-X importtime``)."""
    result, out = plotted
    assert result.returncode == 0 and list(out.iterdir()), result.stderr[-3000:]
    without, with_plot = imported(printed_run.stderr), imported(result.stderr)
    assert "dg_plugins.collect.cli" in without, sorted(without)  # the imports are listed
    assert "matplotlib" in with_plot and "dg_plugins.collect.plots" in with_plot
    assert not {m for m in without if m == "torch" or m.startswith(("torch.", "matplotlib"))}
    heavy = {m for m in with_plot if m == "torch" or m.startswith("torch.")
             or m == "matplotlib.pyplot"}
    assert not heavy, heavy


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


@pytest.fixture(scope="module")
def first_sweep(tmp_path_factory):
    """A first sweep as the quick start runs it: one trial, one test environment (75 degrees)
    of RotatedMNIST5k; GMoE's last record has a NaN target accuracy, DisMAE's a NaN loss."""
    root = tmp_path_factory.mktemp("first") / "sweep"
    for algorithm in ("ERM", "DMG", "GMoE", "DisMAE"):
        write_job(root, algorithm, "RotatedMNIST5k", algorithm, [5], 6, 0, 0)
    for name, key in (("GMoE", "env5_in_acc"), ("DisMAE", "loss")):
        path = root / name / "results.jsonl"
        lines = path.read_text().splitlines()
        last = json.loads(lines[-1])
        last[key] = float("nan")
        path.write_text("\n".join(lines[:-1] + [json.dumps(last)]) + "\n")
    return root


def test_one_trial_nan_values_and_columns_not_run(first_sweep, tmp_path, capsys):
    kept = {}
    save = plots.save_png
    plots.save_png = lambda figure, path: kept.setdefault(path.rsplit("/", 1)[1], figure)
    try:
        assert collect_results.main(["--input_dir", str(first_sweep), "--no_save",
                                     "--plot", str(tmp_path)]) == 0
    finally:
        plots.save_png = save
    out, err = capsys.readouterr()
    # the table: test environment 75 only, a line names the others; NaN named, never "no key"
    lines = out.splitlines()
    at = lines.index("-------- Dataset: RotatedMNIST5k, model selection method: training-domain "
                     "validation set")
    assert lines[at + 1].split() == ["Algorithm", "75"]
    assert lines[at + 6] == ("left out: test environments 0, 15, 30, 45, 60 (not run) and Avg (it "
                             "needs every one); --all_columns shows them as X")
    last = STEPS[-1]
    notes = err.splitlines()
    assert (f"note: job GMoE has NaN env5_in_acc at step {last} (a NaN accuracy counts as missing "
            "in the tables and figures).") in notes
    assert f"note: job DisMAE has NaN loss at step {last} (a non-finite loss" in err
    assert (f"X for GMoE at 75 although the runs exist: the chosen records have NaN as "
            f"env<t>_in_acc (job GMoE at step {last})") in err
    assert "have no env<t>_in_acc" not in err
    # the bars: one trial is n=1, without an error bar; the caption says what was left out (the
    # oracle chose GMoE's last record, whose target accuracy is NaN)
    figure = kept["RotatedMNIST5k_accuracy_oracle.png"]
    artists = gids(figure)
    for algorithm in ("ERM", "DMG", "DisMAE"):
        assert artists[f"{algorithm}|75"].get_height() > 0
        assert artists[f"{algorithm}|75|n"].get_text() == "n=1"
        assert f"{algorithm}|err" not in artists
    assert "GMoE|75" not in artists
    text = caption(figure)
    assert "Left out: test environments 0, 15, 30, 45, 60 (not run)" in text
    assert f"job GMoE: NaN env5_in_acc at step {last}" in text
    assert f"job DisMAE: NaN loss at step {last}" in text and "Not drawn: GMoE" in text
    # the curves: the NaN value is not drawn and is named; a one-trial cell reads n=1
    curves = kept["RotatedMNIST5k_GMoE_curves.png"]
    xs, ys = gids(curves)["oracle|target 75|target"].get_data()
    assert list(xs) == list(STEPS) and np.isnan(ys[-1]) and not np.isnan(ys[:-1]).any()
    assert f"job GMoE: NaN env5_in_acc at step {last}" in caption(curves)
    titles = [ax.get_title() for ax in kept["RotatedMNIST5k_ERM_curves.png"].axes]
    assert any(t.endswith("iid table: " + cell_text(first_sweep, "ERM")) for t in titles)
    assert not any("± 0.0" in t for t in titles)
    # one dataset's curves share their y range, which holds every value and chance (10%)
    ranges = {name: figure.axes[0].get_ylim() for name, figure in kept.items()
              if name.endswith("_curves.png")}
    assert len(ranges) == 4 and len(set(ranges.values())) == 1
    low, high = next(iter(ranges.values()))
    for name, figure in kept.items():
        if name.endswith("_curves.png"):
            for gid, artist in gids(figure).items():
                if gid.endswith(("|signal", "|target")):
                    values = artist.get_data()[1]
                    values = values[~np.isnan(values)]
                    assert low <= values.min() and values.max() <= high
            assert gids(figure)["iid|target 75|chance"].get_ydata()[0] == pytest.approx(10)
    assert low <= 10


def cell_text(root, algorithm) -> str:
    """The iid cell of a one-trial, one-hparams job: its best source-validation checkpoint's
    target accuracy, as the figures write it."""
    records = [json.loads(line) for line in
               (root / algorithm / "results.jsonl").read_text().splitlines()]
    best = max(records, key=lambda r: np.mean([r[f"env{i}_out_acc"] for i in range(5)]))
    return f"{100 * best['env5_in_acc']:.1f} (n=1)"


def test_a_dataset_without_a_column_to_show_still_gets_its_curves(tmp_path, capsys,
                                                                  monkeypatch):
    """VLCS has only single-source runs, so its multi-source tables show no column and no Avg:
    collect_results --plot drew every figure's titles from those empty rows and raised IndexError
    (as on the before/after fixture, where Debug28 is such a dataset). Now PACS's panel carries
    its table cell and VLCS's single-source curves their own table's Avg."""
    root = tmp_path / "sweep"
    for trial in range(2):
        write_job(root, f"MPBM_{trial}", "VLCS", "MPBM", [1, 2, 3], 4, trial, 0)
        write_job(root, f"ERM_{trial}", "PACS", "ERM", [3], 4, trial, 0)
    kept = {}
    monkeypatch.setattr(plots, "save_png",
                        lambda figure, path: kept.setdefault(path.rsplit("/", 1)[1], figure))
    assert collect_results.main(["--input_dir", str(root), "--no_save",
                                 "--plot", str(tmp_path / "figures")]) == 0
    assert "left out: dataset VLCS (no single-test-environment run)" in capsys.readouterr().out
    titles = {name: [ax.get_title() for ax in figure.axes] for name, figure in kept.items()}
    assert any("iid table: " in title for title in titles["PACS_ERM_curves.png"])
    assert any("iid table: Avg " in title
               for title in titles["VLCS_MPBM_single_source_curves.png"])


def test_an_infinite_leave_one_out_signal_leaves_the_y_range_finite(tmp_path, capsys):
    """A step whose first record has a NaN ``env1_out_acc`` counts one environment, and
    leave-one-out divides by that count minus one (DomainBed's rule): target 1's signal at step 0
    is infinite. The figures are still drawn, on a range of the finite values."""
    root = tmp_path / "sweep"
    for name, envs in (("single", [1]), ("pair0", [1, 0]), ("pair2", [1, 2]), ("pair3", [1, 3])):
        write_job(root, name, "PACS", "ERM", envs, 4, 0, 0)
        path = root / name / "results.jsonl"
        records = [json.loads(line) for line in path.read_text().splitlines()]
        records[0]["env1_out_acc"] = float("nan")
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    kept = {}
    save = plots.save_png
    plots.save_png = lambda figure, path: kept.setdefault(path.rsplit("/", 1)[1], figure)
    try:
        assert collect_results.main(["--input_dir", str(root), "--no_save", "--selection", "loo",
                                     "--plot", str(tmp_path / "f")]) == 0
    finally:
        plots.save_png = save
    capsys.readouterr()
    curves = kept["PACS_ERM_curves.png"]
    signal = gids(curves)["loo|target C|signal"].get_data()[1]
    assert np.isinf(signal[0]) and np.isfinite(signal[1:]).all()
    low, high = curves.axes[0].get_ylim()
    assert 0 <= low < signal[1:].min() and signal[1:].max() < high <= 100  # in percent
