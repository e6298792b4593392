"""collect_results: DomainBed's tables byte for byte, plus our formats and tables
(dg_plugins.collect.tables, dg_plugins.scripts.collect_results; ``domainbed/scripts/collect_results.py``)."""

import csv
import io
import json
import re
import shutil
import subprocess
import sys

import pytest

from dg_plugins.collect import formats, ipoop, selection, tables
from dg_plugins.collect import report as report_lib
from dg_plugins.collect.records import load_records
from dg_plugins.scripts import collect_results
from dg_plugins.job.records import format_row

FIXTURE = "domainbed_sweep_data"
EXPECTED = {"text": "domainbed_sweep_data.expected_tables.txt",
            "latex": "domainbed_sweep_data.expected_tables_latex.txt"}


@pytest.fixture
def sweep(shared_fixtures, tmp_path):
    """A writable copy of the fixture sweep (40 VLCS jobs, ERM, 200 records)."""
    target = tmp_path / "sweep"
    shutil.copytree(shared_fixtures / FIXTURE, target)
    for name in ("results.txt", "results.tex"):
        (target / name).unlink(missing_ok=True)
    return target


def expected(shared_fixtures, fmt):
    return (shared_fixtures / EXPECTED[fmt]).read_text()


def rewrite(sweep, change):
    """Apply ``change(record) -> record or None (dropped)`` to every record of the sweep."""
    for path in sweep.glob("*/results.jsonl"):
        records = [change(json.loads(line)) for line in path.read_text().splitlines()]
        path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in records if r))


def run(capsys, *argv):
    status = collect_results.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return status, out, err


# --------------------------------------------------------------------------------------------------
# Formatting helpers


def test_cells_are_domainbeds_format_mean():
    cell = tables.Cell.of([0.1, 0.2, 0.3])
    assert cell.text() == "20.0 +/- 4.7" and cell.text("$\\pm$") == "20.0 $\\pm$ 4.7"
    assert cell.n == 3
    assert tables.Cell.of([]).text() == "X" and tables.Cell.of([]).n == 0
    cell = tables.Cell.of([0.5, 0.7])
    assert cell.mean == pytest.approx(60.0) and cell.err == pytest.approx(100 * 0.1 / 2 ** 0.5)
    average = tables.Cell.average([tables.Cell.of([0.5]), tables.Cell.of([0.7, 0.8])])
    assert average.mean == pytest.approx(62.5) and average.text() == "62.5"
    assert average.n is None and average.err is None
    assert tables.Cell.average([tables.Cell.of([0.5]), tables.Cell.of([])]).text() == "X"


def test_format_row_truncates_and_keeps_the_trailing_space():
    assert format_row(["Algorithm", "a_very_long_cell", 0.5], colwidth=6) == (
        "Algori  a_very  0.5000 ")
    assert format_row(["\\textbf{C1}", "x"], colwidth=10, latex=True) == (
        "\\textbf{C1 & x          \\\\")


# --------------------------------------------------------------------------------------------------
# Parity with DomainBed's golden output


@pytest.mark.parametrize("fmt", ["text", "latex"])
def test_cli_prints_domainbeds_tables_byte_for_byte(shared_fixtures, sweep, fmt):
    command = [sys.executable, "-m", "dg_plugins.scripts.collect_results", "--input_dir",
               str(sweep)] + (["--latex"] if fmt == "latex" else [])
    result = subprocess.run(command, capture_output=True, check=True)
    assert result.stdout.decode() == expected(shared_fixtures, fmt)
    written = sweep / ("results.tex" if fmt == "latex" else "results.txt")
    assert written.read_text() == expected(shared_fixtures, fmt)


def test_in_process_output_and_overwrite(shared_fixtures, sweep, capsys):
    (sweep / "results.txt").write_text("old content that must go\n" * 100)
    status, out, err = run(capsys, "--input_dir", sweep)
    assert status == 0 and out == expected(shared_fixtures, "text") and err == ""
    assert (sweep / "results.txt").read_text() == out
    status, out, _ = run(capsys, "--input_dir", sweep, "--format", "latex", "--no_save")
    assert out == expected(shared_fixtures, "latex")


