#!/usr/bin/env bash
# GMoE (Li et al., ICLR 2023, Table 1) and its dense baseline ERM_ViT on the paper's five DomainBed
# datasets: DeiT-S/16 with ImageNet weights (hparam pretrained, the default), the per-dataset lr /
# weight decay of the official hparams_registry (GMoE's and ERM_ViT's defaults), batch 32 per
# domain, every domain held out once, 3 trials, train-validation (iid) selection.
# Steps and checkpoint frequency per dataset as the official fork: 5001 / 300, DomainNet 15001 / 500
# (our sweep takes one --steps per call, so each dataset is its own sweep call into one folder).
# Needs the datasets under DATA_DIR and a GPU (about 2.5 GPU-hours per 5001-step DeiT-S job).
#   PYTHON=.venv/bin/python bash sweeps/gmoe_domainbed.sh DATA_DIR [OUTPUT_DIR] [DATASET ...]
# Environment: N_HPARAMS (default 1: the defaults only, hparams_seed 0; DomainBed's search: 20),
# N_TRIALS (3), LAUNCHER (local; multi_gpu or submitit on clusters), ALGORITHMS ("GMoE ERM_ViT"),
# DRY_RUN=1 prints the jobs and commands without running anything.
set -euo pipefail
PYTHON=${PYTHON:-python}
DATA_DIR=${1:?usage: gmoe_domainbed.sh DATA_DIR [OUTPUT_DIR] [DATASET ...]}
OUT=${2:-sweep_output/gmoe_domainbed}
shift 2 || shift $#
DATASETS=("$@")
[ ${#DATASETS[@]} -gt 0 ] || DATASETS=(PACS VLCS OfficeHome TerraIncognita DomainNet)
read -r -a ALGORITHMS <<< "${ALGORITHMS:-GMoE ERM_ViT}"
EXTRA=()
[ "${DRY_RUN:-0}" = 1 ] && EXTRA+=(--dry_run)
for dataset in "${DATASETS[@]}"; do
    steps=5001; freq=300
    if [ "$dataset" = DomainNet ]; then steps=15001; freq=500; fi
    "$PYTHON" -m dg_plugins.scripts.sweep launch \
        --datasets "$dataset" --algorithms "${ALGORITHMS[@]}" \
        --data_dir "$DATA_DIR" --output_dir "$OUT" \
        --command_launcher "${LAUNCHER:-local}" \
        --n_hparams "${N_HPARAMS:-1}" --n_trials "${N_TRIALS:-3}" --single_test_envs \
        --steps "$steps" --checkpoint_freq "$freq" --skip_confirmation "${EXTRA[@]}"
done
[ "${DRY_RUN:-0}" = 1 ] && exit 0
"$PYTHON" -m dg_plugins.scripts.collect_results --input_dir "$OUT" --selection iid oracle \
    --format markdown
