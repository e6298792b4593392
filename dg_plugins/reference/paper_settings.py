"""Every setting of every paper script (``sweeps/*.sh``), each value with its source: a file
and line of an official release at a named commit, DomainBed's file, or the paper's table.
``python -m dg_plugins.scripts.reproduce SETTING --protocol P`` runs one (docs/reproduce.md).

Protocols: ``release`` (the official release's training and evaluation, as far as the host can
express it) and ``domainbed`` (DomainBed's protocol with the paper's hparams); what the host
cannot express is in each protocol's ``differences``. Releases read: DMG prithv1/DMG @6b162b4,
GMoE Luodian/Generalizable-Mixture-of-Experts @0689d55, DisMAE rookiehb/DisMAE @ff91675, IP/OOP
piotr-teterwak/dg_openclip @a87528a, DomainBed facebookresearch/DomainBed @b93c22a, PACS's split
lists DeLightCMU/RSC @bf6d280; MPBM has no release (arXiv 2502.16064). Image counts
(:data:`DATASET_SIZES`) let a dry run derive the steps of epoch-based settings without the data.
Torch-free."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, NamedTuple

DMG = "prithv1/DMG@6b162b4"
GMOE = "Luodian/Generalizable-Mixture-of-Experts@0689d55"
DISMAE = "rookiehb/DisMAE@ff91675"
IPOOP = "piotr-teterwak/dg_openclip@a87528a"
DOMAINBED = "facebookresearch/DomainBed@b93c22a"
PACS_LISTS = "DeLightCMU/RSC@bf6d280 Domain_Generalization/data/correct_txt_lists"
DMG_PAPER = "Chattopadhyay, Balaji, Hoffman, ECCV 2020 (DMG)"
GMOE_PAPER = "Li et al., ICLR 2023 (GMoE, arXiv 2206.04046)"
DISMAE_PAPER = "Zhang et al., ECCV 2024 (DisMAE, arXiv 2407.07544)"
MPBM_PAPER = "Heidari & Guo, arXiv 2502.16064 (MPBM)"
IPOOP_PAPER = "Teterwak et al., ICLR 2025 (IP/OOP, arXiv 2412.02856)"
OURS = "dg_plugins' choice"

PROTOCOLS = ("release", "domainbed")


class Value(NamedTuple):
    """A setting's value and where it comes from."""
    value: Any
    source: str


class Run(NamedTuple):
    """Algorithms trained with the same hparam overrides (one ``--hparams`` JSON)."""
    algorithms: tuple[str, ...]
    hparams: Mapping[str, Value] = {}


class Group(NamedTuple):
    """One sweep folder and the paper rows its tables sit beside; ``hparams`` go to every run."""
    folder: str
    paper_keys: tuple[str, ...]
    title: str
    hparams: Mapping[str, Value] = {}


class Difference(NamedTuple):
    """Something the protocol does not do as its source does, and why."""
    what: str
    reason: str


def _v(**rows) -> dict[str, Value]:
    """Rows ``name=(value, source)`` as :class:`Value` s."""
    return {name: Value(*row) for name, row in rows.items()}


def _diffs(*rows: tuple[str, str]) -> tuple[Difference, ...]:
    return tuple(Difference(*row) for row in rows)


@dataclass(frozen=True, kw_only=True)
class Protocol:
    """One way of running a setting (defaults: DomainBed's protocol). ``test_envs``:
    ``"single_test_envs"``, ``"single_source"`` or explicit sets; length in ``steps`` and
    ``checkpoint_freq`` per dataset, or in ``epochs`` (:func:`steps_per_epoch`); ``alignment``:
    the IP/OOP scoring settings."""
    name: str = "domainbed"
    summary: str
    datasets: Value
    test_envs: Value = Value("single_test_envs", f"{DOMAINBED} domainbed/scripts/sweep.py:154")
    runs: tuple[Run, ...]
    groups: tuple[Group, ...]
    n_trials: Value = Value(3, f"{DOMAINBED} domainbed/scripts/sweep.py:149")
    n_hparams: Value
    selections: Value = Value(("iid", "oracle"),
                              f"{DOMAINBED} domainbed/model_selection.py:75, :54")
    steps: Mapping[str, Value] = field(default_factory=dict)
    checkpoint_freq: Mapping[str, Value] = field(default_factory=dict)
    epochs: Value | None = None
    holdout_fraction: Value | None = None
    sweep_flags: Mapping[str, Value] = field(default_factory=dict)
    collect_flags: tuple[str, ...] = ()
    alignment: Mapping[str, Value] = field(default_factory=dict)
    differences: tuple[Difference, ...] = ()


class Setting(NamedTuple):
    """A paper table and the script that reproduces it."""
    name: str
    script: str
    paper: str
    table: str
    protocols: Mapping[str, Protocol]


# --- Image counts ---

