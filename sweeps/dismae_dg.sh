#!/usr/bin/env bash
# DisMAE (Zhang et al., ECCV 2024), its DG setting: multi-source DG on PACS and VLCS with the CE
# term (dismae_lambda2 1.0, linear head), ViT-B/16 from random init, against ERM on the same ViT
# and the plain MAE baseline; DomainBed's protocol (each domain held out, 5001 steps, 32 images per
# domain, training-domain validation and oracle), DisMAE's hparam defaults, 3 trials; tables beside
# the paper's rows (dismae_dg).
# PROTOCOL=domainbed only: the release has no DG script and never evaluates; what this setting
# takes from the release and what it does otherwise (lambda2, batch, epochs, augmentation):
#   python -m dg_plugins.scripts.reproduce dismae_dg --describe
# Needs (checked for every sweep before the first starts; DRY_RUN=1 lists what is missing):
#   PACS and VLCS under DATA_DIR (those of DATASETS):
#     python -m dg_plugins.scripts.download --data_dir DATA_DIR PACS VLCS
#   no pretrained weights (every ViT starts from random init); a GPU.
#   DATA_DIR=/data [LAUNCHER=multi_gpu] [DRY_RUN=1] bash sweeps/dismae_dg.sh [sweep flags]
# Knobs: DATASETS, ALGORITHMS, TEST_ENVS, STEPS, N_TRIALS, HPARAMS (sweeps/_common.sh).
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
reproduce dismae_dg
