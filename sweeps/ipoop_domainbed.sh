#!/usr/bin/env bash
# IP/OOP evaluation (Teterwak et al., ICLR 2025, arXiv 2412.02856) on DomainBed-IP/OOP's five
# datasets (PACS, VLCS, OfficeHome, TerraIncognita, DomainNet): first every image is scored with
# the authors' scorer (python -m dg_plugins.scripts.alignment_scores: open_clip ViT-B-16,
# pretrained laion400m_e32, prompt "A photo of {}.", the dataset's evaluation transform; scores in
# OUTPUT_DIR/<protocol>/alignment_scores/<dataset>.csv, cached), then ERM (DomainBed's ResNet-50)
# is swept with --alignment_scores and the paper's split rule (--alignment_preset teterwak2025:
# drop < 0.15 and > 0.40, IP at >= 0.21), each domain held out, 3 trials; collect_results prints
# the IP and OOP tables beside the paper's rows (ipoop).
#   PROTOCOL=release (default): the authors' trainer's lengths (5001 steps, a checkpoint every 200;
#     DomainNet 15001 / 1000);
#   PROTOCOL=domainbed: DomainBed's lengths (5001 / 300; DomainNet 5001 / 1000).
# The paper's rows are DG methods on CLIP image encoders, which dg_plugins does not train: see
#   python -m dg_plugins.scripts.reproduce ipoop --describe
# Needs (checked for every sweep before the first starts; DRY_RUN=1 lists what is missing):
#   the datasets under DATA_DIR (those of DATASETS):
#     python -m dg_plugins.scripts.download --data_dir DATA_DIR PACS VLCS OfficeHome TerraIncognita DomainNet
#   the CLIP weights of the scorer (open_clip ViT-B-16 laion400m_e32) in the Hugging Face cache
#     (HF_HOME; fetched on first use when online), or a local copy of them:
#     CLIP_CHECKPOINT=/path/open_clip_pytorch_model.bin (huggingface.co/timm/
#     vit_base_patch16_clip_224.laion400m_e32); a score file computed before is reused;
#   the ImageNet ResNet-50 weights of DomainBed's ERM in the Hugging Face cache, or
#     HPARAMS='{"pretrained_path": FILE}' or '{"pretrained": false}' (random init: a smoke test);
#   a GPU.
#   DATA_DIR=/data [PROTOCOL=release] [LAUNCHER=multi_gpu] [DRY_RUN=1] \
#       bash sweeps/ipoop_domainbed.sh [sweep flags]
# Knobs: DATASETS, ALGORITHMS, TEST_ENVS, STEPS, N_TRIALS, HPARAMS, CLIP_CHECKPOINT
# (sweeps/_common.sh).
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
reproduce ipoop