#: Images per environment (in the dataset's environment order) of DomainBed's data folders.
#: TerraIncognita's are not recorded (no per-domain count with a source at hand): a dry run
#: counts them under ``--data_dir`` or says that its evaluation cost is unknown.
DATASET_SIZES: dict[str, Value] = _v(
    PACS=((2048, 2344, 1670, 3929),
          f"PACS's official *_test_kfold.txt lists (each the whole domain), counted in "
          f"{PACS_LISTS}; 9,991 images as DMG's paper says (its PACS paragraph)"),
    DomainNet=((48129, 51605, 72266, 172500, 172947, 69128),
               f"DomainNet's cleaned image lists, counted in {DMG} "
               "data/DomainNet/tv_0.9_splits/<domain>_{train,val,test}.txt (quickdraw: "
               "345 classes x 500 images; its train list is not in the mirror, its test "
               "list holds 150 per class); DomainBed's download "
               "(domainbed/scripts/download.py) removes the duplicates those lists omit"),
    VLCS=((1415, 2656, 3282, 3376),
          "the Caltech101, LabelMe, SUN09 and VOC2007 folders of DomainBed's VLCS "
          "download (domainbed/scripts/download.py); 10,729 images in all, as DomainBed's "
          "paper (Gulrajani & Lopez-Paz, ICLR 2021, appendix) says"),
    OfficeHome=((2427, 4365, 4439, 4357),
                "the Art, Clipart, Product and Real World domains of Office-Home "
                "(Venkateswara et al., CVPR 2017, its dataset table); 15,588 images in all, "
                "as DomainBed's paper (appendix) says"),
    Digits=((10000, 26032, 9001, 9553, 2007),
            "dg_plugins/datasets/digits.py (MNIST: its first 10,000 training digits) and "
            "the test sets' published sizes, not counted here: SVHN test_32x32.mat "
            "26,032, MNIST-M mnist_m_test_labels.txt 9,001, SYN synth_test_32x32.mat "
            "9,553, USPS zip.test 2,007 (its zip.info)"),
    DomainNet20=((3855, 5176, 5586, 10000, 10756, 4301),
                 "the 20 classes of dg_plugins/datasets/domainnet20.py (the DisMAE "
                 f"release's dataset/split.sh), counted in the same {DMG} DomainNet lists "
                 "(quickdraw: 20 x 500)"))

#: The in-split (training images) of each environment under the dataset hparam
#: ``data_split: "official"`` (when the lists are not under the data folder to be counted).
OFFICIAL_TRAIN_SIZES: dict[str, Value] = _v(PACS=(
    (1840, 2107, 1499, 3531), f"PACS's official *_train_kfold.txt lists, counted in "
    f"{PACS_LISTS} (*_crossval_kfold.txt: 208/237/171/398 validation images)"))
#: The out-split (validation images) of each environment under ``data_split: "official"``; a
#: test environment's in-split is its test list, the whole domain (:data:`DATASET_SIZES`).
OFFICIAL_VAL_SIZES: dict[str, Value] = _v(PACS=(
    (208, 237, 171, 398), f"PACS's official *_crossval_kfold.txt lists, counted in {PACS_LISTS}"))


def steps_per_epoch(in_sizes, batch_size: int, batch_sampling: str) -> int:
    """Steps of one epoch over the sources' in-splits: ``pooled`` (the DMG release's one loader over
    the union, ``ceil(sum / batch)``) or ``per_domain`` (DomainBed's: ``ceil(min / batch)``)."""
    if (reduce := {"pooled": sum, "per_domain": min}.get(batch_sampling)) is None:
        raise ValueError(f"unknown batch_sampling {batch_sampling!r}; choices: pooled, per_domain")
    return max(1, math.ceil(reduce(in_sizes) / batch_size))

def _lengths(where: str, rows: dict, note: str = "") -> dict[str, dict[str, Value]]:
    """``steps`` and ``checkpoint_freq`` per dataset as ``where`` (a datasets.py) sets them:
    rows ``dataset: (steps, its line, checkpoint_freq, its line)``."""
    return {"steps": {d: Value(s, f"{where}:{at}{note}") for d, (s, at, _, _) in rows.items()},
            "checkpoint_freq": {d: Value(f, f"{where}:{at}") for d, (_, _, f, at) in rows.items()}}


#: DomainBed's lengths (domainbed/datasets.py): 5001 steps (N_STEPS), a checkpoint frequency each.
_DB_LENGTHS = {"PACS": (5001, 55, 300, 235), "VLCS": (5001, 55, 300, 228),
               "OfficeHome": (5001, 55, 300, 249), "TerraIncognita": (5001, 55, 300, 256),
               "DomainNet": (5001, 55, 1000, 242)}


def _db_lengths(*datasets: str, note: str = "") -> dict[str, dict[str, Value]]:
    return _lengths(f"{DOMAINBED} domainbed/datasets.py", {d: _DB_LENGTHS[d] for d in datasets},
                    note)


# --- DMG (Chattopadhyay et al., ECCV 2020) ---

_DMG_PACS_CFG = f"{DMG} configs/PACS/supermask_training.yml"
_DMG_DN_CFG = f"{DMG} configs/DomainNet/supermask_training.yml"
_DMG_TRAINER = f"{DMG} trainers/subnetwork_supermask_trainer.py"
_DMG_APPENDIX = f"{DMG_PAPER}, appendix (implementation details)"


def _dmg_backbones(dataset_key: str) -> tuple[Group, ...]:
    return tuple(Group(f"resnet{n}", (f"dmg_{dataset_key}_resnet{n}",), f"ResNet-{n}", _v(
        resnet18=(n == 18, f"{DMG} run_jobs.sh:{lines} (MODEL.BASE_MODEL resnet{n})")))
        for n, lines in ((18, "58-65"), (50, "67-74")))


#: hparams every DMG-paper job shares (network and optimiser), both protocols.
_DMG_BACKBONE = _v(
    pretrained=(True, f"{_DMG_PACS_CFG}:21 (USE_PRETRAINED)"),
    resnet50_augmix=(False, f"{DMG} models/basic_model.py:41-42 (torchvision "
                     "models.<name>(pretrained=True))"),
    resnet_dropout=(0.0, f"{DMG} models/basic_model.py:53-56 (torchvision ResNet: no "
                    "dropout before fc)"))
