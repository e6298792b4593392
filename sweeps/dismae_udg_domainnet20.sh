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
# Each setting and the file of the authors' release (rookiehb/DisMAE @ ff91675) it comes from:
# * pretraining: 501 epochs (script/udg_pt.sh --epochs 501), batch 96 per domain (--batch_size
#   96), mask ratio 0.8, lr 1e-4, lambda1 1e-3, lambda2 0 (script/udg_pt.sh; our hparam defaults),
#   on 99% of each source domain (train.py: --holdout_fraction default 0.01) -> --udg_split
#   release, --udg_pretrain_epochs 501 (each job prints the step count it derives);
# * fine-tuning: 51 epochs (script/udg_ft.sh --epochs 51) of the labelled data, so the step count
#   grows with the label fraction -> --udg_ft_epochs 51 (printed per job); the labelled data are
#   a fraction of the 90% in-split of each source domain, the other 10% held out
#   (script/udg_ft.sh --holdout_fraction 0.10; dataloader.py prepare_finetune_data) ->
#   --holdout_fraction 0.1 with --udg_split release; the 10% out-split is the validation data of
#   training-domain model selection, as DomainBed's holdout;
# * per-fraction mode, lr and batch (linear probe below 10%: train_finetune.py, --val_fraction <
#   0.10 freezes the blocks): dg_plugins/algorithms/udg_finetune.py FINETUNE_TABLE;
# * the domain classifier's schedule, epochs 0-5 and every 15th up to 100 (engine_dmae.py with
#   train.py's --inter_ada 15 --max_epoch_ada 100): dismae_dcls_epoch_steps left null, so the
#   epoch is the run's real one (the pretraining set at the batch above), set by the job.
# One difference we keep: the release's dataloader.py computes an epoch from the size of all six
# domains (targets included) divided by the last domain index; ours is one pass over the images
# the job trains on (see dg_plugins/engine/udg_jobs.py).
# Splits: envs are clip info paint quick real sketch (0..5): 0,1,3 = test on clipart, infograph,
# quickdraw (pretrain/fine-tune on painting, real, sketch); 2,4,5 = the reverse.
# Pretraining runs once per (algorithm, split, trial) and is reused by the 4 label fractions
# (dg_plugins.engine.udg_jobs); with a parallel launcher the other fractions wait for it.
set -euo pipefail
PYTHON=${PYTHON:-python}
DATA_DIR=${1:?usage: dismae_udg_domainnet20.sh DATA_DIR [OUT] [sweep flags...]}
OUT=${2:-sweep_output/dismae_udg_domainnet20}
shift $(( $# >= 2 ? 2 : 1 ))
PRETRAIN_EPOCHS=${PRETRAIN_EPOCHS:-501}
FT_EPOCHS=${FT_EPOCHS:-51}
LAUNCHER=${LAUNCHER:-multi_gpu}
COMMON=(--datasets DomainNet20 --data_dir "$DATA_DIR" --output_dir "$OUT"
        --test_env_sets 0,1,3 2,4,5 --label_fractions 0.01 0.05 0.1 1.0
        --udg_split release --holdout_fraction 0.1
        --udg_pretrain_epochs "$PRETRAIN_EPOCHS" --udg_ft_epochs "$FT_EPOCHS"
        --checkpoint_freq 250 --n_hparams 1 --n_trials 3 --command_launcher "$LAUNCHER"
        --skip_confirmation)
# one command per algorithm (their hparams differ); one output folder, one table
"$PYTHON" -m dg_plugins.scripts.sweep launch --algorithms DisMAE "${COMMON[@]}" \
    --hparams '{"batch_size": 96, "vit_arch": "vit_base_patch16_224"}' "$@"
"$PYTHON" -m dg_plugins.scripts.sweep launch --algorithms MAE "${COMMON[@]}" \
    --hparams '{"batch_size": 96, "vit_arch": "vit_base_patch16_224"}' "$@"
"$PYTHON" -m dg_plugins.scripts.sweep launch --algorithms ERM "${COMMON[@]}" \
    --hparams '{"batch_size": 96, "backbone": "vit", "vit_arch": "vit_base_patch16_224", "pretrained": false}' "$@"
if [[ " $* " != *" --dry_run "* ]]; then
    "$PYTHON" -m dg_plugins.scripts.collect_results --input_dir "$OUT" --selection iid oracle \
        --format markdown
fi
