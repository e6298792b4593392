"""One train command from its parsed flags to its exit status: check the input, lock the folder,
tee the output into out.txt/err.txt, catch stop signals, run the job, report failures in a line."""

from __future__ import annotations

import contextlib
import glob
import os
import sys
import traceback

from dg_plugins import catalog, plugins
from dg_plugins import hparams as hparams_lib
from dg_plugins.networks import PretrainedWeightsUnavailable
from dg_plugins.registry import ALGORITHMS, DATASETS, UnknownNameError
from dg_plugins.runtime import pick_device
from dg_plugins.signals import StopRequest
from dg_plugins.job import flags
from dg_plugins.train import udg
from dg_plugins.train.checkpoint import RESTART_FIX, check_checkpoint_file
from dg_plugins.train.compute import Compute
from dg_plugins.job.folder import (CHECKPOINT_FILE, DONE_FILE, ERR_FILE, MODEL_FILE, OUT_FILE,
                                   RESULTS_FILE, STEP_MODEL_FILE, DiskFullError, FolderLock,
                                   JobStateError, is_done, remove_temporary_files, writing)
from dg_plugins.job.records import read_record_lines
from dg_plugins.train.loop import Interrupted, Job, check_test_envs


def user_errors() -> tuple:
    """Exceptions that mean bad input or missing data/weights: one line, no traceback."""
    return (UnknownNameError, ValueError, FileNotFoundError, PretrainedWeightsUnavailable)


def validate(args, compute) -> None:
    """Reject bad input before anything is written (names, hparams, ranges, test environments, an
    image tree one level off, compute settings the device cannot run)."""
    plugins.load()
    dataset_cls = DATASETS.get(args.dataset)
    args.algorithm = ALGORITHMS.resolve(args.algorithm, say="--algorithm")  # erm: ERM
    getattr(ALGORITHMS.get(args.algorithm), "check_args", lambda args: None)(args)
    hparams_lib.validate(args.algorithm, args.dataset, hparams_lib.parse_overrides(args.hparams))
    fraction = flags.flag(args, "label_fraction")
    flags.check_ranges(args, None if fraction is None else [fraction])
    if dataset_cls.ENVIRONMENTS or args.dataset in catalog.IMAGE_FOLDER_DATASETS:  # or on disk
        check_test_envs(args, dataset_cls.ENVIRONMENTS
                        or catalog.environments_of(args.dataset, args.data_dir))
    if args.dataset in catalog.IMAGE_FOLDER_DATASETS:  # a tree one level off: nonsense labels
        from dg_plugins.datasets.check import one_level_off
        from dg_plugins.layouts import visible_subfolders

        folder = catalog.IMAGE_FOLDER_DATASETS[args.dataset]
        root = os.path.join(args.data_dir, folder) if args.data_dir and folder else args.data_dir
        if root and os.path.isdir(root):  # else the dataset names what is missing
            error = one_level_off(args.dataset, root, visible_subfolders(root), folder is None,
                                  catalog.image_folder_layout(args.dataset))
            if error is not None:
                raise ValueError(error)
    compute.check(pick_device(args.device), ALGORITHMS.get(args.algorithm))


def prepare_output_dir(args) -> None:
    """Under the folder lock: a done job reruns only with ``--force`` (its outputs removed first),
    an interrupted one with ``--resume`` or ``--force``."""
    folder = args.output_dir
    done = is_done(folder)
    records = read_record_lines(os.path.join(folder, RESULTS_FILE))
    if flags.flag(args, "force"):
        if done or records or os.path.exists(os.path.join(folder, CHECKPOINT_FILE)):
            print(f"--force: starting {folder} over (removing done, records, models and the "
                  "checkpoint)", file=sys.stderr)
        steps = glob.glob(os.path.join(glob.escape(folder), STEP_MODEL_FILE.format(step="*")))
        for path in [os.path.join(folder, name) for name in
                     (DONE_FILE, RESULTS_FILE, CHECKPOINT_FILE, MODEL_FILE)] + steps:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        return
    if done:
        raise JobStateError(f"{folder} holds a finished job ('done' exists); nothing was changed. "
                            "To run it again from scratch pass --force (its records and model are "
                            "replaced), or choose another --output_dir.")
    if records and not args.resume:
        raise JobStateError(f"{folder} holds {len(records)} records of an interrupted run; "
                            "continue it with --resume (same arguments), or start over with "
                            "--force.")
    if args.resume:
        check_checkpoint_file(os.path.join(folder, CHECKPOINT_FILE), RESTART_FIX)


