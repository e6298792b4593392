#!/usr/bin/env bash
# MPBM (Heidari & Guo, arXiv 2502.16064), Digits single-source DG: train on the first 10,000 MNIST
# training digits, test on SVHN, MNIST-M, SYN and USPS (32x32 RGB, LeNet: Digits' default
# backbone); ERM and MPBM, Adam lr 1e-4, batch 32, 10001 steps, 3 trials; single-source tables
# beside the paper's numbers (mpbm_digits: MPBM 81.3 average; 51.7 without L_mix^tr, 77.7 without
# L_adv, from the paper's summary).
# PROTOCOL=domainbed only: no official code exists (dg_plugins/algorithms/mpbm.py marks every
# reconstructed choice): python -m dg_plugins.scripts.reproduce mpbm_digits --describe
# Needs (checked for every sweep before the first starts; DRY_RUN=1 lists what is missing):
#   each Digits domain's released files under DATA_DIR/digits/ (dg_plugins/datasets/digits.py
#     lists them; the downloader does not provide them);
#   no pretrained weights (LeNet from random init); preferably a GPU.
#   DATA_DIR=/data [LAUNCHER=local] [DRY_RUN=1] bash sweeps/mpbm_digits.sh [sweep flags]
# Knobs: ALGORITHMS, STEPS, N_TRIALS, HPARAMS (sweeps/_common.sh).
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
reproduce mpbm_digits
