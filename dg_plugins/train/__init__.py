"""train: one job, read top to bottom from ``python -m dg_plugins.scripts.train``.

cli (the parser, the command) -> run (validate, take the folder, tee, signals, exit status) ->
job (the one step loop; build_job_data) -> splits / batches / evaluate -> checkpoint (the resume
file); flags: what the flags mean (names, range checks, exit statuses; sweep shares them);
folder: the job-folder contract (file names, lock, done, records) that sweep and collect read;
udg: the UDG protocol's jobs; progress: what a job says while it runs. This package, cli, flags
and folder import no torch.
"""
