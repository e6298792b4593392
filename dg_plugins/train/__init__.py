"""train: one job, read top to bottom: cli -> run (validate, folder, tee, signals, exit status)
-> job (the step loop) -> splits / batches / evaluate -> checkpoint; udg: the UDG protocol's jobs.
The job contract (flags, folder, records) is dg_plugins.job. This package and cli import no torch.
"""