_DMG_MASKS = _v(
    dmg_lambda_overlap=(0.1, f"{_DMG_PACS_CFG}:46 (OVERLAP_LAMBDA); {_DMG_DN_CFG}:47"),
    dmg_lambda_sparsity=(0.0, f"{_DMG_PACS_CFG}:45 (SPARSITY_LAMBDA); {_DMG_DN_CFG}:46"),
    dmg_mask_lr=(1e-4, f"{_DMG_PACS_CFG}:38 (POLICY_LEARNING_RATE); {_DMG_DN_CFG}:39"),
    dmg_mask_layers=("layer3,layer4,fc", f"{DMG} run_jobs.sh:64 and :73 (MODEL.MASK_LAYERS for "
                                         "ResNet-18/50; line 2: the same commands run PACS)"),
    dmg_test_ensemble=("logits", f"{_DMG_TRAINER}:314-335 (test: the mean of the "
                       "scores under every source domain's soft mask)"))

#: Why the release protocols select with DomainBed's training-domain validation.
_DMG_BEST_EPOCH = Value(("iid",), f"{_DMG_TRAINER}:412, 489-498 (best_so_far.pth: the epoch "
                        "whose mean source validation accuracy first beats every earlier one); "
                        "DomainBed's training-domain validation already keeps each run's best "
                        "checkpoint by mean source validation accuracy, the earliest on ties "
                        f"({DOMAINBED} domainbed/model_selection.py:75-100, "
                        "IIDAccuracySelectionMethod.run_acc's argmax), which is the release's "
                        "best-epoch rule")
_DMG_RELEASE_TRIALS = Value(3, f"{DOMAINBED} domainbed/scripts/sweep.py:149 (the release: "
                            "one seed)")

_DMG_COMMON_DIFFERENCES = _diffs(
    ("Best epoch: the rule is the release's (the best mean source validation accuracy, selection "
     "iid), but the release validates each source domain with its own mask thresholded ('greedy', "
     f"DMG-KD: {_DMG_TRAINER}:298-307); the host's validation accuracy is that of predict (the "
     "soft masks of every source averaged), the prediction the tables report.",
     "the host validates with predict, the one prediction rule every algorithm has"),
    ("Checkpoints: the release evaluates at the end of each epoch; the host records "
     "after update k*S + 1 of an S-step epoch (step % checkpoint_freq == 0, after the "
     "update), one update into the next epoch; the last record ends the last epoch.",
     "DomainBed's train records at step % checkpoint_freq == 0 (domainbed/scripts/train.py)"),
    ("Trials: the release runs one seed (RANDOM_SEED 123, config line 3); the host runs "
     "3 trials seeded as DomainBed seeds them and reports mean +/- standard error.",
     "DomainBed's protocol (domainbed/scripts/sweep.py --n_trials 3)"),
    ("Images: the release reads pre-read HDF5 files (data/PACS/download.txt, "
     "data/DomainNet/create_hdf5.py); the host reads DomainBed's image folders.",
     "the host's datasets are DomainBed's folders"))

_DMG_PACS_RELEASE_HPARAMS = {**_DMG_BACKBONE, **_v(
    lr=(1e-4, f"{_DMG_PACS_CFG}:37 (MODEL_LEARNING_RATE)"),
    weight_decay=(1e-5, f"{_DMG_PACS_CFG}:43-44 (MODEL/POLICY_WEIGHT_DECAY)"),
    batch_size=(64, f"{_DMG_PACS_CFG}:31 (BATCH_SIZE)"),
    batch_sampling=("pooled", f"{DMG} dataloaders/domain_datasets.py:134, 159-164 "
                    "(one shuffled loader over the union of the sources)"),
    lr_schedule=("exp_epoch", f"{_DMG_PACS_CFG}:39, 41 (LEARNING_RATE_SCHEDULER exp, "
                 f"DECAY_MODE epoch); {_DMG_TRAINER}:532-538"),
    lr_decay=(0.99, f"{_DMG_PACS_CFG}:40 (LEARNING_RATE_DECAY_RATE)"),
    data_split=("official", f"{_DMG_PACS_CFG}:12 (DATA_SPLIT_DIR data/PACS/: the "
                "official train/val/test files)"),
    augmentation=("dmg_pacs", f"{DMG} train_model.py:146-155 (RandomResizedCrop 224 "
                  "scale 0.8-1, flip, ColorJitter 0.4)"))}
_DMG_PACS_RELEASE = Protocol(
    name="release", datasets=Value(("PACS",), f"{_DMG_PACS_CFG}:9"),
    summary="the DMG release's PACS protocol: official splits, one pooled shuffled batch of 64, "
            "Adam 1e-4 with the network's lr x0.99 per epoch, 150 epochs, best epoch on source "
            "validation",
    test_envs=Value("single_test_envs", f"{DMG_PAPER}, PACS paragraph: each domain held out once"),
    runs=(Run(("DMG",), {**_DMG_PACS_RELEASE_HPARAMS, **_DMG_MASKS, **_v(
        dmg_mask_lr_schedule=(False, f"{_DMG_TRAINER}:540-545 (the mask scheduler's step is "
                                     "commented out)"),
        dmg_fc_init_std=(None, f"{_DMG_PACS_CFG}:20 (PARAM_INIT "
                         "standard: PyTorch's default init)"))}),
          # ERM is the paper's Aggregate* baseline (Tables 2 and 6)
          Run(("ERM",), dict(_DMG_PACS_RELEASE_HPARAMS))),
    groups=_dmg_backbones("pacs"), n_trials=_DMG_RELEASE_TRIALS,
    n_hparams=Value(1, f"{_DMG_PACS_CFG} (fixed hparams: hparams_seed 0 with the overrides)"),
    selections=_DMG_BEST_EPOCH,
    epochs=Value(150, f"{_DMG_PACS_CFG}:50 (MAX_EPOCHS; the paper's appendix: best of 50 "
                 "epochs; --epochs 50 runs that)"),
    differences=_diffs(
        ("Length: 150 epochs as the release's config; the paper's appendix says the best "
         "checkpoint of 50 epochs.",
         "the release is what ran; --epochs 50 gives the paper's budget"),
        ("Mask lr: constant as in the release (the epoch step of the mask optimizer's scheduler "
         f"is commented out, {_DMG_TRAINER}:540-545); the paper says both the network's and the "
         "masks' lr decay.", "follows the release"),
        ("Oracle column: under data_split official the target's out-split is its crossval list, "
         "a subset of its test list (*_test_kfold.txt holds every image of the domain), so "
         "test-domain (oracle) selection selects on test images; the release selects on source "
         "validation only.", "the target accuracy itself is the release's: env{t}_in_acc is the "
         "whole test list; read the training-domain validation table"),
    ) + _DMG_COMMON_DIFFERENCES,
)


