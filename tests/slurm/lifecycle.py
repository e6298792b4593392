"""The sweeps the Slurm tests run: the real ``sweep`` command as a subprocess (with the
cluster's SLURM_CONF), jobs of a few seconds held at a step by the test gate where a test must
act while they run (``job_gate``), and their records compared with the local launcher's.

The lifecycle scenarios mostly wait on Slurm (its signal before a time limit, a requeue), so a
module starts them all at once, each in a thread of its own (:class:`Scenario`), and each test
checks the outcome of one."""

from __future__ import annotations

import contextlib
import io
import json
import threading
from pathlib import Path

from support import helpers
from support import job_gate
from support import processes

SWEEP = "dg_plugins.scripts.sweep"
#: Debug28 jobs of 3 steps, a checkpoint every 2 (records at steps 0 and 2), evaluating only
#: the splits model selection reads (the records and tables compared are those of the same
#: flags under the local launcher).
JOB_FLAGS = ["--datasets", "Debug28", "--algorithms", "ERM", "--n_hparams", "1", "--n_trials",
             "1", "--steps", "3", "--checkpoint_freq", "2", "--hparams", '{"batch_size": 4}',
             "--eval_splits", "selection"]
#: The step after which a gated job waits: stopped there, it writes its checkpoint and a rerun
#: resumes at step 2, between two records.
GATE_STEP = 1
TIMEOUT = 240


def sweep_args(out: Path, test_env_sets=("0", "1"), *extra) -> list[str]:
    return [*JOB_FLAGS, "--test_env_sets", *test_env_sets, "--output_dir", str(out),
            "--data_dir", "data", *extra]  # Debug28 reads no files; one string, one hash


def run_sweep(cluster, action: str, args, env=None, timeout: float = 120) -> tuple[int, str]:
    """``sweep ACTION args`` as a user runs it; ``(exit status, output)``."""
    environ = dict(env or processes.command_env(), SLURM_CONF=cluster.env["SLURM_CONF"])
    return processes.run(SWEEP, action, *args, "--skip_confirmation", env=environ,
                         timeout=timeout)


def gated_env(gate: Path, step: int = GATE_STEP) -> dict:
    """A job environment whose train stops after ``step`` until ``gate/release`` exists."""
    gate.mkdir(parents=True, exist_ok=True)
    return job_gate.gate_env(gate, step=step)


def job_folders(out: Path) -> list[Path]:
    return sorted(p for p in out.iterdir() if p.is_dir() and not p.name.startswith((".", "sub")))


def slurm_id(folder: Path) -> str:
    return json.loads((folder / "slurm_job.json").read_text())["job_id"]


def all_done(out: Path, n: int) -> bool:
    folders = job_folders(out) if out.exists() else []
    return len(folders) == n and all((f / "done").exists() for f in folders)


def records_by_job(out: Path) -> dict[str, list[dict]]:
    return {f.name: helpers.read_records(f, drop=helpers.VOLATILE_KEYS) for f in job_folders(out)}


def local_reference(tmp_path_factory, test_env_sets=("0", "1")) -> Path:
    """The same jobs run by the local launcher (no Slurm), uninterrupted."""
    out = tmp_path_factory.mktemp("local") / "sweep"
    code, text = processes.run(SWEEP, "launch", *sweep_args(out, test_env_sets),
                               "--command_launcher", "local", "--skip_confirmation",
                               env=processes.command_env(), timeout=TIMEOUT)
    assert code == 0, text
    return out


def tables(out: Path) -> str:
    """collect_results' tables of a sweep folder, its path replaced (its ``main`` in this
    process: the tables are the subject, not the command's process)."""
    from dg_plugins.collect.cli import main

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(io.StringIO()):
        code = main(["--input_dir", str(out), "--no_save"])
    assert code == 0, printed.getvalue()
    return printed.getvalue().replace(str(out), "<sweep>")


def no_train_process_left(env: dict) -> list[str]:
    """Train processes of this test (its marker) still alive."""
    return [p for p in processes.survivors(env, wait=20) if "dg_plugins.scripts.train" in p]


def text(path: Path) -> str:
    """A file's text ("" while it does not exist)."""
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def task_log(out: Path, job_id: str) -> str:
    logs = out / "submitit_logs"
    return "\n".join(p.read_text(errors="replace") for p in sorted(logs.glob(f"{job_id}_*log*")))



class Scenario(threading.Thread):
    """``fn(*args)`` run in a thread; :meth:`outcome` waits for it and re-raises its failure."""

    def __init__(self, fn, *args):
        super().__init__(daemon=True, name=fn.__name__)
        self.fn, self.args = fn, args
        self.error: BaseException | None = None
        self.value = None
        self.start()

    def run(self) -> None:
        try:
            self.value = self.fn(*self.args)
        except BaseException as err:  # noqa: BLE001  (re-raised in the test)
            self.error = err

    def outcome(self, timeout: float = 600):
        self.join(timeout)
        assert not self.is_alive(), f"{self.name} still running after {timeout:g} s"
        if self.error is not None:
            raise self.error
        return self.value


def ids_gone(cluster, ids) -> bool:
    return not set(ids) & set(cluster.squeue())
