"""What the local and multi-GPU launchers print per job (a line when it starts, one when it ends),
and how long a sweep's remaining jobs will take, from the wall time per training step of the jobs
that finished, over a whole planned run (:mod:`dg_plugins.sweep.plan`)."""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from typing import Callable, Sequence

from dg_plugins.job.flags import parse_command
from dg_plugins.job.folder import OUT_FILE, is_done
from dg_plugins.job.records import last_record
from dg_plugins.sweep import jobs
from dg_plugins.sweep.processes import ErrorLogs, error_excerpt, read_lines

#: The plan of the run under way, while one queue runs several sweeps' jobs
#: (:mod:`dg_plugins.sweep.plan`): its launcher estimates over every job of the run.
RUN: "Progress | None" = None


def format_duration(seconds: float) -> str:
    """``about 40 s``, ``about 1 min 40 s``, ``about 2 h 10 min``, ``about 5 days 7 h``."""
    seconds = max(0.0, seconds)
    if seconds < 600:  # to 10 s under 2 min, else to 30 s
        s = (max(10, int(round(seconds / 10) * 10)) if seconds < 120
             else int(round(seconds / 30) * 30))
        return f"about {s} s" if s < 60 else f"about {s // 60} min" + (
            f" {s % 60} s" if s % 60 else "")
    if seconds < 3600:
        return f"about {int(round(seconds / 60))} min"
    if seconds < 48 * 3600:
        m = int(round(seconds / 600) * 10)
        return f"about {m // 60} h" + (f" {m % 60} min" if m % 60 else "")
    h = int(round(seconds / 3600))
    return f"about {h // 24} days" + (f" {h % 24} h" if h % 24 else "")


def command_steps(command: str) -> int | None:
    """A job command's ``--steps`` (None without it)."""
    with contextlib.suppress(KeyError, IndexError, ValueError):
        return int(parse_command(command)[1]["steps"][0])
    return None


class Progress:
    """The jobs of a run (``planned``), those that ended (``measured``), a reference rate."""

    def __init__(self, planned: dict[str, int | None], reference: Sequence | None = None,
                 parallel: int = 1, name: str = ""):
        self.planned = {os.path.abspath(k): v for k, v in planned.items()}
        self.measured: dict[str, list] = {}  # folder: [seconds, succeeded], in this run
        self.reference = list(reference) if reference else None
        self.parallel = max(1, parallel)
        self.name = name

    @classmethod
    def for_commands(cls, commands: Sequence[str], folders: Sequence[str | None],
                     parallel: int = 1) -> "Progress":
        """The run's plan (:data:`RUN`) when it holds these jobs, else theirs."""
        if RUN is not None and all(os.path.abspath(f) in RUN.planned for f in folders if f):
            RUN.parallel = max(1, parallel)
            return RUN
        return cls({f: command_steps(c) for c, f in zip(commands, folders) if f},
                   parallel=parallel)

    def ended(self, folder: str | None, seconds: float, succeeded: bool) -> None:
        if folder is not None:
            self.measured[os.path.abspath(folder)] = [float(seconds), bool(succeeded)]

    def _remaining(self) -> list[str]:
        return [f for f in self.planned if not is_done(f) and f not in self.measured]

    def line(self) -> str | None:
        """``3/15 jobs done, about 1 min 40 s left (...)``, or None before anything measured."""
        ok = {f: s for f, (s, good) in self.measured.items() if good}  # succeeded in this run
        if not ok:
            return None
        done = sum(is_done(f) for f in self.planned)
        remaining = self._remaining()
        what = f"{self.name}: " if self.name else ""
        if not remaining:
            return f"{what}{done}/{len(self.planned)} jobs done."
        if all(self.planned.values()) and all(self.planned.get(f) for f in ok):  # per step
            rate = sum(ok.values()) / sum(self.planned[f] for f in ok)
            per, work = f"{rate:.2g} s per training step", sum(self.planned[f] for f in remaining)
        else:  # per job
            rate = sum(ok.values()) / len(ok)
            per, work = f"{rate:.0f} s per job", len(remaining)
        at_once = f", {self.parallel} at a time" if self.parallel > 1 else ""
        left = format_duration(rate * work / self.parallel)
        return (f"{what}{done}/{len(self.planned)} jobs done, {left} left ({per}{at_once}, "
                f"measured over the {len(ok)} job(s) finished in this run; start-up and "
                "evaluation included)")

    def first_line(self) -> str:
        """The estimate before the first job: measured, else rough from the reference rate."""
        if (measured := self.line()) is not None:
            return measured
        what = f"{self.name}: " if self.name else ""
        remaining = self._remaining()
        done = len(self.planned) - len(remaining)
        if not remaining:  # a rerun of a finished run
            return f"{what}{done}/{len(self.planned)} jobs done."
        steps = [self.planned[f] for f in remaining]
        head = f"{what}{len(self.planned)} jobs, {done} done"
        if self.reference and all(steps):
            rate, how = self.reference
            return (f"{head}; rough estimate: {format_duration(rate * sum(steps) / self.parallel)}"
                    f" for the {len(remaining)} left ({sum(steps)} training steps at {rate:g} s "
                    f"per step: {how}; nothing is measured on this machine yet). Updated as jobs "
                    "finish.")
        return f"{head}; a time estimate follows once the first job has finished."


