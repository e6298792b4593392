"""The UDG protocol (dg_plugins.train.udg): labelled subsets, pretraining once and reused,
fine-tuning from exactly the semantic encoder, resume, a missing pretraining, and the protocol end
to end through sweep + collect_results on Debug28 (jobs run in-process to stay fast)."""

import json
import shlex
import threading
import time

import pytest
import torch

import dg_plugins.datasets  # noqa: F401
from dg_plugins import hparams as hparams_lib
from dg_plugins.job import folder as job_folder
from dg_plugins.train import run as train
from dg_plugins.train import udg as udg_jobs
from dg_plugins.train.splits import SplitDataset
from dg_plugins.scripts import collect_results
from dg_plugins.scripts import sweep as sweep_cli
from dg_plugins.scripts import train as train_cli
from support.helpers import VOLATILE_KEYS, read_records

TINY = {"batch_size": 4, "vit_arch": "tiny", "mnist_cnn_width": 16}


def job_args(out, algorithm="DisMAE", fraction=0.5, *extra, hparams=TINY, pretrain_dir=None):
    argv = ["--dataset", "Debug28", "--algorithm", algorithm, "--output_dir", str(out),
            "--test_envs", "0", "--steps", "3", "--checkpoint_freq", "2",
            "--label_fraction", str(fraction), "--pretrain_steps", "3",
            "--hparams", json.dumps(hparams), *extra]
    if pretrain_dir is not None:
        argv += ["--udg_pretrain_dir", str(pretrain_dir)]
    return train_cli.build_parser().parse_args(argv)


def test_labelled_subset_is_fixed_by_trial_seed_nested_and_seed_dependent():
    split = SplitDataset(list(range(1000)), range(200, 1000))
    subsets = {f: udg_jobs.labelled_subset(split, f, trial_seed=3, env=1).keys
               for f in (0.01, 0.05, 0.1, 1.0)}
    assert [len(subsets[f]) for f in (0.01, 0.05, 0.1, 1.0)] == [8, 40, 80, 800]
    assert udg_jobs.labelled_subset(split, 0.05, trial_seed=3, env=1).keys == subsets[0.05]
    assert set(subsets[0.01]) < set(subsets[0.05]) < set(subsets[0.1]) < set(subsets[1.0])
    assert udg_jobs.labelled_subset(split, 0.05, trial_seed=4, env=1).keys != subsets[0.05]
    assert udg_jobs.labelled_subset(split, 0.05, trial_seed=3, env=2).keys != subsets[0.05]
    assert len(udg_jobs.labelled_subset(split, 1e-6, 0, 0)) == 1  # never empty


def test_finetuning_starts_from_exactly_the_semantic_encoder(tmp_path):
    """Linear probe (fraction < 0.1): the frozen backbone of the finished job equals the pretrained
    semantic encoder key for key; nothing of the variation encoder or decoder is in the model."""
    assert train.run(job_args(tmp_path / "job", fraction=0.05)) == "done"
    (folder,) = (tmp_path / "udg_pretrain").iterdir()
    # on the CPU both: the job ran on CUDA where one is visible
    pretrained = torch.load(folder / "pretrained.pt", map_location="cpu",
                            weights_only=False)["state"]
    model = torch.load(tmp_path / "job" / "model.pkl", map_location="cpu", weights_only=False)
    assert model["udg"]["mode"] == "linear"
    backbone = {k[len("backbone."):]: v for k, v in model["model_dict"].items()
                if k.startswith("backbone.")}
    assert set(backbone) == set(pretrained)
    assert all(torch.equal(backbone[k], pretrained[k]) for k in pretrained)
    assert not any(k.startswith(("var_blocks", "decoder", "domain_classifier"))
                   for k in model["model_dict"])
    assert {k.split(".")[0] for k in model["model_dict"]} == {"backbone", "head"}


def test_pretraining_runs_once_and_records_do_not_depend_on_who_ran_it(tmp_path, capsys):
    alone, shared = tmp_path / "alone", tmp_path / "shared"
    assert train.run(job_args(alone / "f100", fraction=1.0)) == "done"
    assert train.run(job_args(shared / "f50", fraction=0.5)) == "done"
    capsys.readouterr()
    assert train.run(job_args(shared / "f100", fraction=1.0)) == "done"
    assert "UDG pretraining: reusing" in capsys.readouterr().out
    assert len(list((shared / "udg_pretrain").iterdir())) == 1
    assert read_records(shared / "f100", VOLATILE_KEYS) == read_records(alone / "f100", VOLATILE_KEYS)
    # another hparam that matters for pretraining: another pretraining folder
    other = {**TINY, "dismae_lambda1": 0.01}
    assert train.run(job_args(shared / "other", fraction=1.0, hparams=other)) == "done"
    assert len(list((shared / "udg_pretrain").iterdir())) == 2


