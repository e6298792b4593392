"""Names and environment labels of DomainBed's and dg_plugins' algorithms and datasets, without
importing torch.

collect_results orders table rows and columns by these lists (DomainBed orders them by
``algorithms.ALGORITHMS`` and ``datasets.DATASETS``) and sweeps validate names with them; both must
stay fast, so neither imports the torch classes. dg_plugins' built-in algorithm names are *derived*
from the source of ``dg_plugins/algorithms/`` (:func:`builtin_algorithms`: every class decorated
with ``@register_algorithm``), so adding a method file is the only edit; a test checks the result
against the registry. Datasets and algorithms registered at run time also append themselves here
(:func:`declare_dataset`, :func:`declare_algorithm`).
"""

from __future__ import annotations

import os
import re

#: DomainBed's ``algorithms.ALGORITHMS`` (b93c22a), in its order.
DOMAINBED_ALGORITHMS = [
    "ERM", "ERMPlusPlus", "Fish", "IRM", "GroupDRO", "Mixup", "MLDG", "CORAL", "MMD", "DANN",
    "CDANN", "MTL", "SagNet", "ARM", "VREx", "RSC", "SD", "ANDMask", "SANDMask", "IGA", "SelfReg",
    "Fishr", "TRM", "IB_ERM", "IB_IRM", "CAD", "CondCAD", "Transfer", "CausIRL_CORAL",
    "CausIRL_MMD", "EQRM", "RDM", "ADRMX", "URM",
]

_SPAWRIOUS_ENVS = ["Test", "SC_group_1", "SC_group_2"]

#: DomainBed's ``datasets.DATASETS`` in its order, with each class's ``ENVIRONMENTS``.
DOMAINBED_DATASETS: dict[str, list[str]] = {
    "Debug28": ["0", "1", "2"],
    "Debug224": ["0", "1", "2"],
    "ColoredMNIST": ["+90%", "+80%", "-90%"],
    "RotatedMNIST": ["0", "15", "30", "45", "60", "75"],
    "VLCS": ["C", "L", "S", "V"],
    "PACS": ["A", "C", "P", "S"],
    "OfficeHome": ["A", "C", "P", "R"],
    "TerraIncognita": ["L100", "L38", "L43", "L46"],
    "DomainNet": ["clip", "info", "paint", "quick", "real", "sketch"],
    "SVIRO": ["aclass", "escape", "hilux", "i3", "lexus", "tesla", "tiguan", "tucson", "x5", "zoe"],
    "WILDSCamelyon": ["hospital_0", "hospital_1", "hospital_2", "hospital_3", "hospital_4"],
    "WILDSFMoW": ["region_0", "region_1", "region_2", "region_3", "region_4", "region_5"],
    "SpawriousO2O_easy": _SPAWRIOUS_ENVS,
    "SpawriousO2O_medium": _SPAWRIOUS_ENVS,
    "SpawriousO2O_hard": _SPAWRIOUS_ENVS,
    "SpawriousM2M_easy": _SPAWRIOUS_ENVS,
    "SpawriousM2M_medium": _SPAWRIOUS_ENVS,
    "SpawriousM2M_hard": _SPAWRIOUS_ENVS,
}

#: Number of classes of each dataset (DomainBed's classes set ``num_classes`` when they load;
#: these are the values they set), for chance levels in reports that do not import torch.
DATASET_CLASSES: dict[str, int] = {
    "Debug28": 2, "Debug224": 2, "ColoredMNIST": 2, "RotatedMNIST": 10, "VLCS": 5, "PACS": 7,
    "OfficeHome": 65, "TerraIncognita": 10, "DomainNet": 345, "SVIRO": 7, "WILDSCamelyon": 2,
    "WILDSFMoW": 62, **{name: 4 for name in DOMAINBED_DATASETS if name.startswith("Spawrious")},
    "RotatedMNIST5k": 10, "DomainNet20": 20, "Digits": 10, "DigitsOffline": 10,
}

ALGORITHMS_PACKAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "algorithms")
#: The module imported first (the template and every table's baseline); the rest in name order.
FIRST_ALGORITHM_MODULE = "erm"
_REGISTRATION = re.compile(
    r"^@register_algorithm\(\s*(?:(?:name\s*=\s*)?[\"']([^\"']+)[\"'])?[^)]*\)\s*\n"
    r"(?:@.*\n)*class\s+(\w+)", re.MULTILINE)