def _dmg_domainbed(dataset: str, batch: int, weight_decay: tuple[float, str], steps_note: str,
                   differences: tuple, extra: str = "", dmg: dict | None = None) -> Protocol:
    """DMG's DomainBed protocol: the paper's hparams, ``batch`` images per source domain."""
    hparams = {**_DMG_BACKBONE, **_v(
        lr=(1e-4, f"{_DMG_APPENDIX} (Adam 1e-4)"),
        weight_decay=(weight_decay[0], f"{_DMG_APPENDIX} ({dataset}: {weight_decay[1]})"),
        # DomainBed's per-domain batch closest to the paper's 64 images per step: 64 // sources
        batch_size=(batch, f"{_DMG_APPENDIX}: batch 64 per step, shared by the source domains "
                    "(64 // n)"))}
    return Protocol(
        summary=f"DomainBed's protocol (random 80/20 splits, {batch} images per source domain "
                f"per step, constant lr, 5001 steps) with the paper's hparams{extra}",
        datasets=Value((dataset,), (_DMG_PACS_CFG if dataset == "PACS" else _DMG_DN_CFG) + ":9"),
        runs=(Run(("DMG",), {**hparams, **_DMG_MASKS, **(dmg or {})}),
              Run(("ERM",), dict(hparams))),
        groups=_dmg_backbones(dataset.lower()),
        n_hparams=Value(1, "the paper's hparams (hparams_seed 0 with the overrides)"),
        **_db_lengths(dataset, note=steps_note), differences=differences)


_DMG_PACS_DOMAINBED = _dmg_domainbed("PACS", 21, (1e-5, "1e-5"), " (N_STEPS)", _diffs((
    "No lr decay, per-domain minibatches of 21, DomainBed's augmentation and "
    "random splits, 5001 steps (about 15 epochs of the pooled sources).",
    "DomainBed's protocol: comparable with DomainBed's tables, not with the paper's")))
_DMG_DN_RELEASE_HPARAMS = {**_DMG_BACKBONE, **_v(
    pretrained=(True, f"{_DMG_DN_CFG}:18 (USE_PRETRAINED)"),
    lr=(1e-4, f"{_DMG_DN_CFG}:38 (MODEL_LEARNING_RATE)"),
    weight_decay=(0.0, f"{_DMG_DN_CFG}:44-45 (MODEL/POLICY_WEIGHT_DECAY)"),
    batch_size=(64, f"{_DMG_DN_CFG}:32 (BATCH_SIZE)"),
    batch_sampling=("pooled", f"{DMG} dataloaders/domain_datasets.py:134, 159-164"),
    lr_schedule=("inv_step", f"{_DMG_DN_CFG}:40, 42 (invlr, DECAY_MODE iter); "
                 f"{_DMG_TRAINER}:196-203 (both schedulers step every "
                 "iteration); the paper's appendix says per epoch"),
    lr_inv_gamma=(1e-4, f"{DMG} utils/inverse_lr_scheduler.py:10 (InvLR defaults; "
                  "train_model.py:272-273 passes none; the config's "
                  "LEARNING_RATE_DECAY_RATE 0.1 is unused)"),
    lr_inv_power=(0.75, f"{DMG} utils/inverse_lr_scheduler.py:10"),
    augmentation=("dmg_domainnet", f"{DMG} train_model.py:156-165 (Resize 256, "
                  "RandomCrop 224, flip)"),
    dmg_fc_init_std=(0.001, f"{_DMG_DN_CFG}:17 (PARAM_INIT custom); {DMG} "
                     "models/basic_model.py:57-58, utils/misc.py:27-30 "
                     "(N(0, 0.001) weights, zero bias)"))}
