#!/usr/bin/env bash
# Offline study: GMoE vs its dense baseline ERM_ViT vs ERM (DomainBed's MNIST CNN, width 32) on the
# built-in RotatedMNIST5k (no download, CPU), 3 trials, every domain held out once, default hparams
# except the batch size, which (like the steps) is the same for all three algorithms.
# GMoE and ERM_ViT use the 28x28 ViT preset dg_vit_patch4_28 (6 blocks, width 64, random init; GMoE:
# MoE FFNs in blocks 2 and 4, 6 experts, top-1). The step count and batch are cut to fit a 2-core
# machine (the full-strength benchmark, sweeps/rotatedmnist5k_benchmark.sh, runs 501 steps at 64).
#   PYTHON=.venv/bin/python bash sweeps/gmoe_rotatedmnist5k.sh [OUTPUT_DIR]
# Environment: STEPS (default 201), BATCH (per domain, default 32), CHECKPOINT_FREQ (50),
# ALGORITHMS ("GMoE ERM_ViT ERM"), DRY_RUN=1 prints the jobs and commands only.
set -euo pipefail
PYTHON=${PYTHON:-python}
OUT=${1:-sweep_output/gmoe_rotatedmnist5k}
read -r -a ALGORITHMS <<< "${ALGORITHMS:-GMoE ERM_ViT ERM}"
EXTRA=()
[ "${DRY_RUN:-0}" = 1 ] && EXTRA+=(--dry_run)
"$PYTHON" -m dg_plugins.scripts.sweep launch \
    --datasets RotatedMNIST5k --data_dir builtin --output_dir "$OUT" \
    --algorithms "${ALGORITHMS[@]}" --command_launcher local --n_hparams 1 --n_trials 3 \
    --single_test_envs --steps "${STEPS:-201}" --checkpoint_freq "${CHECKPOINT_FREQ:-50}" \
    --hparams "{\"batch_size\": ${BATCH:-32}}" --skip_confirmation "${EXTRA[@]}"
[ "${DRY_RUN:-0}" = 1 ] && exit 0
"$PYTHON" -m dg_plugins.scripts.collect_results --input_dir "$OUT" --selection iid oracle \
    --format markdown
