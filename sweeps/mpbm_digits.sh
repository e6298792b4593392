#!/usr/bin/env bash
# MPBM paper setting, Digits single-source DG: train on the first 10,000 MNIST training digits,
# test on SVHN, MNIST-M, SYN and USPS (32x32 RGB, LeNet-style ConvNet: Digits' default backbone).
# Needs the local files described in dg_plugins/datasets/digits.py under DATA_DIR/digits/ (nothing
# is downloaded) and, at 10,001 steps per job, preferably a GPU.
#
#   PYTHON=.venv/bin/python bash sweeps/mpbm_digits.sh DATA_DIR [OUTPUT_DIR] [--dry_run]
#
# ERM and MPBM, 3 trials, default hparams except the SDG literature's optimiser setting (Adam lr
# 1e-4, batch 32; see dg_plugins/algorithms/mpbm.py for the reconstructed choices), source
# environment 0 (MNIST) only: the benchmark's direction. `--test_env_sets 1,2,3,4` makes exactly
# the source-0 jobs of `sweep launch --single_source` (same job folders).
# Reported in the paper (arXiv 2502.16064, from its summary): MPBM 81.3 average over the four
# targets; 51.7 without L_mix^tr and 77.7 without L_adv.
set -euo pipefail
PYTHON=${PYTHON:-python}
DATA=${1:?usage: mpbm_digits.sh DATA_DIR [OUTPUT_DIR] [--dry_run]}
OUT=${2:-sweep_output/mpbm_digits}
EXTRA=("${@:3}")
"$PYTHON" -m dg_plugins.scripts.sweep launch --datasets Digits --data_dir "$DATA" \
    --test_env_sets 1,2,3,4 --algorithms ERM MPBM --n_hparams 1 --n_trials 3 \
    --hparams '{"lr": 0.0001, "batch_size": 32}' \
    --output_dir "$OUT" --command_launcher "${LAUNCHER:-local}" --skip_confirmation "${EXTRA[@]}"
if [[ " ${EXTRA[*]} " != *" --dry_run "* ]]; then
    "$PYTHON" -m dg_plugins.scripts.collect_results --input_dir "$OUT" --single_source on \
        --selection iid oracle --format markdown
fi
