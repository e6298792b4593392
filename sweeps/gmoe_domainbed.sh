#!/usr/bin/env bash
# GMoE (Li et al., ICLR 2023), Table 1: GMoE-S/16 and its dense baseline ERM_ViT (DeiT-S/16 with
# ImageNet weights) on PACS, VLCS, OfficeHome, TerraIncognita and DomainNet, every domain held out
# once, the release's per-dataset lr / weight decay (GMoE's and ERM_ViT's defaults), batch 32 per
# domain, 5001 steps and a checkpoint every 300 (DomainNet: 15001 / 500), 3 trials, training-domain
# validation; the tables print the paper's rows beside ours (gmoe_domainbed).
#   PROTOCOL=release (default): GMoE evaluates at capacity 1.5 as in training (the release's
#     evaluation: a prediction depends on the other images of its batch);
#   PROTOCOL=domainbed: batch-independent evaluation (no token dropped, dg_plugins' default).
# Every value with its source: python -m dg_plugins.scripts.reproduce gmoe_domainbed --describe
# Needs (checked for every sweep before the first starts; DRY_RUN=1 lists what is missing):
#   the datasets under DATA_DIR (those of DATASETS):
#     python -m dg_plugins.scripts.download --data_dir DATA_DIR PACS VLCS OfficeHome TerraIncognita DomainNet
#   timm's DeiT-S/16 ImageNet weights (deit_small_patch16_224) in the Hugging Face cache
#     (HF_HOME; fetched on first use when online), or HPARAMS='{"pretrained_path": FILE}' or
#     '{"pretrained": false}' (random init: a smoke test);
#   a GPU.
#   DATA_DIR=/data [PROTOCOL=release] [LAUNCHER=multi_gpu] [DRY_RUN=1] \
#       bash sweeps/gmoe_domainbed.sh [sweep flags]
# Knobs: DATASETS ("PACS VLCS ..."), ALGORITHMS ("GMoE ERM_ViT"), N_HPARAMS (default 1: the
# defaults; 20: DomainBed's random search, lr 10^U(-4.5,-2.5) as the release), N_TRIALS, HPARAMS,
# TEST_ENVS, STEPS.
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
reproduce gmoe_domainbed