def test_a_second_job_waits_for_the_pretraining_another_holds(tmp_path, monkeypatch):
    monkeypatch.setattr(udg_jobs, "POLL_SECONDS", 0.05)
    args = job_args(tmp_path / "job")
    identity = udg_jobs.pretrain_identity(
        args, hparams_lib.job_hparams("DisMAE", "Debug28", 0, 0, args.hparams), 3)
    folder = tmp_path / "udg_pretrain" / udg_jobs.pretrain_key(identity)
    folder.mkdir(parents=True)
    lock = job_folder.FolderLock(str(folder)).__enter__()
    threading.Timer(0.6, lambda: lock.__exit__(None, None, None)).start()
    start = time.time()
    assert train.run(args) == "done"
    assert time.time() - start >= 0.6
    assert "waiting for it" in (tmp_path / "job" / "err.txt").read_text()
    assert (folder / "done").exists()


def test_missing_pretraining_is_reported_with_require(tmp_path, capsys):
    code = train_cli.main(["--dataset", "Debug28", "--algorithm", "MAE", "--output_dir",
                           str(tmp_path / "job"), "--label_fraction", "0.1", "--steps", "2",
                           "--hparams", json.dumps(TINY), "--udg_pretrain", "require"])
    assert code == 2
    captured = capsys.readouterr()
    err = captured.out + captured.err
    assert "UDG pretraining of this job is missing" in err and "udg_pretrain" in err
    assert "UDG pretraining of this job is missing" in (tmp_path / "job" / "err.txt").read_text()


def test_interrupted_finetuning_resumes_to_the_same_records(tmp_path):
    full, cut = tmp_path / "a" / "job", tmp_path / "b" / "job"
    assert train.run(job_args(full, "MAE", 1.0)) == "done"
    assert train.run(job_args(cut, "MAE", 1.0), stop_after_step=0) == "stopped"
    assert train.run(job_args(cut, "MAE", 1.0, "--resume")) == "done"
    assert read_records(cut, VOLATILE_KEYS) == read_records(full, VOLATILE_KEYS)


def test_bad_udg_input_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="label_fraction"):
        train.run(job_args(tmp_path / "j", fraction=1.5))
    with pytest.raises(SystemExit):
        sweep_cli.main(["launch", "--datasets", "Debug28", "--algorithms", "MAE",
                        "--output_dir", str(tmp_path / "s"), "--data_dir", "x", "--dry_run",
                        "--label_fractions", "0", "0.5"])


def in_process_launcher(commands):
    for command in commands:
        assert train_cli.main(shlex.split(command)[3:]) == 0


def test_udg_end_to_end_through_sweep_and_collect_results(tmp_path, capsys, monkeypatch):
    from dg_plugins.registry import LAUNCHERS

    import dg_plugins.sweep.launchers  # noqa: F401

    if "udg_test_inprocess" not in LAUNCHERS:
        LAUNCHERS.register("udg_test_inprocess", in_process_launcher)
    sweep_dir = tmp_path / "sweep"
    common = ["--datasets", "Debug28", "--n_hparams", "1", "--n_trials", "2", "--steps", "3",
              "--checkpoint_freq", "2", "--output_dir", str(sweep_dir), "--data_dir", "x",
              "--command_launcher", "udg_test_inprocess", "--skip_confirmation",
              "--hparams", json.dumps(TINY), "--test_env_sets", "0"]
    assert sweep_cli.main(["launch", "--algorithms", "DisMAE", "MAE", "ERM",
                           "--label_fractions", "0.05", "1.0", "--pretrain_steps", "3",
                           *common]) == 0
    pretrainings = list((sweep_dir / "udg_pretrain").iterdir())
    assert len(pretrainings) == 4  # (DisMAE, MAE) x 2 trials, shared by both fractions
    capsys.readouterr()
    # an ordinary DG job in the same folder: its tables are exactly those it gets alone
    assert sweep_cli.main(["launch", "--algorithms", "ERM", *common]) == 0
    capsys.readouterr()
    assert collect_results.main(["--input_dir", str(sweep_dir), "--no_save"]) == 0
    text = capsys.readouterr().out
    assert "Dataset: Debug28, UDG, test environments: 0, model selection method: " \
           "training-domain validation set" in text
    for row in ("DisMAE 5%", "DisMAE 100%", "MAE 5%", "MAE 100%", "ERM 5%", "ERM 100%"):
        assert sum(line.startswith(row + " ") for line in text.splitlines()) == 2  # iid, oracle
    assert "Total records: 28" in text  # 12 UDG jobs x 2 records + 2 DG jobs x 2
    standard = text.split("\n-------- Dataset: Debug28, UDG")[0]

    alone = tmp_path / "alone"
    alone.mkdir()
    for job in sweep_dir.iterdir():
        if (job / "results.jsonl").exists() and "label_fraction" not in (
                job / "results.jsonl").read_text():
            (alone / job.name).symlink_to(job)
    assert collect_results.main(["--input_dir", str(alone), "--no_save"]) == 0
    assert capsys.readouterr().out.replace("Total records: 4", "") == \
        standard.replace("Total records: 28", "")


