#!/usr/bin/env bash
# Offline UDG study (CPU, no download): the UDG protocol of dg_plugins.engine.udg_jobs on the built-in
# RotatedMNIST5k. Pretrain (unlabelled) on the 4 middle rotations (15-60 degrees), fine-tune on
# 1% / 10% / 100% of their labels, test on the extreme rotations 0 and 75 degrees; DisMAE vs MAE
# (same ViT-28 semantic encoder and decoder) vs ERM trained from scratch on the labelled fraction
# (the same ViT-28 architecture, backbone "vit", batch 16 per domain); default hparams, 3 trials.
# Budget-sized for 2 CPU cores (about 15-20 minutes): PRETRAIN_STEPS pretraining steps (default
# 600, about 23 epochs of the source images at 4 x 32 images per step) and STEPS fine-tuning
# steps (default 200), checkpoints every 100 steps. DisMAE runs in one process and MAE + ERM in
# another, in parallel (one core each).
#   PYTHON=.venv/bin/python bash sweeps/dismae_udg_rotatedmnist5k.sh [OUT]
set -euo pipefail
PYTHON=${PYTHON:-python}
OUT=${1:-sweep_output/dismae_udg_rotatedmnist5k}
PRETRAIN_STEPS=${PRETRAIN_STEPS:-600}
STEPS=${STEPS:-200}
COMMON=(--datasets RotatedMNIST5k --data_dir builtin --output_dir "$OUT" --test_env_sets 0,5
        --label_fractions 0.01 0.1 1.0 --pretrain_steps "$PRETRAIN_STEPS" --steps "$STEPS"
        --checkpoint_freq 100 --n_hparams 1 --n_trials 3 --command_launcher local
        --skip_confirmation)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
"$PYTHON" -m dg_plugins.scripts.sweep launch --algorithms DisMAE "${COMMON[@]}" > "$OUT.dismae.log" 2>&1 &
A=$!
( "$PYTHON" -m dg_plugins.scripts.sweep launch --algorithms MAE "${COMMON[@]}" &&
  "$PYTHON" -m dg_plugins.scripts.sweep launch --algorithms ERM "${COMMON[@]}" \
      --hparams '{"backbone": "vit", "batch_size": 16}' ) > "$OUT.mae_erm.log" 2>&1 &
B=$!
wait $A; wait $B
"$PYTHON" -m dg_plugins.scripts.collect_results --input_dir "$OUT" --selection iid oracle \
    --format markdown
