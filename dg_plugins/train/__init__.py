"""train: one job, top to bottom: cli -> run (checks, folder, signals) -> loop -> splits / batches /
evaluate -> checkpoint; udg: the UDG jobs. Contract: dg_plugins.job. No torch here or in cli."""
