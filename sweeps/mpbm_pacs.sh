#!/usr/bin/env bash
# MPBM paper setting, PACS single-source DG: ResNet-18 (ImageNet-pretrained, torchvision
# weights), each of the four domains as the source in turn, tested on the other three (the
# sweep's --single_source). Needs PACS under DATA_DIR/PACS/<domain>/<class>/ and the ResNet-18
# weights (download or --hparams pretrained_path), and a GPU (5,001 steps per job).
#
#   PYTHON=.venv/bin/python bash sweeps/mpbm_pacs.sh DATA_DIR [OUTPUT_DIR] [--dry_run]
#
# ERM and MPBM, 3 trials, default hparams (DomainBed's Adam lr 5e-5, batch 32; MPBM's defaults:
# N_b = T = 5, lambda_adv = lambda_mix = 0.5, 1,000 warm-up steps, eta = 2/255).
# Reported in the paper (arXiv 2502.16064, from its summary): MPBM 54.5 PACS average.
set -euo pipefail
PYTHON=${PYTHON:-python}
DATA=${1:?usage: mpbm_pacs.sh DATA_DIR [OUTPUT_DIR] [--dry_run]}
OUT=${2:-sweep_output/mpbm_pacs}
EXTRA=("${@:3}")
"$PYTHON" -m dg_plugins.scripts.sweep launch --single_source --datasets PACS --data_dir "$DATA" \
    --algorithms ERM MPBM --n_hparams 1 --n_trials 3 \
    --hparams '{"resnet18": true, "resnet50_augmix": false}' \
    --output_dir "$OUT" --command_launcher "${LAUNCHER:-local}" --skip_confirmation "${EXTRA[@]}"
if [[ " ${EXTRA[*]} " != *" --dry_run "* ]]; then
    "$PYTHON" -m dg_plugins.scripts.collect_results --input_dir "$OUT" --single_source on \
        --selection iid oracle --format markdown
fi
