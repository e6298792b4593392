"""sweep: many jobs (``python -m dg_plugins.scripts.sweep``), read in the order below; plan runs on
its own. Torch-free. How it works: docs/sweep.md."""

from dg_plugins.sweep.cli import build_parser, main  # the flags, their checks, the flow
from dg_plugins.sweep.jobs import (LauncherClaim, SweepJob,  # enumeration, identity, folders
                                   make_args_list, make_jobs, sweep_lock)  # a launcher queued
from dg_plugins.sweep.checks import launch_problems  # what every job would meet, found once
from dg_plugins.sweep.actions import run_action  # select, confirm, launch or delete
from dg_plugins.sweep.launchers import (MemoryCheck, cores_per_job,  # DomainBed's launchers,
                                        local_launcher, multi_gpu_launcher)  # N jobs per GPU
from dg_plugins.sweep.submitit import SubmititOptions, submitit_launcher  # Slurm job arrays
from dg_plugins.sweep.processes import (JobProcesses, JobsFailed,  # signals, how a job starts
                                        LaunchInterrupted, fork_train)
from dg_plugins.sweep.progress import JobOutputs, Progress  # a launcher's line per job, time left
