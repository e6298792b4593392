#!/usr/bin/env bash
# GMoE's single-source study (Li et al., ICLR 2023, Table 3): train on one DomainNet domain, test on
# the other five; the paper trains on painting and reports painting validation (IID) and the other
# domains. `sweep --single_source` makes one job per source domain (6 x the paper's jobs: the
# painting rows of the single-source tables are the paper's numbers; the others come free);
# PAINTING_ONLY=1 runs just the painting jobs with train (DomainNet envs: clipart 0, infograph 1,
# painting 2, quickdraw 3, real 4, sketch 5). DeiT-S/16 ImageNet weights, DomainNet lr 5e-5, wd 0,
# 15001 steps, checkpoints every 500, 3 trials, default hparams. Needs DomainNet and a GPU.
#   PYTHON=.venv/bin/python bash sweeps/gmoe_single_source_domainnet.sh DATA_DIR [OUTPUT_DIR]
# DRY_RUN=1 prints the jobs and commands without running anything.
set -euo pipefail
PYTHON=${PYTHON:-python}
DATA_DIR=${1:?usage: gmoe_single_source_domainnet.sh DATA_DIR [OUTPUT_DIR]}
OUT=${2:-sweep_output/gmoe_single_source_domainnet}
read -r -a ALGORITHMS <<< "${ALGORITHMS:-GMoE ERM_ViT}"
if [ "${PAINTING_ONLY:-0}" = 1 ]; then
    for algorithm in "${ALGORITHMS[@]}"; do
        for trial in 0 1 2; do
            cmd=("$PYTHON" -m dg_plugins.scripts.train --dataset DomainNet --data_dir "$DATA_DIR"
                 --algorithm "$algorithm" --test_envs 0 1 3 4 5 --trial_seed "$trial"
                 --seed "$trial" --steps 15001 --checkpoint_freq 500
                 --output_dir "$OUT/${algorithm}_painting_trial$trial")
            if [ "${DRY_RUN:-0}" = 1 ]; then echo "${cmd[*]}"; else "${cmd[@]}"; fi
        done
    done
else
    EXTRA=()
    [ "${DRY_RUN:-0}" = 1 ] && EXTRA+=(--dry_run)
    "$PYTHON" -m dg_plugins.scripts.sweep launch \
        --datasets DomainNet --algorithms "${ALGORITHMS[@]}" \
        --data_dir "$DATA_DIR" --output_dir "$OUT" --command_launcher "${LAUNCHER:-local}" \
        --n_hparams 1 --n_trials 3 --single_source \
        --steps 15001 --checkpoint_freq 500 --skip_confirmation "${EXTRA[@]}"
fi
[ "${DRY_RUN:-0}" = 1 ] && exit 0
"$PYTHON" -m dg_plugins.scripts.collect_results --input_dir "$OUT" --selection iid oracle \
    --single_source on --format markdown
