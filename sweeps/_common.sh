# Sourced by every script in sweeps/: their one calling convention.
#
#   [PYTHON=python] [DATA_DIR=/data] [OUTPUT_DIR=sweep_output/<script>] [LAUNCHER=local] \
#   [DRY_RUN=1] [PROTOCOL=release|domainbed] [EVAL_SPLITS=selection|all] \
#   bash sweeps/<script>.sh [sweep flags...]
#
# PYTHON      the interpreter whose dg_plugins runs everything (default: python)
# DATA_DIR    the data folder (paper scripts; the offline scripts use the built-in datasets)
# OUTPUT_DIR  the sweep folder (default: sweep_output/<script name>; paper scripts write each
#             protocol into OUTPUT_DIR/<protocol>)
# LAUNCHER    the sweep's --command_launcher: local (default), multi_gpu, submitit, ...
# DRY_RUN=1   print every sweep call's jobs and commands, the number of jobs and the total steps;
#             launch nothing, write nothing
# PROTOCOL    paper scripts: release (the official release's protocol; the default where a
#             release exists) or domainbed (DomainBed's protocol with the paper's hparams);
#             python -m dg_plugins.scripts.reproduce <setting> --describe lists every value
# EVAL_SPLITS selection (default): every job evaluates only the splits model selection reads
#             (every out-split, the test environments' in-splits): the same tables for less
#             evaluation; all: every split at every record (full learning curves). A sweep
#             started with one value is continued with the same one (the launch says so).
# N_WORKERS   every job's loader workers (default: one per core the job has; multi_gpu divides
#             the machine's cores among the jobs it runs at once)
# DG_JOBS_PER_GPU  LAUNCHER=multi_gpu: jobs at once on each GPU (default 1; checked against the
#             GPUs' free memory before packing)
# Arguments are sweep flags passed to every `sweep launch` (e.g. --n_trials 1, --n_hparams 20,
# --slurm_partition gpu). Every launch carries --resume: rerunning a script continues where it
# stopped (finished jobs are skipped, interrupted ones resume from their last checkpoint).
# Each script lists its own study knobs (environment variables) in its header.
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    echo "error: sweeps/_common.sh is sourced by the scripts in sweeps/, not run" >&2
    exit 2
fi
set -euo pipefail
SCRIPT=$(basename "${BASH_SOURCE[1]}" .sh)
declare -A GIVEN_KNOBS=()  # the knobs defaulted below, as given (for script_command)
for _knob in PYTHON OUTPUT_DIR LAUNCHER EVAL_SPLITS; do GIVEN_KNOBS[$_knob]=${!_knob:-}; done
PYTHON=${PYTHON:-python}
if ! command -v "$PYTHON" > /dev/null; then
    echo "error: PYTHON=$PYTHON is not a command; point PYTHON at the interpreter that has" \
         "dg_plugins installed, e.g. PYTHON=.venv/bin/python bash sweeps/$SCRIPT.sh" >&2
    exit 2
fi
OUTPUT_DIR=${OUTPUT_DIR:-sweep_output/$SCRIPT}
LAUNCHER=${LAUNCHER:-local}
DRY_RUN=${DRY_RUN:-0}
if [[ "$DRY_RUN" != 0 && "$DRY_RUN" != 1 ]]; then
    echo "error: DRY_RUN must be 1 (list the jobs only) or 0, got '$DRY_RUN'" >&2
    exit 2
fi
EVAL_SPLITS=${EVAL_SPLITS:-selection}
if [[ "$EVAL_SPLITS" != selection && "$EVAL_SPLITS" != all ]]; then
    echo "error: EVAL_SPLITS must be selection (evaluate what model selection reads) or all" \
         "(every split at every record), got '$EVAL_SPLITS'" >&2
    exit 2
