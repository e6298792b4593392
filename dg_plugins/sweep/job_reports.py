"""What the local and multi-GPU launchers print per job: a line when it starts, one when it ends."""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from typing import Callable, Sequence

from dg_plugins.sweep import claims
from dg_plugins.sweep.progress import Progress
from dg_plugins.sweep.processes import ErrorLogs, error_excerpt, read_lines
from dg_plugins.job.flags import parse_command
from dg_plugins.job.folder import OUT_FILE
from dg_plugins.job.records import last_record

#: Lines of a failed job's captured output kept for the failure summary.
CAPTURED_LINES_KEPT = 20


def describe(command: str) -> str:
    """``ERM on PACS, test envs 0 1, hparams 0, trial 0`` for a train command (else the command)."""
    flags = parse_command(command)[1]
    if not {"algorithm", "dataset"} <= set(flags):
        return command
    text = f"{' '.join(flags['algorithm'])} on {' '.join(flags['dataset'])}"
    for flag, name in (("test_envs", "test envs"), ("label_fraction", "label fraction"),
                       ("hparams_seed", "hparams"), ("trial_seed", "trial")):
        if flags.get(flag):
            text += f", {name} {' '.join(flags[flag])}"
    return text


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


class JobOutputs:
    """Per-job lines of a launcher, then the time left; the jobs' output goes to temporary files."""

    def __init__(self, name: str, commands: Sequence[str], logs: ErrorLogs,
                 write: Callable[[str], None] = lambda line: print(line, flush=True),
                 parallel: int = 1, clock: Callable[[], float] = time.monotonic):
        self.name = name
        self.commands = list(commands)
        self.logs = logs
        self.write = write
        self.clock = clock
        self.paths: dict[int, str] = {}
        self.started_at: dict[int, float] = {}
        self.progress = Progress.for_commands(self.commands, logs.folders, parallel)

    def __enter__(self) -> "JobOutputs":
        return self

    def __exit__(self, *exc) -> None:
        for index in list(self.paths):
            self._remove(index)

    def _prefix(self, index: int) -> str:
        return f"[{index + 1}/{len(self.commands)}]"

    def log(self, index: int) -> str:
        """A new temporary file for job ``index``'s output."""
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
        self.write(f"{self._prefix(index)} started{where}: "
                   f"{describe(self.commands[index])}{log}")

    def ended(self, index: int, code: int | None, interrupted: bool = False) -> None:
        """The line of a job that ended: done with its accuracy, or failed with its error line."""
        now = self.clock()
        seconds = now - self.started_at.get(index, now)
        took = f"in {seconds:.0f} s"
        if code == 0:
            test_envs = [int(t) for t in parse_command(self.commands[index])[1].get("test_envs", [])
                         if t.lstrip("-").isdigit()]
            record = last_record(self.logs.folders[index])
            self.write(f"{self._prefix(index)} done {took}: "
                       f"{accuracy_summary(record, test_envs)}")
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
        claims.job_ended(self.logs.folders[index])  # other launches now see it as it is
        self._remove(index)
        if code is not None and not interrupted:
            self.progress.ended(self.logs.folders[index], seconds, code == 0)
            line = self.progress.line()
            if line is not None:
                self.write(f"  {line}")

    def _remove(self, index: int) -> None:
        path = self.paths.pop(index, None)
        if path is not None:
            with contextlib.suppress(OSError):
                os.unlink(path)
