"""The ``submitit`` launcher: the commands as the tasks of a Slurm job array (each a ``TrainTask``
of one or ``--jobs_per_gpu`` jobs) or of submitit's local/debug executor (docs/sweep.md)."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import shutil
import signal
import time
from typing import Callable, Sequence

from dg_plugins.signals import (SignalCatcher, forget_stop_signal, last_stop_signal,
                                signal_name, stop_grace_period)
from dg_plugins.job.flags import parse_command
from dg_plugins.sweep.processes import (ErrorLogs, JobProcesses, LaunchInterrupted,
                                        command_output_dir, report_exit_codes,
                                        report_interrupted)

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


def options_from_env(environ=None) -> SubmititOptions:
    """The fields set through ``DG_SLURM_*`` variables, parsed by the field's type."""
    environ = os.environ if environ is None else environ
    parsers = {"int": int, "float": float, "bool": _parse_bool, "dict": parse_json_object}
    values = {}
    for f in dataclasses.fields(SubmititOptions):
        var = SUBMITIT_ENV_VARS[f.name]
        if var in environ:
            try:
                values[f.name] = parsers.get(f.type.split(" ")[0], str)(environ[var])
            except ValueError as err:
                raise ValueError(f"bad value for ${var}: {err}") from None
    return SubmititOptions(**values)


def _over(options: SubmititOptions, *layers: SubmititOptions | None) -> SubmititOptions:
    """``options`` with the fields each layer sets (not None), the last layer highest."""
    for layer in layers:
        options = dataclasses.replace(options, **{
            f.name: getattr(layer, f.name) for f in dataclasses.fields(SubmititOptions)
            if layer is not None and getattr(layer, f.name) is not None})
    return options


def given_options(overrides: SubmititOptions | None = None, environ=None) -> SubmititOptions:
    """What was set, highest first: ``overrides``, the environment (the rest None)."""
    return _over(SubmititOptions(), options_from_env(environ), overrides)


def resolve_submitit_options(commands: Sequence[str] = (),
                             overrides: SubmititOptions | None = None,
                             environ=None) -> SubmititOptions:
    """Merge, highest first: ``overrides``, the environment, the defaults."""
    merged = given_options(overrides, environ)
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


def _import_submitit():
    try:
        import submitit
    except ImportError as err:
        raise ImportError(
            "the submitit launcher needs the submitit package: pip install 'dg_plugins[slurm]' "
            "(or pip install submitit)"
        ) from err
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
    from dg_plugins.sweep.slurm import SlurmError, check_request

    try:
        check_request(resolved, given_options(options))
    except SlurmError as err:
        return str(err)
    return None


def make_executor(options: SubmititOptions):
    """A ``submitit.AutoExecutor`` configured from fully resolved ``options``."""
    submitit = _import_submitit()
    requeues = ({"slurm_max_num_timeout": options.max_requeues} if options.cluster == "slurm"
                else {})
    executor = submitit.AutoExecutor(folder=options.log_dir, cluster=options.cluster, **requeues)
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
    given = options
    options = resolve_submitit_options(commands, overrides=options)
    commands = list(commands)
    if not commands:
        return []
    if options.cluster == "slurm":
        return submit_to_slurm(commands, options, given_options(given))
    executor = make_executor(options)
    logs = ErrorLogs(commands)
    cwd = os.getcwd()
    grace = stop_grace_period(grace_period_s)
    forget_stop_signal()
    jobs: list = []

    def pass_on(signum: int) -> None:  # local executor: via each job's controller process,
        for job in jobs:               # which forwards SIGTERM to its task
            process = getattr(job, "_process", None)
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)

    with SignalCatcher(pass_on) as catcher:
        jobs = executor.map_array(run_shell_command, commands, [cwd] * len(commands),
                                  [grace] * len(commands))
        ids = [job.job_id for job in jobs]
        print(f"submitit launcher: submitted {len(jobs)} jobs to {options.cluster} "
              f"(ids {ids[0]}..{ids[-1]}); logs in {options.log_dir}", flush=True)
        if catcher.signum is not None:  # a signal came during the submission
            pass_on(catcher.signum)
        if not options.wait:
            return jobs
        if options.cluster == "local":
            codes = _wait_local(commands, jobs, catcher, grace)
        else:
            codes = _wait_debug(commands, jobs)
    report_exit_codes("submitit", commands, codes, logs)  # raises JobsFailed if a job failed
    return jobs


def submit_to_slurm(commands: Sequence[str], options: SubmititOptions,
                    given: SubmititOptions) -> list:
    """The commands as ``TrainTask`` array tasks, each job folder recording its Slurm id."""
    from dg_plugins.sweep import slurm

    options, notes = slurm.check_request(options, given)
    for note in notes:
        print(note, flush=True)
    executor = make_executor(options)
    size = max(1, options.jobs_per_task or 1)
    # Slurm signals up to a minute early (its periodic check): what is left is at least this
    grace = options.signal_delay_s - min(30.0, options.signal_delay_s / 4)
    tasks = [slurm.TrainTask([parse_command(c)[0] for c in commands[i:i + size]], os.getcwd(), grace)
             for i in range(0, len(commands), size)]
    try:
        with executor.batch():
            jobs = [executor.submit(task) for task in tasks]
    except Exception as err:  # noqa: BLE001  (sbatch's refusal, in submitit's words)
        lines = [line.strip() for line in str(err).splitlines() if "error" in line.lower()]
        raise slurm.SlurmError(f"Slurm refused the submission: "
                               f"{lines[-1] if lines else str(err).strip()[:300]}") from None
    for task, job in zip(tasks, jobs):
        for folder in filter(None, map(command_output_dir, task.argvs)):
            slurm.record_job(folder, job.job_id, options.log_dir)
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
        if deadline is not None and pending and time.monotonic() >= deadline:
            cancelled = sorted(pending)
            for i in cancelled:
                jobs[i].cancel()
            deadline = float("inf")
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