def test_no_torch_import(sweep):
    code = ("import sys; from dg_plugins.scripts.collect_results import main; "
            f"main(['--input_dir', {str(sweep)!r}, '--no_save']); "
            "heavy = {'torch', 'torchvision', 'timm', 'dg_plugins.datasets', "
            "'dg_plugins.algorithms'} & set(sys.modules); assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


def test_selection_subset(shared_fixtures, sweep, capsys):
    _, out, _ = run(capsys, "--input_dir", sweep, "--selection", "oracle", "iid", "--no_save")
    # the golden text: "Total records", then 2 tables per method, separated by empty lines
    blocks = expected(shared_fixtures, "text").rstrip("\n").split("\n\n")
    assert out == "\n\n".join([blocks[0], *blocks[5:7], *blocks[1:3]]) + "\n"


# --------------------------------------------------------------------------------------------------
# Robustness and differences from DomainBed


def test_corrupt_lines_are_skipped_and_tables_still_printed(shared_fixtures, sweep, capsys):
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir())
    path = jobs[0] / "results.jsonl"
    path.write_text(path.read_text() + '{"args": {"algorithm": "ERM", "dat')
    path = jobs[1] / "results.jsonl"
    path.write_text("garbage\n" + path.read_text().rstrip("\n"))  # and no final newline
    status, out, err = run(capsys, "--input_dir", sweep, "--no_save")
    assert status == 0
    assert out == expected(shared_fixtures, "text")
    assert f"line 6 of {jobs[0] / 'results.jsonl'}" in err
    assert f"line 1 of {jobs[1] / 'results.jsonl'}" in err


def test_unknown_dataset_is_shown_after_known_ones(sweep, capsys):
    def change(record):
        if record["args"]["trial_seed"] == 1:
            record["args"]["dataset"] = "MyData"
        return record

    rewrite(sweep, change)
    _, out, _ = run(capsys, "--input_dir", sweep, "--no_save")
    lines = out.splitlines()
    header = lines.index("-------- Dataset: MyData, model selection method: "
                         "training-domain validation set")
    assert lines.index("-------- Dataset: VLCS, model selection method: "
                       "training-domain validation set") < header
    assert lines[header + 1].split() == ["Algorithm", "0", "1", "2", "3", "Avg"]
    assert lines[header + 2].split()[:4] == ["ERM", "98.3", "+/-", "0.0"]  # one trial
    averages = lines.index("-------- Averages, model selection method: "
                           "training-domain validation set")
    assert lines[averages + 1].split() == ["Algorithm", "VLCS", "MyData", "Avg"]


def test_missing_environment_shows_x_but_averages_keep_a_number(sweep, capsys):
    rewrite(sweep, lambda r: None if r["args"]["test_envs"] == [0] else r)
    _, out, _ = run(capsys, "--input_dir", sweep, "--no_save", "--selection", "iid",
                    "--all_columns")
    lines = out.splitlines()
    row = lines[lines.index("-------- Dataset: VLCS, model selection method: "
                            "training-domain validation set") + 2]
    assert row.split()[:2] == ["ERM", "X"] and row.split()[-1] == "X"
    averages = lines[lines.index("-------- Averages, model selection method: "
                                 "training-domain validation set") + 2]
    assert averages.split()[1] != "X" and averages.split()[-1] != "X"  # DomainBed's quirk


def test_columns_no_run_has_are_left_out_with_a_line(sweep, capsys):
    """By default a test environment no run has is left out, and Avg with it (X in every row);
    --all_columns is DomainBed's layout; csv keeps every cell."""
    rewrite(sweep, lambda r: None if 0 in r["args"]["test_envs"] else r)
    _, full, _ = run(capsys, "--input_dir", sweep, "--no_save", "--all_columns")
    _, out, err = run(capsys, "--input_dir", sweep, "--no_save")
    table = block(out, "Dataset: VLCS, model selection method: training-domain validation set")
    assert table[0].split() == ["Algorithm", "L", "S", "V"]
    assert table[-1] == ("left out: test environment C (not run) and Avg (it needs every one); "
                         "--all_columns shows them as X")
    full_table = block(full, "Dataset: VLCS, model selection method: training-domain "
                             "validation set")
    assert full_table[0].split() == ["Algorithm", "C", "L", "S", "V", "Avg"]
    assert cells(full_table[1])[2:5] == cells(table[1])[1:4]  # the same cells, C and Avg gone
    averages = block(out, "Averages, model selection method: training-domain validation set")
    assert averages == block(full, "Averages, model selection method: training-domain "
                                   "validation set")  # VLCS ran: its column stays
    # the notes do not explain X cells that are not printed, and say what the Averages mean
    assert "X for ERM in every table" not in err
    assert ("note: Averages table, VLCS column: each trial is averaged over the test "
            "environments it has (DomainBed's rule), here L, S, V for every row; VLCS has C, L, "
            "S, V [iid, oracle]." in err.splitlines())
    _, csv_out, _ = run(capsys, "--input_dir", sweep, "--no_save", "--format", "csv")
    assert {row["column"] for row in csv.DictReader(io.StringIO(csv_out))
            if row["table"] == "VLCS"} == {"C", "L", "S", "V", "Avg"}
    _, text, _ = run(capsys, "--input_dir", sweep, "--no_save", "--format", "markdown")
    assert "\n\nleft out: test environment C (not run) and Avg" in text
    _, text, _ = run(capsys, "--input_dir", sweep, "--no_save", "--format", "latex")
    assert ("\\midrule\n\\multicolumn{4}{l}{\\footnotesize left out: test environment C (not "
            "run) and Avg (it needs every one); -{}-all\\_columns shows them as X} \\\\\n"
            "\\bottomrule") in text


