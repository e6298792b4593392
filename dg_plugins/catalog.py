"""Names and environment labels of DomainBed's algorithms and datasets, without importing torch.

collect_results orders table rows and columns by these lists (protocol spec 2.5, 5.1, 9.5) and must
stay fast, so it cannot import the dataset classes. dg_plugins' own datasets and algorithms append
their names here when they are declared (:func:`declare_dataset`, :func:`declare_algorithm`); their
torch classes register separately in :mod:`dg_plugins.registry`.
"""

from __future__ import annotations

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

#: dg_plugins' built-in algorithms (registered by importing dg_plugins.algorithms), listed here so
#: that sweeps validate names without importing torch; tests check it matches the registry.
BUILTIN_ALGORITHMS = ["ERM"]

#: Every algorithm name in table order: DomainBed's, then dg_plugins' own as declared.
ALGORITHM_ORDER: list[str] = list(DOMAINBED_ALGORITHMS)
#: Every dataset in table order with its environment labels: DomainBed's, then dg_plugins'.
DATASET_ENVIRONMENTS: dict[str, list[str]] = dict(DOMAINBED_DATASETS)


def declare_algorithm(name: str) -> None:
    if name not in ALGORITHM_ORDER:
        ALGORITHM_ORDER.append(name)


def declare_dataset(name: str, environments: list[str]) -> None:
    known = DATASET_ENVIRONMENTS.get(name)
    if known is not None and list(known) != list(environments):
        raise ValueError(
            f"dataset {name!r} is declared with environments {known}, not {list(environments)}"
        )
    DATASET_ENVIRONMENTS[name] = list(environments)


# dg_plugins' built-in offline benchmark, declared here so that collect_results labels its columns
# without importing torch (its class, in dg_plugins.datasets.mnist, re-declares the same labels).
declare_dataset("RotatedMNIST5k", ["0", "15", "30", "45", "60", "75"])
