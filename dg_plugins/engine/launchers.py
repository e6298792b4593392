"""Command launchers (spec 8.3): each is ``fn(commands: list[str]) -> None``.

Importing this module registers ``dummy``, ``local``, ``multi_gpu`` and ``submitit`` in
:data:`dg_plugins.registry.LAUNCHERS`. No launcher imports torch or submitit at module import.

Differences from DomainBed's launchers (spec 8.3, 12 item 3):

* ``local`` reports progress and prints the failed commands at the end (DomainBed ignores exit
  codes); a failing job never stops the others and nothing is raised.
* ``multi_gpu`` raises when no GPU is visible (DomainBed spins forever), passes the GPU through the
  environment rather than a command prefix, and reports failures like ``local``.
* ``submitit`` is new: one Slurm job array (or submitit's local/debug executor for testing),
  configured by :func:`configure_submitit` (the sweep's ``--slurm_*`` flags) or ``DG_SLURM_*``
  environment variables.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys
import time
from typing import Callable, Sequence

from dg_plugins.registry import LAUNCHERS


def _report(name: str, commands: Sequence[str], exit_codes: Sequence[int]) -> list[int]:
    """Print a one-line summary and every failed command; return the failed indices."""
    failed = [i for i, code in enumerate(exit_codes) if code != 0]
    if failed:
        print(f"{name} launcher: {len(failed)} of {len(commands)} commands failed:", flush=True)
        for i in failed:
            print(f"  exit code {exit_codes[i]}: {commands[i]}", flush=True)
    else:
        print(f"{name} launcher: all {len(commands)} commands succeeded.", flush=True)
    return failed


# --------------------------------------------------------------------------------------------
# dummy and local


def dummy_launcher(commands: list[str]) -> None:
    """Print ``Dummy launcher: <cmd>`` for each command; run nothing."""
    for command in commands:
        print(f"Dummy launcher: {command}")


def run_sequentially(commands: Sequence[str], progress: bool | None = None) -> list[int]:
    """Run each command through the shell, one after another; return the exit codes.

    Progress: a tqdm bar on stderr when ``progress`` (default: stderr is a terminal), otherwise a
    plain ``[i/N] <cmd>`` line on stdout before each job.
    """
    if progress is None:
        progress = sys.stderr.isatty()
    codes = []
    if progress:
        from tqdm import tqdm

        for command in tqdm(commands, desc="jobs", unit="job", file=sys.stderr):
            codes.append(subprocess.call(command, shell=True))
    else:
        for i, command in enumerate(commands, 1):
            print(f"[{i}/{len(commands)}] {command}", flush=True)
            codes.append(subprocess.call(command, shell=True))
    return codes


def local_launcher(commands: list[str]) -> None:
    """Run the commands serially on this machine; summarize failures at the end."""
    _report("local", commands, run_sequentially(commands))


# --------------------------------------------------------------------------------------------
# multi_gpu


def visible_gpus() -> list[str]:
    """GPU ids from ``CUDA_VISIBLE_DEVICES`` (comma-split, empty entries dropped) when set, else
    ``range(torch.cuda.device_count())`` (torch imported only then)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [gpu.strip() for gpu in env.split(",") if gpu.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def run_on_gpus(commands: Sequence[str], gpus: Sequence[str],
                poll_interval: float = 1.0) -> list[int]:
    """Run the commands in order, at most one per GPU at a time, each with
    ``CUDA_VISIBLE_DEVICES=<its gpu>``; poll every ``poll_interval`` s; return the exit codes."""
    gpus = list(gpus)
    if not gpus:
        raise RuntimeError(
            "multi_gpu launcher: no GPU visible (CUDA_VISIBLE_DEVICES is empty or "
            "torch.cuda.device_count() is 0); use the local launcher on CPU machines"
        )
    codes: list[int | None] = [None] * len(commands)
    running: dict[str, tuple[int, subprocess.Popen]] = {}
    pending = list(enumerate(commands))
    while pending or running:
        for gpu, (index, proc) in list(running.items()):
            if proc.poll() is not None:
                codes[index] = proc.returncode
                del running[gpu]
        for gpu in gpus:
            if pending and gpu not in running:
                index, command = pending.pop(0)
                print(f"[{index + 1}/{len(commands)}] GPU {gpu}: {command}", flush=True)
                env = dict(os.environ, CUDA_VISIBLE_DEVICES=gpu)
                running[gpu] = (index, subprocess.Popen(command, shell=True, env=env))
        if running:
            time.sleep(poll_interval)
    return [int(code) for code in codes]


def multi_gpu_launcher(commands: list[str], gpus: Sequence[str] | None = None,
                       poll_interval: float = 1.0) -> None:
    """One job per visible GPU at a time (``gpus`` overrides :func:`visible_gpus`)."""
    gpus = visible_gpus() if gpus is None else gpus
    _report("multi_gpu", commands, run_on_gpus(commands, gpus, poll_interval))


# --------------------------------------------------------------------------------------------
# submitit (Slurm job arrays; submitit's local/debug executors for testing)

SUBMITIT_CLUSTERS = ("slurm", "local", "debug")


@dataclasses.dataclass
class SubmititOptions:
    """Settings of the ``submitit`` launcher; None means "not set here".

    Each field can also come from an environment variable (:data:`SUBMITIT_ENV_VARS`). Defaults
    when unset everywhere: cluster ``slurm``; time 1440 min (submitit's own Slurm default is 5);
    gpus_per_node 1 on Slurm, 0 otherwise; partition, cpus_per_task, mem_gb: the cluster's
    defaults; array_parallelism 256 (submitit's default; Slurm only, the local executor starts
    every task at once); log_dir ``<sweep output_dir>/submitit_logs`` (derived from the
    commands' ``--output_dir``); wait False on Slurm (return after submission), True on
    local/debug (the debug executor only runs jobs while waited on, so it always waits);
    extra: more ``executor.update_parameters`` keywords, e.g. ``{"slurm_account": "abc"}``.
    """

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


#: Environment variable of each :class:`SubmititOptions` field.
SUBMITIT_ENV_VARS = {
    "cluster": "DG_SLURM_CLUSTER",
    "partition": "DG_SLURM_PARTITION",
    "time_min": "DG_SLURM_TIME",
    "gpus_per_node": "DG_SLURM_GPUS_PER_NODE",
    "cpus_per_task": "DG_SLURM_CPUS_PER_TASK",
    "mem_gb": "DG_SLURM_MEM_GB",
    "array_parallelism": "DG_SLURM_ARRAY_PARALLELISM",
    "log_dir": "DG_SLURM_LOG_DIR",
    "wait": "DG_SLURM_WAIT",
    "extra": "DG_SLURM_EXTRA",
}

#: Module-level settings the sweep CLI fills from its ``--slurm_*`` flags; they win over the
#: environment. Change through :func:`configure_submitit`.
SUBMITIT_OPTIONS = SubmititOptions()


def configure_submitit(reset: bool = False, **options) -> SubmititOptions:
    """Set fields of :data:`SUBMITIT_OPTIONS` (None values are ignored; ``reset`` clears all
    first). Unknown option names raise."""
    global SUBMITIT_OPTIONS
    if reset:
        SUBMITIT_OPTIONS = SubmititOptions()
    names = {f.name for f in dataclasses.fields(SubmititOptions)}
    unknown = sorted(set(options) - names)
    if unknown:
        raise TypeError(f"unknown submitit option(s) {unknown}; valid: {sorted(names)}")
    SUBMITIT_OPTIONS = dataclasses.replace(
        SUBMITIT_OPTIONS, **{k: v for k, v in options.items() if v is not None})
    return SUBMITIT_OPTIONS


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "y", "on"):
        return True
    if lowered in ("0", "false", "no", "n", "off", ""):
        return False
    raise ValueError(f"not a boolean: {text!r} (use 1/0, true/false, yes/no)")


