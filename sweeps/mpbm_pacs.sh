#!/usr/bin/env bash
# MPBM (Heidari & Guo, arXiv 2502.16064), PACS single-source DG: ResNet-18 (torchvision ImageNet
# weights), each domain as the source in turn, tested on the other three; ERM and MPBM with
# DomainBed's and MPBM's default hparams, 5001 steps, 3 trials; single-source tables beside the
# paper's number (mpbm_pacs: MPBM 54.5 average, from the paper's summary).
# PROTOCOL=domainbed only: no official code exists:
#   python -m dg_plugins.scripts.reproduce mpbm_pacs --describe
# Needs (checked for every sweep before the first starts; DRY_RUN=1 lists what is missing):
#   PACS under DATA_DIR:
#     python -m dg_plugins.scripts.download --data_dir DATA_DIR PACS
#   torchvision's ImageNet ResNet-18 weights in the torch cache (TORCH_HOME; fetched on first
#     use when online), or HPARAMS='{"pretrained_path": FILE}' or '{"pretrained": false}'
#     (random init: a smoke test);
#   a GPU.
#   DATA_DIR=/data [LAUNCHER=multi_gpu] [DRY_RUN=1] bash sweeps/mpbm_pacs.sh [sweep flags]
# Knobs: ALGORITHMS, TEST_ENVS (the sources' sets, e.g. "1,2,3": trained on environment 0),
# STEPS, N_TRIALS, HPARAMS (sweeps/_common.sh).
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
reproduce mpbm_pacs
