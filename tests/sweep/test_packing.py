"""Several jobs per GPU (``sweep --jobs_per_gpu N``, the ``multi_gpu`` launcher): each job's share
of the cores, the memory check before packing (a refusal naming the N that fits), and a job's
records the same whether it ran alone or beside others (on a CPU the launcher's "GPU" is a name:
its jobs run on the CPU, concurrently)."""

import re

import pytest

from dg_plugins.runtime import CORES_ENV
from dg_plugins.sweep import launchers as packing
from support.helpers import VOLATILE_KEYS, read_records
from support.processes import command_env, run

SWEEP = "dg_plugins.scripts.sweep"


def test_the_cores_are_divided_among_the_jobs_running_at_once(monkeypatch):
    monkeypatch.setenv(CORES_ENV, "16")
    assert packing.cores_per_job(2, 2)[0] == 4
    share, line = packing.cores_per_job(1, 3)
    assert share == 5 and "1 GPU(s) x 3 job(s) at once; each job gets 5 of the launcher's 16" \
        in line
    assert packing.cores_per_job(8, 4)[0] == 1  # never 0
    assert packing.job_env("3", 5)[CORES_ENV] == "5"
    assert packing.job_env("3", 5)["CUDA_VISIBLE_DEVICES"] == "3"


def test_the_peak_is_the_largest_mem_gb_of_the_jobs_records(tmp_path):
    for name, values in (("a", [0.5, 2.5]), ("b", [1.0])):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.jsonl").write_text(
            "".join(f'{{"step": {k}, "mem_gb": {v}}}\n' for k, v in enumerate(values)))
    assert packing.peak_gb([str(tmp_path / "a"), str(tmp_path / "b"), None,
                            str(tmp_path / "none")]) == (2.5, str(tmp_path / "a"))
    assert packing.peak_gb([str(tmp_path / "none")]) is None


def test_n_jobs_that_do_not_fit_are_refused_with_the_n_that_fits():
    check = packing.MemoryCheck(["0", "1"], 4, free={"0": 79.0, "1": 30.0})
    assert check.decide(None) is None and not check.decided  # no peak known yet
    with pytest.raises(packing.PackingRefused) as refused:
        check.decide((10.0, "job7"))  # needs 10 x 1.2 + 1 = 13 GiB: GPU 1 holds 2
    assert refused.value.code == 2
    assert re.match(r"--jobs_per_gpu 4: a job needs about 13\.0 GiB \(10\.00 GiB at its peak "
                    r"\(job7's records\).*GPU 1 has 30\.0 GiB free: 2 fit; relaunch with "
                    r"--jobs_per_gpu 2", str(refused.value))
    fits = packing.MemoryCheck(["0"], 4, free={"0": 79.0})
    assert "4 jobs per GPU fit: a job needs about 13.0 GiB" in fits.decide((10.0, "job7"))
    blind = packing.MemoryCheck(["0"], 2, free={"0": None})
    assert "cannot be read" in blind.decide((1.0, "job"))


def records(folder, gb: float) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.jsonl").write_text(f'{{"step": 0, "mem_gb": {gb}}}\n')
    return str(folder)


def test_each_sweep_of_a_queue_is_checked_with_the_largest_peak(tmp_path):
    """A queue of two sweeps (reproduce's one launch: a ResNet-18 and a ResNet-50 folder): the
    first sweep's peak decides, then a job of the second one stops the packing until its own
    peak is known, which is checked in turn (here it does not fit: refused, naming it)."""
    check = packing.MemoryCheck(["0"], 2, free={"0": 40.0})
    small = records(tmp_path / "resnet18" / "job0", 2.0)  # needs 2 x 1.2 + 1 = 3.4 GiB
    assert "2 jobs per GPU fit: a job needs about 3.4 GiB" in check.update([small])
    assert check.decided and check.knows(str(tmp_path / "resnet18" / "job1"))
    big = str(tmp_path / "resnet50" / "job0")  # started, no record yet
    assert not check.knows(big)
    assert check.update([small, big]) is None and not check.decided
    records(tmp_path / "resnet50" / "job0", 30.0)  # needs 37 GiB: 1 fits
    with pytest.raises(packing.PackingRefused) as refused:
        check.update([small, big])
    assert re.match(r"--jobs_per_gpu 2: a job needs about 37\.0 GiB \(30\.00 GiB at its peak "
                    rf"\({re.escape(big)}'s records\).*relaunch with --jobs_per_gpu 1",
                    str(refused.value)), str(refused.value)
    larger_first = packing.MemoryCheck(["0"], 2, free={"0": 80.0})
    assert "a job needs about 37.0 GiB" in larger_first.update([big])
    assert larger_first.update([big, small]) is None and larger_first.decided  # 30 GiB holds


