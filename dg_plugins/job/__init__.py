"""job: what a train job is, the one contract train, sweep, collect, reproduce and alignment read:
its flags (one table), folder, records, what model selection reads, and its sizes. Torch-free."""

from dg_plugins.job.flags import borrow, option, train_argv  # what other commands borrow