def parse_json_object(text: str) -> dict:
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object, got {text!r}")
    return value


_PARSERS = {"time_min": int, "gpus_per_node": int, "cpus_per_task": int, "mem_gb": float,
            "array_parallelism": int, "wait": _parse_bool, "extra": parse_json_object}


def options_from_env(environ=None) -> SubmititOptions:
    """The fields set through ``DG_SLURM_*`` variables; a bad value raises naming the variable."""
    environ = os.environ if environ is None else environ
    values = {}
    for name, var in SUBMITIT_ENV_VARS.items():
        if var in environ:
            try:
                values[name] = _PARSERS.get(name, str)(environ[var])
            except ValueError as err:
                raise ValueError(f"bad value for ${var}: {err}") from None
    return SubmititOptions(**values)


def sweep_dir_of(commands: Sequence[str]) -> str | None:
    """The sweep output_dir: the parent of the first command's ``--output_dir``, if any."""
    for command in commands[:1]:
        tokens = shlex.split(command)
        if "--output_dir" in tokens[:-1]:
            return os.path.dirname(os.path.normpath(tokens[tokens.index("--output_dir") + 1]))
    return None


def resolve_submitit_options(commands: Sequence[str] = (),
                             overrides: SubmititOptions | None = None,
                             environ=None) -> SubmititOptions:
    """Merge, highest first: ``overrides``, :data:`SUBMITIT_OPTIONS`, the environment, defaults
    (see :class:`SubmititOptions`). Every field of the result is set except partition,
    cpus_per_task and mem_gb (None there means the cluster default)."""
    merged = SubmititOptions()
    for layer in (options_from_env(environ), SUBMITIT_OPTIONS, overrides or SubmititOptions()):
        merged = dataclasses.replace(merged, **{
            f.name: getattr(layer, f.name) for f in dataclasses.fields(layer)
            if getattr(layer, f.name) is not None})
    cluster = merged.cluster or "slurm"
    if cluster not in SUBMITIT_CLUSTERS:
        raise ValueError(f"unknown submitit cluster {cluster!r}; choices: "
                         f"{', '.join(SUBMITIT_CLUSTERS)}")
    sweep_dir = sweep_dir_of(commands)
    defaults = SubmititOptions(
        cluster=cluster,
        time_min=24 * 60,
        gpus_per_node=1 if cluster == "slurm" else 0,
        array_parallelism=256,
        log_dir=os.path.join(sweep_dir if sweep_dir is not None else ".", "submitit_logs"),
        wait=cluster != "slurm",
        extra={},
    )
    resolved = dataclasses.replace(defaults, **{
        f.name: getattr(merged, f.name) for f in dataclasses.fields(merged)
        if getattr(merged, f.name) is not None})
    if cluster == "debug":
        resolved.wait = True
    return resolved


