#!/usr/bin/env bash
# DisMAE's DG setting (ECCV 2024, arXiv 2407.07544): multi-source DG on PACS and VLCS with the CE
# term (dismae_lambda2 1.0, linear head), ViT-B/16 from random init as released, against ERM on
# the same ViT-B/16 (random init) and the plain MAE baseline; DomainBed's protocol (each domain
# held out, training-domain validation), default hparams, 3 trials.
# Needs DomainBed's PACS and VLCS under DATA_DIR and a GPU; NOT run here (no data, no GPU).
#   PYTHON=.venv/bin/python bash sweeps/dismae_dg.sh DATA_DIR [OUT] [sweep flags, e.g. --dry_run]
set -euo pipefail
PYTHON=${PYTHON:-python}
DATA_DIR=${1:?usage: dismae_dg.sh DATA_DIR [OUT] [sweep flags...]}
OUT=${2:-sweep_output/dismae_dg}
shift $(( $# >= 2 ? 2 : 1 ))
LAUNCHER=${LAUNCHER:-multi_gpu}
COMMON=(--datasets PACS VLCS --data_dir "$DATA_DIR" --output_dir "$OUT" --single_test_envs
        --n_hparams 1 --n_trials 3 --steps 5001 --command_launcher "$LAUNCHER"
        --skip_confirmation)
"$PYTHON" -m dg_plugins.scripts.sweep launch --algorithms DisMAE MAE "${COMMON[@]}" "$@"
"$PYTHON" -m dg_plugins.scripts.sweep launch --algorithms ERM "${COMMON[@]}" \
    --hparams '{"backbone": "vit", "vit_arch": "vit_base_patch16_224", "pretrained": false}' "$@"
if [[ " $* " != *" --dry_run "* ]]; then
    "$PYTHON" -m dg_plugins.scripts.collect_results --input_dir "$OUT" --selection iid oracle \
        --format markdown
fi
