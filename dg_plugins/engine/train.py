"""One training job, DomainBed-compatible (``domainbed/scripts/train.py``), resumable.

``run(args)`` takes the parsed train CLI namespace (see :mod:`dg_plugins.scripts.train`) and
writes DomainBed's output folder: ``out.txt``/``err.txt`` (Tee'd, appended), ``results.jsonl``
(one sorted-key JSON record per checkpoint), ``model.pkl`` and, last, ``done``. Beyond DomainBed:

* ``checkpoint.pt`` (atomic) after every record: model, optimizers, LR schedulers, batch streams,
  RNG states, the record count, the job's args and hparams. ``--resume`` continues from it and
  writes the same records (timing aside) as an uninterrupted run with the same seed; records
  written after the checkpoint are dropped first. It is deleted once the job is done.
* Guarantees (each tested): bad input (unknown names, mistyped or out-of-range hparams,
  non-positive ``--steps``/``--checkpoint_freq``) is rejected before anything is written; a
  finished job is never rerun over (``--force`` starts it over); a folder holding records of an
  interrupted run is continued only with ``--resume`` and only with the same arguments and hparams
  (the differences are listed otherwise; ``output_dir`` and ``data_dir`` may change); every record
  is fsynced before the checkpoint that counts it, and resume checks that the kept records are
  complete and as many as counted; one process at a time holds a job folder (an exclusive lock,
  released when the process dies); leftover temporary files of an interrupted atomic write are
  removed; SIGTERM/SIGINT stop the job at the next step boundary with a checkpoint and exit status
  143/130, so ``--resume`` continues exactly there.
* One-line errors that leave the folder as the next command expects: an output folder this
  process cannot write (exit 2, naming the folder and the fix); a damaged ``checkpoint.pt`` on
  ``--resume`` (exit 2, nothing changed, ``--force`` starts over); a full disk while writing a
  checkpoint, a record or the model (exit 1: the failed write leaves no temporary file and no
  torn record, the previous checkpoint stays valid, and ``--resume`` continues once there is
  space). ``--force`` starts ``out.txt``/``err.txt`` over too; repeated ``--test_envs`` are
  rejected.
* A NaN/inf value returned by ``update`` stops the job with an error (no ``done``).
* ``--device`` (default: cuda when available), in-process loading of in-memory data.
* What it says while it runs: the weights the model took and from where, the measured step time
  with the estimate of the job's time, and a progress bar on a terminal, else a progress line
  every ``--progress_every`` seconds (:mod:`dg_plugins.engine.progress`).
"""

from __future__ import annotations

import contextlib
import errno
import glob
import os
import sys
import traceback

from dg_plugins import catalog
from dg_plugins import hparams as hparams_lib
from dg_plugins.engine import udg_jobs
from dg_plugins.engine.job import Interrupted, Job, check_test_envs
from dg_plugins.engine.job_folder import (CHECKPOINT_FILE, DONE_FILE, RESULTS_FILE, FolderLock,
                                          JobStateError, OutputFolderError, read_record_lines,
                                          remove_temporary_files, unwritable_folder_error)
from dg_plugins.engine.outputs import Tee
from dg_plugins.engine.signals import StopRequest
from dg_plugins.registry import ALGORITHMS, DATASETS


def user_errors() -> tuple:
    """Exceptions that mean bad input or missing data/weights: reported as one line, no traceback."""
    from dg_plugins.networks import PretrainedWeightsUnavailable
    from dg_plugins.registry import UnknownNameError

    return (UnknownNameError, ValueError, FileNotFoundError, PretrainedWeightsUnavailable)


class DiskFullError(OSError):
    """A write of the job failed for lack of space (``ENOSPC``, ``EDQUOT``): reported as one line
    (exit status 1); everything written before is intact (atomic writes, records trimmed back),
    so the job continues with ``--resume`` once there is space."""

    def __str__(self) -> str:
        return str(self.strerror)


DISK_FULL_ERRNOS = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))
UNWRITABLE_ERRNOS = (errno.EACCES, errno.EPERM, errno.EROFS)


