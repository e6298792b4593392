#!/usr/bin/env bash
# DisMAE's main setting (ECCV 2024, arXiv 2407.07544), DARLING's UDG protocol on DomainNet-20:
# self-supervised pretraining on 3 unlabelled DomainNet domains, fine-tuning on 1/5/10/100% of
# their labels, testing on the other 3 domains; both 3+3 splits; DisMAE vs MAE vs ERM trained
# from scratch on the labelled fraction (all ViT-B/16, random init); 3 trials.
# Needs DomainBed's DomainNet under DATA_DIR/domain_net (20 classes are read, see
# dg_plugins/datasets/domainnet20.py) and GPUs; NOT run here (no data, no GPU in this session).
#
#   PYTHON=.venv/bin/python bash sweeps/dismae_udg_domainnet20.sh DATA_DIR [OUT] [sweep flags...]
#   e.g. ... --dry_run   (prints the 72 jobs; --command_launcher multi_gpu to run them)
#
# Steps: the release pretrains 501 epochs at 96 images per domain and fine-tunes 51 epochs. In
# DomainBed steps an epoch is min(source in-split size) / batch: set PRETRAIN_STEPS and STEPS
# from your copy (python -m dg_plugins.scripts.check_data --dataset DomainNet20 --data_dir
# DATA_DIR prints the sizes); DCLS_EPOCH maps the domain classifier's epoch schedule to steps
# (hparam dismae_dcls_epoch_steps = steps per epoch). The defaults below assume ~4,800 images
# per source domain (in-split), i.e. 50 steps per epoch at batch 96.
# Splits: envs are clip info paint quick real sketch (0..5): 0,1,3 = test on clipart, infograph,
# quickdraw (pretrain/fine-tune on painting, real, sketch); 2,4,5 = the reverse.
# Pretraining runs once per (algorithm, split, trial) and is reused by the 4 label fractions
# (dg_plugins.engine.udg); with a parallel launcher the other fractions wait for it.
set -euo pipefail
PYTHON=${PYTHON:-python}
DATA_DIR=${1:?usage: dismae_udg_domainnet20.sh DATA_DIR [OUT] [sweep flags...]}
OUT=${2:-sweep_output/dismae_udg_domainnet20}
shift $(( $# >= 2 ? 2 : 1 ))
PRETRAIN_STEPS=${PRETRAIN_STEPS:-25050}   # 501 epochs x 50 steps
STEPS=${STEPS:-2550}                      # 51 epochs x 50 steps (fine-tuning)
DCLS_EPOCH=${DCLS_EPOCH:-50}
LAUNCHER=${LAUNCHER:-multi_gpu}
COMMON=(--datasets DomainNet20 --data_dir "$DATA_DIR" --output_dir "$OUT"
        --test_env_sets 0,1,3 2,4,5 --label_fractions 0.01 0.05 0.1 1.0
        --pretrain_steps "$PRETRAIN_STEPS" --steps "$STEPS" --checkpoint_freq 250
        --n_hparams 1 --n_trials 3 --command_launcher "$LAUNCHER" --skip_confirmation)
# one command per algorithm (their hparams differ); one output folder, one table
"$PYTHON" -m dg_plugins.scripts.sweep launch --algorithms DisMAE "${COMMON[@]}" \
    --hparams "{\"batch_size\": 96, \"vit_arch\": \"vit_base_patch16_224\", \"dismae_dcls_epoch_steps\": $DCLS_EPOCH}" "$@"
"$PYTHON" -m dg_plugins.scripts.sweep launch --algorithms MAE "${COMMON[@]}" \
    --hparams '{"batch_size": 96, "vit_arch": "vit_base_patch16_224"}' "$@"
"$PYTHON" -m dg_plugins.scripts.sweep launch --algorithms ERM "${COMMON[@]}" \
    --hparams '{"batch_size": 96, "backbone": "vit", "vit_arch": "vit_base_patch16_224", "pretrained": false}' "$@"
if [[ " $* " != *" --dry_run "* ]]; then
    "$PYTHON" -m dg_plugins.scripts.collect_results --input_dir "$OUT" --selection iid oracle \
        --format markdown
fi
