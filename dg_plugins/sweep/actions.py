"""What a sweep does with its jobs (``domainbed/scripts/sweep.py``'s ``__main__``): select, check,
confirm, launch or delete, then say how to go on (docs/sweep.md). :func:`run_action` is the flow."""

from __future__ import annotations

import contextlib
import os
import random
import shlex
import shutil
import sys
from typing import Callable, Mapping, Sequence, Union

from dg_plugins import runtime
from dg_plugins.files import DISK_FULL_ERRNOS
from dg_plugins.signals import signal_name
from dg_plugins.sweep import submitit
from dg_plugins.sweep.checks import done_eval_splits_note
from dg_plugins.sweep.jobs import (IN_SLURM, INCOMPLETE, NOT_LAUNCHED, QUEUED, RUNNING,
                                   LauncherClaim, SweepJob, by_sweep, held_folders,
                                   left_alone_notes, python_executable, read_claims, select_jobs,
                                   summary_line, sweep_dir_of, sweep_lock)
from dg_plugins.sweep.processes import (JobsFailed, LaunchInterrupted, command_output_dir,
                                        error_excerpt, read_lines)
from dg_plugins.job.flags import EXIT_BAD_INPUT
from dg_plugins.job.folder import CHECKPOINT_FILE, ERR_FILE, OUT_FILE, RESULTS_FILE

ACTIONS = ("launch", "delete_incomplete", "delete_all", "status", "cancel")
#: What suggested command lines are made from: one ``sweep`` argv, or for a queue of sweeps each
#: job's (and sweep folder's) argv by its absolute path; None: a template with ``<your flags>``.
CommandLines = Union[Sequence[str], Mapping[str, Sequence[str]], None]


def launch(jobs: Sequence[SweepJob], launcher_fn: Callable[[list], None], seed: int = 0,
           resume_incomplete: bool = True, command_line: CommandLines = None) -> list[str]:
    """Shuffle (by ``seed``), claim the jobs, hand their commands to ``launcher_fn``."""
    runtime.resume_collector()  # the command's start-up ends here
    print("Launching...")
    order = list(jobs)
    random.Random(seed).shuffle(order)
    wanted = {NOT_LAUNCHED, INCOMPLETE} if resume_incomplete else {NOT_LAUNCHED}
    with contextlib.ExitStack() as stack:
        kept, others = set(), []  # the ids of the jobs this launch claimed
        for sweep_dir, group in by_sweep(order, lambda job: job.output_dir).items():
            claim = stack.enter_context(LauncherClaim(
                sweep_dir, sweep_command(command_for(command_line, sweep_dir), "launch")))
            mine, theirs = claim.take(group, lambda job, held: job.refresh_state(held),
                                      lambda job: job.state in wanted, _create_folder)
            kept.update(map(id, mine))
            others += theirs
        if len(kept) < len(order):
            print(f"{len(order) - len(kept)} of these jobs were taken meanwhile by another "
                  "launcher or finished; this launch leaves them alone:")
            for claim in others:
                print(f"  {claim.describe()} holds {len(claim.jobs)} jobs")
        order = [job for job in order if id(job) in kept]
        commands = [job.command(resume=resume_incomplete and job.state == INCOMPLETE)
                    for job in order]
        try:
            if commands:
                launcher_fn(commands)
        except LaunchInterrupted as err:
            if not err.remote:
                unlaunch(order, err.not_started)
            raise
        except submitit.SlurmError as err:  # refused at submission: no job was submitted
            unlaunch(order, commands)
            raise LaunchRefused(str(err)) from None
    print(f"Launched {len(order)} jobs!")
    return commands


def _create_folder(job: SweepJob) -> None:
    try:
        os.makedirs(job.output_dir, exist_ok=True)
    except OSError as err:
        fix = ("free space, then relaunch" if err.errno in DISK_FULL_ERRNOS else "choose a "
               "writable --output_dir or give yourself write permission on it")
        raise LaunchRefused(f"cannot create the job folder {job.output_dir} ({err.strerror}); "
                            f"{fix}") from None


class LaunchRefused(ValueError):
    """A problem found before launching (a line naming the problem and its fix)."""


