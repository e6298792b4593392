#!/usr/bin/env bash
# GMoE (Li et al., ICLR 2023), Table 3: single-source DomainNet, trained on painting (environment
# 2), tested on the other five domains; GMoE and ERM_ViT (DeiT-S/16, ImageNet weights), DomainNet
# lr 5e-5 and weight decay 0, 15001 steps, a checkpoint every 500, 3 trials; single-source tables
# (painting validation = training-domain validation, and oracle) beside the paper's rows
# (gmoe_single_source_domainnet).
#   PROTOCOL=release (default): GMoE evaluates at capacity 1.5 as in training (the release);
#   PROTOCOL=domainbed: batch-independent evaluation (dg_plugins' default).
# The other sources (sweep --single_source) are not part of the paper's table: run
# python -m dg_plugins.scripts.sweep launch ... --single_source for them.
# Every value with its source:
#   python -m dg_plugins.scripts.reproduce gmoe_single_source_domainnet --describe
# Needs (checked for every sweep before the first starts; DRY_RUN=1 lists what is missing):
#   DomainNet under DATA_DIR:
#     python -m dg_plugins.scripts.download --data_dir DATA_DIR DomainNet
#   timm's DeiT-S/16 ImageNet weights (deit_small_patch16_224) in the Hugging Face cache
#     (HF_HOME; fetched on first use when online), or HPARAMS='{"pretrained_path": FILE}' or
#     '{"pretrained": false}' (random init: a smoke test);
#   a GPU.
#   DATA_DIR=/data [PROTOCOL=release] [LAUNCHER=multi_gpu] [DRY_RUN=1] \
#       bash sweeps/gmoe_single_source_domainnet.sh [sweep flags]
# Knobs: ALGORITHMS ("GMoE ERM_ViT"), N_TRIALS, HPARAMS, STEPS (sweeps/_common.sh).
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
reproduce gmoe_single_source_domainnet
