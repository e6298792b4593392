"""What a training job says about its time: once a few steps are timed, a step's time and the
job's estimate; then a tqdm bar on a terminal, else a line every ``interval`` s. Torch-free."""

from __future__ import annotations

import sys
import time

#: Steps timed (after the run's first, its warm-up) before the estimate is printed.
TIMED_STEPS = 5
#: Seconds between two plain progress lines off a terminal (``--progress_every``).
DEFAULT_INTERVAL_S = 60.0


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def format_duration(seconds: float) -> str:
    """``0.35 s``, ``42 s``, ``3 min 20 s``, ``2 h 05 min``, ``2 d 7 h``."""
    if seconds < 10:
        return f"{seconds:.2g} s"
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    minutes, secs = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes:02d} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h"


class Progress:
    """One run of a job's loop from step ``start`` to ``total``; ``records_left(step)``: the
    evaluations after ``step``; ``stream``: the tqdm bar's terminal; ``out``: where lines go."""

    def __init__(self, total: int, start: int, records_left, desc: str, stream=None,
                 interval: float = DEFAULT_INTERVAL_S, out=None, clock=time.monotonic):
        self.total, self.start, self.records_left = total, start, records_left
        self.out, self.interval, self.clock = out or sys.stdout, interval, clock
        self.began = self.last_line = clock()
        self.step_times: list[float] = []
        self.eval_time: float | None = None
        self.bar = None
        if stream is not None and stream.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=start, leave=False, file=stream, desc=desc)

    def print(self, line: str) -> None:
        if self.bar is not None:
            self.bar.write(line, file=self.out)
        else:
            print(line, file=self.out, flush=True)

    def evaluated(self, seconds: float) -> None:
        if self.eval_time is None:
            self.eval_time = seconds

    def stepped(self, step: int, seconds: float) -> None:
        self.step_times.append(seconds)
        if self.bar is not None:
            self.bar.update(1)
        if len(self.step_times) == TIMED_STEPS + 1:  # once: the list only grows
            self.print(self.estimate(step))
        now = self.clock()
        if self.bar is None and now - self.last_line >= self.interval and step + 1 < self.total:
            self.last_line = now
            self.print(self.line(step, now))

    def estimate(self, step: int) -> str:
        timed = self.step_times[1:]
        per_step = sum(timed) / len(timed)
        first = self.start + 1
        left = self.total - step - 1
        evaluations = self.records_left(step)
        training = per_step * left
        text = (f"timing: {format_duration(per_step)} a step (mean of steps {first}-"
                f"{first + len(timed) - 1}); {plural(left, 'step')} left: about "
                f"{format_duration(training)}")
        if evaluations and self.eval_time is not None:
            rest = training + evaluations * self.eval_time
            text += (f", plus {plural(evaluations, 'evaluation')} of about "
                     f"{format_duration(self.eval_time)}: about {format_duration(rest)} left, "
                     f"{format_duration(self.clock() - self.began + rest)} for this run")
        elif evaluations:
            text += f", plus {plural(evaluations, 'evaluation')}"
        return text

    def line(self, step: int, now: float) -> str:
        """``progress: step 120/5001 (2.4%), 0.41 steps/s, about 3 h 18 min left``."""
        rate = (step + 1 - self.start) / max(now - self.began, 1e-9)
        return (f"progress: step {step + 1}/{self.total} ({100 * (step + 1) / self.total:.1f}%), "
                f"{rate:.3g} steps/s, about {format_duration((self.total - step - 1) / rate)} left")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
