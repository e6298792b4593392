"""The train CLI: DomainBed's output folder, resume, NaN guard, no hang, clear errors."""

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from dg_plugins.train import loop
from dg_plugins.train import run as train
from dg_plugins.registry import ALGORITHMS
from dg_plugins.scripts.train import build_parser, main
from support.helpers import read_records
from support.job_gate import gate_env, released
from support.processes import start

TINY = '{"batch_size": 8}'
TIMING_KEYS = {"step_time", "mem_gb"}
CONTRACT_KEYS = {"args", "hparams", "step", "epoch", "step_time", "mem_gb", "loss"}
DOMAINBED_ARGS = {"algorithm", "checkpoint_freq", "data_dir", "dataset", "holdout_fraction",
                  "hparams", "hparams_seed", "output_dir", "save_model_every_checkpoint", "seed",
                  "skip_model_save", "steps", "task", "test_envs", "trial_seed",
                  "uda_holdout_fraction"}


def args_for(out, *extra):
    return build_parser().parse_args(["--dataset", "Debug28", "--output_dir", str(out),
                                      "--hparams", TINY, *extra])


def without_timing(recs):
    """Records minus wall-clock keys and the output folder (which differs between two runs)."""
    return [{k: ({**v, "output_dir": None} if k == "args" else v)
             for k, v in r.items() if k not in TIMING_KEYS} for r in recs]


