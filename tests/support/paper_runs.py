"""Running the scripts of ``sweeps/`` as a user does, for the tests: ``bash sweeps/<script>.sh`` in
a subprocess with the interpreter under test (on a timeout, every process it started, jobs in
their own sessions included, first prints its Python stacks, then is killed),
``DATA_DIR`` and ``OUTPUT_DIR`` set, the other knobs as given, the download caches (``HF_HOME``,
``TORCH_HOME``, ``XDG_CACHE_HOME``) in a temporary folder, offline mode on, and a
``sitecustomize`` that logs every Python process started (so a test can tell what was launched).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from support.processes import MARKER, python_path, stop_marked

REPO = Path(__file__).resolve().parents[2]
SWEEPS = REPO / "sweeps"
#: The knobs of sweeps/*.sh; a test sets those it uses, the others are removed.
KNOBS = ("OUTPUT_DIR", "PROTOCOL", "LAUNCHER", "DATASETS", "ALGORITHMS", "TEST_ENVS", "EPOCHS",
         "PRETRAIN_EPOCHS", "STEPS", "N_TRIALS", "N_HPARAMS", "HPARAMS", "CLIP_CHECKPOINT",
         "DRY_RUN", "PARTS", "EVAL_SPLITS", "N_WORKERS", "DG_JOBS_PER_GPU")

SITECUSTOMIZE = '''
import os, sys
log = os.environ.get("SWEEP_SCRIPTS_PROCESS_LOG")
if log:
    with open(log, "a") as f:
        f.write(" ".join(getattr(sys, "orig_argv", sys.argv)) + "\\n")
'''


def script_env(tmp: Path, data_dir, log: Path, **knobs) -> dict:
    """The environment of a script run: the knobs given (others removed), caches under
    ``tmp/home`` (never the user's), offline, one torch thread per process."""
    site = tmp / "site"
    site.mkdir(exist_ok=True)
    # Threads call this at once: an atomic replace, so no process ever starts while the file is
    # truncated (it would log nothing).
    partial = site / f"sitecustomize.{os.getpid()}.{threading.get_ident()}.tmp"
    partial.write_text(SITECUSTOMIZE)
    os.replace(partial, site / "sitecustomize.py")
    home = tmp / "home"
    env = dict(os.environ)
    for name in KNOBS + ("DG_PLUGINS_CACHE",):
        env.pop(name, None)
    env.update(PYTHON=sys.executable, DATA_DIR=str(data_dir), OMP_NUM_THREADS="1",
               PYTHONPATH=python_path(site, REPO),
               SWEEP_SCRIPTS_PROCESS_LOG=str(log), HF_HOME=str(home / "hf"),
               TORCH_HOME=str(home / "torch"), XDG_CACHE_HOME=str(home / "cache"),
               HF_HUB_OFFLINE="1", DG_PLUGINS_OFFLINE="1", PYTHONFAULTHANDLER="1")
    env[MARKER] = uuid.uuid4().hex
    env.update(knobs)
    return env


@dataclass
class ScriptRun:
    returncode: int
    stdout: str
    stderr: str
    output_dir: Path
    processes: list[str]  # the command line of every Python process started
    seconds: float

    def report(self) -> str:
        logs = "".join(f"\n--- {log} (tail)\n{log.read_text(errors='replace')[-3000:]}"
                       for log in sorted(self.output_dir.glob("**/*.txt"))
                       if log.name in ("out.txt", "err.txt"))
        return (f"exit {self.returncode} after {self.seconds:.0f} s\n--- stdout (tail)\n"
                f"{self.stdout[-4000:]}\n--- stderr (tail)\n{self.stderr[-4000:]}{logs}")

    def launched_jobs(self) -> list[str]:
        """The jobs the launcher reported as started (one ``[i/n] started: ...`` line each; the
        local launcher runs them in processes forked from a server process, so the process log
        has only that)."""
        return re.findall(r"^\[\d+/\d+\] started(?: on [^:]+)?: (.*)$", self.stdout, re.MULTILINE)

    def started_anything(self) -> list[str]:
        """Processes that only a launch starts: a train job, the launcher's process server."""
        return [p for p in self.processes if "dg_plugins.scripts.train" in p
                or "multiprocessing.forkserver" in p]


def run_script(script: str, tmp: Path, data_dir, *, tag: str, timeout: float,
               **knobs) -> ScriptRun:
    """``bash sweeps/<script>``, output under ``tmp/<tag>``; a run past ``timeout`` seconds is
    killed with its process group (every job it started) and reported as exit status -9."""
    out = tmp / tag
    log = tmp / f"{tag}.processes"
    env = script_env(tmp, data_dir, log, OUTPUT_DIR=str(out), **knobs)
    start = time.monotonic()
    proc = subprocess.Popen(["bash", str(SWEEPS / script)], cwd=tmp, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        stopped = stop_marked(env)  # jobs run in sessions of their own: killpg misses them
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        code = -9
        stderr += (f"\n[test] killed after {timeout:g} s, with the processes it started (their "
                   f"Python stacks are in their logs):\n" + "\n".join(stopped))
    processes = log.read_text().splitlines() if log.exists() else []
    return ScriptRun(code, stdout, stderr, out, processes, time.monotonic() - start)


def table_sections(stdout: str) -> dict[str, str]:
    """The text each ``collect_results`` call of a reproduce run printed, by its --input_dir."""
    sections, current = {}, None
    for line in stdout.splitlines():
        match = re.match(r"-- \S+ -m dg_plugins\.scripts\.collect_results --input_dir (\S+)", line)
        if match:
            current = match.group(1)
            sections[current] = ""
        elif line.startswith(("-- sweep", "-- score", "-- tables of")):
            current = None
        elif current is not None:
            sections[current] += line + "\n"
    return sections


def job_folders(sweep_folder: Path) -> list[Path]:
    """The job folders of a sweep (UDG pretraining folders, one level down, aside)."""
    return sorted(p.parent for p in sweep_folder.glob("*/results.jsonl"))


def sweep_call_listings(stdout: str) -> dict[str, str]:
    """Each ``sweep launch`` call a reproduce run printed (``$ ... -m dg_plugins.scripts.sweep
    launch ...``), listed by the sweep's own ``--dry_run`` in this process: {job folder: state}."""
    import contextlib
    import io
    import shlex

    from dg_plugins.sweep import cli as sweep_cli

    listed = {}
    for line in stdout.splitlines():
        words = shlex.split(line[2:]) if line.startswith("$ ") else []
        if words[1:4] != ["-m", "dg_plugins.scripts.sweep", "launch"]:
            continue
        text = io.StringIO()
        with contextlib.redirect_stdout(text):
            assert sweep_cli.main(words[3:] + ["--dry_run"]) == 0, text.getvalue()
        for state, folder in re.findall(r"^([A-Z][a-z ]+): (\S+) \(", text.getvalue(),
                                        re.MULTILINE):
            listed[folder] = state
    return listed


def assert_one_queue(run: ScriptRun, jobs: list[Path]) -> None:
    """The run handed every job of the setting to the launcher in one call (the local launcher
    counts them ``[i/n]`` with n all of them, and says ``Launched`` once), and the job folders
    it made are exactly those its sweep calls name, one by one, each Done there (a rerun of
    any of them launches nothing)."""
    n = len(jobs)
    counts = re.findall(r"^\[\d+/(\d+)\] started", run.stdout, re.MULTILINE)
    assert counts == [str(n)] * n, (counts, run.report())
    assert re.findall(r"^Launched \d+ jobs!$", run.stdout, re.MULTILINE) == [
        f"Launched {n} jobs!"], run.report()
    assert sweep_call_listings(run.stdout) == {str(job): "Done" for job in jobs}


def assert_reproduced(run: ScriptRun, setting_name: str, protocol_name: str,
                      algorithms: list[str], n_jobs: int) -> dict[str, str]:
    """A paper script's real run ended as a user expects: exit 0; ``n_jobs`` jobs, each done, each
    started by the local launcher with a train command without ``--n_workers``, all in one queue
    (:func:`assert_one_queue`), each using loader workers (but for an in-memory dataset); then,
    per folder of the setting, its tables with a number for each algorithm and the paper's rows
    (or, for a paper without numbers, what it claims) beside them. Returns the tables' text by
    folder."""
    from dg_plugins import reference
    from dg_plugins.reference import paper_settings as ps

    assert run.returncode == 0, run.report()
    protocol = ps.SETTINGS[setting_name].protocols[protocol_name]
    root = run.output_dir / protocol_name
    folders = [root / group.folder if group.folder else root for group in protocol.groups]
    jobs = [job for folder in folders for job in job_folders(folder)]
    assert len(jobs) == n_jobs, (jobs, run.report())
    trains = run.launched_jobs()
    assert len(trains) == n_jobs, (trains, run.report())
    assert_one_queue(run, jobs)
    for job in jobs:
        assert (job / "done").exists(), job
        workers = re.search(r"loader workers: (\d+)(.*)", (job / "out.txt").read_text())
        assert workers, f"{job}: no loader line"
        assert int(workers.group(1)) >= 1 or "in-memory dataset" in workers.group(2), \
            workers.group(0)
    sections = table_sections(run.stdout)
    for group, folder in zip(protocol.groups, map(str, folders)):
        assert folder in sections, (folder, list(sections), run.report())
        text = sections[folder]
        for algorithm in algorithms:
            row = rf"^\| {re.escape(algorithm)}(?: \d+%)? +\|.*\d+\.\d ± \d+\.\d"
            assert re.search(row, text, re.MULTILINE), (algorithm, text[-3000:])
        for key in group.paper_keys:
            assert f"*paper [{key}]:" in text, (key, text[-3000:])
            if reference.get(key).rows:
                assert "| Paper row / ours − paper |" in text, text[-3000:]
            else:
                assert "Paper: not available in the sources we have" in text
    return sections


# --------------------------------------------------------------------------------------------------
# Several script runs, their Python part in one process


#: A stand-in PYTHON for a script's bash part: it records the one command the script hands the
#: interpreter (its arguments, environment and folder) and refuses a second.
STAND_IN = """#!/bin/sh
if [ -e "$SCRIPT_CALL.argv" ]; then echo "stand-in PYTHON: a second call: $*" >&2; exit 99; fi
printf '%s\\0' "$@" > "$SCRIPT_CALL.argv"
env -0 > "$SCRIPT_CALL.env"
pwd > "$SCRIPT_CALL.cwd"
"""

#: Runs recorded commands one after another in this one Python process, each as ``python -m
#: MODULE ARGS`` runs it (runpy as __main__, the command's environment and folder, its exit
#: status), its file descriptors 1 and 2 on files of its own (so the output of the processes it
#: starts lands there too, as under a real run). Writes each command's exit status and seconds.
REPLAY = """
import json, os, runpy, sys, time
calls, into = json.load(open(sys.argv[1])), sys.argv[2]
saved = os.dup(1), os.dup(2)
for call in calls:
    assert call["argv"][0] == "-m", call["argv"]
    os.environ.clear()
    os.environ.update(call["env"])
    os.chdir(call["cwd"])
    sys.argv = [call["argv"][1], *call["argv"][2:]]
    sys.stdout.flush(), sys.stderr.flush()
    for fd, name in ((1, "stdout"), (2, "stderr")):
        opened = os.open(call[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(opened, fd)
        os.close(opened)
    start, code = time.monotonic(), 0
    try:
        runpy.run_module(call["argv"][1], run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (stop.code is not None)
    sys.stdout.flush(), sys.stderr.flush()
    os.dup2(saved[0], 1), os.dup2(saved[1], 2)
    with open(into, "a") as f:
        f.write(json.dumps({"returncode": code, "seconds": time.monotonic() - start}) + "\\n")
"""


def run_scripts(cases: dict[str, tuple[str, dict]], tmp: Path, data_dir, *, timeout: float,
                wholly: tuple[str, ...] = ()) -> dict[str, ScriptRun]:
    """Several script runs as a user starts them, ``{tag: (script, knobs)}`` (a case's knobs may
    name its own ``DATA_DIR``), for less CPU than a :func:`run_script` each: the cases named in
    ``wholly`` run exactly so; of each other case the bash part runs (``bash sweeps/<script>``
    with the knobs, as a subprocess) with a stand-in
    PYTHON that records the one command it hands the interpreter (``python -m
    dg_plugins.scripts.reproduce ...``); then all those commands run one after another in one
    Python process, each as ``python -m`` runs it (its arguments, environment, folder, output
    and exit status; the stand-in's path in its environment reads as this interpreter's, the
    path a user's run has there), and every process a command starts (scoring, the launcher's
    fork server, jobs) as it starts under a real run. Each case gets a :class:`ScriptRun`
    (``processes``: the command handed to the interpreter, then what it started and logged; the
    fork server, started by the first command that launches jobs, serves the later ones too).
    Past ``timeout`` seconds per replayed case, the replay is killed with every process it
    started and the cases it did not finish report exit status -9."""
    import json

    runs = {tag: run_script(script, tmp, data_dir, tag=tag, timeout=timeout, **knobs)
            for tag, (script, knobs) in cases.items() if tag in wholly}
    replayed = [tag for tag in cases if tag not in wholly]
    if not replayed:
        return runs
    stand_in = tmp / "replay" / "python"
    stand_in.parent.mkdir(exist_ok=True)
    stand_in.write_text(STAND_IN)
    stand_in.chmod(0o755)
    calls, envs = [], []
    for tag in replayed:
        script, knobs = cases[tag]
        base = tmp / "replay" / tag
        env = script_env(tmp, data_dir, tmp / f"{tag}.processes", OUTPUT_DIR=str(tmp / tag),
                         **knobs)
        env.update(PYTHON=str(stand_in), SCRIPT_CALL=str(base))
        proc = subprocess.run(["bash", str(SWEEPS / script)], cwd=tmp, env=env, text=True,
                              capture_output=True, timeout=60)
        assert proc.returncode == 0 and base.with_suffix(".argv").exists(), (
            f"{script}'s bash part with {knobs}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
        argv = base.with_suffix(".argv").read_bytes().decode().split("\0")[:-1]
        pairs = (item.split("=", 1) for item in
                 base.with_suffix(".env").read_bytes().decode().split("\0") if "=" in item)
        environment = {k: v.replace(str(stand_in), sys.executable) for k, v in pairs
                       if k != "SCRIPT_CALL"}
        envs.append(environment)
        calls.append({"argv": argv, "env": environment,
                      "cwd": base.with_suffix(".cwd").read_text().strip(),
                      "stdout": str(base) + ".stdout", "stderr": str(base) + ".stderr"})
    (tmp / "replay" / "calls.json").write_text(json.dumps(calls))
    (tmp / "replay" / "replay.py").write_text(REPLAY)
    results = tmp / "replay" / "results.jsonl"
    results.unlink(missing_ok=True)
    env = script_env(tmp, data_dir, tmp / "replay.processes")
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, str(tmp / "replay" / "replay.py"),
                             str(tmp / "replay" / "calls.json"), str(results)],
                            cwd=tmp, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    killed = ""
    try:
        out, err = proc.communicate(timeout=timeout * len(calls))
    except subprocess.TimeoutExpired:
        stopped = [p for e in (env, *envs) for p in stop_marked(e)]
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        killed = (f"\n[test] the replay was killed after {timeout * len(calls):g} s, with the "
                  "processes it started (their Python stacks are in their logs):\n"
                  + "\n".join(stopped))
    done = [json.loads(line) for line in results.read_text().splitlines()] \
        if results.exists() else []
    for i, (tag, call) in enumerate(zip(replayed, calls)):
        log = tmp / f"{tag}.processes"
        processes = [" ".join([sys.executable, *call["argv"]])]
        processes += log.read_text().splitlines() if log.exists() else []
        text = {name: Path(call[name]).read_text(errors="replace")
                if Path(call[name]).exists() else "" for name in ("stdout", "stderr")}
        if i < len(done):
            code, seconds = done[i]["returncode"], done[i]["seconds"]
        else:  # not finished: killed, or the replay itself failed
            code, seconds = -9, time.monotonic() - start
            text["stderr"] += (killed or f"\n[test] the replay ended (exit {proc.returncode}) "
                               f"before this command finished:\n{out[-2000:]}\n{err[-3000:]}")
        runs[tag] = ScriptRun(code, text["stdout"], text["stderr"], tmp / tag, processes, seconds)
    return {tag: runs[tag] for tag in cases}