def test_the_multi_gpu_launcher_packs_a_second_sweep_only_once_its_peak_fits(tmp_path,
                                                                            monkeypatch):
    """The launcher, two jobs per GPU, a queue of two sweeps whose jobs write their peak at once:
    the ResNet-18 sweep's jobs share the GPU; the first ResNet-50 job runs without a second one
    beside it until its peak is known, which does not fit twice: refused, and the second
    ResNet-50 job never starts (before, the first peak decided for the whole queue)."""
    import shlex
    import sys

    from dg_plugins.sweep.launchers import run_on_gpus

    monkeypatch.setattr(packing, "free_gb", lambda gpu: 40.0)
    code = ("import os, sys, time; argv = sys.argv; out = argv[argv.index('--output_dir') + 1]; "
            "os.makedirs(out, exist_ok=True); "
            "open(os.path.join(out, 'results.jsonl'), 'w').write("
            "'{\"step\": 0, \"mem_gb\": %s}\\n' % argv[argv.index('--gb') + 1]); "
            "time.sleep(0.5)")

    def job(sweep, k, gb):
        return shlex.join([sys.executable, "-c", code, "--output_dir",
                           str(tmp_path / sweep / f"job{k}"), "--gb", str(gb)])

    commands = [job("resnet18", 0, 2.0), job("resnet18", 1, 2.0), job("resnet50", 0, 30.0),
                job("resnet50", 1, 30.0)]
    with pytest.raises(packing.PackingRefused) as refused:
        run_on_gpus(commands, ["0"], poll_interval=0.05, jobs_per_gpu=2)
    assert "resnet50" in str(refused.value) and "relaunch with --jobs_per_gpu 1" in str(
        refused.value)
    assert (tmp_path / "resnet18" / "job1" / "results.jsonl").exists()
    assert not (tmp_path / "resnet50" / "job1" / "results.jsonl").exists()


def sweep_args(out, launcher, *extra, trials=2):
    return ["launch", "--datasets", "Debug28", "--algorithms", "ERM", "--test_env_sets", "0",
            "--n_hparams", "1", "--n_trials", str(trials), "--steps", "5", "--checkpoint_freq", "2",
            "--hparams", '{"batch_size": 8}', "--data_dir", "builtin", "--output_dir", out,
            "--command_launcher", launcher, "--skip_confirmation", *extra]


def test_two_jobs_on_one_gpu_run_at_once_and_write_the_records_of_jobs_run_alone(tmp_path,
                                                                                capfd):
    """Three jobs, two per GPU (the real command): the second slot opens once the first job's
    records give its peak memory, and then a job starts beside another whatever the jobs' speed
    (beside the first job if it still runs, else the second and third together), so two starts
    follow each other with no end between them. The jobs run alone by the local launcher (the
    sweep's ``main`` in process) write the same records."""
    from dg_plugins.sweep import cli as sweep_cli

    code = sweep_cli.main(sweep_args(str(tmp_path / "alone"), "local", trials=3))
    alone = capfd.readouterr().out
    assert code == 0, alone
    env = command_env(CUDA_VISIBLE_DEVICES="0", **{CORES_ENV: "2"})
    code, packed = run(SWEEP, *sweep_args(tmp_path / "packed", "multi_gpu", "--jobs_per_gpu",
                                          "2", trials=3), env=env, timeout=300)
    assert code == 0, packed
    assert "1 GPU(s) x 2 job(s) at once; each job gets 1 of the launcher's 2 cores" in packed
    events = re.findall(r"^\[\d/3\] (started|done)", packed, re.MULTILINE)
    assert len(events) == 6 and "started started" in " ".join(events), packed  # side by side
    folders = sorted(p.parent.name for p in (tmp_path / "alone").glob("*/done"))
    assert len(folders) == 3
    assert sorted(p.parent.name for p in (tmp_path / "packed").glob("*/done")) == folders
    for name in folders:
        assert read_records(tmp_path / "packed" / name, VOLATILE_KEYS) == read_records(
            tmp_path / "alone" / name, VOLATILE_KEYS)


def test_jobs_per_gpu_needs_the_multi_gpu_launcher(tmp_path, capsys):
    from dg_plugins.sweep import cli as sweep_cli

    with pytest.raises(SystemExit) as exited:
        sweep_cli.main(sweep_args(str(tmp_path), "local", "--jobs_per_gpu", "2"))
    output = capsys.readouterr().err
    assert exited.value.code == 2 and "--jobs_per_gpu packs jobs on the GPUs of the multi_gpu " \
        "launcher" in output, output
    assert not any(tmp_path.iterdir())


def test_a_packed_job_is_forked_with_its_gpu_and_cores(tmp_path):
    """The multi_gpu launcher's job environment (its GPU, its share of the cores) reaches a job
    forked from the fork server as it reaches a fresh interpreter: the job counts its loader
    workers from the share it was given, not from the launcher's cores."""
    import shlex
    import sys

    from dg_plugins.job.flags import TRAIN_MODULE
    from dg_plugins.sweep.processes import ForkedJob
    from dg_plugins.sweep.processes import JobProcesses
    from support.image_tree import make_pacs_tree

    data = make_pacs_tree(tmp_path / "data", per_class=1, size=16) / "PACS"
    command = shlex.join([sys.executable, "-m", TRAIN_MODULE, "--dataset", "ImageFolder",
                          "--data_dir", str(data), "--test_envs", "0", "--steps", "1",
                          "--hparams", '{"resnet18": true, "pretrained": false, "batch_size": 2, '
                          '"image_size": 32}',
                          "--output_dir", str(tmp_path / "job")])
    log = tmp_path / "job.log"
    with JobProcesses() as jobs:
        env = command_env(CUDA_VISIBLE_DEVICES="0", **{CORES_ENV: "1"})  # as packing.job_env
        proc = jobs.start(0, command, env=env, log=str(log))
        assert isinstance(proc, ForkedJob)
        code = proc.wait(timeout=240)
    assert code == 0, log.read_text()[-3000:]
    assert f"loader workers: 1 (one per core: 1 core, ${CORES_ENV})" in log.read_text()
