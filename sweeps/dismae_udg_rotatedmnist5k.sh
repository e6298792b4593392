#!/usr/bin/env bash
# Offline UDG study (CPU, no download): the UDG protocol of dg_plugins.train.udg on the
# built-in RotatedMNIST5k. Pretrain (unlabelled) on the 4 middle rotations (15-60 degrees),
# fine-tune on 1% / 10% / 100% of their labels, test on the extreme rotations 0 and 75 degrees;
# DisMAE vs MAE (same ViT-28 semantic encoder and decoder) vs ERM trained from scratch on the
# labelled fraction (the same ViT-28 architecture, backbone "vit", batch 16 per domain); default
# hparams, 3 trials.
# Budget-sized for 2 CPU cores (about 15-20 minutes): PRETRAIN_STEPS pretraining steps (default
# 600, about 23 epochs of the source images at 4 x 32 images per step) and STEPS fine-tuning
# steps (default 200), checkpoints every 100 steps. DisMAE runs in one process and MAE + ERM in
# another, in parallel (one core each; logs in OUTPUT_DIR.dismae.log and OUTPUT_DIR.mae_erm.log).
#   [PYTHON=.venv/bin/python] [OUTPUT_DIR=sweep_output/dismae_udg_rotatedmnist5k] [DRY_RUN=1] \
#       bash sweeps/dismae_udg_rotatedmnist5k.sh [sweep flags]
# Knobs: PRETRAIN_STEPS, STEPS; conventions and LAUNCHER: sweeps/_common.sh.
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
COMMON=(--datasets RotatedMNIST5k --data_dir builtin --output_dir "$OUTPUT_DIR" --test_env_sets 0,5
        --label_fractions 0.01 0.1 1.0 --pretrain_steps "${PRETRAIN_STEPS:-600}"
        --steps "${STEPS:-200}" --checkpoint_freq 100 --n_hparams 1 --n_trials 3)
ERM_HPARAMS='{"backbone": "vit", "batch_size": 16}'
if [[ "$DRY_RUN" == 1 ]]; then
    sweep_launch --algorithms DisMAE "${COMMON[@]}"
    sweep_launch --algorithms MAE "${COMMON[@]}"
    sweep_launch --algorithms ERM "${COMMON[@]}" --hparams "$ERM_HPARAMS"
    finish_dry_run
fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
mkdir -p "$(dirname "$OUTPUT_DIR")"
sweep_launch --algorithms DisMAE "${COMMON[@]}" > "$OUTPUT_DIR.dismae.log" 2>&1 &
A=$!
( sweep_launch --algorithms MAE "${COMMON[@]}" &&
  sweep_launch --algorithms ERM "${COMMON[@]}" --hparams "$ERM_HPARAMS" ) \
    > "$OUTPUT_DIR.mae_erm.log" 2>&1 &
B=$!
trap 'kill -TERM "$A" "$B" 2>/dev/null; wait' INT TERM
status=0
wait "$A" || status=$?
wait "$B" || status=$?
if [[ "$status" != 0 ]]; then
    echo "a sweep exited with status $status (see $OUTPUT_DIR.dismae.log and" \
         "$OUTPUT_DIR.mae_erm.log)" >&2
    exit "$status"
fi
"$PYTHON" -m dg_plugins.scripts.collect_results --input_dir "$OUTPUT_DIR" --selection iid oracle \
    --format markdown