_DMG_DN_RELEASE = Protocol(
    name="release", datasets=Value(("DomainNet",), f"{_DMG_DN_CFG}:9"),
    summary="the DMG release's DomainNet protocol: one pooled shuffled batch of 64, Adam 1e-4 "
            "with an inverse decay of both lrs every step, classifier N(0, 0.001), 50 epochs, "
            "best epoch on source validation",
    test_envs=Value("single_test_envs", f"{DMG_PAPER}, DomainNet paragraph: 6 leave-one-out "
                    "experiments"),
    runs=(Run(("DMG",), {**_DMG_DN_RELEASE_HPARAMS, **_DMG_MASKS, **_v(
        dmg_mask_lr_schedule=(True, f"{_DMG_TRAINER}:201-203 (the mask scheduler steps too)"))}),
          Run(("ERM",), {k: v for k, v in _DMG_DN_RELEASE_HPARAMS.items()
                         if not k.startswith("dmg_")})),
    groups=_dmg_backbones("domainnet"), n_trials=_DMG_RELEASE_TRIALS,
    n_hparams=Value(1, f"{_DMG_DN_CFG} (fixed hparams)"), selections=_DMG_BEST_EPOCH,
    epochs=Value(50, f"{_DMG_DN_CFG}:51 (MAX_EPOCHS; the paper's appendix: 50 epochs)"),
    holdout_fraction=Value(0.1, f"{_DMG_DN_CFG}:12 (tv_0.9_splits: 90% train, 10% validation)"),
    differences=_diffs(
        ("Splits: the release trains on 90% of DomainNet's official train list and "
         "tests on the target's official test list (data/DomainNet/tv_0.9_splits); the "
         "host holds out 10% of each whole domain at random and tests on the target's "
         "in-split (90% of the domain), so an epoch is about 1.4x the release's "
         "updates.", "the host has no DomainNet official split (data_split is PACS's)"),
        ("The inverse lr decay runs every step as in the release; the paper's appendix "
         "says per epoch.", "follows the release"),
        ("dmg_fc_init_std 0.001 initialises ERM's classifier as PyTorch's default, "
         "not N(0, 0.001) (the release's Aggregate uses the same custom init).",
         "dmg_fc_init_std is DMG's hparam"),
    ) + _DMG_COMMON_DIFFERENCES,
)
_DMG_DN_DOMAINBED = _dmg_domainbed(
    "DomainNet", 12, (0.0, "0"), " (N_STEPS; DomainNet keeps the default)", _diffs(
        ("No lr decay, per-domain minibatches of 12, DomainBed's augmentation and "
         "random splits, 5001 steps (well under one epoch of the pooled sources).",
         "DomainBed's protocol: comparable with DomainBed's tables"),
        ("ERM's classifier starts from PyTorch's default init, not N(0, 0.001) (the "
         "paper's Aggregate uses the same init as DMG).", "dmg_fc_init_std is DMG's hparam")),
    " and classifier init", _v(dmg_fc_init_std=(0.001, f"{_DMG_APPENDIX}: N(0, 0.001) for "
                                                       "DomainNet")))

# --- GMoE (Li et al., ICLR 2023) ---

_GMOE_DATASETS = ("PACS", "VLCS", "OfficeHome", "TerraIncognita", "DomainNet")
#: The release's lengths (its domainbed/datasets.py, N_STEPS at line 50).
_GMOE_LENGTHS = {d: (5001, "50 (N_STEPS)", 300, at) for d, at in (
    ("PACS", 245), ("VLCS", 236), ("OfficeHome", 264), ("TerraIncognita", 274))}
_GMOE_LENGTHS["DomainNet"] = (15001, 255, 500, 254)
_GMOE_HPARAMS_SOURCE = (f"{GMOE} domainbed/hparams_registry.py:171-195 (per-dataset lr / weight "
                        "decay: GMoE's and ERM_ViT's defaults in dg_plugins/algorithms/gmoe.py), "
                        ":154 (batch 32 per domain)")
_GMOE_EVAL_RELEASE = Value(1.5, f"{GMOE} domainbed/vision_transformer.py:256 (capacity_factor "
                                "1.5, kept in eval mode: predictions depend on the batch)")
#: The release's evaluation batch (``FastDataLoader(batch_size=64)``); pinned, because at
#: capacity 1.5 in eval mode a prediction depends on the other images of its batch, so another
#: ``--eval_batch_size`` would evaluate another model (reproduce refuses one).
_GMOE_EVAL_BATCH = Value(64, f"{GMOE} domainbed/scripts/train.py:180-182 (FastDataLoader "
                             "batch_size=64; capacity 1.5 in eval mode makes a prediction depend "
                             "on its batch, so the batch is pinned)")
_GMOE_EVAL_OURS = Value(None, f"{OURS}: no token dropped in evaluation, so a prediction "
                              "depends only on its image (dg_plugins/algorithms/gmoe.py)")


def _gmoe(name: str, single_source: bool) -> Protocol:
    eval_capacity = _GMOE_EVAL_RELEASE if name == "release" else _GMOE_EVAL_OURS
    eval_note = ("evaluation at capacity 1.5 as in training, in the release's batches of 64 "
                 "(batch-dependent)" if eval_capacity.value is not None
                 else "batch-independent evaluation (no token dropped)")
    # batch-dependent predictions: the release's evaluation batch is part of the protocol
    flags = {"eval_batch_size": _GMOE_EVAL_BATCH} if eval_capacity.value is not None else {}
    if single_source:
        datasets, key, table = ("DomainNet",), "gmoe_single_source_domainnet", "Table 3"
        fields = dict(
            summary=f"train on painting, test on the other five domains; {eval_note}",
            datasets=Value(datasets, f"{GMOE_PAPER}, Table 3 (single-source DomainNet)"),
            test_envs=Value(((0, 1, 3, 4, 5),), f"{GMOE_PAPER}, Table 3: trained on painting "
                                                "(environment 2)"),
            n_hparams=Value(1, _GMOE_HPARAMS_SOURCE), collect_flags=("--single_source", "on"))
        selection = "painting validation = training-domain validation"
    else:
        datasets, key, table = _GMOE_DATASETS, "gmoe_domainbed", "Table 1"
        fields = dict(
            summary=f"DomainBed's protocol on the paper's five datasets, DeiT-S/16; {eval_note}",
            datasets=Value(_GMOE_DATASETS, f"{GMOE_PAPER}, Table 1"),
            n_hparams=Value(1, _GMOE_HPARAMS_SOURCE + " (the release's README: the registry holds "
                               "the optimal hparams; --n_hparams 20 runs DomainBed's search)"))
        selection = "training-domain validation"
    return Protocol(
        name=name, **fields,
        runs=(Run(("GMoE",), {"gmoe_eval_capacity": eval_capacity}), Run(("ERM_ViT",), {})),
        groups=(Group("", (key,), "DeiT-S/16"),), sweep_flags=flags,
        selections=Value(("iid", "oracle"), f"{GMOE_PAPER}, {table} ({selection})"),
        **_lengths(f"{GMOE} domainbed/datasets.py", {d: _GMOE_LENGTHS[d] for d in datasets}),
        differences=_diffs(
            ("The MoE layer is pure PyTorch (dg_plugins/networks/moe.py) instead of Tutel; "
             "routing, capacity and the auxiliary loss follow Tutel's.",
             "no Tutel dependency; same function")),
    )