def test_algorithm_order_known_first_then_first_appearance(sweep, capsys):
    def change(record):
        record["args"]["algorithm"] = {0: "Zeta", 1: "CORAL"}[record["args"]["trial_seed"]]
        return record

    rewrite(sweep, change)
    (sweep / "extra").mkdir()
    record = json.loads(next(sweep.glob("*/results.jsonl")).read_text().splitlines()[0])
    record["args"].update(algorithm="ERM", trial_seed=5)
    (sweep / "extra" / "results.jsonl").write_text(json.dumps(record) + "\n")
    _, out, _ = run(capsys, "--input_dir", sweep, "--no_save", "--selection", "oracle")
    rows = [line.split()[0] for line in out.splitlines()[4:7]]
    assert rows == ["ERM", "CORAL", "Zeta"]


def test_empty_and_missing_input_dirs(tmp_path, capsys):
    status, out, err = run(capsys, "--input_dir", tmp_path)
    assert status == 1 and out == "" and "no records" in err and str(tmp_path) in err
    assert not (tmp_path / "results.txt").exists()
    with pytest.raises(SystemExit) as exit_info:
        collect_results.main(["--input_dir", str(tmp_path / "missing")])
    assert exit_info.value.code == 2
    assert "missing" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        collect_results.main(["--input_dir", str(tmp_path), "--latex", "--format", "csv"])


# --------------------------------------------------------------------------------------------------
# Beyond DomainBed: formats, hparams table, IP/OOP tables


def test_markdown_and_csv_files(sweep, capsys):
    status, out, _ = run(capsys, "--input_dir", sweep, "--format", "markdown")
    assert status == 0 and (sweep / "results.md").read_text() == out
    assert "| Algorithm | C | L | S | V | Avg |" in out
    assert "| ERM | 98.0 ± 0.2 | 64.2 ± 0.8 | 74.1 ± 0.4 | 77.1 ± 0.2 | 78.3 |" in out
    status, out, _ = run(capsys, "--input_dir", sweep, "--format", "csv")
    assert (sweep / "results.csv").read_text() == out
    rows = list(csv.DictReader(io.StringIO(out)))
    assert len(rows) == 3 * (5 + 2)  # 3 methods x (VLCS: 4 envs + Avg; Averages: VLCS + Avg)
    cell = next(r for r in rows if r["selection"] == "iid" and r["column"] == "C")
    assert cell["table"] == "VLCS" and cell["text"] == "98.0 +/- 0.2" and cell["n"] == "2"
    assert float(cell["mean"]) == pytest.approx(97.97, abs=0.01)


def test_hparams_table(sweep, capsys):
    status, out, _ = run(capsys, "--input_dir", sweep, "--hparams_table")
    assert status == 0
    assert "-------- Selected hparams, model selection method: leave-one-domain-out" in out
    rows = list(csv.DictReader(io.StringIO((sweep / "selected_hparams.csv").read_text())))
    assert len(rows) == 3 * 4 * 2  # methods x test envs x trials
    records = load_records(str(sweep))
    for method in selection.METHODS.values():
        for choice in selection.select(records, method).itertuples():
            row = next(r for r in rows if r["selection"] == method.key
                       and int(r["test_env"]) == choice.test_env
                       and int(r["trial_seed"]) == choice.trial_seed)
            picked = records.iloc[choice.record]
            assert int(row["hparams_seed"]) == choice.hparams_seed
            assert int(row["step"]) == choice.step == picked["step"]
            assert json.loads(row["hparams"]) == picked["hparams"]
            assert row["job"] == picked["job"]
            assert f"{row['test_env_label']} ({row['test_env']})" in out
    # the default output does not have it
    _, out, _ = run(capsys, "--input_dir", sweep, "--no_save")
    assert "Selected hparams" not in out