fi
if (( $# )) && [[ "$1" != -* ]]; then
    echo "error: sweeps/$SCRIPT.sh takes sweep flags as arguments (e.g. --n_trials 1), not" \
         "'$1'; set DATA_DIR, OUTPUT_DIR, LAUNCHER, ... in the environment, e.g." \
         "DATA_DIR=/data bash sweeps/$SCRIPT.sh" >&2
    exit 2
fi
SCRIPT_ARGS=("$@")
SWEEP_FLAGS=("$@")
if [[ -n "${N_WORKERS:-}" ]]; then SWEEP_FLAGS+=(--n_workers "$N_WORKERS"); fi
if [[ -n "${DG_JOBS_PER_GPU:-}" ]]; then SWEEP_FLAGS+=(--jobs_per_gpu "$DG_JOBS_PER_GPU"); fi
PLANNED=()

# quote WORD: the word as a shell reads it back (as is when safe, else in single quotes).
quote() {
    if [[ "$1" =~ ^[A-Za-z0-9_./:=,+@%-]+$ ]]; then printf %s "$1"
    else printf "'%s'" "${1//\'/\'\\\'\'}"; fi
}

# script_command KNOB...: the command that ran this script, to run it again: the named knobs
# the user set (KNOB=value), then bash <script> and its arguments, each word quoted.
script_command() {
    local line="" knob value word
    for knob in "$@"; do
        value=${!knob:-}
        if [[ -v "GIVEN_KNOBS[$knob]" ]]; then value=${GIVEN_KNOBS[$knob]}; fi
        if [[ -n "$value" ]]; then line+="$knob=$(quote "$value") "; fi
    done
    line+="bash $(quote "$0")"
    for word in "${SCRIPT_ARGS[@]}"; do line+=" $(quote "$word")"; done
    printf %s "$line"
}

# sweep_launch FLAGS...: one `sweep launch` (with --resume, --eval_splits $EVAL_SPLITS and the
# script's arguments); under DRY_RUN=1 only recorded, then listed by finish_dry_run.
sweep_launch() {
    if [[ "$DRY_RUN" == 1 ]]; then
        PLANNED+=(:: launch "$@" --resume --eval_splits "$EVAL_SPLITS" "${SWEEP_FLAGS[@]}")
    else
        "$PYTHON" -m dg_plugins.scripts.sweep launch "$@" --resume --skip_confirmation \
            --eval_splits "$EVAL_SPLITS" --command_launcher "$LAUNCHER" "${SWEEP_FLAGS[@]}"
    fi
}

# finish_dry_run: under DRY_RUN=1, list the recorded calls (jobs, commands, count, total steps)
# and exit; otherwise return.
finish_dry_run() {
    if [[ "$DRY_RUN" == 1 ]]; then
        "$PYTHON" -m dg_plugins.scripts.reproduce --dry_run_sweeps "${PLANNED[@]}"
        exit $?
    fi
}

# reproduce SETTING: the paper scripts' body, a thin wrapper over
# python -m dg_plugins.scripts.reproduce SETTING (dg_plugins/reference/paper_settings.py).
# Knobs: DATASETS / ALGORITHMS (a subset of the setting's), TEST_ENVS (a subset of its
# test-environment sets, e.g. "0" or "1,2,3"), EPOCHS / PRETRAIN_EPOCHS (replace an epoch-based
# setting's lengths), STEPS (replace a step-based setting's steps: a trial run), N_TRIALS,
# N_HPARAMS, HPARAMS (JSON added to every run's hparams, e.g. '{"pretrained_path":
# "/weights/resnet18.pth"}' or '{"pretrained": false}'), CLIP_CHECKPOINT (IP/OOP: a local file of
# the CLIP weights that score the images). Before launching anything, reproduce checks what every
# sweep of the setting needs (data, split lists, pretrained and CLIP weights) and lists what is
# missing with its fix (DRY_RUN=1: as warnings). Then every job of every sweep of the setting goes
# to LAUNCHER as one queue (LAUNCHER=multi_gpu keeps every GPU busy), each in its sweep's folder.
reproduce() {
    local setting=$1
    if [[ -z "${DATA_DIR:-}" ]]; then
        echo "error: set DATA_DIR to the data folder: DATA_DIR=/data bash sweeps/$SCRIPT.sh" >&2
        exit 2
    fi
    local args=(--data_dir "$DATA_DIR" --output_dir "$OUTPUT_DIR" --command_launcher "$LAUNCHER"
                --eval_splits "$EVAL_SPLITS")
    local names=()
    if [[ -n "${PROTOCOL:-}" ]]; then args+=(--protocol "$PROTOCOL"); fi
    if [[ -n "${DATASETS:-}" ]]; then
        read -r -a names <<< "$DATASETS"
        args+=(--datasets "${names[@]}")
    fi
    if [[ -n "${ALGORITHMS:-}" ]]; then
        read -r -a names <<< "$ALGORITHMS"
        args+=(--algorithms "${names[@]}")
    fi
    if [[ -n "${TEST_ENVS:-}" ]]; then
        read -r -a names <<< "$TEST_ENVS"
        args+=(--test_envs "${names[@]}")
    fi
    if [[ -n "${EPOCHS:-}" ]]; then args+=(--epochs "$EPOCHS"); fi
    if [[ -n "${STEPS:-}" ]]; then args+=(--steps "$STEPS"); fi
    if [[ -n "${CLIP_CHECKPOINT:-}" ]]; then args+=(--clip_checkpoint "$CLIP_CHECKPOINT"); fi
    if [[ -n "${PRETRAIN_EPOCHS:-}" ]]; then args+=(--pretrain_epochs "$PRETRAIN_EPOCHS"); fi
    if [[ -n "${HPARAMS:-}" ]]; then args+=(--hparams "$HPARAMS"); fi
    if [[ -n "${N_TRIALS:-}" ]]; then args+=(--n_trials "$N_TRIALS"); fi
    if [[ -n "${N_HPARAMS:-}" ]]; then args+=(--n_hparams "$N_HPARAMS"); fi
    if [[ "$DRY_RUN" == 1 ]]; then args+=(--dry_run); fi
    # what a stopped or failed run suggests to continue: this script's command, which continues
    # every sweep of the setting (one queue: docs/reproduce.md)
    export DG_SWEEP_RERUN_COMMAND=${DG_SWEEP_RERUN_COMMAND:-$(script_command PYTHON DATA_DIR \
        OUTPUT_DIR LAUNCHER PROTOCOL DATASETS ALGORITHMS TEST_ENVS EPOCHS PRETRAIN_EPOCHS STEPS \
        N_TRIALS N_HPARAMS HPARAMS CLIP_CHECKPOINT EVAL_SPLITS N_WORKERS DG_JOBS_PER_GPU)}
    exec "$PYTHON" -m dg_plugins.scripts.reproduce "$setting" "${args[@]}" "${SWEEP_FLAGS[@]}"
}