def test_domainnet20_reads_domainbeds_layout_and_keeps_the_20_classes(tmp_path):
    from dg_plugins.datasets.domainnet20 import CLASSES, DomainNet20

    root = tmp_path / "domain_net"
    for domain in ("clipart", "infograph", "painting", "quickdraw", "real", "sketch"):
        for cls in [*CLASSES, "zebra"]:
            (root / domain / cls).mkdir(parents=True)
            (root / domain / cls / "a.jpg").write_bytes(b"")
    dataset = DomainNet20(str(tmp_path), [0, 1, 3], {})
    assert dataset.num_classes == 20 and len(CLASSES) == 20
    assert [len(env) for env in dataset] == [20] * 6  # the extra class is ignored
    assert dataset.ENVIRONMENTS == ["clip", "info", "paint", "quick", "real", "sketch"]
    (root / "real" / "bee" / "a.jpg").unlink()
    (root / "real" / "bee").rmdir()
    with pytest.raises(FileNotFoundError, match="bee"):
        DomainNet20(str(tmp_path), [], {})


def udg_argv(out, *extra, algorithm="DisMAE", fraction="0.5"):
    return train_cli.build_parser().parse_args(
        ["--dataset", "Debug28", "--algorithm", algorithm, "--output_dir", str(out),
         "--test_envs", "0", "--checkpoint_freq", "2", "--label_fraction", fraction,
         "--pretrain_steps", "2", "--hparams", json.dumps(TINY), *map(str, extra)])


