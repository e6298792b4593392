"""train: one job, read top to bottom from ``python -m dg_plugins.scripts.train``.

cli (every flag, the range checks sweep shares) -> run (validate, take the folder, tee, signals,
exit status) -> job (the one step loop; :func:`~dg_plugins.train.job.build_job_data`) ->
splits / batches / evaluate -> checkpoint (the resume file); folder: the job-folder contract
(file names, lock, done, records) that sweep and collect read; udg: the UDG protocol's
pretraining and fine-tuning jobs; progress: what a job says while it runs. This package, cli and
folder import no torch.
"""
