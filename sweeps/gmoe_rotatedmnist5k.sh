#!/usr/bin/env bash
# Offline study: GMoE vs its dense baseline ERM_ViT vs ERM (DomainBed's MNIST CNN, width 32) on the
# built-in RotatedMNIST5k (no download, CPU), 3 trials, every domain held out once, default hparams
# except the batch size, which (like the steps) is the same for all three algorithms.
# GMoE and ERM_ViT use the 28x28 ViT preset dg_vit_patch4_28 (6 blocks, width 64, random init; GMoE:
# MoE FFNs in blocks 2 and 4, 6 experts, top-1). Steps and batch are cut to fit a 2-core machine
# (the full-strength benchmark, sweeps/rotatedmnist5k_benchmark.sh, runs 501 steps at batch 64).
#   PYTHON=.venv/bin/python bash sweeps/gmoe_rotatedmnist5k.sh [OUTPUT_DIR]
# Environment: STEPS (default 201), BATCH (per domain, default 16), CHECKPOINT_FREQ (100),
# ALGORITHMS ("GMoE ERM_ViT ERM"), PARALLEL=2 runs the first algorithm and the others as two
# single-threaded sweeps side by side (more jobs per minute on 2 cores than one 2-thread sweep),
# DRY_RUN=1 prints the jobs and commands only.
set -euo pipefail
PYTHON=${PYTHON:-python}
OUT=${1:-sweep_output/gmoe_rotatedmnist5k}
read -r -a ALGORITHMS <<< "${ALGORITHMS:-GMoE ERM_ViT ERM}"
EXTRA=()
[ "${DRY_RUN:-0}" = 1 ] && EXTRA+=(--dry_run)
sweep() {
    "$PYTHON" -m dg_plugins.scripts.sweep launch \
        --datasets RotatedMNIST5k --data_dir builtin --output_dir "$OUT" \
        --algorithms "$@" --command_launcher local --n_hparams 1 --n_trials 3 \
        --single_test_envs --steps "${STEPS:-201}" --checkpoint_freq "${CHECKPOINT_FREQ:-100}" \
        --hparams "{\"batch_size\": ${BATCH:-16}}" --skip_confirmation "${EXTRA[@]}"
}
if [ "${PARALLEL:-1}" = 2 ] && [ ${#ALGORITHMS[@]} -gt 1 ]; then
    OMP_NUM_THREADS=1 sweep "${ALGORITHMS[0]}" > "$OUT.part1.log" 2>&1 &
    first=$!
    OMP_NUM_THREADS=1 sweep "${ALGORITHMS[@]:1}" > "$OUT.part2.log" 2>&1 &
    second=$!
    trap 'kill -TERM "$first" "$second" 2>/dev/null; wait' TERM INT
    status=0
    wait "$first" || status=$?
    wait "$second" || status=$?
    tail -n 3 "$OUT.part1.log" "$OUT.part2.log"
    [ "$status" = 0 ] || echo "a sweep exited with status $status" >&2
else
    sweep "${ALGORITHMS[@]}"
fi
[ "${DRY_RUN:-0}" = 1 ] && exit 0
"$PYTHON" -m dg_plugins.scripts.collect_results --input_dir "$OUT" --selection iid oracle \
    --format markdown
