"""Stop signals (SIGTERM, SIGINT, SIGHUP) caught in one place, :class:`SignalCatcher`: train's
:class:`StopRequest` stops at the next step boundary; the sweep's launchers forward them to their
jobs (:mod:`dg_plugins.sweep.processes`). Torch-free."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import Callable

#: Signals that stop a sweep and are forwarded to its running jobs (SIGHUP as SIGTERM).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
DEFAULT_STOP_GRACE_PERIOD_S = 60.0
STOP_GRACE_PERIOD_ENV = "DG_STOP_GRACE_PERIOD"
_last_stop_signal: int | None = None


def stop_grace_period(override: float | None = None) -> float:
    """Seconds jobs get to stop before SIGKILL: ``override``, ``$DG_STOP_GRACE_PERIOD`` or 60."""
    if override is not None:
        if override < 0:
            raise ValueError(f"the stop grace period must be >= 0 seconds, got {override}")
        return float(override)
    if (text := os.environ.get(STOP_GRACE_PERIOD_ENV)) is None:
        return DEFAULT_STOP_GRACE_PERIOD_S
    with contextlib.suppress(ValueError):
        if (value := float(text)) >= 0:
            return value
    raise ValueError(f"bad value for ${STOP_GRACE_PERIOD_ENV}: {text!r} (seconds, >= 0)")


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def last_stop_signal() -> int | None:
    """The last stop signal a :class:`SignalCatcher` caught in this process, or None."""
    return _last_stop_signal


def forget_stop_signal() -> None:
    """Make :func:`last_stop_signal` None again (a launcher does, before it starts)."""
    global _last_stop_signal
    _last_stop_signal = None


class SignalCatcher:
    """While active, catch ``signals`` (main thread only): record, count, call ``on_signal``;
    ignored ones stay ignored with ``keep_ignored``; handlers restored on leaving."""

    def __init__(self, on_signal: Callable[[int], None] | None = None,
                 signals: tuple = STOP_SIGNALS, keep_ignored: bool = True):
        self.on_signal = on_signal
        self.signals = signals
        self.keep_ignored = keep_ignored
        self.signum: int | None = None
        self.count = 0
        self.active = False
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "SignalCatcher":
        if threading.current_thread() is threading.main_thread():
            for signum in self.signals:
                if not (self.keep_ignored and signal.getsignal(signum) == signal.SIG_IGN):
                    self._previous[signum] = signal.signal(signum, self._handle)
            self.active = True
        return self

    def _handle(self, signum, frame) -> None:
        global _last_stop_signal
        _last_stop_signal = signum
        self.count += 1
        if self.signum is None:
            self.signum = signum
        if self.on_signal is not None:
            self.on_signal(signum)

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}


#: Set in a job's environment by its Slurm task (:mod:`dg_plugins.sweep.submitit`).
SLURM_TASK_ENV = "DG_SLURM_TASK"


class StopRequest(SignalCatcher):
    """A train job's stop at the next step boundary after a checkpoint; a second signal raises
    ``KeyboardInterrupt`` (not under a Slurm task, which repeats the same stop)."""

    def __init__(self):
        super().__init__(self._stop, signals=(signal.SIGTERM, signal.SIGINT), keep_ignored=False)
        self.repeats_stop = not os.environ.get(SLURM_TASK_ENV)

    def _stop(self, signum: int) -> None:
        if self.count > 1:
            if not self.repeats_stop:
                return
            raise KeyboardInterrupt(f"{signal_name(signum)} received twice")
        print(f"received {signal_name(signum)}: stopping after this step with a checkpoint",
              file=sys.stderr)
