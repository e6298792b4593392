#!/usr/bin/env bash
# MPBM offline single-source study on the built-in RotatedMNIST5k (CPU, no download):
# MPBM vs ERM, plus the paper's two ablations as separate runs (MPBM with mpbm_lambda_mix = 0,
# MPBM with mpbm_lambda_adv = 0), default hparams otherwise, 3 trials.
#   [PYTHON=.venv/bin/python] [OUTPUT_DIR=sweep_output/mpbm_rotatedmnist5k_study] [DRY_RUN=1] \
#       bash sweeps/mpbm_rotatedmnist5k_study.sh [sweep flags]
# Knobs: STEPS (301), TRIALS (3), SOURCES ("0"); conventions and LAUNCHER: sweeps/_common.sh.
#
# Each configuration is its own sweep folder (a result table shows one row per algorithm name, so
# two configurations of MPBM need two folders): OUTPUT_DIR/main (ERM and MPBM), OUTPUT_DIR/no_mix,
# OUTPUT_DIR/no_adv. The jobs are exactly those of
#   python -m dg_plugins.scripts.sweep launch --single_source --datasets RotatedMNIST5k \
#       --data_dir builtin --algorithms ERM MPBM --n_hparams 1 --n_trials 3 \
#       --steps $STEPS --checkpoint_freq 50 [--hparams JSON] --output_dir OUTPUT_DIR/<config>
# (same arguments, same md5 job folders: a source s is the test environment set of every other
# environment) restricted to the source environments in $SOURCES (default "0": train on upright
# digits, test on 15..75 degrees), so that a machine with more time completes the other sources by
# running that sweep command into the same folders.
# Budget on 2 CPU cores: about 20 minutes with the defaults below (MPBM costs ~5-7 ERM steps per
# step after its 100-step warm-up).
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
read -r -a SOURCE_LIST <<< "${SOURCES:-0}"
TEST_ENV_SETS=()
for source in "${SOURCE_LIST[@]}"; do
    if ! [[ "$source" =~ ^[0-5]$ ]]; then
        echo "error: SOURCES holds RotatedMNIST5k environment indices 0-5, got '$source'" >&2
        exit 2
    fi
    others=()
    for env in 0 1 2 3 4 5; do [[ "$env" == "$source" ]] || others+=("$env"); done
    TEST_ENV_SETS+=("$(IFS=,; echo "${others[*]}")")
done
run_config() {  # run_config <folder> <hparams JSON or ""> <algorithm>...
    local folder=$1 hparams=$2
    shift 2
    local flags=(--datasets RotatedMNIST5k --data_dir builtin --output_dir "$OUTPUT_DIR/$folder"
                 --algorithms "$@" --test_env_sets "${TEST_ENV_SETS[@]}" --n_hparams 1
                 --n_trials "${TRIALS:-3}" --steps "${STEPS:-301}" --checkpoint_freq 50)
    if [[ -n "$hparams" ]]; then flags+=(--hparams "$hparams"); fi
    sweep_launch "${flags[@]}"
}
run_config main "" ERM MPBM
run_config no_mix '{"mpbm_lambda_mix": 0.0}' MPBM
run_config no_adv '{"mpbm_lambda_adv": 0.0}' MPBM
finish_dry_run
for config in main no_mix no_adv; do
    echo "== $config"
    "$PYTHON" -m dg_plugins.scripts.collect_results --input_dir "$OUTPUT_DIR/$config" \
        --single_source on --format markdown
done