def delete(jobs: Sequence[SweepJob]) -> None:
    """Remove each job's folder under the sweep lock, leaving Running and Queued jobs alone."""
    print("Deleting...")
    deleted = 0
    for sweep_dir, group in by_sweep(jobs, lambda job: job.output_dir).items():
        if not os.path.isdir(sweep_dir):
            continue
        with sweep_lock(sweep_dir, exclusive=True):
            held = held_folders(read_claims(sweep_dir, remove_stale=True), sweep_dir)
            for job in group:
                state = job.refresh_state(held)
                why = {RUNNING: lambda: f"still running (pid {job.holder})",
                       QUEUED: lambda: f"queued by a live {job.launcher.describe()}",
                       IN_SLURM: lambda: f"held by Slurm ({job.slurm.describe()})"}.get(state)
                if why is not None:
                    print(f"not deleted, {why()}: {job.output_dir}")
                    continue
                if os.path.isdir(job.output_dir):
                    shutil.rmtree(job.output_dir)
                job.refresh_state(held)
                deleted += 1
    print(f"Deleted {deleted} jobs!")


def refused_confirmation() -> int | None:
    """Ask ``Are you sure? (y/n)``: None on yes, else the exit status (0 on no; 2: no input)."""
    try:
        answer = input("Are you sure? (y/n) ")
    except EOFError:
        print()
        print("error: no answer to the confirmation prompt (stdin reached end of input); pass "
              "--skip_confirmation to run without asking", file=sys.stderr)
        return 2
    if answer.strip().lower()[:1] == "y":
        return None
    print("Nevermind!")
    return 0


def sweep_command(command_line: Sequence[str] | None, action: str = "launch",
                  resume: bool = False, drop: Sequence[str] = ()) -> str:
    """``command_line`` with its action replaced (and ``--resume``); a template without it."""
    head = f"{python_executable()} -m dg_plugins.scripts.sweep"
    if command_line is None:
        return f"{head} {action} <your flags>" + (" --resume" if resume else "")
    removed = ("--resume", "--dry_run", *drop)  # each also as argparse abbreviates it (--res)
    words = [w for w in command_line if not (w.startswith("--") and len(w) > 3 and any(
        flag.startswith(w) for flag in removed))]
    for i, word in enumerate(words):
        if word in ACTIONS:
            words[i] = action
            break
    return f"{head} {shlex.join(words + (['--resume'] if resume else []))}"


def command_for(command_line: CommandLines, folder: str) -> Sequence[str] | None:
    """The argv of the sweep call of the job (or sweep) folder ``folder`` (None: not known)."""
    if isinstance(command_line, Mapping):
        return command_line.get(os.path.abspath(folder)) or command_line.get(
            os.path.abspath(sweep_dir_of(folder)))
    return command_line


def sweep_commands(command_line: CommandLines, output_dirs: Sequence[str],
                   action: str = "launch", resume: bool = False,
                   drop: Sequence[str] = ()) -> list[str]:
    """:func:`sweep_command` for the sweep call of each of ``output_dirs`` (once each line)."""
    if not isinstance(command_line, Mapping):
        return [sweep_command(command_line, action, resume, drop)]
    lines = [sweep_command(command_for(command_line, d), action, resume, drop)
             for d in output_dirs]
    return list(dict.fromkeys(lines)) or [sweep_command(None, action, resume, drop)]


def incomplete_note(jobs: Sequence[SweepJob], command_line: CommandLines) -> list[str]:
    """A launch without ``--resume``: the Incomplete jobs skipped, how to continue or clear them."""
    n = sum(job.state == INCOMPLETE for job in jobs)
    if not n:
        return []
    fresh = sum(job.state == INCOMPLETE and never_started(job) for job in jobs)
    why = ("they were interrupted or failed" if not fresh else
           "they never started (an empty folder)" if fresh == n else
           f"{n - fresh} were interrupted or failed and {fresh} never started (an empty folder)")
    folders = [job.output_dir for job in jobs if job.state == INCOMPLETE]
    return [
        f"Note: {n} job(s) are Incomplete (their folder exists but has no 'done', and no live "
        f"process holds it): {why}. This launch skips them.",
        "  To continue them from their last checkpoint:",
        *(f"    {line}" for line in sweep_commands(command_line, folders, resume=True)),
        "  To delete them, so that the next launch starts them over:",
        *(f"    {line}" for line in sweep_commands(command_line, folders, "delete_incomplete",
                                                   drop=["--skip_confirmation"])),
    ]


#: The command that continues a script's sweeps, suggested instead of ``launch --resume``.
RERUN_ENV = "DG_SWEEP_RERUN_COMMAND"