# --- DisMAE (Zhang et al., ECCV 2024) ---

_DISMAE_PT = f"{DISMAE} script/udg_pt.sh"
_DISMAE_FT = f"{DISMAE} script/udg_ft.sh"
_UDG_HPARAMS = _v(
    batch_size=(96, f"{_DISMAE_PT}:4 (--batch_size 96 per domain)"),
    vit_arch=("vit_base_patch16_224", f"{DISMAE} train.py:95 (mae_vit_cls) and "
              "models_dmae.py:404-409 (ViT-B/16: width 768, depth 12)"))
_UDG_ERM = {**_UDG_HPARAMS, **_v(
    backbone=("vit", f"{OURS}: the from-scratch baseline on DisMAE's ViT-B/16"),
    pretrained=(False, f"{OURS}: no ImageNet weights, as DisMAE's encoder (random init)"))}


def _dismae_udg(name: str) -> Protocol:
    release = name == "release"
    flags = _v(
        label_fractions=((0.01, 0.05, 0.1, 1.0), f"{DISMAE_PAPER}, DomainNet UDG table "
                         "(1/5/10/100% of the labels)"),
        udg_pretrain_epochs=(501, f"{_DISMAE_PT}:7 (--epochs 501)"),
        udg_ft_epochs=(51, f"{_DISMAE_FT}:8 (--epochs 51)"))
    if release:
        flags["udg_split"] = Value("release", f"{DISMAE} train.py:63 (pretraining holdout 0.01) "
                                              f"and {_DISMAE_FT}:7 (--holdout_fraction 0.10)")
    return Protocol(
        name=name, sweep_flags=flags, checkpoint_freq={"DomainNet20": Value(250, OURS)},
        summary=("the release's UDG protocol: pretrain 501 epochs on 99% of the sources, "
                 "fine-tune 51 epochs on a fraction of their 90% in-splits" if release else
                 "DomainBed's 80/20 splits for pretraining and labels; lengths as the release"),
        datasets=Value(("DomainNet20",), f"{DISMAE} dataset/split.sh (20 DomainNet classes)"),
        test_envs=Value(((0, 1, 3), (2, 4, 5)), f"{_DISMAE_PT}:3 (--test_envs 0 1 3) and the "
                                                "README (2 4 5)"),
        runs=(Run(("DisMAE",), dict(_UDG_HPARAMS)), Run(("MAE",), dict(_UDG_HPARAMS)),
              Run(("ERM",), dict(_UDG_ERM))),
        groups=(Group("", ("dismae_udg_domainnet20",), "ViT-B/16"),),
        n_hparams=Value(1, f"{_DISMAE_PT}:5-9 (fixed hparams: lr 1e-4, mask ratio 0.8, lambda1 "
                           "1e-3 are DisMAE's defaults; pretraining has no CE term, lambda2 0)"),
        selections=Value(("iid", "oracle"), f"{OURS}: the UDG tables' training-domain "
                                            "validation and oracle"),
        holdout_fraction=(Value(0.1, f"{_DISMAE_FT}:7 (--holdout_fraction 0.10)") if release
                          else Value(0.2, f"{DOMAINBED} domainbed/scripts/train.py:46")),
        differences=_diffs(
            ("Epoch length: the release's dataloader.py:96 divides all six domains' "
             "images (targets included) by the last domain index; the host's epoch is "
             "one pass over the images the job trains on (dg_plugins/train/"
             "udg.py).", "the host counts what it trains on"),
            (f"Augmentation: the release's --augment ({DISMAE} datasets.py:246-260: "
             "RandomResizedCrop 0.7-1, ColorJitter 0.3, RandomGrayscale); the host "
             "uses DomainBed's training augmentation.",
             "no DisMAE augmentation among the image datasets' augmentation options")),
    )


_DISMAE_DG = Protocol(
    summary="DomainBed's protocol on PACS and VLCS (each domain held out, 5001 steps, 32 images "
            "per domain) with DisMAE's hparams and the CE term",
    datasets=Value(("PACS", "VLCS"), f"{DISMAE_PAPER}, DG table (PACS, VLCS)"),
    runs=(Run(("DisMAE", "MAE"), {}), Run(("ERM",), _v(
        backbone=("vit", f"{OURS}: ERM on DisMAE's ViT-B/16"),
        vit_arch=("vit_base_patch16_224", f"{DISMAE} models_dmae.py (mae_vit_cls: ViT-B/16)"),
        pretrained=(False, f"{DISMAE} train.py (random init, as DisMAE's encoder)")))),
    groups=(Group("", ("dismae_dg",), "ViT-B/16"),),
    n_hparams=Value(1, "DisMAE's hparam defaults (dg_plugins/algorithms/dismae.py: lr 1e-4 "
                       f"({_DISMAE_PT}:6), weight decay 0.05 ({DISMAE} train.py:55), mask ratio "
                       f"0.8 ({_DISMAE_PT}:5), lambda1 1e-3, linear head ({_DISMAE_PT}:10), "
                       "lambda2 1.0)"),
    **_db_lengths("PACS", "VLCS"),
    differences=_diffs(
        (f"No release protocol: the release has no DG script and its train.py never evaluates "
         f"({DISMAE} engine_dmae.py:25-95 trains only); its CE weight --lambda2 defaults to 0 "
         "(train.py:39), so the DG weight is ours (dismae_lambda2 1.0).", "nothing to follow"),
        ("Batch 32 per domain and 5001 steps (DomainBed's) instead of the release "
         f"pretraining's 96 per domain and 501 epochs ({_DISMAE_PT}:4, :7).",
         "DomainBed's protocol"),
        (f"Augmentation: DomainBed's, not the release's --augment ({DISMAE} "
         "datasets.py:246-260).", "no DisMAE augmentation among the options")),
)