#: Lines of a failed job's captured output kept for the failure summary.
CAPTURED_LINES_KEPT = 20


def describe(command: str) -> str:
    """``ERM on PACS, test envs 0 1, hparams 0, trial 0`` for a train command (else the command)."""
    flags = parse_command(command)[1]
    if not {"algorithm", "dataset"} <= set(flags):
        return command
    details = "".join(f", {name} {' '.join(flags[flag])}" for flag, name in (
        ("test_envs", "test envs"), ("label_fraction", "label fraction"),
        ("hparams_seed", "hparams"), ("trial_seed", "trial")) if flags.get(flag))
    return f"{' '.join(flags['algorithm'])} on {' '.join(flags['dataset'])}{details}"


def accuracy_summary(record: dict | None, test_envs: Sequence[int]) -> str:
    """``test-env accuracy 53.2%, source validation 87.1% (step 100)`` from a record."""
    if not record:
        return "no record"

    def mean(keys):
        values = [record[k] for k in keys if isinstance(record.get(k), (int, float))]
        return f"{100 * sum(values) / len(values):.1f}%" if values else "n/a"

    envs = sorted({int(key[3:].split("_")[0]) for key in record
                   if key.startswith("env") and key.endswith(("_in_acc", "_out_acc"))
                   and key[3:].split("_")[0].isdigit()})
    target = mean(f"env{t}_in_acc" for t in test_envs)
    source = mean(f"env{i}_out_acc" for i in envs if i not in test_envs)
    return f"test-env accuracy {target}, source validation {source} (step {record.get('step')})"


class JobOutputs(contextlib.AbstractContextManager):
    """Per-job lines of a launcher, then the time left; the jobs' output goes to temporary files."""

    def __init__(self, commands: Sequence[str], logs: ErrorLogs,
                 write: Callable[[str], None] = lambda line: print(line, flush=True),
                 parallel: int = 1, clock: Callable[[], float] = time.monotonic):
        self.commands = list(commands)
        self.logs = logs
        self.write = write
        self.clock = clock
        self.paths: dict[int, str] = {}
        self.started_at: dict[int, float] = {}
        self.progress = Progress.for_commands(self.commands, logs.folders, parallel)

    def __exit__(self, *exc) -> None:
        for index in list(self.paths):
            self._remove(index)

    def _prefix(self, index: int) -> str:
        return f"[{index + 1}/{len(self.commands)}]"

    def log(self, index: int) -> str:
        fd, path = tempfile.mkstemp(prefix="dg_plugins_job_", suffix=".log")
        os.close(fd)
        self.paths[index] = path
        return path

    def started(self, index: int, where: str = "") -> None:
        """The line of a job that starts (``where``: e.g. ``GPU 3``)."""
        self.started_at[index] = self.clock()
        folder = self.logs.folders[index]
        log = f" (log: {os.path.join(folder, OUT_FILE)})" if folder else ""
        where = f" on {where}" if where else ""
        self.write(f"{self._prefix(index)} started{where}: {describe(self.commands[index])}{log}")

    def ended(self, index: int, code: int | None, interrupted: bool = False) -> None:
        """The line of a job that ended: done with its accuracy, or failed with its error line."""
        now = self.clock()
        seconds = now - self.started_at.get(index, now)
        took = f"in {seconds:.0f} s"
        if code == 0:
            test_envs = [int(t) for t in parse_command(self.commands[index])[1].get("test_envs", [])
                         if t.lstrip("-").isdigit()]
            record = last_record(self.logs.folders[index])
            self.write(f"{self._prefix(index)} done {took}: {accuracy_summary(record, test_envs)}")
        elif code is not None:
            path = self.paths.get(index)  # the job's output, for when it wrote no err.txt
            if path is not None and os.path.exists(path):
                self.logs.captured[index] = read_lines(path)[-CAPTURED_LINES_KEPT:]
            excerpt = error_excerpt(self.logs.new_lines(index), 1)
            line = excerpt[0] if excerpt else "no error message"
            if interrupted:  # "stopped by SIGINT after step 3" (how to go on: the sweep says)
                line = line.split("; ")[0]
            what = "interrupted" if interrupted else "failed"
            self.write(f"{self._prefix(index)} {what} (exit code {code}) {took}: {line}")
        jobs.job_ended(self.logs.folders[index])  # other launches now see it as it is
        self._remove(index)
        if code is not None and not interrupted:
            self.progress.ended(self.logs.folders[index], seconds, code == 0)
            if (line := self.progress.line()) is not None:
                self.write(f"  {line}")

    def _remove(self, index: int) -> None:
        if (path := self.paths.pop(index, None)) is not None:
            with contextlib.suppress(OSError):
                os.unlink(path)