def algorithm_modules() -> list[str]:
    """The modules of ``dg_plugins.algorithms`` that may define algorithms, in import order:
    ``erm`` first, then every other module (``base`` and private ``_*`` excluded) by name."""
    names = sorted(f[:-3] for f in os.listdir(ALGORITHMS_PACKAGE)
                   if f.endswith(".py") and not f.startswith("_") and f != "base.py")
    if FIRST_ALGORITHM_MODULE in names:
        names.remove(FIRST_ALGORITHM_MODULE)
        names.insert(0, FIRST_ALGORITHM_MODULE)
    return names


def builtin_algorithms() -> list[str]:
    """Names registered by ``@register_algorithm`` in dg_plugins' algorithm modules, in registry
    order, found by reading their source (no import, no torch)."""
    found = []
    for module in algorithm_modules():
        with open(os.path.join(ALGORITHMS_PACKAGE, module + ".py"), encoding="utf-8") as f:
            source = f.read()
        found += [name or cls for name, cls in _REGISTRATION.findall(source)]
    return found


#: dg_plugins' built-in algorithms (see :func:`builtin_algorithms`).
BUILTIN_ALGORITHMS = builtin_algorithms()

#: Every algorithm name in table order: DomainBed's, then dg_plugins' own, then those declared.
ALGORITHM_ORDER: list[str] = list(dict.fromkeys(DOMAINBED_ALGORITHMS + BUILTIN_ALGORITHMS))
#: Every dataset in table order with its environment labels: DomainBed's, then dg_plugins'.
DATASET_ENVIRONMENTS: dict[str, list[str]] = dict(DOMAINBED_DATASETS)
#: A dataset's default ``backbone`` hparam when it is not "auto" (e.g. LeNet for 32x32 digits).
DATASET_BACKBONES: dict[str, str] = {}
#: Hparams that a dataset reads from the job's hparams (e.g. an augmentation switch), as
#: ``{dataset: {name: (default, random_fn[, check])}}`` entries of ``dg_plugins.hparams`` spaces;
#: :func:`dataset_hparam_space` returns them for one dataset.
DATASET_HPARAMS: dict[str, dict[str, tuple]] = {}


def declare_algorithm(name: str) -> None:
    if name not in ALGORITHM_ORDER:
        ALGORITHM_ORDER.append(name)


def declare_dataset(name: str, environments: list[str], backbone: str | None = None) -> None:
    known = DATASET_ENVIRONMENTS.get(name)
    if known is not None and list(known) != list(environments):
        raise ValueError(
            f"dataset {name!r} is declared with environments {known}, not {list(environments)}"
        )
    DATASET_ENVIRONMENTS[name] = list(environments)
    if backbone is not None:
        DATASET_BACKBONES[name] = backbone


def declare_dataset_hparams(name: str, space: dict[str, tuple]) -> None:
    """Declare hparams read by dataset ``name`` (``{hparam: (default, random_fn[, check])}``, the
    form of ``dg_plugins.hparams`` spaces); a name declared again with another default raises."""
    known = DATASET_HPARAMS.setdefault(name, {})
    for hparam, entry in space.items():
        if hparam in known and known[hparam][0] != entry[0]:
            raise ValueError(f"dataset {name!r} already declares hparam {hparam!r} with default "
                             f"{known[hparam][0]!r}, not {entry[0]!r}")
        known[hparam] = entry


def dataset_hparam_space(name: str) -> dict[str, tuple]:
    """The hparams dataset ``name`` reads ({} for most datasets)."""
    return dict(DATASET_HPARAMS.get(name, {}))


def _probability(value) -> str | None:
    return None if 0 <= value <= 1 else "must be a probability in [0, 1]"


# dg_plugins' built-in offline benchmark, declared here so that collect_results labels its columns
# without importing torch (its class, in dg_plugins.datasets.mnist, re-declares the same labels).
declare_dataset("RotatedMNIST5k", ["0", "15", "30", "45", "60", "75"])
# DomainNet restricted to the 20 classes of the UDG protocol (dg_plugins.datasets.domainnet20);
# DomainBed's DomainNet environment labels.
declare_dataset("DomainNet20", ["clip", "info", "paint", "quick", "real", "sketch"])
# Single-source digits (dg_plugins.datasets.digits): MNIST-10k -> SVHN, MNIST-M, SYN, USPS; LeNet.
declare_dataset("Digits", ["mnist", "svhn", "mnist_m", "syn", "usps"], "lenet")
# Offline stand-in for Digits built from pip wheels (dg_plugins.datasets.digits_offline): same
# environments and backbone; its hparam digits_color_jitter (probability, default 0 = off) gives the
# training environments' images random per-channel colours (the plain-augmentation reference).
declare_dataset("DigitsOffline", ["mnist", "svhn", "mnist_m", "syn", "usps"], "lenet")
declare_dataset_hparams("DigitsOffline",
                        {"digits_color_jitter": (0.0, lambda r: 0.0, _probability)})
