#!/usr/bin/env bash
# The offline benchmark at full strength: every given algorithm (default: all registered) on
# RotatedMNIST5k, 3 trials, default hparams, each domain held out once, 501 steps, then the tables.
# CPU only, no download: about 20 minutes per algorithm on 2 cores.
#   [PYTHON=.venv/bin/python] [OUTPUT_DIR=sweep_output/rotatedmnist5k_benchmark] [DRY_RUN=1] \
#   [ALGORITHMS="ERM DMG"] bash sweeps/rotatedmnist5k_benchmark.sh [sweep flags]
# Conventions and LAUNCHER: sweeps/_common.sh.
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
ALGORITHM_FLAGS=()
if [[ -n "${ALGORITHMS:-}" ]]; then
    read -r -a _algorithms <<< "$ALGORITHMS"
    ALGORITHM_FLAGS=(--algorithms "${_algorithms[@]}")
fi
sweep_launch --datasets RotatedMNIST5k --data_dir builtin --output_dir "$OUTPUT_DIR" \
    "${ALGORITHM_FLAGS[@]}" --n_hparams 1 --n_trials 3 \
    --single_test_envs --steps 501 --checkpoint_freq 50
finish_dry_run
"$PYTHON" -m dg_plugins.scripts.collect_results --input_dir "$OUTPUT_DIR" --selection iid oracle \
    --format markdown
