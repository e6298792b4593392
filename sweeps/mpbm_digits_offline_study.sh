#!/usr/bin/env bash
# MPBM's schedules, value projection and diagnostics on the offline digits benchmark DigitsOffline
# (dg_plugins/datasets/digits_offline.py; results/digits_offline.md): train on MNIST (environment
# 0), test on the SVHN-, MNIST-M-, SYN- and USPS-like domains, LeNet from scratch, Adam lr 1e-4,
# batch 32, STEPS steps (1,001: ERM's source accuracy has levelled off by step 600), TRIALS trials.
# No download, CPU only.
#
#   [PYTHON=.venv/bin/python] [OUTPUT_DIR=sweep_output/mpbm_digits_offline_study] [DRY_RUN=1] \
#   bash sweeps/mpbm_digits_offline_study.sh [sweep flags]
#   knobs: STEPS (1001), CHECKPOINT_FREQ (100), TRIALS (3), SGLD_NOISE (0.03: the noise scale of
#        phased_noise), CONFIGS (the folders to run, default all eight, in order), PARALLEL (1: one
#        configuration after the other; 2: two lanes of configurations at once);
#        conventions and LAUNCHER: sweeps/_common.sh
#
# One sweep folder per configuration (a table shows one row per algorithm name); every job is
# `sweep launch --test_env_sets 1,2,3,4`, i.e. the source-0 job of `sweep launch --single_source`:
#   erm            ERM
#   color_jitter   ERM with the dataset hparam digits_color_jitter 0.8 (plain colour augmentation,
#                  the reference)
#   online         MPBM, mpbm_schedule online: the earlier per-step alternation (STEPS/10 ERM
#                  warm-up steps, SGLD + g/D step + f/h step every step after; C every 100 steps)
#   phased         MPBM, mpbm_schedule phased (the paper's alternation): STEPS/2 pre-training
#                  steps, then 2 rounds of 50 C steps, 10 query steps, STEPS/20 g/D steps,
#                  32 steps making a 1,024-feature synthetic set and STEPS/10 fine-tuning steps
#                  (the last round's fine-tuning lasts to the end): the defaults' fractions of the
#                  dataset's default budget (dg_plugins/algorithms/mpbm.py) applied to STEPS
#   phased_value   phased with mpbm_value_proj true (a learned value projection: the mixes may
#                  leave the per-dimension hull of the real features)
#   phased_noise   phased with mpbm_sgld_noise SGLD_NOISE (queries that stay recognisable: the
#                  largest noise scale whose queries keep a mean correlation of at least 0.9 with
#                  their source images under the ERM model of trial 0, measured by
#                  results/tools/mpbm_query_noise.py; see the results file)
#   phased_no_mix  phased with mpbm_lambda_mix 0 (fine-tuning without the synthetic set: the same
#                  seeds, batches and schedule as phased, so the pair isolates what the mixes do)
#   online_no_mix  online with mpbm_lambda_mix 0: its f/h steps are plain ERM steps on the MPBM
#                  jobs' seeds and batches (sweep seeds depend on the algorithm name, so the ERM
#                  row has other ones): the seed-matched ERM control of every MPBM row
# Every MPBM configuration: mpbm_eta 1.0 ([0, 1] pixels), diagnostics every 50 steps.
# Then each folder's single-source tables (training-domain validation and oracle selection), the
# study table with standard errors (results/tools/mpbm_study_table.py) and the diagnostics
# (results/tools/mpbm_diagnostics.py).
# Measured on 2 shared CPU cores, one thread per job (OMP_NUM_THREADS=1): see the results file.
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
OUT=$OUTPUT_DIR
STEPS=${STEPS:-1001}
CHECKPOINT_FREQ=${CHECKPOINT_FREQ:-100}
TRIALS=${TRIALS:-3}
SGLD_NOISE=${SGLD_NOISE:-0.03}
CONFIGS=(${CONFIGS:-erm color_jitter online phased phased_value phased_noise phased_no_mix
    online_no_mix})
PARALLEL=${PARALLEL:-1}

