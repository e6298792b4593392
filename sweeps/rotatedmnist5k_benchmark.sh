#!/usr/bin/env bash
# The offline benchmark at full strength: every given algorithm (default: all registered) on
# RotatedMNIST5k, 3 trials, default hparams, each domain held out once, 501 steps, then the tables.
# CPU only, no download: about 20 minutes per algorithm on 2 cores.
#   PYTHON=.venv/bin/python bash sweeps/rotatedmnist5k_benchmark.sh [OUTPUT_DIR] [ALGORITHM ...]
set -euo pipefail
PYTHON=${PYTHON:-python}
OUT=${1:-sweep_output/rotatedmnist5k_benchmark}
shift || true
ALGORITHMS=("$@")
"$PYTHON" -m dg_plugins.scripts.sweep launch \
    --datasets RotatedMNIST5k --data_dir builtin --output_dir "$OUT" \
    ${ALGORITHMS[@]:+--algorithms "${ALGORITHMS[@]}"} \
    --command_launcher local --n_hparams 1 --n_trials 3 --single_test_envs \
    --steps 501 --checkpoint_freq 50 --skip_confirmation
"$PYTHON" -m dg_plugins.scripts.collect_results --input_dir "$OUT" --selection iid oracle \
    --format markdown
