"""Test-only plugin: holds a running train job until the test lets it go, so that a test which
signals, kills or races a job never depends on the job's speed (``DG_PLUGINS_IMPORT=job_gate``
in the job's environment, :func:`gate_env`; tests/ is on the PYTHONPATH of
``processes.command_env``).

Environment of the job:

* ``DG_TEST_GATE``: a folder. The job writes ``<folder>/waiting`` (its pid) where it stops, and
  goes on once ``<folder>/release`` exists, or, stopped by SIGTERM/SIGINT, to the step boundary
  where it writes its checkpoint and exits. A job started after ``release`` exists never waits
  (so the resume of a gated job runs through).
* ``DG_TEST_GATE_STEP`` (default 0): the step after which it waits (a training step hook,
  :func:`dg_plugins.train.loop.add_step_hook`), once per process;
  ``DG_TEST_GATE_PHASE``: only in jobs of that kind (``Job.PHASE``, e.g. "pretraining").
* ``DG_TEST_GATE_WRITE``: a file name (e.g. ``checkpoint.pt``). Instead of a step, the job waits
  in its first atomic write of that file, after the temporary file is written and before the
  rename (:func:`dg_plugins.files.atomic_write_bytes`): a kill then leaves the temporary file.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import os
import sys
import time

GATE, STEP, PHASE, WRITE = ("DG_TEST_GATE", "DG_TEST_GATE_STEP", "DG_TEST_GATE_PHASE",
                            "DG_TEST_GATE_WRITE")
_passed = False


def gate_vars(folder, step: int = 0, phase: str | None = None, write: str | None = None,
              plugins: str = "") -> dict:
    """The environment variables of a job held by this gate (``plugins``: other plugin
    modules, comma-separated, for ``DG_PLUGINS_IMPORT``)."""
    env = {"DG_PLUGINS_IMPORT": ",".join(filter(None, [plugins, "support.job_gate"])),
           GATE: str(folder), STEP: str(step)}
    if phase is not None:
        env[PHASE] = phase
    if write is not None:
        env[WRITE] = write
    return env


def gate_env(folder, step: int = 0, phase: str | None = None, write: str | None = None,
             plugins: str = "", **extra) -> dict:
    """``processes.command_env`` for a job held by this gate (``extra``: more variables)."""
    from support.processes import command_env

    return command_env(**gate_vars(folder, step, phase, write, plugins), **extra)


@contextlib.contextmanager
def released(folder):
    """A block after which the gate in ``folder`` is open, however the block ends (a failing
    test leaves no job waiting)."""
    try:
        yield
    finally:
        open(os.path.join(folder, "release"), "a").close()


def wait(folder: str, stopped=lambda: False, timeout: float = 600.0) -> None:
    """Write ``<folder>/waiting``, then wait for ``<folder>/release`` or ``stopped()`` (at most
    ``timeout`` seconds: a test that forgot its gate fails instead of hanging)."""
    global _passed
    _passed = True
    release = os.path.join(folder, "release")
    if os.path.exists(release):
        return
    with open(os.path.join(folder, "waiting.tmp"), "w") as f:
        f.write(str(os.getpid()))
    os.replace(os.path.join(folder, "waiting.tmp"), os.path.join(folder, "waiting"))
    deadline = time.monotonic() + timeout
    while not (os.path.exists(release) or stopped()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"job_gate: no {release} after {timeout:g} s")
        time.sleep(0.01)


def _step_hook(job, step: int) -> None:
    folder = os.environ.get(GATE)
    if (folder is None or _passed or os.environ.get(WRITE)
            or step != int(os.environ.get(STEP, "0"))
            or os.environ.get(PHASE, job.PHASE) != job.PHASE):
        return
    wait(folder, lambda: job.stop.signum is not None)


def _gate_writes(name: str) -> None:
    """Wrap ``os.replace`` so that the first rename of a temporary file onto ``name`` waits."""
    replace = os.replace

    def gated_replace(src, dst, *args, **kwargs):
        if (not _passed and os.path.basename(str(dst)) == name
                and os.path.basename(str(src)).startswith(".tmp-")):
            wait(os.environ[GATE])
        return replace(src, dst, *args, **kwargs)

    os.replace = gated_replace


class _WhenTheLoopImports(importlib.abc.MetaPathFinder):
    """Adds the step hook once :mod:`dg_plugins.train.loop` is imported: a process that loads
    the plugins but never trains (a sweep, a launcher) does not import torch for the gate."""

    def find_spec(self, name, path, target=None):
        if name != LOOP:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            module.add_step_hook(_step_hook)

        spec.loader.exec_module = exec_module
        return spec


LOOP = "dg_plugins.train.loop"
if LOOP in sys.modules:
    sys.modules[LOOP].add_step_hook(_step_hook)
else:
    sys.meta_path.insert(0, _WhenTheLoopImports())
if os.environ.get(GATE) and os.environ.get(WRITE):
    _gate_writes(os.environ[WRITE])


def wait_at_gate(gate, proc, timeout: float) -> None:
    """Wait until the job ``proc`` (or a job of the sweep ``proc``) waits at the test's gate."""
    from support.processes import finish

    deadline = time.monotonic() + timeout
    while not (gate / "waiting").exists():
        assert proc.poll() is None, finish(proc, 1)[1][-3000:]
        assert time.monotonic() < deadline, "the job never reached its gate"
        time.sleep(0.02)
