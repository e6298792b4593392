"""train: one job, read top to bottom from ``python -m dg_plugins.scripts.train``.

cli (the parser, the command) -> run (validate, take the folder, tee, signals, exit status) ->
job (the one step loop; build_job_data) -> splits / batches / evaluate -> checkpoint (the resume
file); udg: the UDG protocol's jobs; progress: what a job says while it runs; preload: what the
sweep's fork server imports for the jobs it forks. What a job is (its flags, folder, records) is
the job contract below it (dg_plugins.job). This package and cli import no torch.
"""
