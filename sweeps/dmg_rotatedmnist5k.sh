#!/usr/bin/env bash
# Offline study of DMG against ERM on the built-in benchmark RotatedMNIST5k (5,000 MNIST digits,
# 6 rotation domains, DomainBed's MNIST CNN at width 32; no download, CPU only): default hparams
# for both (DMG: lambda_O 0.1, masks on the input of block4 and on the pooled feature, mask lr =
# lr), 3 trials, every domain held out once (18 jobs per algorithm), then the tables with
# training-domain validation and test-domain (oracle) selection, mean +/- standard error.
#   [PYTHON=.venv/bin/python] [OUTPUT_DIR=sweep_output/dmg_rotatedmnist5k] [STEPS=201] \
#   [DRY_RUN=1] bash sweeps/dmg_rotatedmnist5k.sh [sweep flags]
# STEPS defaults to 201 (results/dmg_rotatedmnist5k.md: about 20 minutes for both algorithms on
# 2 cores); sweeps/rotatedmnist5k_benchmark.sh's 501 steps take about 2.5x longer.
# Conventions and LAUNCHER: sweeps/_common.sh.
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
sweep_launch --datasets RotatedMNIST5k --data_dir builtin --output_dir "$OUTPUT_DIR" \
    --algorithms ERM DMG --n_hparams 1 --n_trials 3 --single_test_envs \
    --steps "${STEPS:-201}" --checkpoint_freq 50
finish_dry_run
"$PYTHON" -m dg_plugins.scripts.collect_results --input_dir "$OUTPUT_DIR" --selection iid oracle \
    --format markdown