# --- MPBM (Heidari & Guo, arXiv 2502.16064): no release ---

_MPBM_SUMMARY = f"{MPBM_PAPER} (/work/shared/papers summary)"


def _mpbm(key: str, title: str, **fields) -> Protocol:
    return Protocol(
        groups=(Group("", (f"mpbm_{key}",), title),),
        selections=Value(("iid", "oracle"), f"{OURS}: the single-source tables"),
        collect_flags=("--single_source", "on"), **fields,
        differences=_diffs(
            ("No official code exists: every choice the paper leaves open is reconstructed "
             "(marked in dg_plugins/algorithms/mpbm.py); the schedule, epochs and model "
             "selection of the paper's runs are not published.",
             "there is no release to follow")))


_MPBM_DIGITS = _mpbm(
    "digits", "LeNet",
    summary="Digits single-source DG (MNIST-10k -> SVHN, MNIST-M, SYN, USPS), LeNet, Adam 1e-4, "
            "batch 32, 10001 steps",
    datasets=Value(("Digits",), f"{_MPBM_SUMMARY}: digits benchmark"),
    test_envs=Value(((1, 2, 3, 4),), "the Digits benchmark's direction: train on MNIST "
                                     "(environment 0)"),
    runs=(Run(("ERM", "MPBM"), _v(
        lr=(1e-4, f"{OURS}: the single-source digits literature's Adam 1e-4"),
        batch_size=(32, f"{OURS}: the single-source digits literature's batch 32"))),),
    n_hparams=Value(1, "MPBM's defaults (N_b = T = 5, lambda_adv = lambda_mix = 0.5: "
                       f"{_MPBM_SUMMARY})"),
    steps={"Digits": Value(10001, "dg_plugins/datasets/digits.py (N_STEPS)")},
    checkpoint_freq={"Digits": Value(500, "dg_plugins/datasets/digits.py (CHECKPOINT_FREQ)")},
)
_MPBM_PACS = _mpbm(
    "pacs", "ResNet-18",
    summary="PACS single-source DG (each domain as the source in turn), ImageNet ResNet-18, "
            "DomainBed's hparams and lengths",
    datasets=Value(("PACS",), f"{_MPBM_SUMMARY}: PACS"),
    test_envs=Value("single_source", f"{_MPBM_SUMMARY}: single-source DG"),
    runs=(Run(("ERM", "MPBM"), _v(
        resnet18=(True, f"{OURS}: ResNet-18, the single-source PACS literature's"),
        resnet50_augmix=(False, f"{OURS}: torchvision ImageNet weights"))),),
    n_hparams=Value(1, "DomainBed's and MPBM's defaults"),
    **_db_lengths("PACS"),
)

# --- IP/OOP (Teterwak et al., ICLR 2025) ---

_IPOOP_DATASETS = ("PACS", "VLCS", "OfficeHome", "TerraIncognita", "DomainNet")
#: The authors' trainer's lengths (its domainbed/datasets/datasets.py).
_IPOOP_LENGTHS = {"PACS": (5001, 47, 200, 223), "VLCS": (5001, 47, 200, 214),
                  "OfficeHome": (5001, 47, 200, 242), "TerraIncognita": (5001, 47, 200, 251),
                  "DomainNet": (15001, 233, 1000, 232)}
_IPOOP_ALIGNMENT = _v(
    model=("ViT-B-16", f"{IPOOP} domainbed/evaluator.py:30"),
    pretrained=("laion400m_e32", f"{IPOOP} domainbed/evaluator.py:30"),
    prompt=("A photo of {}.", f"{IPOOP} domainbed/evaluator.py:47"),
    transform=("dataset", f"{IPOOP} domainbed/evaluator.py:40-48 (the images of the "
               "evaluation loader: the dataset's eval transform)"),
    preset=("teterwak2025", f"{IPOOP_PAPER}: IP/OOP at 0.21 after dropping < 0.15 and "
            "> 0.40 (dg_plugins/alignment/rule.py)"))


def _ipoop(name: str) -> Protocol:
    release = name == "release"
    return Protocol(
        name=name, runs=(Run(("ERM",), {}),), alignment=dict(_IPOOP_ALIGNMENT),
        summary=("the authors' scorer and split rule, ERM trained for the authors' trainer's "
                 "lengths" if release else
                 "the authors' scorer and split rule, ERM in DomainBed's protocol"),
        datasets=Value(_IPOOP_DATASETS, f"{IPOOP_PAPER}: DomainBed-IP/OOP's five datasets"),
        test_envs=Value("single_test_envs", f"{IPOOP_PAPER}: leave-one-domain-out"),
        groups=(Group("", ("ipoop",), "ResNet-50 (DomainBed's ERM)"),),
        n_hparams=Value(1, "DomainBed's default hparams"),
        selections=Value(("iid", "oracle"), f"{DOMAINBED} domainbed/model_selection.py:75, :54 "
                                            "(IP/OOP tables use the same selection)"),
        **(_lengths(f"{IPOOP} domainbed/datasets/datasets.py", _IPOOP_LENGTHS) if release
           else _db_lengths(*_IPOOP_DATASETS)),
        differences=_diffs(
            ("Models: the paper's rows are DG methods on CLIP image encoders trained "
             f"with the authors' MIRO-based trainer ({IPOOP} train_all.py, "
             "domainbed/networks/backbones.py:94-95); the host trains DomainBed's ERM "
             "(ResNet-50): the IP/OOP protocol is the paper's, the models are not.",
             "the host has no CLIP-encoder DG methods"),
            ("Scores are computed once per image before training (alignment_scores, "
             "cached) instead of during each evaluation (evaluator.py --dump_scores); "
             "the values are the same function of the image and its class.",
             "the split must be known when jobs evaluate")),
    )