def test_ip_oop_tables_only_when_the_keys_exist(shared_fixtures, sweep, capsys):
    golden = expected(shared_fixtures, "text")

    def change(record):
        for i in range(4):
            record[f"env{i}_in_ip_acc"] = 1.0
            record[f"env{i}_in_oop_acc"] = 0.25
        return record

    rewrite(sweep, change)
    _, out, _ = run(capsys, "--input_dir", sweep, "--no_save")
    assert out.startswith(golden) and out != golden
    extra = out[len(golden):]
    assert extra.count("test accuracy: env{t}_in_ip_acc") == 6  # 3 methods x (VLCS, Averages)
    assert extra.count("test accuracy: env{t}_in_oop_acc") == 6
    assert "ERM                   100.0 +/- 0.0" in extra and "25.0 +/- 0.0" in extra
    _, latex, _ = run(capsys, "--input_dir", sweep, "--no_save", "--latex")
    assert latex.endswith("\\end{document}\n")
    assert ("\\subsection{Model selection: training-domain validation set (IP: in-pretraining"
            in latex)


def test_ip_oop_pooled_over_the_whole_test_environment(shared_fixtures, sweep, capsys):
    """With the subsets' sizes, the whole-domain figure is the in and out splits' subset
    accuracies weighted by those sizes (an empty subset adds nothing); --ipoop picks which
    figure is shown and each table's header names its key."""
    golden = expected(shared_fixtures, "text")

    def change(record):
        for i in range(4):
            record.update({f"env{i}_in_ip_acc": 1.0, f"env{i}_in_ip_count": 30,
                           f"env{i}_out_ip_acc": 0.0, f"env{i}_out_ip_count": 10,
                           f"env{i}_in_oop_acc": 0.5, f"env{i}_in_oop_count": 20,
                           f"env{i}_out_oop_acc": float("nan"), f"env{i}_out_oop_count": 0})
        return record

    rewrite(sweep, change)
    _, both, _ = run(capsys, "--input_dir", sweep, "--no_save", "--selection", "iid")
    _, pooled, _ = run(capsys, "--input_dir", sweep, "--no_save", "--selection", "iid",
                       "--ipoop", "pooled")
    _, in_only, _ = run(capsys, "--input_dir", sweep, "--no_save", "--selection", "iid",
                        "--ipoop", "in")
    standard = run(capsys, "--input_dir", shared_fixtures / FIXTURE, "--no_save",
                   "--selection", "iid")[1]
    for out in (both, pooled, in_only):
        assert out.startswith(standard)  # the standard tables are unchanged
    assert "env{t}_pooled" not in in_only and "env{t}_in_ip_acc" in in_only
    assert "env{t}_in_ip_acc" not in pooled
    ip = [s for s in pooled.split("-------- ") if "test accuracy: env{t}_pooled_ip_acc" in s]
    oop = [s for s in pooled.split("-------- ") if "test accuracy: env{t}_pooled_oop_acc" in s]
    assert len(ip) == len(oop) == 2  # VLCS and Averages
    assert "ERM                   75.0 +/- 0.0" in ip[0]  # (1.0 * 30 + 0.0 * 10) / 40
    assert "ERM                   50.0 +/- 0.0" in oop[0]  # the empty out subset adds nothing
    assert both.count("test accuracy: env{t}_pooled_ip_acc") == 2
    assert both.count("test accuracy: env{t}_in_ip_acc") == 2
    assert ("test accuracy: env{t}_pooled_ip_acc (IP subset of the whole test environment, in "
            "and out splits pooled)") in pooled
    assert "test accuracy: env{t}_in_ip_acc (IP subset of the test environment's in split)" in both
    assert golden  # the fixture's tables exist
    with pytest.raises(SystemExit):
        collect_results.parse_args(["--input_dir", str(sweep), "--ipoop", "out"])


def test_report_api(sweep):
    records = load_records(str(sweep))
    report = report_lib.build_report(records, [selection.LOO])
    [section] = report.sections
    assert (section.method, section.test_key, section.subtitle) == (selection.LOO,
                                                                    selection.TEST_KEY, "")
    assert section.title == "Model selection: leave-one-domain-out cross-validation"
    table, averages = section.tables
    assert table.title == "VLCS" and table.col_labels == ["C", "L", "S", "V", "Avg"]
    assert table.rows["ERM"][0].text() == "96.9 +/- 1.0" and table.rows["ERM"][-1].text() == "77.1"
    assert averages.rows["ERM"][0].n == 2
    assert ipoop.subset_keys(records) == []
    with pytest.raises(ValueError, match="choose from text, latex, markdown, csv"):
        formats.render(report, "html")
    with pytest.raises(ValueError, match="auto, on or off"):
        report_lib.build_report(records, [selection.LOO], single_source="yes")


