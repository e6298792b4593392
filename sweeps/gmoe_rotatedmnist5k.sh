#!/usr/bin/env bash
# Offline study: GMoE vs its dense baseline ERM_ViT vs ERM (DomainBed's MNIST CNN, width 32) on the
# built-in RotatedMNIST5k (no download, CPU), 3 trials, every domain held out once, default hparams
# except the batch size, which (like the steps) is the same for all three algorithms.
# GMoE and ERM_ViT use the 28x28 ViT preset dg_vit_patch4_28 (6 blocks, width 64, random init; GMoE:
# MoE FFNs in blocks 2 and 4, 6 experts, top-1). Steps and batch are cut to fit a 2-core machine
# (the full-strength benchmark, sweeps/rotatedmnist5k_benchmark.sh, runs 501 steps at batch 64).
#   [PYTHON=.venv/bin/python] [OUTPUT_DIR=sweep_output/gmoe_rotatedmnist5k] [DRY_RUN=1] \
#       bash sweeps/gmoe_rotatedmnist5k.sh [sweep flags]
# Knobs: STEPS (default 201), BATCH (per domain, default 16), CHECKPOINT_FREQ (100),
# ALGORITHMS ("GMoE ERM_ViT ERM"), PARALLEL=2 runs the first algorithm and the others as two
# single-threaded sweeps side by side (more jobs per minute on 2 cores than one 2-thread sweep;
# logs in OUTPUT_DIR.part1.log and OUTPUT_DIR.part2.log); conventions and LAUNCHER:
# sweeps/_common.sh.
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
read -r -a ALGORITHM_LIST <<< "${ALGORITHMS:-GMoE ERM_ViT ERM}"
sweep() {
    sweep_launch --datasets RotatedMNIST5k --data_dir builtin --output_dir "$OUTPUT_DIR" \
        --algorithms "$@" --n_hparams 1 --n_trials 3 --single_test_envs \
        --steps "${STEPS:-201}" --checkpoint_freq "${CHECKPOINT_FREQ:-100}" \
        --hparams "{\"batch_size\": ${BATCH:-16}}"
}
if [[ "${PARALLEL:-1}" == 2 && ${#ALGORITHM_LIST[@]} -gt 1 && "$DRY_RUN" != 1 ]]; then
    mkdir -p "$(dirname "$OUTPUT_DIR")"
    OMP_NUM_THREADS=1 sweep "${ALGORITHM_LIST[0]}" > "$OUTPUT_DIR.part1.log" 2>&1 &
    first=$!
    OMP_NUM_THREADS=1 sweep "${ALGORITHM_LIST[@]:1}" > "$OUTPUT_DIR.part2.log" 2>&1 &
    second=$!
    trap 'kill -TERM "$first" "$second" 2>/dev/null; wait' INT TERM
    status=0
    wait "$first" || status=$?
    wait "$second" || status=$?
    tail -n 3 "$OUTPUT_DIR.part1.log" "$OUTPUT_DIR.part2.log"
    if [[ "$status" != 0 ]]; then
        echo "a sweep exited with status $status" >&2
        exit "$status"
    fi
else
    sweep "${ALGORITHM_LIST[@]}"
fi
finish_dry_run
"$PYTHON" -m dg_plugins.scripts.collect_results --input_dir "$OUTPUT_DIR" --selection iid oracle \
    --format markdown
