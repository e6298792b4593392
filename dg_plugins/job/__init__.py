"""job: what a train job is, the one contract train, sweep, collect, reproduce and alignment read:
its flags (one table), folder, records, what model selection reads, and its sizes. Torch-free."""

from dg_plugins.job.flags import (FLAGS, Flag, add_flags, borrow, build_train_parser,  # flags
                                  check_ranges, compute_settings, option, record_args,
                                  sweep_job_args, train_argv)
from dg_plugins.job.folder import (DONE_FILE, RESULTS_FILE, FolderLock, JobStateError,  # folder
                                   is_done, lock_holder)
from dg_plugins.job.records import append_record, format_row, last_record  # results.jsonl
from dg_plugins.job.selection import SELECTION_READS, evaluated_splits  # what selection reads
from dg_plugins.job.sizes import records_after, split_sizes  # split sizes, record counts