def test_cli_writes_domainbed_output_folder(tmp_path):
    out = tmp_path / "job"
    proc = subprocess.run([sys.executable, "-m", "dg_plugins.scripts.train", "--dataset", "Debug28",
                           "--steps", "5", "--checkpoint_freq", "2", "--hparams", TINY,
                           "--test_envs", "0", "--output_dir", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert sorted(os.listdir(out)) == ["done", "err.txt", "model.pkl", "out.txt", "results.jsonl"]
    assert (out / "done").read_bytes() == b"done"
    recs = read_records(out)
    assert [r["step"] for r in recs] == [0, 2, 4]
    for r in recs:
        assert CONTRACT_KEYS <= set(r)
        assert {f"env{i}_{s}_acc" for i in range(3) for s in ("in", "out")} <= set(r)
        assert set(r["args"]) == DOMAINBED_ARGS
        assert r["hparams"]["batch_size"] == 8
    with open(out / "results.jsonl") as f:
        assert f.read().endswith("\n")
    model = torch.load(out / "model.pkl", weights_only=False)
    assert set(model) == {"args", "model_input_shape", "model_num_classes", "model_num_domains",
                          "model_hparams", "model_dict"}
    assert model["model_num_domains"] == 2
    assert "HParams:" in (out / "out.txt").read_text()


def test_batch_larger_than_split_does_not_hang(tmp_path):
    """Debug28 in-splits have 13 samples; the default small-image batch is 64 (DomainBed hangs)."""
    args = build_parser().parse_args(["--dataset", "Debug28", "--steps", "2",
                                      "--output_dir", str(tmp_path)])
    assert train.run(args) == "done"
    assert read_records(tmp_path)[-1]["hparams"]["batch_size"] == 64
    assert "drawn with replacement" in (tmp_path / "err.txt").read_text()


def test_resume_gives_the_same_records(tmp_path):
    full, cut = tmp_path / "full", tmp_path / "cut"
    assert train.run(args_for(full, "--steps", "9", "--checkpoint_freq", "3")) == "done"
    assert train.run(args_for(cut, "--steps", "9", "--checkpoint_freq", "3"),
                     stop_after_step=3) == "stopped"
    assert not (cut / "done").exists() and len(read_records(cut)) == 2
    assert train.run(args_for(cut, "--steps", "9", "--checkpoint_freq", "3", "--resume")) == "done"
    assert without_timing(read_records(cut)) == without_timing(read_records(full))
    assert not (cut / "checkpoint.pt").exists()
    assert train.run(args_for(cut, "--steps", "9", "--resume")) == "already done"


def test_resume_after_sigkill(tmp_path):
    """A real kill -9 in the middle of a run (the job held after step 5 by the test's gate,
    past its checkpoint of step 4), then --resume: same records as an uninterrupted run."""
    common = ["--dataset", "RotatedMNIST5k", "--steps", "8", "--checkpoint_freq", "4",
              "--hparams", '{"batch_size": 32}']
    full, cut, gate = tmp_path / "full", tmp_path / "cut", tmp_path / "gate"
    gate.mkdir()
    assert main(common + ["--output_dir", str(full)]) == 0
    proc = start("dg_plugins.scripts.train", *common, "--output_dir", cut,
                 env=gate_env(gate, step=5))
    with released(gate):
        wait_for(lambda: (gate / "waiting").exists())
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
    assert not (cut / "done").exists() and len(read_records(cut)) == 2  # steps 0 and 4
    assert main(common + ["--output_dir", str(cut), "--resume"]) == 0
    assert without_timing(read_records(cut)) == without_timing(read_records(full))


def wait_for(predicate, timeout=120.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_missing_data_dir_is_a_clear_error(tmp_path, capsys):
    out = tmp_path / "job"
    assert main(["--dataset", "PACS", "--output_dir", str(out)]) == 2
    message = (out / "err.txt").read_text()
    assert "error: " in message and "<data_dir>/PACS/<domain>/<class>" in message
    assert not (out / "done").exists()


@pytest.fixture
def nan_algorithm():
    """``NaNAfterTwoSteps`` registered for one test only (other tests list the registry)."""
    from support.nan_algorithm import NaNAfterTwoSteps

    ALGORITHMS.register("NaNAfterTwoSteps", NaNAfterTwoSteps)
    yield "NaNAfterTwoSteps"
    ALGORITHMS.unregister("NaNAfterTwoSteps")


def test_nan_loss_stops_without_done(tmp_path, nan_algorithm):
    args = args_for(tmp_path, "--algorithm", nan_algorithm, "--steps", "5")
    with pytest.raises(loop.NonFiniteLossError, match="loss=nan at step 2"):
        train.run(args)
    assert not (tmp_path / "done").exists()
    assert "loss=nan" in (tmp_path / "err.txt").read_text()


@pytest.mark.parametrize("argv, message", [
    (["--algorithm", "NoSuchAlgo"], "unknown algorithm 'NoSuchAlgo'; registered algorithms: ERM"),
    (["--dataset", "NoSuchSet"], "unknown dataset 'NoSuchSet'; registered datasets: Debug28"),
    (["--algorithm", "dmgg"], "unknown algorithm 'dmgg' (did you mean 'DMG'?); registered"),
    (["--dataset", "rotatedmnist5k"], "unknown dataset 'rotatedmnist5k' (did you mean "
                                      "'RotatedMNIST5k'?); registered"),
    (["--hparams", "{batch_size: 8}"], "--hparams is not valid JSON"),
    (["--hparams", "[1, 2]"], "--hparams must be a JSON object"),
    (["--hparams", '{"lrr": 0.1}'], "unknown hparam(s) 'lrr' (did you mean 'lr'?) for ERM"),
    (["--hparams", '{"batch_size": "64"}'], "'batch_size' must be an integer"),
    (["--hparams", '{"batch_size": 0}'], "hparam 'batch_size' must be > 0, got 0"),
    (["--hparams", '{"lr": "0.1"}'], "'lr' must be a number"),
    (["--test_envs", "3"], "--test_envs [3] out of range: Debug28 has 3 environments"),
    (["--test_envs", "0", "1", "2"], "leaves no training environment"),
])
def test_bad_input_exits_2_with_a_clear_message(tmp_path, capsys, argv, message):
    out = tmp_path / "job"
    base = ["--dataset", "Debug28", "--output_dir", str(out), "--steps", "1"]
    assert main(base + argv) == 2
    assert message in capsys.readouterr().err
    assert not out.exists(), "nothing is written for input rejected up front"


def test_train_help_renders():
    """argparse formats every help string with %-formatting: a bare '%' crashed --help."""
    from dg_plugins.scripts.train import build_parser

    assert "--uda_holdout_fraction" in build_parser().format_help()


def test_test_envs_of_a_tree_found_on_disk_are_checked_before_the_settings(tmp_path, capsys):
    """ImageFolder finds its environments on disk: a --test_envs out of range is refused before
    train prints its settings or creates the folder (it used to print some 60 lines first)."""
    from support.image_tree import make_pacs_tree

    data = make_pacs_tree(tmp_path / "data", per_class=1, size=16) / "PACS"
    out = tmp_path / "job"
    assert main(["--dataset", "ImageFolder", "--data_dir", str(data), "--test_envs", "4",
                 "--output_dir", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and not out.exists()
    assert captured.err == ("error: --test_envs [4] out of range: ImageFolder has 4 environments "
                            "['art_painting', 'cartoon', 'photo', 'sketch'] (valid indices "
                            "0..3)\n")
