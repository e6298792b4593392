"""The ``submitit`` launcher: the commands as the tasks of a Slurm job array (each a
:class:`TrainTask` of one or ``--jobs_per_gpu`` jobs) or of submitit's local/debug executor; what
the sweep asks a Slurm cluster through its clients (the request checked before any job folder is
made, the Slurm job that holds each job folder, cancelling); and what one array task runs: its
train jobs with ``--resume``, Slurm's signals passed on, and a requeue at each time limit
(submitit's checkpoint protocol) (docs/sweep.md, "Slurm")."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from typing import Callable, Iterable, Sequence

from dg_plugins.files import atomic_write_text
from dg_plugins.job.flags import parse_command
from dg_plugins.job.folder import CHECKPOINT_FILE, DONE_FILE, is_done
from dg_plugins.runtime import CORES_ENV, job_cores
from dg_plugins.signals import (SLURM_TASK_ENV, SignalCatcher, forget_stop_signal,
                                last_stop_signal, signal_name, stop_grace_period)
from dg_plugins.sweep.processes import (ErrorLogs, JobProcesses, LaunchInterrupted,
                                        _load_libc, command_output_dir, die_with_parent,
                                        report_exit_codes, report_interrupted)

SUBMITIT_CLUSTERS = ("slurm", "local", "debug")


@dataclasses.dataclass
class SubmititOptions:
    """Settings of the ``submitit`` launcher; None means "not set here"."""
    cluster: str | None = None
    partition: str | None = None
    time_min: int | None = None
    gpus_per_node: int | None = None
    cpus_per_task: int | None = None
    mem_gb: float | None = None
    array_parallelism: int | None = None
    log_dir: str | None = None
    wait: bool | None = None
    extra: dict | None = None
    signal_delay_s: float | None = None
    max_requeues: int | None = None
    jobs_per_task: int | None = None


#: Environment variable of each :class:`SubmititOptions` field: ``DG_SLURM_<NAME>``.
SUBMITIT_ENV_VARS = {f.name: "DG_SLURM_" + {"time_min": "TIME", "signal_delay_s": "SIGNAL_DELAY"}
                     .get(f.name, f.name.upper()) for f in dataclasses.fields(SubmititOptions)}
#: Seconds before the time limit at which Slurm signals a task (time for a step and a checkpoint),
#: and the time limits after which a task is requeued (preemptions are not counted).
DEFAULT_SIGNAL_DELAY_S, DEFAULT_MAX_REQUEUES = 120, 10


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "y", "on", "0", "false", "no", "n", "off", ""):
        return lowered in ("1", "true", "yes", "y", "on")
    raise ValueError(f"not a boolean: {text!r} (use 1/0, true/false, yes/no)")


def parse_json_object(text: str) -> dict:
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object, got {text!r}")
    return value


def given_options(overrides: SubmititOptions | None = None) -> SubmititOptions:
    """What was set: ``overrides`` over the ``DG_SLURM_*`` variables (by field type); else None."""
    parsers = {"int": int, "float": float, "bool": _parse_bool, "dict": parse_json_object}
    values = {}
    for f in dataclasses.fields(SubmititOptions):
        var = SUBMITIT_ENV_VARS[f.name]
        if var in os.environ:
            try:
                values[f.name] = parsers.get(f.type.split(" ")[0], str)(os.environ[var])
            except ValueError as err:
                raise ValueError(f"bad value for ${var}: {err}") from None
    return _over(SubmititOptions(**values), overrides)


def _over(options: SubmititOptions, layer: SubmititOptions | None) -> SubmititOptions:
    """``options`` with the fields ``layer`` sets (not None)."""
    return dataclasses.replace(options, **{
        f.name: getattr(layer, f.name) for f in dataclasses.fields(SubmititOptions)
        if layer is not None and getattr(layer, f.name) is not None})


def resolve_submitit_options(commands: Sequence[str] = (),
                             overrides: SubmititOptions | None = None) -> SubmititOptions:
    """Merge, highest first: ``overrides``, the environment, the defaults."""
    merged = given_options(overrides)
    cluster = merged.cluster or "slurm"
    if cluster not in SUBMITIT_CLUSTERS:
        raise ValueError(f"unknown submitit cluster {cluster!r}; choices: "
                         f"{', '.join(SUBMITIT_CLUSTERS)}")
    folder = command_output_dir(commands[0]) if commands else None  # the sweep's: its parent
    resolved = _over(SubmititOptions(
        cluster=cluster, time_min=24 * 60, gpus_per_node=None if cluster == "slurm" else 0,
        array_parallelism=256, wait=cluster != "slurm", extra={}, log_dir=os.path.join(
            "." if folder is None else os.path.dirname(os.path.normpath(folder)), "submitit_logs"),
        signal_delay_s=DEFAULT_SIGNAL_DELAY_S, max_requeues=DEFAULT_MAX_REQUEUES,
        jobs_per_task=1), merged)
    if cluster == "debug":
        resolved.wait = True
    return resolved


def run_shell_command(command: str, cwd: str | None = None,
                      grace_period_s: float | None = None) -> int:
    """One task of submitit's local/debug executor (a nonzero exit raises)."""
    with JobProcesses(grace_period_s) as jobs:
        proc = jobs.start(0, command, cwd=cwd)
        code = jobs.wait(proc) if proc is not None else 128 + jobs.signum
    if code != 0:
        raise RuntimeError(f"command exited with code {code}: {command}")
    return code


