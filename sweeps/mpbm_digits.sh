#!/usr/bin/env bash
# MPBM (Heidari & Guo, arXiv 2502.16064), Digits single-source DG: train on the first 10,000 MNIST
# training digits, test on SVHN, MNIST-M, SYN and USPS (32x32 RGB, LeNet: Digits' default
# backbone); ERM and MPBM, Adam lr 1e-4, batch 32, 10001 steps, 3 trials; single-source tables
# beside the paper's numbers (mpbm_digits: MPBM 81.3 average; 51.7 without L_mix^tr, 77.7 without
# L_adv, from the paper's summary).
# PROTOCOL=domainbed only: no official code exists (dg_plugins/algorithms/mpbm.py marks every
# reconstructed choice): python -m dg_plugins.scripts.reproduce mpbm_digits --describe
# Needs the local files of dg_plugins/datasets/digits.py under DATA_DIR/digits/ (nothing is
# downloaded) and preferably a GPU.
#   DATA_DIR=/data [LAUNCHER=local] [DRY_RUN=1] bash sweeps/mpbm_digits.sh [sweep flags]
# Knobs: ALGORITHMS, N_TRIALS, HPARAMS (sweeps/_common.sh).
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
reproduce mpbm_digits
