"""reproduce: a paper setting of dg_plugins/reference/paper_settings.py, run or listed
(``python -m dg_plugins.scripts.reproduce``), read in the order below. Torch is imported only
when a listing or a run needs it (``--help`` and ``--describe`` run without). docs/reproduce.md."""

from dg_plugins.reproduce.cli import (build_parser, main, run,  # the flags, the flow, a run,
                                      dry_run, dry_run_sweeps, list_settings)  # listings
from dg_plugins.reproduce.plan import (OWNED_SWEEP_FLAGS, Plan, SweepCall,  # setting -> calls,
                                       CallCost, call_cost,  # a call's jobs and their cost,
                                       prerequisites,  # what the jobs need, found at once
                                       check_extra, parse_test_env_sets, plan_setting)
from dg_plugins.sweep.cli import sweep_jobs  # a call's jobs, enumerated as sweep does
# the counting rules reproduce shares with the sweep's prompt (dg_plugins.sweep)
from dg_plugins.sweep.costs import (EVAL_SPLITS, Sizes, UsageError,  # image counts, splits
                                    dataset_sizes, split_sizes)
from dg_plugins.sweep.costs import FORWARDS_DEFINITION, Forwards, job_forwards, job_steps  # steps
from dg_plugins.sweep.costs import GpuTime, job_gpu_time  # the GPU-hours estimate