# --- The table ---


def _both(build, *args) -> dict[str, Protocol]:
    return {name: build(name, *args) for name in PROTOCOLS}


SETTINGS: dict[str, Setting] = {s.name: s for s in (
    Setting("dmg_pacs", "sweeps/dmg_pacs_paper.sh", DMG_PAPER,
            "Table 2 (PACS, out-of-domain), ResNet-18 and ResNet-50 rows: DMG and Aggregate*",
            {"release": _DMG_PACS_RELEASE, "domainbed": _DMG_PACS_DOMAINBED}),
    Setting("dmg_domainnet", "sweeps/dmg_domainnet_paper.sh", DMG_PAPER,
            "Table 1 (DomainNet, out-of-domain), ResNet-18 and ResNet-50 rows: DMG and Aggregate",
            {"release": _DMG_DN_RELEASE, "domainbed": _DMG_DN_DOMAINBED}),
    Setting("gmoe_domainbed", "sweeps/gmoe_domainbed.sh", GMOE_PAPER,
            "Table 1 (DomainBed, train-validation selection): GMoE-S/16 and ERM (ViT-S/16)",
            _both(_gmoe, False)),
    Setting("gmoe_single_source_domainnet", "sweeps/gmoe_single_source_domainnet.sh", GMOE_PAPER,
            "Table 3 (single-source DomainNet, trained on painting)",
            _both(_gmoe, True)),
    Setting("dismae_udg_domainnet20", "sweeps/dismae_udg_domainnet20.sh", DISMAE_PAPER,
            "the DomainNet UDG table (label fractions 1/5/10/100%, both 3+3 splits)",
            _both(_dismae_udg)),
    Setting("dismae_dg", "sweeps/dismae_dg.sh", DISMAE_PAPER, "the DG table (PACS, VLCS)",
            {"domainbed": _DISMAE_DG}),
    Setting("mpbm_digits", "sweeps/mpbm_digits.sh", MPBM_PAPER,
            "the Digits table (average over SVHN, MNIST-M, SYN, USPS: MPBM 81.3)",
            {"domainbed": _MPBM_DIGITS}),
    Setting("mpbm_pacs", "sweeps/mpbm_pacs.sh", MPBM_PAPER,
            "the PACS single-source table (average: MPBM 54.5)", {"domainbed": _MPBM_PACS}),
    Setting("ipoop", "sweeps/ipoop_domainbed.sh", IPOOP_PAPER,
            "DomainBed-IP/OOP (IP and OOP accuracy per dataset)", _both(_ipoop)),
)}


def get_setting(name: str) -> Setting:
    """The setting called ``name``; an unknown name raises ``KeyError`` naming the choices."""
    if name in SETTINGS:
        return SETTINGS[name]
    import difflib

    close = difflib.get_close_matches(name, list(SETTINGS), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise KeyError(f"unknown setting {name!r}{hint}; settings: {', '.join(SETTINGS)}")


def get_protocol(setting: Setting, name: str | None) -> Protocol:
    """``setting``'s protocol ``name`` (None: its default); ``KeyError`` saying why otherwise."""
    if not name:  # release where the paper has a release, else its only protocol
        name = "release" if "release" in setting.protocols else next(iter(setting.protocols))
    if name not in PROTOCOLS:
        raise KeyError(f"unknown protocol {name!r}; choices: {', '.join(PROTOCOLS)}")
    if name not in setting.protocols:
        why = "no official release exists" if name == "release" else "not defined"
        raise KeyError(f"{setting.name} has no {name!r} protocol ({why}); its protocols: "
                       f"{', '.join(setting.protocols)}")
    return setting.protocols[name]


def run_hparams(protocol: Protocol, group: Group, run: Run) -> dict[str, Any]:
    """The hparam overrides (values only) of ``run``'s jobs in ``group``."""
    return {name: value.value for name, value in {**group.hparams, **run.hparams}.items()}


def describe(setting: Setting, protocol: Protocol) -> str:
    """Every value of one protocol with its source, and the differences (plain text)."""
    p = protocol
    lines = [f"{setting.name} ({setting.script}), protocol {p.name}: {p.summary}",
             f"  paper: {setting.paper}, {setting.table}"]

    def rows(*named) -> None:
        lines.extend(f"  {name} = {v.value!r}  [{v.source}]" for name, v in named if v is not None)

    rows(("datasets", p.datasets), ("test_envs", p.test_envs), ("epochs", p.epochs),
         *((f"steps[{d}]", v) for d, v in p.steps.items()),
         *((f"checkpoint_freq[{d}]", v) for d, v in p.checkpoint_freq.items()))
    if p.epochs is not None and not p.checkpoint_freq:
        lines.append("  checkpoint_freq = one epoch  [a checkpoint every epoch, as the release "
                     "evaluates]")
    rows(("holdout_fraction", p.holdout_fraction), ("n_trials", p.n_trials),
         ("n_hparams", p.n_hparams), *((f"--{flag}", v) for flag, v in p.sweep_flags.items()),
         *((f"alignment {name}", v) for name, v in p.alignment.items()))
    for group in p.groups:
        lines.append(f"  group {group.folder or '.'} ({group.title}): paper rows "
                     f"{', '.join(group.paper_keys)}")
        rows(*((f"    {name}", v) for name, v in group.hparams.items()))
    for run in p.runs:
        lines.append(f"  run {', '.join(run.algorithms)}:")
        rows(*((f"    {name}", v) for name, v in run.hparams.items()))
    rows(("selection", p.selections))
    if p.differences:
        lines.append("  differences the host cannot express:")
        lines += [f"  - {diff.what} (why: {diff.reason})" for diff in p.differences]
    return "\n".join(lines) + "\n"
