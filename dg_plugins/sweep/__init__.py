"""sweep: many jobs, read top to bottom from ``python -m dg_plugins.scripts.sweep``.

cli (flags, their checks) -> jobs (dataset names, enumeration, identity: the md5 folder
names, states; claims: the folders a live launcher has queued) -> checks (algorithm names; what
every job would meet, found once before launching) -> actions (select, confirm, launch or
delete, what to say after) -> launchers (dummy, local, multi_gpu; submitit for Slurm) ->
processes (a job's process group, stop signals, failure summaries) -> fork (how a job's process
starts); job_reports: a launcher's line per job, with the time left (progress). Of train it uses
train.flags, train.folder and (to fork a job) train.cli; it imports no torch.
"""
