#!/usr/bin/env bash
# DisMAE (Zhang et al., ECCV 2024), its main setting: DARLING's UDG protocol on DomainNet-20
# (dg_plugins/datasets/domainnet20.py): self-supervised pretraining on 3 unlabelled DomainNet
# domains, fine-tuning on 1/5/10/100% of their labels, testing on the other 3 domains, both 3+3
# splits (0,1,3 and 2,4,5); DisMAE vs MAE vs ERM trained from scratch on the labelled fraction
# (all ViT-B/16, random init, batch 96 per domain); 3 trials; UDG tables beside the paper's rows
# (dismae_udg_domainnet20).
#   PROTOCOL=release (default): the release's lengths and split: 501 pretraining epochs on 99% of
#     each source domain, 51 fine-tuning epochs of the labelled part of the 90% in-split (the other
#     10% validates), the release's per-fraction fine-tuning mode, lr and batch;
#   PROTOCOL=domainbed: the same lengths on DomainBed's 80/20 splits.
# Every value with its release file and line, and the differences:
#   python -m dg_plugins.scripts.reproduce dismae_udg_domainnet20 --describe
# Pretraining runs once per (algorithm, split, trial) and is reused by the 4 label fractions;
# with a parallel launcher the other fractions wait for it.
# Needs (checked for every sweep before the first starts; DRY_RUN=1 lists what is missing):
#   DomainNet under DATA_DIR (DomainNet-20 reads 20 of its classes in DATA_DIR/domain_net):
#     python -m dg_plugins.scripts.download --data_dir DATA_DIR DomainNet
#   no pretrained weights (every ViT starts from random init); GPUs.
#   DATA_DIR=/data [PROTOCOL=release] [LAUNCHER=multi_gpu] [DRY_RUN=1] \
#       bash sweeps/dismae_udg_domainnet20.sh [sweep flags]
# Knobs: PRETRAIN_EPOCHS (501), EPOCHS (fine-tuning, 51), TEST_ENVS ("0,1,3" or "2,4,5"),
# ALGORITHMS, N_TRIALS, HPARAMS.
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
reproduce dismae_udg_domainnet20