def _inside(path, folder: str) -> bool:
    if path is None:
        return False
    path, folder = os.path.abspath(str(path)), os.path.abspath(folder)
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def folder_error(folder: str, err: OSError, anywhere: bool = True) -> Exception | None:
    """The one-line error for an OSError met while writing job folder ``folder`` (a full disk,
    a folder this process may not write), or None for other errors (kept with their traceback).
    Without ``anywhere``, a permission error counts only when it names a file in ``folder`` (a
    data file the job may not read is another matter)."""
    if not anywhere and not _inside(err.filename, folder) and err.errno not in DISK_FULL_ERRNOS:
        return None
    if err.errno in DISK_FULL_ERRNOS:
        target = err.filename or folder
        return DiskFullError(
            err.errno,
            f"no space left on the device of {folder} while writing {target} ({err.strerror}); "
            "the job stopped, and what it wrote before is intact (its last checkpoint, the "
            "records that checkpoint counts, its model). Free space (or quota), then rerun the "
            "same command with --resume to continue from the last checkpoint")
    if err.errno in UNWRITABLE_ERRNOS:
        return unwritable_folder_error(folder, err)
    if isinstance(err, (FileExistsError, NotADirectoryError)):
        return OutputFolderError(f"--output_dir {folder} cannot be a job folder: {err.strerror} "
                                 f"({err.filename}); choose another --output_dir")
    return None


@contextlib.contextmanager
def writing(folder: str):
    """Turn the OSErrors of writes into ``folder`` that the user can fix (a full disk, missing
    permissions) into their one-line errors (:func:`folder_error`)."""
    try:
        yield
    except OSError as err:
        translated = folder_error(folder, err) if not isinstance(
            err, (DiskFullError, OutputFolderError)) else None
        if translated is None:
            raise
        raise translated from err


def load_plugins() -> None:
    """Import the built-in algorithms and datasets, and the plugin modules named in
    ``$DG_PLUGINS_IMPORT`` (they register on import)."""
    from dg_plugins.engine import plugins

    plugins.load()


def validate(args) -> None:
    """Reject bad input before anything is written (names, JSON, environment indices)."""
    load_plugins()
    dataset_cls = DATASETS.get(args.dataset)
    ALGORITHMS.get(args.algorithm)
    hparams_lib.validate(args.algorithm, args.dataset, hparams_lib.parse_overrides(args.hparams))
    duplicates = sorted({t for t in args.test_envs if args.test_envs.count(t) > 1})
    if duplicates:
        raise ValueError(f"--test_envs {' '.join(map(str, args.test_envs))} names environment(s) "
                         f"{duplicates} more than once; give each test environment once")
    for flag in ("steps", "checkpoint_freq"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise ValueError(f"--{flag} must be a positive integer, got {value} (leave it out for "
                             "the dataset's default)")
    progress_every = getattr(args, "progress_every", None)
    if progress_every is not None and not progress_every >= 0:
        raise ValueError(f"--progress_every must be >= 0 seconds, got {progress_every}")
    if dataset_cls.ENVIRONMENTS:
        check_test_envs(args, dataset_cls.ENVIRONMENTS)
    elif args.dataset in catalog.IMAGE_FOLDER_DATASETS:  # environments found on disk
        check_test_envs(args, catalog.environments_of(args.dataset, args.data_dir))
    if not 0 <= args.holdout_fraction < 1:
        raise ValueError(f"--holdout_fraction must be in [0, 1), got {args.holdout_fraction}")
    if not 0 <= args.uda_holdout_fraction < 1:
        raise ValueError(f"--uda_holdout_fraction must be in [0, 1), got "
                         f"{args.uda_holdout_fraction}")
    if any(getattr(args, name, None) is not None for name in
           ("label_fraction", "pretrain_steps", "udg_pretrain_epochs", "udg_ft_epochs",
                  "udg_split")):
        udg_jobs.validate(args)


# --------------------------------------------------------------------------------------------------
# Entry point


def prepare_output_dir(args) -> None:
    """Decide, under the folder lock, whether this run may proceed: a finished job is rerun only
    with ``--force`` (which first removes ``done``, the records, models and checkpoint); a folder
    with records of an interrupted run needs ``--resume`` (or ``--force``)."""
    folder = args.output_dir
    done = os.path.exists(os.path.join(folder, DONE_FILE))
    records = read_record_lines(os.path.join(folder, RESULTS_FILE))
    if getattr(args, "force", False):
        if done or records or os.path.exists(os.path.join(folder, CHECKPOINT_FILE)):
            print(f"--force: starting {folder} over (removing done, records, models and the "
                  "checkpoint)", file=sys.stderr)
        for name in [DONE_FILE, RESULTS_FILE, CHECKPOINT_FILE, "model.pkl"] + [
                os.path.basename(p) for p in glob.glob(os.path.join(glob.escape(folder),
                                                                    "model_step*.pkl"))]:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(folder, name))
        return
    if done:
        raise JobStateError(
            f"{folder} holds a finished job ('done' exists); nothing was changed. To run it "
            "again from scratch pass --force (its records and model are replaced), or choose "
            "another --output_dir.")
    if records and not args.resume:
        raise JobStateError(
            f"{folder} holds {len(records)} records of an interrupted run; continue it with "
            "--resume (same arguments), or start over with --force.")
    if args.resume:
        from dg_plugins.engine.checkpoint import check_checkpoint_file

        check_checkpoint_file(os.path.join(folder, CHECKPOINT_FILE),
                              "Start the job over with --force (its records, models and "
                              "checkpoint are removed first), or move the folder away")