def test_finetuning_length_in_epochs_follows_the_labelled_set(tmp_path, capsys):
    """``--udg_ft_epochs E``: ceil(E x pooled labelled images / (batch per domain x domains))
    steps, so a larger label fraction fine-tunes for more steps (DisMAE's release counts epochs)."""
    steps = {}
    for fraction in ("0.25", "1.0"):
        out = tmp_path / fraction
        assert train.run(udg_argv(out, "--udg_ft_epochs", 3, algorithm="ERM",
                                  fraction=fraction)) == "done"
        printed = [line for line in capsys.readouterr().out.splitlines()
                   if line.startswith("UDG fine-tuning length")]
        assert len(printed) == 1
        last = json.loads((out / "results.jsonl").read_text().splitlines()[-1])
        assert last["args"]["udg_ft_epochs"] == 3
        steps[fraction] = last["step"] + 1
        sizes = [int(n) for n in printed[0].split("(")[1].split(" per")[0].split(", ")]
        expected = -(-3 * sum(sizes) // (TINY["batch_size"] * len(sizes)))  # ceil
        assert steps[fraction] == expected and f"= {expected} steps" in printed[0]
    assert steps["1.0"] > steps["0.25"]
    with pytest.raises(ValueError, match="--udg_ft_epochs 3 and --steps 5"):
        train.run(udg_argv(tmp_path / "both", "--udg_ft_epochs", 3, "--steps", 5))


def test_release_split_pretrains_on_99_percent_and_needs_a_10_percent_holdout(tmp_path, capsys):
    with pytest.raises(ValueError, match="--holdout_fraction 0.1"):
        train.run(udg_argv(tmp_path / "bad", "--udg_split", "release", "--steps", 2))
    assert train.run(udg_argv(tmp_path / "rel", "--udg_split", "release", "--holdout_fraction",
                              0.1, "--steps", 2)) == "done"
    out = capsys.readouterr().out
    line = next(l for l in out.splitlines() if l.startswith("UDG pretraining data"))
    import dg_plugins.datasets.debug  # noqa: F401
    from dg_plugins.registry import DATASETS

    env_size = len(DATASETS.get("Debug28")("x", [0], hparams_lib.default_hparams(
        "DisMAE", "Debug28"))[1])
    share = round(0.99 * env_size)
    assert line.startswith(f"UDG pretraining data (release split): {share}, {share} unlabelled")
    # the classifier schedule's epoch: the pooled pretraining set at batch 4 per domain
    assert f"an epoch is {2 * share / (4 * 2):.1f} steps" in line
    (folder,) = (tmp_path / "udg_pretrain").iterdir()
    assert json.loads((folder / "identity.json").read_text())["udg_split"] == "release"
    # the default split: the in-splits (90% here), another pretraining
    assert train.run(udg_argv(tmp_path / "dom", "--holdout_fraction", 0.1, "--steps", 2)) == \
        "done"
    line = next(l for l in capsys.readouterr().out.splitlines()
                if l.startswith("UDG pretraining data"))
    assert line.startswith("UDG pretraining data (domainbed split): "
                           f"{env_size - int(env_size * 0.1)},")
    assert len(list((tmp_path / "udg_pretrain").iterdir())) == 2


def test_sweep_passes_the_udg_protocol_flags_to_every_job(tmp_path, capsys):
    base = ["launch", "--datasets", "Debug28", "--algorithms", "MAE", "--data_dir", "x",
            "--output_dir", str(tmp_path / "s"), "--dry_run", "--test_env_sets", "0",
            "--n_hparams", "1", "--n_trials", "1"]
    assert sweep_cli.main([*base, "--label_fractions", "0.1", "1.0", "--udg_ft_epochs", "51",
                           "--udg_split", "release", "--holdout_fraction", "0.1"]) == 0
    out = capsys.readouterr().out
    commands = [line for line in out.splitlines() if "dg_plugins.scripts.train" in line]
    assert len(commands) == 2
    assert all("--udg_ft_epochs 51" in c and "--udg_split release" in c for c in commands)
    for bad, message in ((["--udg_ft_epochs", "51"], "--label_fractions"),
                         (["--label_fractions", "1.0", "--udg_split", "release"],
                          "--holdout_fraction 0.1"),
                         (["--label_fractions", "1.0", "--udg_ft_epochs", "5", "--steps", "9"],
                          "--udg_ft_epochs 5 and --steps 9 both set the fine-tuning length")):
        with pytest.raises(SystemExit):
            sweep_cli.main([*base, *bad])
        assert message in capsys.readouterr().err


def test_pretraining_length_in_epochs(tmp_path, capsys):
    argv = udg_argv(tmp_path / "j", "--steps", 2)
    argv.pretrain_steps, argv.udg_pretrain_epochs = None, 2.0
    assert train.run(argv) == "done"
    line = next(l for l in capsys.readouterr().out.splitlines()
                if l.startswith("UDG pretraining length"))
    sizes = [int(n) for n in line.split("(")[1].split(" per")[0].split(", ")]
    expected = -(-2 * sum(sizes) // (TINY["batch_size"] * len(sizes)))
    assert line.endswith(f"= {expected} steps")
    (folder,) = (tmp_path / "udg_pretrain").iterdir()
    lines = (folder / "results.jsonl").read_text().splitlines()
    assert json.loads(lines[-1])["step"] == expected - 1
    assert json.loads((folder / "identity.json").read_text())["pretrain_steps"] == expected
    with pytest.raises(ValueError, match="give one of them"):
        train.run(udg_argv(tmp_path / "both", "--steps", 2, "--udg_pretrain_epochs", 2))


# Determinism of DisMAE's pretraining (issue 31, item 2) ---------------------------------------

def test_dismae_updates_are_bit_reproducible_on_two_threads():
    """Two identical DisMAE runs with 2 CPU threads (and torch's deterministic algorithms off, as
    outside a train job): the same weights. The anchors' rows used to be gathered by advanced
    indexing, whose backward adds repeated rows with parallel atomic adds on a multi-threaded
    CPU (here: domains interleaved in the batch, as pooled batches have them; 54 samples make
    the gathered latent 54 x 10 x 64 = 34560 elements, above the 32768 from which torch
    parallelises that accumulation), so the runs drifted apart (~1e-5 after 3 steps)."""
    from dg_plugins.registry import ALGORITHMS

    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(False)
    try:
        def run():
            torch.manual_seed(0)
            x, domain = torch.rand(54, 3, 28, 28), torch.arange(54) % 3
            hp = hparams_lib.default_hparams("DisMAE", "Debug28")
            hp.update(vit_arch="tiny", dismae_lambda1=1.0)
            model = ALGORITHMS.get("DisMAE")((3, 28, 28), 2, 3, hp)
            for _ in range(3):
                model._update(x, None, domain)
            return model.state_dict()

        first, second = run(), run()
        assert all(torch.equal(first[k], second[k]) for k in first)
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)


def test_interrupted_dismae_pretraining_resumes_to_the_uninterrupted_weights(tmp_path):
    """A DisMAE UDG job run as a user runs it (a subprocess, 2 CPU threads), stopped by SIGTERM
    during its pretraining and run again: the pretraining continues from its checkpoint and its
    pretrained.pt, its records and the job's records equal those of an uninterrupted job (run
    in this process, also on 2 threads)."""
    import os
    import signal

    from support.job_gate import gate_env, released
    from support.processes import finish, run, start, survivors

    def argv(root):
        return ["--dataset", "Debug28", "--algorithm", "DisMAE", "--output_dir", root / "job",
                "--test_envs", "0", "--steps", "3", "--checkpoint_freq", "2",
                "--label_fraction", "0.5", "--pretrain_steps", "8", "--hparams",
                json.dumps(TINY)]

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        uninterrupted = train_cli.build_parser().parse_args(map(str, argv(tmp_path / "full")))
        assert train.run(uninterrupted) == "done"
    finally:
        torch.set_num_threads(threads)
    gate = tmp_path / "gate"
    gate.mkdir()
    env = gate_env(gate, step=3, phase="pretraining", OMP_NUM_THREADS="2")
    proc = start("dg_plugins.scripts.train", *argv(tmp_path / "cut"), env=env)
    with released(gate):  # the job waits after pretraining step 3 until it is stopped
        deadline = time.monotonic() + 240
        while not (gate / "waiting").exists():
            assert proc.poll() is None and time.monotonic() < deadline, finish(proc, 1)[1]
            time.sleep(0.01)
        os.killpg(proc.pid, signal.SIGTERM)
        code, output = finish(proc, 240)
    assert code == 143 and "UDG pretraining" in output, output
    (folder,) = (tmp_path / "cut" / "udg_pretrain").iterdir()
    assert (folder / "checkpoint.pt").exists() and not (folder / "pretrained.pt").exists()
    code, output = run("dg_plugins.scripts.train", *argv(tmp_path / "cut"), "--resume", env=env,
                       timeout=240)
    assert code == 0 and "continuing" in output, output
    assert not survivors(env)
    (full,) = (tmp_path / "full" / "udg_pretrain").iterdir()
    weights = [torch.load(f / "pretrained.pt", map_location="cpu", weights_only=False)["state"]
               for f in (full, folder)]
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    assert read_records(folder, ("step_time",)) == read_records(full, ("step_time",))
    assert read_records(tmp_path / "cut" / "job", VOLATILE_KEYS) == read_records(
        tmp_path / "full" / "job", VOLATILE_KEYS)


def test_a_damaged_pretraining_checkpoint_says_to_pretrain_again(tmp_path):
    """A pretraining folder whose checkpoint cannot be read: the job that needs it stops with the
    fix of a pretraining (remove that folder; the next job pretrains again), not train's
    ``--force``, which would not touch the shared folder; nothing in it is changed."""
    from dg_plugins.train.checkpoint import DamagedCheckpoint

    assert train.run(job_args(tmp_path / "a", "MAE", 0.5, pretrain_dir=tmp_path / "pre")) == "done"
    (folder,) = (tmp_path / "pre").iterdir()
    (folder / job_folder.DONE_FILE).unlink()
    (folder / udg_jobs.PRETRAINED_FILE).unlink()
    (folder / job_folder.CHECKPOINT_FILE).write_bytes(b"not a checkpoint")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    with pytest.raises(DamagedCheckpoint) as caught:
        train.run(job_args(tmp_path / "b", "MAE", 1.0, pretrain_dir=tmp_path / "pre"))
    message = str(caught.value)
    assert str(folder / job_folder.CHECKPOINT_FILE) in message
    assert f"rm -r {folder}" in message and "--force" not in message
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
