#!/usr/bin/env bash
# DMG (Chattopadhyay, Balaji, Hoffman, ECCV 2020), Table 1: DomainNet (6 domains, 345 classes),
# ImageNet-pretrained torchvision ResNet-18 and ResNet-50 (one folder each), each domain held out
# once, DMG and the Aggregate baseline (ERM), 3 trials; the tables print the paper's rows beside
# ours (dmg_domainnet_resnet18, dmg_domainnet_resnet50).
#   PROTOCOL=release (default): the release's protocol: one pooled shuffled batch of 64, Adam 1e-4
#     with an inverse lr decay of the network and the masks every step, weight decay 0, final layer
#     N(0, 0.001), the release's augmentation, 10% of each domain held out for validation, 50
#     epochs, a checkpoint every epoch, best epoch on source validation (iid:
#     DomainBed's training-domain validation keeps each run's best checkpoint);
#   PROTOCOL=domainbed: DomainBed's protocol (80/20 splits, 12 images per source per step,
#     constant lr, 5001 steps) with the paper's hparams.
# Every value with its source, and what the host cannot express:
#   python -m dg_plugins.scripts.reproduce dmg_domainnet --describe [--protocol domainbed]
# The release protocol is large (about 7,000 steps per epoch of the pooled sources): DRY_RUN=1
# prints every job's steps before anything starts.
# Needs (checked for every sweep before the first starts; DRY_RUN=1 lists what is missing):
#   DomainNet under DATA_DIR:
#     python -m dg_plugins.scripts.download --data_dir DATA_DIR DomainNet
#   torchvision's ImageNet ResNet-18 and ResNet-50 weights in the torch cache (TORCH_HOME;
#     fetched on first use when online), or HPARAMS='{"pretrained": false}' (random init: a
#     smoke test; a "pretrained_path" in HPARAMS would go to both backbones);
#   GPUs.
#   DATA_DIR=/data [PROTOCOL=release] [LAUNCHER=multi_gpu] [DRY_RUN=1] \
#       bash sweeps/dmg_domainnet_paper.sh [sweep flags]
# Knobs: EPOCHS (release), STEPS (domainbed), TEST_ENVS, ALGORITHMS, N_TRIALS, HPARAMS
# (sweeps/_common.sh).
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
reproduce dmg_domainnet