def _terminate(processes: Iterable) -> None:
    """SIGTERM each of the ``processes`` (``Popen``s; None skipped) that still runs."""
    for process in processes:
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)


def _import_submitit():
    try:
        import submitit
    except ImportError as err:
        raise ImportError("the submitit launcher needs the submitit package: pip install "
                          "'dg_plugins[slurm]' (or pip install submitit)") from err
    return submitit


def launch_problem(options: SubmititOptions | None = None) -> str | None:
    """Why the launcher cannot submit from this machine, with the fix (None: it can)."""
    try:
        _import_submitit()
        resolved = resolve_submitit_options(overrides=options)
    except (ImportError, ValueError) as err:
        return str(err)
    if resolved.cluster != "slurm":
        return None
    if shutil.which("srun") is None:
        return ("no Slurm on this machine (srun is not on PATH); run the jobs here through "
                "submitit with --slurm_cluster local, or use --command_launcher local")
    try:
        check_request(resolved, given_options(options))
    except SlurmError as err:
        return str(err)
    return None


def make_executor(options: SubmititOptions):
    """A ``submitit.AutoExecutor`` configured from fully resolved ``options``."""
    submitit = _import_submitit()
    executor = submitit.AutoExecutor(folder=options.log_dir, cluster=options.cluster,
                                     slurm_max_num_timeout=options.max_requeues)
    params = {"name": "dg_sweep", "timeout_min": options.time_min,
              "gpus_per_node": options.gpus_per_node, "cpus_per_task": options.cpus_per_task,
              "mem_gb": options.mem_gb, "slurm_partition": options.partition,
              "slurm_array_parallelism": options.array_parallelism}
    extra = dict(options.extra or {})
    if options.cluster == "slurm":
        # a requeued task appends to its logs (srun's own --output truncates by default): every
        # allocation's lines are kept
        params.update(slurm_signal_delay_s=int(options.signal_delay_s),
                      slurm_srun_args=["--open-mode=append",
                                       *(extra.pop("slurm_srun_args", None) or [])])
    params.update(extra)
    executor.update_parameters(**{k: v for k, v in params.items() if v is not None})
    return executor


def submit_commands(commands: Sequence[str], options: SubmititOptions | None = None,
                    grace_period_s: float | None = None) -> list:
    """Submit the commands as the tasks of a job array (and wait, with ``options.wait``)."""
    resolved = resolve_submitit_options(commands, overrides=options)
    commands = list(commands)
    if not commands:
        return []
    if resolved.cluster == "slurm":
        return submit_to_slurm(commands, resolved, given_options(options))
    executor = make_executor(resolved)
    logs = ErrorLogs(commands)
    grace = stop_grace_period(grace_period_s)
    forget_stop_signal()
    jobs: list = []

    def pass_on(signum: int) -> None:  # local executor: via each job's controller process,
        _terminate(getattr(job, "_process", None) for job in jobs)  # which forwards it to its task

    with SignalCatcher(pass_on) as catcher:
        jobs = executor.map_array(run_shell_command, commands, [os.getcwd()] * len(commands),
                                  [grace] * len(commands))
        print(f"submitit launcher: submitted {len(jobs)} jobs to {resolved.cluster} "
              f"(ids {jobs[0].job_id}..{jobs[-1].job_id}); logs in {resolved.log_dir}", flush=True)
        if catcher.signum is not None:  # a signal came during the submission
            pass_on(catcher.signum)
        if not resolved.wait:
            return jobs
        codes = (_wait_local(commands, jobs, catcher, grace) if resolved.cluster == "local"
                 else _wait_debug(commands, jobs))
    report_exit_codes("submitit", commands, codes, logs)  # raises JobsFailed if a job failed
    return jobs