def continue_lines(command_line: CommandLines, what: str,
                   output_dirs: Sequence[str] = ()) -> list[str]:
    """How to continue the jobs of ``output_dirs``: ``launch --resume`` lines, or the rerun one."""
    if rerun := os.environ.get(RERUN_ENV):
        return [f"To continue, run the whole command again (finished jobs are skipped; {what}):",
                f"  {rerun}"]
    return [f"To continue them ({what}):",
            *(f"  {line}" for line in sweep_commands(command_line, output_dirs, resume=True))]


def unlaunch(jobs: Sequence[SweepJob], commands: Sequence[str]) -> None:
    """Remove the empty folders of the jobs a stop signal kept from starting."""
    never = set(commands)
    for job in jobs:
        if job.command(resume=False) in never or job.command(resume=True) in never:
            with contextlib.suppress(OSError):
                os.rmdir(job.output_dir)
            job.refresh_state()


def report_interruption(err: LaunchInterrupted, selected: Sequence[SweepJob],
                        command_line: CommandLines) -> None:
    """Print which jobs a stop signal interrupted and the command that continues them."""
    by_command = {job.command(resume=r): job for job in selected for r in (False, True)}
    name = signal_name(err.signum)
    left = [by_command[c].output_dir for c in [*err.interrupted, *err.not_started]
            if c in by_command] or [job.output_dir for job in selected]
    if err.remote:
        print(f"Sweep stopped waiting ({name}): {len(err.interrupted)} job(s) are still running "
              "on the cluster (see above to cancel them).")
        print("Once they have ended, continue those that did not finish with:",
              *(f"  {line}" for line in sweep_commands(command_line, left, resume=True)), sep="\n")
        return
    print(f"Sweep stopped by {name}: {len(err.interrupted)} job(s) interrupted, "
          f"{len(err.not_started)} not started.")
    for command in err.interrupted:
        job = by_command.get(command)
        print(f"  interrupted: {job.describe() if job is not None else command}")
    if err.interrupted or err.not_started:
        print(*continue_lines(command_line, "interrupted jobs resume from their last checkpoint",
                              left), sep="\n")


def report_failures(err: JobsFailed, command_line: CommandLines) -> None:
    """After a launcher's failure summary: the count and how to go on."""
    print(f"Sweep: {len(err.failed)} of {err.n_commands} launched jobs failed (their errors and "
          "err.txt files are listed above); their folders are kept, Incomplete.")
    refused = [c for c, code in zip(err.failed, err.exit_codes) if code == EXIT_BAD_INPUT
               and (d := command_output_dir(c)) is not None
               and not os.path.exists(os.path.join(d, CHECKPOINT_FILE))]
    folders = [d for d in map(command_output_dir, err.failed) if d is not None]
    delete_lines = [f"  {line}" for line in sweep_commands(
        command_line, folders, "delete_incomplete", drop=["--skip_confirmation"])]
    if len(refused) == len(err.failed):
        print("Each failed on bad input before its first checkpoint (exit status 2: the data "
              "under --data_dir or an argument; see its error line above): run again unchanged, "
              "it fails the same way, and it has nothing to resume. Fix the cause (e.g. "
              "--data_dir), remove their folders with:")
        print(*delete_lines, "then launch the corrected command.", sep="\n")
        return
    if refused:
        print(f"({len(refused)} of them failed on bad input before their first checkpoint, "
              "exit status 2: fix the cause first, or they fail again.)")
    print("Fix the cause first.", *continue_lines(
        command_line, "a job resumes from its last checkpoint, if any", folders),
        "or delete them, so that the next launch starts them over:", *delete_lines, sep="\n")


def never_started(job: SweepJob) -> bool:
    """A job folder that no train process ever wrote to (no log, no record)."""
    return not any(os.path.exists(os.path.join(job.output_dir, name))
                   for name in (OUT_FILE, ERR_FILE, RESULTS_FILE, CHECKPOINT_FILE))