def run_shell_command(command: str, cwd: str | None = None) -> int:
    """One array task: run ``command`` through the shell in ``cwd`` (the directory the sweep was
    launched from, so relative paths keep their meaning). A nonzero exit raises, so that the
    scheduler marks the task failed."""
    code = subprocess.call(command, shell=True, cwd=cwd)
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


def make_executor(options: SubmititOptions):
    """A ``submitit.AutoExecutor`` configured from fully resolved ``options``."""
    submitit = _import_submitit()
    executor = submitit.AutoExecutor(folder=options.log_dir, cluster=options.cluster)
    params = {"name": "dg_sweep", "timeout_min": options.time_min,
              "gpus_per_node": options.gpus_per_node, "cpus_per_task": options.cpus_per_task,
              "mem_gb": options.mem_gb, "slurm_partition": options.partition,
              "slurm_array_parallelism": options.array_parallelism}
    params.update(options.extra or {})
    executor.update_parameters(**{k: v for k, v in params.items() if v is not None})
    return executor


def submit_commands(commands: Sequence[str], options: SubmititOptions | None = None) -> list:
    """Submit every command as one task of a job array (``executor.map_array``); when
    ``options.wait``, wait for all and print a failure summary. Returns the submitit jobs."""
    options = resolve_submitit_options(commands, overrides=options)
    commands = list(commands)
    if not commands:
        return []
    executor = make_executor(options)
    cwd = os.getcwd()
    jobs = executor.map_array(run_shell_command, commands, [cwd] * len(commands))
    ids = [job.job_id for job in jobs]
    print(f"submitit launcher: submitted {len(jobs)} jobs to {options.cluster} "
          f"(ids {ids[0]}..{ids[-1]}); logs in {options.log_dir}", flush=True)
    if options.wait:
        codes = []
        for job in jobs:
            # exception() waits and returns the error; the debug executor's result() would open
            # pdb on a failure.
            try:
                err = job.exception()
            except Exception as raised:  # noqa: BLE001  (e.g. UncompletedJobError)
                err = raised
            codes.append(0 if err is None else _exit_code_of(err))
            if err is not None:
                print(f"submitit job {job.job_id} failed; log: {job.paths.stderr}", flush=True)
        _report("submitit", commands, codes)
    return jobs


def _exit_code_of(err: Exception) -> int:
    """The child's exit code from a task error (its message or the remote traceback), or 1."""
    codes = re.findall(r"command exited with code (-?\d+)", str(err))
    return int(codes[-1]) if codes else 1


def submitit_launcher(commands: list[str]) -> None:
    """Run the commands as a submitit job array, configured by :data:`SUBMITIT_OPTIONS` and the
    ``DG_SLURM_*`` environment (see :class:`SubmititOptions`)."""
    submit_commands(commands)


def make_submitit_launcher(**options) -> Callable[[list], None]:
    """A launcher with its own submitit options (they win over every other source)."""
    overrides = SubmititOptions(**options)

    def launcher(commands: list[str]) -> None:
        submit_commands(commands, overrides)

    return launcher


# --------------------------------------------------------------------------------------------
# Registration


def _register(name: str, fn: Callable) -> None:
    """Register, replacing an entry only when it comes from this module (a reload)."""
    if name in LAUNCHERS and getattr(LAUNCHERS.get(name), "__module__", None) == __name__:
        LAUNCHERS.unregister(name)
    LAUNCHERS.register(name, fn)


for _name, _fn in (("dummy", dummy_launcher), ("local", local_launcher),
                   ("multi_gpu", multi_gpu_launcher), ("submitit", submitit_launcher)):
    _register(_name, _fn)