def submit_to_slurm(commands: Sequence[str], options: SubmititOptions,
                    given: SubmititOptions) -> list:
    """The commands as ``TrainTask`` array tasks, each job folder recording its Slurm id."""
    options, notes = check_request(options, given)
    for note in notes:
        print(note, flush=True)
    executor = make_executor(options)
    size = max(1, options.jobs_per_task or 1)
    # Slurm signals up to a minute early (its periodic check): what is left is at least this
    grace = options.signal_delay_s - min(30.0, options.signal_delay_s / 4)
    tasks = [TrainTask([parse_command(c)[0] for c in commands[i:i + size]], os.getcwd(), grace)
             for i in range(0, len(commands), size)]
    try:
        with executor.batch():
            jobs = [executor.submit(task) for task in tasks]
    except Exception as err:  # noqa: BLE001  (sbatch's refusal, in submitit's words)
        lines = [line.strip() for line in str(err).splitlines() if "error" in line.lower()]
        raise SlurmError("Slurm refused the submission: "
                         f"{lines[-1] if lines else str(err).strip()[:300]}") from None
    for task, job in zip(tasks, jobs):
        for folder in filter(None, map(command_output_dir, task.argvs)):
            atomic_write_text(os.path.join(folder, SLURM_JOB_FILE), json.dumps({
                "job_id": str(job.job_id), "log_dir": os.path.abspath(options.log_dir),
                "submitted": time.strftime("%Y-%m-%d %H:%M:%S")}))
    array_id = str(jobs[0].job_id).split("_")[0]
    per = f", {size} jobs per task" if size > 1 else ""
    print(f"submitit launcher: submitted {len(commands)} jobs to slurm as array {array_id} "
          f"({len(jobs)} tasks{per}, partition {options.partition}, {options.time_min} min, "
          f"{options.gpus_per_node} GPU(s) each); logs in {options.log_dir}. A task is requeued "
          f"from its checkpoint after preemption and after each time limit (signal "
          f"{options.signal_delay_s:g} s before it, at most {options.max_requeues} time "
          "limits).", flush=True)
    if options.wait:
        codes = _wait_slurm(commands, [jobs[i // size] for i in range(len(commands))])
        report_exit_codes("submitit", commands, codes, ErrorLogs(commands))
    return jobs


def _job_exit_code(job) -> int:
    """0, or the exit code of a finished job's command (from its error; 1 when unknown)."""
    # exception() waits and returns the error; the debug executor's result() would open pdb.
    try:
        err = job.exception()
    except Exception as raised:  # noqa: BLE001  (e.g. UncompletedJobError)
        err = raised
    if err is None:
        return 0
    print(f"submitit job {job.job_id} failed; log: {job.paths.stderr}", flush=True)
    codes = re.findall(r"command exited with code (-?\d+)", str(err))
    return int(codes[-1]) if codes else 1


def _wait_slurm(commands: Sequence[str], jobs: Sequence) -> list[int]:
    """Wait for every job; a stop signal stops the waiting only (the jobs run on the cluster)."""
    codes: list[int | None] = [None] * len(jobs)

    def stop_waiting(signum: int) -> None:
        array_id = str(jobs[0].job_id).split("_")[0]
        running = [c for c, code in zip(commands, codes) if code is None]
        raise LaunchInterrupted(signum, running, [], codes, remote=True, notes=[
            f"the jobs keep running on the cluster; cancel them with: scancel {array_id}"])

    with SignalCatcher(stop_waiting):
        for i, job in enumerate(jobs):
            codes[i] = _job_exit_code(job)
    return [int(c) for c in codes]


def _wait_local(commands: Sequence[str], jobs: Sequence, catcher: SignalCatcher,
                grace: float) -> list[int]:
    """Poll the local executor's jobs; after a stop signal, cancel those left after ``grace``."""
    codes: list[int | None] = [None] * len(jobs)
    pending = set(range(len(jobs)))
    running_at_stop: set[int] = set()
    deadline = None
    cancelled: list[int] = []
    while pending:
        for i in sorted(pending):
            if jobs[i].done():
                codes[i] = _job_exit_code(jobs[i])
                pending.discard(i)
        if catcher.signum is not None and deadline is None:
            running_at_stop = set(pending)
            deadline = time.monotonic() + grace + 5.0
            print(f"\nReceived {signal_name(catcher.signum)}: passed to {len(pending)} running "
                  f"job(s); waiting up to {grace:g} s for them to stop at a checkpoint.",
                  flush=True)
        if deadline is not None and pending and not cancelled and time.monotonic() >= deadline:
            cancelled = sorted(pending)
            for i in cancelled:
                jobs[i].cancel()
        if pending:
            time.sleep(0.1)
    if catcher.signum is None:
        return [int(c) for c in codes]
    notes = [f"still running after the {grace:g} s grace period: cancelled: {commands[i]}"
             for i in cancelled]
    raise LaunchInterrupted(catcher.signum,
                            [commands[i] for i in sorted(running_at_stop) if codes[i] != 0],
                            [], codes, notes=notes)


def _wait_debug(commands: Sequence[str], jobs: Sequence) -> list[int]:
    """Wait for the debug executor's jobs; a stop signal ends the loop."""
    codes: list[int | None] = [None] * len(jobs)
    for i, job in enumerate(jobs):
        if last_stop_signal() is not None:
            break
        codes[i] = _job_exit_code(job)
        if last_stop_signal() is not None and codes[i] != 0:
            raise LaunchInterrupted(last_stop_signal(), [commands[i]], commands[i + 1:], codes)
    if last_stop_signal() is not None:
        started = sum(c is not None for c in codes)
        raise LaunchInterrupted(last_stop_signal(), [], commands[started:], codes)
    return [int(c) for c in codes]


def submitit_launcher(commands: list[str], submitit: SubmititOptions | None = None,
                      grace_period_s: float | None = None) -> None:
    """Run the commands as a submitit job array (``submitit``: the options over DG_SLURM_*)."""
    try:
        submit_commands(commands, submitit, grace_period_s)
    except LaunchInterrupted as err:
        report_interrupted("submitit", commands, err)
        raise


def make_submitit_launcher(**options) -> Callable[[list], None]:
    """A launcher ``fn(commands)`` with its own submitit options (over the environment)."""
    return functools.partial(submitit_launcher, submitit=SubmititOptions(**options))


#: A job folder's record of the Slurm job (array task) that holds it.
SLURM_JOB_FILE = "slurm_job.json"
#: squeue states in which Slurm still holds a job: it will run, runs, or is being requeued.
HELD_STATES = frozenset({"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED",
                         "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SUSPENDED", "STAGE_OUT",
                         "SIGNALING", "STOPPED", "RESV_DEL_HOLD", "SPECIAL_EXIT"})
CLIENT_TIMEOUT_S = 30


class SlurmError(RuntimeError):
    """A Slurm client failed or Slurm refused the request: one line naming it and the fix."""


def run_client(argv: Sequence[str], timeout: float = CLIENT_TIMEOUT_S) -> str:
    """The stdout of a Slurm client command; raises :class:`SlurmError` with its error line."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise SlurmError(f"{argv[0]} is not on PATH (no Slurm clients on this machine)") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{' '.join(argv)} did not answer within {timeout:g} s") from None
    if done.returncode != 0:
        text = (done.stderr or done.stdout).strip().splitlines()
        raise SlurmError(text[-1] if text else f"{argv[0]} exited with {done.returncode}")
    return done.stdout


def minutes(text: str) -> float | None:
    """Minutes of a Slurm time (``[D-]HH:MM:SS``, ``MM:SS``, ``MM``; None: unlimited)."""
    text = text.strip()
    if text.upper() in ("UNLIMITED", "INFINITE", "NONE", ""):
        return None
    days, _, text = text.rpartition("-")
    parts = [int(p) for p in text.split(":")]
    hours, mins, secs = {1: [0, *parts, 0], 2: [0, *parts]}.get(len(parts), parts)
    return int(days or 0) * 1440 + hours * 60 + mins + secs / 60


def gpus_in(gres: str) -> int:
    """GPUs in a node's GRES (``gpu:4``, ``gpu:a100:4(S:0-1)``, ``(null)``; a list adds up)."""
    entries = [entry.split("(")[0].strip() for entry in gres.split(",")]
    counts = [entry.split(":")[-1] for entry in entries if entry.startswith("gpu")]
    return sum(int(count) if count.isdigit() else 1 for count in counts)


@dataclasses.dataclass
class Partition:
    name: str
    default: bool
    max_minutes: float | None
    nodes: list[dict] = dataclasses.field(default_factory=list)  # name, cpus, mem_gb, gpus

    def most(self, key: str) -> float:
        return max((node[key] for node in self.nodes), default=0)


def partitions() -> dict[str, Partition]:
    """Every partition, with its MaxTime and its nodes' CPUs, memory and GPUs."""
    found: dict[str, Partition] = {}
    for line in run_client(["scontrol", "show", "partition", "-o"]).splitlines():
        fields = dict(re.findall(r"(\w+)=(\S*)", line))
        if "PartitionName" in fields:
            name = fields["PartitionName"]
            found[name] = Partition(name, fields.get("Default") == "YES",
                                    minutes(fields.get("MaxTime", "UNLIMITED")))
    for line in run_client(["sinfo", "-h", "-N", "-o", "%R|%N|%c|%m|%G"]).splitlines():
        part, node, cpus, mem_mb, gres = (line.split("|") + [""] * 5)[:5]
        if part in found:
            found[part].nodes.append({"name": node, "cpus": int(cpus or 0),
                                      "mem_gb": int(mem_mb or 0) / 1024,
                                      "gpus": gpus_in(gres)})
    return found


def check_request(options, given) -> tuple[object, list[str]]:
    """The options fitted to the partition and the lines saying so (or :class:`SlurmError`)."""
    try:
        answer = run_client(["scontrol", "ping"])
    except SlurmError as err:
        raise SlurmError(f"Slurm's controller does not answer ({err}); check that slurmctld "
                         "runs and that SLURM_CONF names this cluster's slurm.conf") from None
    if "UP" not in answer:
        raise SlurmError(f"Slurm's controller is down ({answer.strip()}); ask the cluster's "
                         "admins, or retry when it is up")
    found = partitions()
    notes = []
    partition = (next((p for p in found.values() if p.default), None)
                 if options.partition is None else found.get(options.partition))
    if partition is None:
        raise SlurmError(("this cluster has no default partition; pass --slurm_partition"
                          if options.partition is None else f"--slurm_partition "
                          f"{options.partition}: no such partition")
                         + f" (partitions: {', '.join(found) or 'none'})")
    where = f"partition {partition.name}"
    limit = partition.max_minutes
    time_min = options.time_min
    if limit is not None and time_min > limit:
        if given.time_min is not None:
            raise SlurmError(f"--slurm_time {time_min} is over {where}'s MaxTime "
                             f"({limit:g} min); pass --slurm_time {int(limit)} or less (a "
                             "job longer than its allocation is requeued from its checkpoint)")
        notes.append(f"submitit launcher: the default time limit ({time_min} min) is over "
                     f"{where}'s MaxTime; each job asks for {int(limit)} min "
                     "(--slurm_time sets it)")
        time_min = int(limit)
    gpus = options.gpus_per_node
    most_gpus = int(partition.most("gpus"))
    if gpus is None:
        gpus = 1 if most_gpus else 0
        if not most_gpus:
            notes.append(f"submitit launcher: {where} has no GPUs; the jobs run on CPU "
                         "(--slurm_gpus_per_node sets the GPUs per job)")
    elif gpus > most_gpus:
        have = f"at most {most_gpus} GPU(s) per node" if most_gpus else "no GPUs"
        raise SlurmError(f"--slurm_gpus_per_node {gpus}: {where}'s nodes have {have}; pass "
                         f"--slurm_gpus_per_node {most_gpus} or choose a GPU partition with "
                         "--slurm_partition")
    if options.cpus_per_task is not None and options.cpus_per_task > partition.most("cpus"):
        raise SlurmError(f"--slurm_cpus_per_task {options.cpus_per_task}: {where}'s nodes have "
                         f"at most {int(partition.most('cpus'))} CPUs; pass a smaller value")
    if options.mem_gb is not None and options.mem_gb > partition.most("mem_gb"):
        raise SlurmError(f"--slurm_mem_gb {options.mem_gb:g}: {where}'s nodes have at most "
                         f"{partition.most('mem_gb'):.1f} GB; pass a smaller value")
    delay = options.signal_delay_s
    if delay * 2 > time_min * 60:
        if given.signal_delay_s is not None:
            raise SlurmError(f"--slurm_signal_delay {delay:g} s leaves too little of a "
                             f"{time_min}-minute allocation (at most half of it); pass a "
                             "smaller --slurm_signal_delay or a longer --slurm_time")
        delay = max(5.0, time_min * 60 / 4)
        notes.append(f"submitit launcher: the signal before the time limit comes {delay:g} s "
                     f"before it in a {time_min}-minute allocation (--slurm_signal_delay sets "
                     "it)")
    return dataclasses.replace(options, partition=partition.name, time_min=time_min,
                               gpus_per_node=gpus, signal_delay_s=delay), notes


def recorded_job(folder: str) -> dict | None:
    """``folder``'s Slurm job record, or None."""
    record = None
    with contextlib.suppress(OSError, ValueError), open(os.path.join(folder, SLURM_JOB_FILE)) as f:
        record = json.load(f)
    return record if isinstance(record, dict) and record.get("job_id") else None


@dataclasses.dataclass
class SlurmState:
    """A Slurm job's state as Slurm reports it (``held``: Slurm will still run it)."""

    job_id: str
    state: str
    reason: str = ""
    held: bool = False

    def describe(self) -> str:
        reason = f", {self.reason}" if self.reason and self.reason != "None" else ""
        return f"Slurm job {self.job_id}: {self.state.lower()}{reason}"


def job_states(job_ids: Iterable[str]) -> dict[str, SlurmState]:
    """Each id's state from ``squeue``, else ``sacct`` (:class:`SlurmError`: no answer)."""
    ids = sorted(set(job_ids))
    if not ids:
        return {}
    arrays = sorted({i.split("_")[0] for i in ids})
    try:
        out = run_client(["squeue", "-h", "-r", "-o", "%i|%T|%r", "-j", ",".join(arrays)])
    except SlurmError as err:
        if "Invalid job id" not in str(err):
            raise
        out = ""  # none of them is known to the controller any more
    states = {}
    for line in out.splitlines():
        job_id, state, reason = (line.strip().split("|") + ["", ""])[:3]
        if job_id in ids:
            states[job_id] = SlurmState(job_id, state, reason, state in HELD_STATES)
    if ended := [i for i in ids if i not in states]:
        out = ""
        with contextlib.suppress(SlurmError):  # no accounting on this cluster
            out = run_client(["sacct", "-n", "-P", "-X", "-o", "JobID,State", "-j",
                              ",".join(ended)])
        for line in out.splitlines():
            job_id, state = (line.strip().split("|") + [""])[:2]
            if job_id in ended:
                states[job_id] = SlurmState(job_id, state.split()[0] if state else "ENDED")
    return states


def cancel(job_ids: Iterable[str]) -> None:
    """``scancel`` the ids (array tasks ``123_4``)."""
    if ids := sorted(set(job_ids)):
        run_client(["scancel", *ids])


#: Allocations in a row that may end at a time limit before any job wrote a checkpoint.
MAX_STALLS = 2
#: Signals the task catches and passes on to its jobs as SIGTERM (USR2 is submitit's).
PASSED_ON = (signal.SIGTERM, signal.SIGINT)


def _child_setup() -> None:  # in the job's process, between fork and exec
    die_with_parent(signal.SIGKILL)  # never outlive the task (it waits for its jobs)
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)  # the time-limit signal is the task's


class TrainTask:
    """One array task: ``argvs`` (train commands, ``--resume`` added) run at once in ``cwd``."""

    def __init__(self, argvs: Sequence[Sequence[str]], cwd: str, grace_s: float,
                 stalls: int = 0):
        self.argvs = [list(a) + ([] if "--resume" in a else ["--resume"]) for a in argvs]
        self.cwd = cwd
        self.grace_s = grace_s
        self.stalls = stalls  # allocations in a row that ended before a new checkpoint
        self.__setstate__({})  # the run's own fields, as a requeued task starts them

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _procs=[], _signum=None, _started=0.0)  # Popens, signal, start

    def __call__(self) -> str:
        self._started = time.time()
        for signum in PASSED_ON:
            signal.signal(signum, self._on_stop_signal)
        todo = [a for a in self.argvs if not is_done(command_output_dir(a) or "")]
        env = dict(os.environ, **{SLURM_TASK_ENV: "1",
                                  CORES_ENV: str(max(1, job_cores()[0] // max(1, len(todo))))})
        _load_libc()
        for argv in todo:
            if self._signum is not None:
                break
            print(f"dg_plugins task: starting {' '.join(argv)}", flush=True)
            self._procs.append(subprocess.Popen(argv, cwd=self.cwd, env=env,
                                                preexec_fn=_child_setup))
        codes = self._wait()
        if self._signum is not None:  # preempted or cancelled: the jobs stopped at a checkpoint
            print(f"dg_plugins task: stopped by {signal.Signals(self._signum).name}; the jobs "
                  "wrote their checkpoints (a requeued task resumes them)", flush=True)
            sys.stderr.flush()
            os._exit(128 + self._signum)  # no result: Slurm requeues or ends the job itself
        failed = [(f, c) for f, c in zip([command_output_dir(a) for a in todo], codes) if c != 0]
        if failed:
            raise RuntimeError("; ".join(f"train exited with code {c}: {f} (see its err.txt)"
                                         for f, c in failed))
        return f"{len(todo)} job(s) done"

    def _on_stop_signal(self, signum: int, frame=None) -> None:
        if self._signum is None:
            self._signum = signum
            _terminate(self._procs)

    def _wait(self, deadline: float | None = None) -> list[int]:
        """Wait for the jobs (until ``deadline``, then SIGKILL); their exit codes."""
        while any(p.poll() is None for p in self._procs):
            if deadline is not None and time.monotonic() >= deadline:
                for proc in self._procs:
                    if proc.poll() is None:
                        print(f"dg_plugins task: {command_output_dir(proc.args)} did not stop "
                              f"within {self.grace_s:g} s; killed", flush=True)
                        proc.kill()
                deadline = None
            time.sleep(0.2)
        return [p.returncode for p in self._procs]

    def progressed(self) -> bool:
        """Whether a job wrote a checkpoint or finished during this allocation."""
        for folder in (command_output_dir(a) or "" for a in self.argvs):
            for name in (CHECKPOINT_FILE, DONE_FILE):
                with contextlib.suppress(OSError):
                    if os.path.getmtime(os.path.join(folder, name)) >= self._started:
                        return True
        return False

    def checkpoint(self, *args, **kwargs):
        """submitit's time-limit hook: stop the jobs at a checkpoint; the task to requeue."""
        self._signum = self._signum or signal.SIGUSR2
        _terminate(self._procs)
        self._wait(time.monotonic() + self.grace_s)
        stalls = 0 if self.progressed() else self.stalls + 1
        if stalls >= MAX_STALLS:
            print(f"dg_plugins task: {stalls} allocations in a row reached their time limit "
                  "before any job wrote a checkpoint: the allocation is too short for a job's "
                  "start-up and first step. Not requeued: raise --slurm_time (or lower "
                  "--slurm_signal_delay), then relaunch with --resume.", flush=True)
            return None
        from submitit.helpers import DelayedSubmission

        print("dg_plugins task: time limit: the jobs stopped at a checkpoint; requeued",
              flush=True)
        return DelayedSubmission(TrainTask(self.argvs, self.cwd, self.grace_s, stalls))
