#!/usr/bin/env bash
# Offline study of DMG against ERM on the built-in benchmark RotatedMNIST5k (5,000 MNIST digits,
# 6 rotation domains, DomainBed's MNIST CNN at width 32; no download, CPU only): default hparams
# for both (DMG: lambda_O 0.1, masks on the input of block4 and on the pooled feature, mask lr =
# lr), 3 trials, every domain held out once (18 jobs per algorithm), then the tables with
# training-domain validation and test-domain (oracle) selection, mean +/- standard error.
#   PYTHON=.venv/bin/python bash sweeps/dmg_rotatedmnist5k.sh [OUTPUT_DIR] [STEPS]
# STEPS defaults to 201 (results/dmg_rotatedmnist5k.md: about 20 minutes for both algorithms on
# 2 cores); sweeps/rotatedmnist5k_benchmark.sh's 501 steps take about 2.5x longer.
set -euo pipefail
PYTHON=${PYTHON:-python}
OUT=${1:-sweep_output/dmg_rotatedmnist5k}
STEPS=${2:-201}
"$PYTHON" -m dg_plugins.scripts.sweep launch \
    --datasets RotatedMNIST5k --data_dir builtin --output_dir "$OUT" \
    --algorithms ERM DMG \
    --command_launcher local --n_hparams 1 --n_trials 3 --single_test_envs \
    --steps "$STEPS" --checkpoint_freq 50 --skip_confirmation
"$PYTHON" -m dg_plugins.scripts.collect_results --input_dir "$OUT" --selection iid oracle \
    --format markdown