def test_every_format_renders_every_section(sweep):
    """Standard, IP/OOP and single-source sections all reach each format's output."""
    def change(record):
        for i in range(4):
            record[f"env{i}_in_ip_acc"] = 0.5
        if record["args"]["test_envs"] == [0, 1]:  # a pair run, made single-source (VLCS: 4 envs)
            record["args"]["test_envs"] = [0, 1, 2]
        return record

    rewrite(sweep, change)
    report = report_lib.build_report(load_records(str(sweep)), [selection.IID, selection.ORACLE])
    assert [(s.method.key, s.test_key) for s in report.sections] == [
        ("iid", "env{t}_in_acc"), ("oracle", "env{t}_in_acc"), ("iid", "env{t}_in_ip_acc"),
        ("oracle", "env{t}_in_ip_acc"), ("iid", "single_source"), ("oracle", "single_source")]
    assert [t.title for t in report.sections[-1].tables] == ["VLCS, source V"]
    outputs = {fmt: formats.render(report, fmt) for fmt in formats.FORMATS}
    cells = list(csv.DictReader(io.StringIO(outputs["csv"])))
    for section in report.sections:
        for table in section.tables:
            assert f"-------- {table.header}\n" in outputs["text"]
            assert f"\\subsubsection{{{table.title}}}" in outputs["latex"]
            assert f"### {table.header}\n" in outputs["markdown"]
            assert sum(c["test_key"] == section.test_key and c["table"] == table.title
                       and c["selection"] == section.method.key for c in cells) == (
                len(table.rows) * len(table.col_labels))
        assert outputs["latex"].count(f"\\subsection{{{section.title}}}") == 1
        assert outputs["markdown"].count(f"## {section.title}\n") == 1


# --------------------------------------------------------------------------------------------------
# the best checkpoint, paper numbers (--paper) and the notes on stderr