def state_line(job: SweepJob) -> str:
    """What a job is doing, for ``status``."""
    if job.state == RUNNING:
        what = f"running (pid {job.holder})"
    elif job.state == IN_SLURM:
        what = job.slurm.describe()
    elif job.state == QUEUED:
        what = f"queued by a live {job.launcher.describe()}"
    elif job.state == INCOMPLETE:
        ended = f" ({job.slurm.describe()})" if job.slurm is not None else ""
        lines = [line.strip() for line in read_lines(os.path.join(job.output_dir, ERR_FILE))]
        error = (error_excerpt(lines, len(lines)) or [None])[-1]  # the last that says what failed
        if never_started(job):
            what = f"never started{ended}"
        elif error and not error.startswith("stopped:"):
            what = f"failed{ended}: {error}"
        else:
            what = f"interrupted{ended}: continue with launch --resume"
    else:  # Done, Not launched
        what = job.state.lower()
    return f"{what}: {job.describe()}"


def cancel(jobs: Sequence[SweepJob], skip_confirmation: bool, dry_run: bool = False) -> int:
    """``scancel`` the Slurm jobs that hold this sweep's jobs."""
    held = [job for job in jobs if job.state == IN_SLURM]
    ids = sorted({job.slurm.job_id for job in held})
    print(summary_line(jobs))
    print(f"About to cancel {len(ids)} Slurm job(s) holding {len(held)} of these jobs"
          + (f": {' '.join(ids)}" if ids else "."))
    if dry_run or not ids:
        if dry_run:
            print("Dry run: nothing is cancelled.")
        return 0
    if not skip_confirmation and (code := refused_confirmation()) is not None:
        return code
    try:
        submitit.cancel(ids)
    except submitit.SlurmError as err:
        print(f"error: scancel failed: {err}", file=sys.stderr)
        return 1
    print(f"Cancelled {len(ids)} Slurm job(s); their jobs stop at a checkpoint (Incomplete: "
          "launch --resume continues them).")
    return 0


def run_action(action: str, jobs: Sequence[SweepJob], *,
               launcher_fn: Callable[[list], None] | None = None, seed: int = 0,
               resume: bool = False, dry_run: bool = False, skip_confirmation: bool = False,
               command_line: CommandLines = None,
               check: Callable[[Sequence[SweepJob]], list[str]] | None = None,
               estimate: Callable[[Sequence[SweepJob]], object] | None = None) -> int:
    """The flow after enumeration: print, select, check, confirm, act; the exit status."""
    if action == "status":  # each job's state_line and the counts
        print(*map(state_line, jobs), summary_line(jobs), sep="\n")
        return 0
    if action == "cancel":
        return cancel(jobs, skip_confirmation, dry_run)
    print(*jobs, summary_line(jobs), sep="\n")
    selected = select_jobs(jobs, action, resume)
    launching = action == "launch"
    print(f"About to {'launch' if launching else 'delete'} {len(selected)} jobs.")
    if launching and resume:
        n_resumed = sum(job.state == INCOMPLETE for job in selected)
        print(f"({n_resumed} of them are Incomplete and will run with --resume.)")
    notes = incomplete_note(jobs, command_line) if launching and not resume else []
    notes += left_alone_notes(jobs, action)
    for line in notes + (done_eval_splits_note(jobs) if launching else []):
        print(line)
    if dry_run:
        print(f"Dry run: nothing is {'launched' if launching else 'deleted'}.")
        for job in selected:
            print(job.command(resume=resume and job.state == INCOMPLETE) if launching
                  else f"would delete {job.output_dir}")
    if not selected:
        return 0
    problems = check(selected) if launching and check is not None and not dry_run else []
    if problems:
        refuse(problems)
        return 2
    if launching and estimate is not None and not skip_confirmation:
        estimate(selected)  # before the prompt (a dry run: at its end)
    if dry_run:
        return 0
    if not skip_confirmation and (code := refused_confirmation()) is not None:
        return code
    if not launching:
        delete(selected)
        return 0
    if launcher_fn is None:
        raise ValueError("launching needs a launcher function")
    try:
        launch(selected, launcher_fn, seed=seed, resume_incomplete=resume,
               command_line=command_line)
    except LaunchInterrupted as err:
        report_interruption(err, selected, command_line)
        return err.code
    except JobsFailed as err:
        report_failures(err, command_line)
        return int(err.code)
    except LaunchRefused as err:
        refuse([str(err)])
        return 2
    return 0


def refuse(problems: Sequence[str]) -> None:
    """Print the problems that stop a launch, one ``error:`` line each, on stderr."""
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    print(f"Nothing was launched ({len(problems)} problem(s) above, found before any job "
          "started).", file=sys.stderr)