BASE='"lr": 0.0001, "batch_size": 32'
# every MPBM hparam the study varies or relies on is explicit (the defaults may change)
MPBM="$BASE, \"mpbm_eta\": 1.0, \"mpbm_diag_every\": 50"
ONLINE="$MPBM, \"mpbm_schedule\": \"online\", \"mpbm_warmup_steps\": $((STEPS / 10))"
ONLINE="$ONLINE, \"mpbm_corr_every\": 100"
PHASED="$MPBM, \"mpbm_schedule\": \"phased\", \"mpbm_pretrain_steps\": $((STEPS / 2))"
PHASED="$PHASED, \"mpbm_rounds\": 2, \"mpbm_corr_steps\": 50, \"mpbm_query_steps\": 10"
PHASED="$PHASED, \"mpbm_gen_steps\": $((STEPS / 20)), \"mpbm_synth_size\": 1024"
PHASED="$PHASED, \"mpbm_finetune_steps\": $((STEPS / 10))"
PLAIN='"mpbm_value_proj": false, "mpbm_sgld_noise": 1.0'

config() {  # config <folder>: prints "<algorithm>|<hparams JSON body>"
    case $1 in
        erm) echo "ERM|$BASE" ;;
        color_jitter) echo "ERM|$BASE, \"digits_color_jitter\": 0.8" ;;
        online) echo "MPBM|$ONLINE, $PLAIN" ;;
        phased) echo "MPBM|$PHASED, $PLAIN" ;;
        phased_value) echo "MPBM|$PHASED, \"mpbm_value_proj\": true, \"mpbm_sgld_noise\": 1.0" ;;
        phased_noise)
            echo "MPBM|$PHASED, \"mpbm_value_proj\": false, \"mpbm_sgld_noise\": $SGLD_NOISE" ;;
        phased_no_mix) echo "MPBM|$PHASED, $PLAIN, \"mpbm_lambda_mix\": 0.0" ;;
        online_no_mix) echo "MPBM|$ONLINE, $PLAIN, \"mpbm_lambda_mix\": 0.0" ;;
        *) echo "unknown configuration '$1' (erm color_jitter online phased phased_value" \
                "phased_noise phased_no_mix online_no_mix)" >&2; return 2 ;;
    esac
}

sweep() {  # sweep <folder>
    local spec algorithm hparams
    spec=$(config "$1")
    algorithm=${spec%%|*}
    hparams=${spec#*|}
    sweep_launch --datasets DigitsOffline --data_dir builtin --output_dir "$OUT/$1" \
        --algorithms "$algorithm" --hparams "{$hparams}" --test_env_sets 1,2,3,4 --n_hparams 1 \
        --n_trials "$TRIALS" --steps "$STEPS" --checkpoint_freq "$CHECKPOINT_FREQ"
}

for folder in "${CONFIGS[@]}"; do config "$folder" > /dev/null; done  # names checked first
if [[ "$DRY_RUN" == 1 ]]; then
    for folder in "${CONFIGS[@]}"; do sweep "$folder"; done
    finish_dry_run
fi

lane() {  # lane <index>: the configurations i with i % PARALLEL == index, one after the other
    local i status=0
    for i in "${!CONFIGS[@]}"; do
        if (( i % PARALLEL == $1 )); then sweep "${CONFIGS[$i]}" || status=1; fi
    done
    return $status
}
pids=()
for ((lane_index = 0; lane_index < PARALLEL; lane_index++)); do
    lane "$lane_index" & pids+=($!)
done
failed=0
for pid in "${pids[@]}"; do wait "$pid" || failed=1; done

for folder in "${CONFIGS[@]}"; do
    echo "== $folder"
    "$PYTHON" -m dg_plugins.scripts.collect_results --input_dir "$OUT/$folder" \
        --single_source on --selection iid oracle --format markdown
done
for selection in iid oracle; do
    echo "== study table ($selection)"
    "$PYTHON" results/tools/mpbm_study_table.py "$OUT" "${CONFIGS[@]}" --selection "$selection"
done
echo "== diagnostics"
"$PYTHON" results/tools/mpbm_diagnostics.py "$OUT" "${CONFIGS[@]}"
exit $failed