class Tee:
    """Writes to ``stream`` and to the file ``path`` (out.txt/err.txt); once the file fails (a
    full disk: ``file_error``) only to ``stream``, so the error still reaches the user."""

    def __init__(self, path: str, stream, mode: str = "a"):
        self.stream, self.file = stream, open(path, mode)
        self.file_error: OSError | None = None

    def _to_file(self, method: str, *message) -> None:
        if self.file_error is None:
            try:
                getattr(self.file, method)(*message)
            except OSError as err:
                self.file_error = err

    def write(self, message: str) -> int:
        self.stream.write(message)
        self._to_file("write", message)
        self.flush()
        return len(message)

    def flush(self) -> None:
        self.stream.flush()
        self._to_file("flush")

    def isatty(self) -> bool:
        return False

    def close(self) -> None:
        with contextlib.suppress(OSError):  # the unwritten tail of a full disk: already reported
            self.file.close()


@contextlib.contextmanager
def teed(folder: str, mode: str):
    """stdout and stderr also into ``folder``'s out.txt and err.txt; yields the real stderr."""
    real_stderr = sys.stderr
    with (contextlib.closing(Tee(os.path.join(folder, OUT_FILE), sys.stdout, mode)) as out,
          contextlib.closing(Tee(os.path.join(folder, ERR_FILE), out, mode)) as err,
          contextlib.redirect_stdout(out), contextlib.redirect_stderr(err)):
        yield real_stderr


def report(err: BaseException) -> int | None:
    """Print a one-line failure and return its exit status; else None (its traceback shows it)."""
    if isinstance(err, Interrupted):
        print(f"stopped: {err}", file=sys.stderr)
        return 128 + err.signum
    if not isinstance(err, (DiskFullError, *user_errors())):
        return None
    print(f"error: {err}", file=sys.stderr)
    return flags.EXIT_BAD_INPUT if isinstance(err, user_errors()) else flags.EXIT_FAILED


def execute(args, stop_after_step: int | None = None
            ) -> tuple[str | None, int, BaseException | None]:
    """Run one job as train does: ``(status, exit status, failure)``, exit 0 done, 2 bad input,
    128 + signal stopped, 1 a full disk or other failure. A failure is printed once; an unexpected
    one before the folder is held, or a ``BaseException`` (a second Ctrl-C), is raised."""
    folder = args.output_dir
    compute = Compute.of(args)  # the call's one Compute, passed on
    compute.prepare_process()
    try:
        validate(args, compute)
        with writing(folder):
            os.makedirs(folder, exist_ok=True)
        with writing(folder), FolderLock(folder):
            if args.resume and not flags.flag(args, "force") and is_done(folder):
                print(f"{folder} is already done; nothing to resume.")
                return "already done", flags.EXIT_DONE, None
            prepare_output_dir(args)
            removed = remove_temporary_files(folder)
            # --force starts the logs over too: err.txt must not show a previous run's errors
            with teed(folder, "w" if flags.flag(args, "force") else "a") as real_stderr:
                for path in removed:
                    print(f"removed a leftover temporary file of an interrupted write: {path}",
                          file=sys.stderr)
                kind = Job if flags.flag(args, "label_fraction") is None else udg.UDGJob
                try:
                    with writing(folder, anywhere=False), StopRequest() as stop:
                        return (kind(args, stop, real_stderr, compute).run(stop_after_step),
                                flags.EXIT_DONE, None)
                except BaseException as err:  # reported here, in out.txt and err.txt
                    if (status := report(err)) is not None:
                        return None, status, err
                    traceback.print_exc()
                    if not isinstance(err, Exception):
                        raise
                    return None, flags.EXIT_FAILED, err
    except Exception as err:  # before the job took its folder: reported on stderr
        if (status := report(err)) is None:
            raise
        return None, status, err


def run(args, stop_after_step: int | None = None) -> str:
    """:func:`execute`'s status, or its failure raised (after it was reported)."""
    status, _, failure = execute(args, stop_after_step)
    if failure is not None:
        raise failure
    return status