def write_job(root, name, records, done=True):
    """A job folder holding ``records``, with ``done`` unless told otherwise."""
    job = root / name
    job.mkdir(parents=True)
    (job / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if done:
        (job / "done").write_text("")


def checkpoints(dataset, algorithm, test_envs, n_envs, val_and_test, trial=0, hparams_seed=0,
                label_fraction=None):
    """Records at steps 0, 100, ...: checkpoint k has every source ``env{i}_out_acc`` =
    ``val_and_test[k][0]`` and every target ``env{t}_in_acc`` = ``val_and_test[k][1]``."""
    records = []
    for k, (val, test) in enumerate(val_and_test):
        args = {"trial_seed": trial, "dataset": dataset, "algorithm": algorithm,
                "test_envs": list(test_envs), "hparams_seed": hparams_seed, "output_dir": "o"}
        if label_fraction is not None:
            args["label_fraction"] = label_fraction
        record = {"args": args, "step": 100 * k, "hparams": {}}
        for i in range(n_envs):
            record[f"env{i}_in_acc"] = test if i in test_envs else 0.95
            record[f"env{i}_out_acc"] = 0.5 if i in test_envs else val
        records.append(record)
    return records


#: Per checkpoint (source validation, target accuracy): the best validation is the middle one.
BEST_IN_THE_MIDDLE = [(0.6, 0.70), (0.9, 0.75), (0.8, 0.80)]


@pytest.fixture
def pacs(tmp_path):
    """ERM and DMG on PACS, every test environment, one trial; the best checkpoint (target 75%
    for ERM, 80% for DMG) is not the last (80%, 85%)."""
    root = tmp_path / "pacs"
    for algorithm, offset in (("ERM", 0.0), ("DMG", 0.05)):
        for t in range(4):
            write_job(root, f"{algorithm}{t}", checkpoints(
                "PACS", algorithm, [t], 4, [(v, a + offset) for v, a in BEST_IN_THE_MIDDLE]))
    return root


def block(out, header):
    """The lines of the text table whose header line is ``-------- {header}``, up to the next
    empty line."""
    lines = out.splitlines()
    start = lines.index(f"-------- {header}")
    end = lines.index("", start) if "" in lines[start:] else len(lines)
    return lines[start + 1:end]


def cells(line):
    return [cell.strip() for cell in re.split(r"\s{2,}", line.strip())]


def test_iid_shows_each_runs_best_checkpoint_not_the_last(pacs, capsys):
    """DomainBed's training-domain validation keeps each run's best checkpoint by mean source
    validation accuracy: the DMG release's best-epoch rule, so its protocol selects with iid."""
    _, out, _ = run(capsys, "--input_dir", pacs, "--selection", "iid", "oracle", "--no_save")
    table = block(out, "Dataset: PACS, model selection method: training-domain validation set")
    assert cells(table[1]) == ["ERM", *["75.0 +/- 0.0"] * 4, "75.0"]
    assert cells(table[2]) == ["DMG", *["80.0 +/- 0.0"] * 4, "80.0"]
    oracle = block(out, "Dataset: PACS, model selection method: test-domain validation set "
                        "(oracle)")
    assert cells(oracle[1])[1] == "80.0 +/- 0.0"  # the last checkpoint


def test_a_removed_or_unknown_selection_key_is_a_usage_error(pacs, capsys):
    """One name per rule: iid_best (the same records as iid) is gone and fails as any unknown
    key does, listing the choices; nothing is written."""
    for key in ("iid_best", "best"):
        with pytest.raises(SystemExit) as exit_info:
            collect_results.main(["--input_dir", str(pacs), "--selection", key])
        err = capsys.readouterr().err
        assert exit_info.value.code == 2
        assert f"invalid choice: '{key}'" in err and "'iid', 'loo', 'oracle'" in err
    assert not (pacs / "results.txt").exists()


def test_paper_rows_and_differences_under_the_matching_tables(pacs, capsys):
    status, out, err = run(capsys, "--input_dir", pacs, "--selection", "oracle", "iid",
                           "--paper", "dmg_pacs_resnet18", "--no_save")
    assert status == 0 and err == ""
    # only under the iid tables: the entry names the release's selection, iid's rule
    oracle = block(out, "Dataset: PACS, model selection method: test-domain validation set "
                        "(oracle)")
    assert not any("paper" in line for line in oracle)
    table = block(out, "Dataset: PACS, model selection method: training-domain validation set")
    assert "selection: iid (best checkpoint over 50 epochs" in table[4]
    assert table[3].startswith("paper [dmg_pacs_resnet18]: Chattopadhyay, Balaji, Hoffman")
    assert "numbers read from dmg_eccv2020.txt (full paper)" in table[4]
    rows = {cells(line)[0]: cells(line)[1:] for line in table[5:]}
    assert rows["Aggregate*"] == ["72.61", "78.46", "93.17", "65.2", "77.36"]
    assert rows["DMG (Ours)"] == ["76.9", "80.38", "93.35", "75.21", "81.46"]
    assert "MASF [11]" in rows  # the paper's other rows too, labelled as the paper's
    assert ("difference (ours - paper), for ERM <-> Aggregate*, DMG <-> DMG (Ours):"
            in table)
    # ours minus the paper's, per column: ERM 75.0 everywhere, DMG 80.0
    assert rows["ERM - paper"] == ["+2.4", "-3.5", "-18.2", "+9.8", "-2.4"]
    assert rows["DMG - paper"] == ["+3.1", "-0.4", "-13.3", "+4.8", "-1.5"]
    # without --paper nothing of it
    _, plain, _ = run(capsys, "--input_dir", pacs, "--selection", "oracle", "iid", "--no_save")
    assert "paper" not in plain and out.startswith(plain.split("\n\n")[0])


def test_paper_numbers_in_every_format(pacs, capsys):
    argv = ["--input_dir", pacs, "--selection", "iid", "--paper", "dmg_pacs_resnet50",
            "dismae_dg", "--no_save", "--format"]
    _, markdown, _ = run(capsys, *argv, "markdown")
    assert "| Paper row / ours − paper | A | C | P | S | Avg |" in markdown
    assert "| Aggregate* | 75.49 | 80.67 | 93.05 | 64.29 | 78.38 |" in markdown
    assert "| ERM − Aggregate* | -0.5 | -5.7 | -18.0 | +10.7 | -3.4 |" in markdown
    assert "Paper: not available in the sources we have; the source says: DisMAE" in markdown
    _, latex, _ = run(capsys, *argv, "latex")
    assert "Aggregate* & 75.49 & 80.67 & 93.05 & 64.29 & 78.38 \\\\" in latex
    assert "DMG $-$ paper & -2.6 & +1.9 & -14.5 & +1.7 & -3.4 \\\\" in latex
    assert "paper [dmg\\_pacs\\_resnet50]" in latex  # escaped for LaTeX
    assert latex.count("\\begin{tabular}") == latex.count("\\end{tabular}")
    _, text, _ = run(capsys, *argv, "csv")
    rows = list(csv.DictReader(io.StringIO(text)))
    assert {r["kind"] for r in rows} == {"measured", "paper", "difference"}
    paper = next(r for r in rows if r["kind"] == "paper" and r["algorithm"] == "Aggregate*"
                 and r["column"] == "S")
    assert (paper["paper"], float(paper["mean"]), paper["table"]) == (
        "dmg_pacs_resnet50", 64.29, "PACS")
    diff = next(r for r in rows if r["kind"] == "difference" and r["algorithm"] == "ERM"
                and r["column"] == "S")
    assert float(diff["mean"]) == pytest.approx(75.0 - 64.29)
    claim = next(r for r in rows if r["paper"] == "dismae_dg")
    assert claim["text"].startswith("not available in the sources we have")
    _, plain, _ = run(capsys, "--input_dir", pacs, "--no_save", "--format", "csv")
    assert plain.splitlines()[0].endswith(",n,text")  # no extra columns without --paper


def test_several_dataset_entries_fill_avg_and_the_averages_table(pacs, capsys):
    _, out, _ = run(capsys, "--input_dir", pacs, "--selection", "iid", "--paper",
                    "gmoe_domainbed", "--no_save")
    table = block(out, "Dataset: PACS, model selection method: training-domain validation set")
    rows = {cells(line)[0]: cells(line)[1:] for line in table[3:]}
    assert rows["GMoE-S/16"] == ["-", "-", "-", "-", "88.1 +/- 0.1"]
    assert rows["ERM - paper"] == ["-", "-", "-", "-", "-10.7"]  # 75.0 - 85.7 (ResNet-50 ERM)
    averages = block(out, "Averages, model selection method: training-domain validation set")
    rows = {cells(line)[0]: cells(line)[1:] for line in averages[3:]}
    assert rows["ERM (ViT-S/16)"] == ["86.2 +/- 0.1", "-"]
    assert rows["ERM - paper"] == ["-10.7", "-"]


def test_unmatched_unknown_and_conflicting_paper_keys(pacs, capsys):
    status, out, err = run(capsys, "--input_dir", pacs, "--selection", "loo", "oracle",
                           "--paper", "dmg_pacs_resnet18", "mpbm_digits", "--no_save")
    assert status == 0 and "paper [" not in out
    assert ("note: paper [dmg_pacs_resnet18]: no table here matches; it needs multi-source "
            "tables of PACS, selection iid (--selection iid).") in err
    assert "paper [mpbm_digits]: no table here matches; it needs single-source tables of " \
           "Digits, source mnist." in err
    for argv, message in ((["--paper", "dmg_pacs"], "did you mean 'dmg_pacs_resnet18'"),
                          (["--paper", "ipoop", "--learning_check"], "--learning_check")):
        with pytest.raises(SystemExit) as exit_info:
            collect_results.main(["--input_dir", str(pacs), *argv])
        assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_single_source_udg_and_ipoop_tables_get_their_entries(tmp_path, capsys):
    root = tmp_path / "sweep"
    # single source: GMoE trained on DomainNet's painting (env 2); MPBM on two PACS sources
    write_job(root, "gmoe", checkpoints("DomainNet", "GMoE", [0, 1, 3, 4, 5], 6,
                                        [(0.5, 0.2), (0.7, 0.3), (0.6, 0.4)]))
    for source in (0, 1):
        write_job(root, f"mpbm{source}", checkpoints(
            "PACS", "MPBM", [t for t in range(4) if t != source], 4, [(0.5, 0.5)]))
    # UDG on DomainNet20, targets clip, info, paint
    write_job(root, "udg", checkpoints("DomainNet20", "DisMAE", [0, 1, 2], 6, [(0.5, 0.4)],
                                       label_fraction=0.1))
    _, out, err = run(capsys, "--input_dir", root, "--selection", "iid", "--paper",
                      "gmoe_single_source_domainnet", "mpbm_pacs", "dismae_udg_domainnet20",
                      "--no_save")
    table = block(out, "Dataset: DomainNet, single source: paint, model selection method: "
                       "training-domain validation set")
    # the best source-validation checkpoint (the second): targets 30%, the source's held-out 70%
    assert cells(table[1])[:7] == ["GMoE", "30.0 +/- 0.0", "30.0 +/- 0.0",
                                   "70.0 +/- 0.0", "30.0 +/- 0.0", "30.0 +/- 0.0", "30.0 +/- 0.0"]
    rows = {cells(line)[0]: cells(line)[1:] for line in table[4:]}
    assert rows["GMoE-S/16"] == ["43.5", "16.1", "69.3", "5.3", "56.4", "38.0", "-"]
    # the source column is compared with the paper's in-domain (IID) column: 70.0 - 69.3
    assert rows["GMoE - paper"] == ["-13.5", "+13.9", "+0.7", "+24.7", "-26.4", "-8.0", "-"]
    for source in ("A", "C"):  # the summary does not name MPBM's PACS source: under each
        table = block(out, f"Dataset: PACS, single source: {source}, model selection method: "
                           "training-domain validation set")
        rows = {cells(line)[0]: cells(line)[1:] for line in table[4:]}
        assert rows["MPBM"] == ["-"] * 4 + ["54.5"] and rows["MPBM - paper"][-1] == "-4.5"
    udg = out[out.index("-------- Dataset: DomainNet20, UDG"):]
    assert "paper [dismae_udg_domainnet20]" in udg
    assert ("paper: not available in the sources we have; the source says: gains of 1.48% to "
            "6.11%") in udg
    assert "no table here matches" not in err


def test_ipoop_entry_goes_under_the_subset_tables_only(sweep, capsys):
    rewrite(sweep, lambda r: {**r, **{f"env{i}_in_ip_acc": 0.9 for i in range(4)}})
    _, out, _ = run(capsys, "--input_dir", sweep, "--selection", "iid", "--paper", "ipoop",
                    "--no_save")
    sections = out.split("\n\n")
    with_paper = [s for s in sections if "paper [ipoop]" in s]
    assert len(with_paper) == 1 and "env{t}_in_ip_acc" in with_paper[0].splitlines()[0]
    assert "not available in the sources we have" in with_paper[0]


def test_notes_say_how_far_the_sweep_is(shared_fixtures, sweep, capsys):
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir())
    for job in jobs[:2]:
        (job / "done").unlink()
    (sweep / ("f" * 32)).mkdir()  # launched, no record yet
    (sweep / "udg_pretrain").mkdir()  # not a job folder
    status, out, err = run(capsys, "--input_dir", sweep, "--no_save")
    assert status == 0 and out == expected(shared_fixtures, "text")  # stdout stays DomainBed's
    assert err.startswith("note: 38 of 41 jobs done (3 running or incomplete: ")
    assert "the tables use the records written so far" in err