def run(args, stop_after_step: int | None = None) -> str:
    """Run one job. Returns "done", "already done" (``--resume`` of a finished job) or "stopped"
    (``stop_after_step`` simulates an interruption right after that step's checkpoint; tests use
    it). Raises :class:`Interrupted` on SIGTERM/SIGINT (after a checkpoint)."""
    validate(args)
    folder = args.output_dir
    with writing(folder):
        os.makedirs(folder, exist_ok=True)
    with writing(folder), FolderLock(folder):
        if args.resume and not getattr(args, "force", False) and os.path.exists(
                os.path.join(folder, DONE_FILE)):
            print(f"{folder} is already done; nothing to resume.")
            return "already done"
        prepare_output_dir(args)
        removed = remove_temporary_files(folder)
        # --force starts the logs over too: err.txt must not show a previous run's errors
        mode = "w" if getattr(args, "force", False) else "a"
        real_stdout, real_stderr = sys.stdout, sys.stderr
        out_tee = Tee(os.path.join(folder, "out.txt"), real_stdout, mode)
        try:
            err_tee = Tee(os.path.join(folder, "err.txt"), out_tee, mode)
        except BaseException:
            out_tee.close()
            raise
        sys.stdout, sys.stderr = out_tee, err_tee
        try:
            for path in removed:
                print(f"removed a leftover temporary file of an interrupted write: {path}",
                      file=sys.stderr)
            with StopRequest() as stop:
                job_kind = udg_jobs.UDGJob if getattr(args, "label_fraction", None) is not None \
                    else Job
                return job_kind(args, stop, progress_stream=real_stderr).run(stop_after_step)
        except user_errors() as err:
            print(f"error: {err}", file=sys.stderr)  # lands in err.txt and out.txt
            err.reported_in_output_dir = True
            raise
        except Interrupted as err:
            print(f"stopped: {err}", file=sys.stderr)
            err.reported_in_output_dir = True
            raise
        except OSError as err:
            translated = folder_error(folder, err, anywhere=False)
            if translated is None:
                traceback.print_exc()
                err.reported_in_output_dir = True
                raise
            print(f"error: {translated}", file=sys.stderr)
            translated.reported_in_output_dir = True
            raise translated from err
        except BaseException as err:
            traceback.print_exc()
            with contextlib.suppress(AttributeError):
                err.reported_in_output_dir = True
            raise
        finally:
            tees = (sys.stdout, sys.stderr)
            sys.stdout, sys.stderr = real_stdout, real_stderr
            for tee in tees:
                tee.close()
