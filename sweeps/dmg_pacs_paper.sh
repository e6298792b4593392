#!/usr/bin/env bash
# DMG (Chattopadhyay, Balaji, Hoffman, ECCV 2020), Table 2: PACS, ImageNet-pretrained torchvision
# ResNet-18 and ResNet-50 (one folder each), each domain held out once, DMG and the paper's
# Aggregate* baseline (ERM), 3 trials; the tables print the paper's rows beside ours
# (dmg_pacs_resnet18, dmg_pacs_resnet50).
#   PROTOCOL=release (default): the release's protocol: official splits, one pooled shuffled batch
#     of 64, Adam 1e-4 (network lr x0.99 per epoch, mask lr constant), weight decay 1e-5, the
#     release's augmentation, 150 epochs (the release's config; EPOCHS=50 is the paper's "best of
#     50 epochs"), a checkpoint every epoch, best epoch on source validation (iid:
#     DomainBed's training-domain validation keeps each run's best checkpoint);
#   PROTOCOL=domainbed: DomainBed's protocol (80/20 splits, 21 images per source per step,
#     constant lr, 5001 steps) with the paper's hparams (training-domain validation, oracle).
# Every value with its source, and what the host cannot express:
#   python -m dg_plugins.scripts.reproduce dmg_pacs --describe [--protocol domainbed]
# Needs (checked for every sweep before the first starts; DRY_RUN=1 lists what is missing):
#   PACS under DATA_DIR, and for PROTOCOL=release its official split lists (PACS_splits):
#     python -m dg_plugins.scripts.download --data_dir DATA_DIR PACS PACS_splits
#   torchvision's ImageNet ResNet-18 and ResNet-50 weights in the torch cache (TORCH_HOME;
#     fetched on first use when online), or HPARAMS='{"pretrained": false}' (random init: a
#     smoke test; a "pretrained_path" in HPARAMS would go to both backbones);
#   a GPU (a CPU trial run: TEST_ENVS=0 EPOCHS=1 N_TRIALS=1).
#   DATA_DIR=/data [PROTOCOL=release] [LAUNCHER=multi_gpu] [DRY_RUN=1] \
#       bash sweeps/dmg_pacs_paper.sh [sweep flags]
# Knobs: EPOCHS (release), STEPS (domainbed), TEST_ENVS, ALGORITHMS, N_TRIALS, HPARAMS
# (sweeps/_common.sh).
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
reproduce dmg_pacs