def test_notes_explain_x_cells_and_averages_over_other_domains(sweep, capsys):
    # trial 0 lacks test environment C (index 0); trial 1 has every one; no pair runs for S
    rewrite(sweep, lambda r: None if (r["args"]["test_envs"] == [0] and
                                      r["args"]["trial_seed"] == 0)
            or (len(r["args"]["test_envs"]) == 2 and 2 in r["args"]["test_envs"]) else r)
    _, out, err = run(capsys, "--input_dir", sweep, "--no_save")
    row = cells(block(out, "Dataset: VLCS, model selection method: training-domain "
                           "validation set")[1])
    assert row[1].endswith("+/- 0.0") and row[-1] != "X"  # C: trial 1 only
    notes = err.splitlines()
    assert ("note: Averages table, VLCS column: each trial is averaged over the test "
            "environments it has (DomainBed's rule), here L, S, V (trial 0) and C, L, S, V "
            "(trial 1) for every row; VLCS has C, L, S, V [iid, oracle].") in notes
    loo = next(n for n in notes if n.startswith("note: VLCS [loo]: "))
    assert "X for every algorithm at C, L, S, V although the runs exist" in loo
    assert "[t, j]" in loo
    # a test environment an algorithm did not run (another did): its X cells are explained
    rewrite(sweep, lambda r: None if 3 in r["args"]["test_envs"]
            and r["args"]["trial_seed"] == 0 else r)
    rewrite(sweep, lambda r: dict(r, args=dict(r["args"], algorithm="DMG"))
            if r["args"]["trial_seed"] == 1 else r)
    _, out, err = run(capsys, "--input_dir", sweep, "--no_save", "--selection", "iid")
    assert ("note: VLCS: X for ERM in every table: records exist only with test environments L, "
            "S, none with C, V (so Avg is X too, as in DomainBed)." in err.splitlines())


def test_cli_end_to_end_with_paper_numbers_and_a_running_job(pacs):
    (pacs / "DMG3" / "done").unlink()
    command = [sys.executable, "-m", "dg_plugins.scripts.collect_results", "--input_dir",
               str(pacs), "--selection", "iid", "--paper", "dmg_pacs_resnet18"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    table = block(result.stdout, "Dataset: PACS, model selection method: training-domain "
                                 "validation set")
    assert "paper [dmg_pacs_resnet18]" in table[3] and "DMG - paper" in result.stdout
    assert (pacs / "results.txt").read_text() == result.stdout  # notes are not in the file
    assert result.stderr == ("note: 7 of 8 jobs done (1 running or incomplete: DMG3); the tables "
                             "use the records written so far\n")
