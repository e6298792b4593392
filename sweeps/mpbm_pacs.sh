#!/usr/bin/env bash
# MPBM (Heidari & Guo, arXiv 2502.16064), PACS single-source DG: ResNet-18 (torchvision ImageNet
# weights), each domain as the source in turn, tested on the other three; ERM and MPBM with
# DomainBed's and MPBM's default hparams, 5001 steps, 3 trials; single-source tables beside the
# paper's number (mpbm_pacs: MPBM 54.5 average, from the paper's summary).
# PROTOCOL=domainbed only: no official code exists:
#   python -m dg_plugins.scripts.reproduce mpbm_pacs --describe
# Needs PACS under DATA_DIR, the ResNet-18 weights (downloaded, or HPARAMS='{"pretrained_path":
# ...}') and a GPU.
#   DATA_DIR=/data [LAUNCHER=multi_gpu] [DRY_RUN=1] bash sweeps/mpbm_pacs.sh [sweep flags]
# Knobs: ALGORITHMS, N_TRIALS, HPARAMS (sweeps/_common.sh).
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
reproduce mpbm_pacs
