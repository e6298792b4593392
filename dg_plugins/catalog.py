"""Names and environment labels of DomainBed's and dg_plugins' algorithms and datasets, without
torch, for collect_results' table order and sweep's checks. Our built-in names are read from the
sources (``@register_...``), so adding a file is the only edit; run-time ones declare here."""

from __future__ import annotations

import os
import re

from dg_plugins.layouts import (IMAGE_EXTENSIONS, domain_folder_error, has_image,
                                inside_dataset_folder, visible_subfolders)
from dg_plugins.registry import close_names

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
    **{f"Spawrious{kind}_{level}": _SPAWRIOUS_ENVS
       for kind in ("O2O", "M2M") for level in ("easy", "medium", "hard")},
}

#: Number of classes of each dataset (the ``num_classes`` DomainBed's classes set on loading).
DATASET_CLASSES: dict[str, int] = {
    "Debug28": 2, "Debug224": 2, "ColoredMNIST": 2, "RotatedMNIST": 10, "VLCS": 5, "PACS": 7,
    "OfficeHome": 65, "TerraIncognita": 10, "DomainNet": 345, "SVIRO": 7, "WILDSCamelyon": 2,
    "WILDSFMoW": 62, **{name: 4 for name in DOMAINBED_DATASETS if name.startswith("Spawrious")},
    "RotatedMNIST5k": 10, "DomainNet20": 20, "Digits": 10, "DigitsOffline": 10,
}

ALGORITHMS_PACKAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "algorithms")
DATASETS_PACKAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "datasets")
#: The module imported first (the template and every table's baseline); the rest in name order.
FIRST_ALGORITHM_MODULE = "erm"


def _modules(package: str) -> list[str]:
    """The modules of ``package`` that may register names (``base`` and ``_*`` excluded)."""
    return sorted(f[:-3] for f in os.listdir(package)
                  if f.endswith(".py") and not f.startswith("_") and f != "base.py")


def algorithm_modules() -> list[str]:
    """The algorithm modules in import order: ``erm`` first, then by name."""
    return sorted(_modules(ALGORITHMS_PACKAGE), key=lambda name: name != FIRST_ALGORITHM_MODULE)


def _registered(package: str, modules: list[str], kind: str) -> list[str]:
    """Names ``@register_KIND`` (or ``DATASETS.register("X", ...)``) registers in ``modules``."""
    decorated = re.compile(
        rf"^@register_{kind}\(\s*(?:(?:name\s*=\s*)?[\"']([^\"']+)[\"'])?[^)]*\)\s*\n"
        r"(?:@.*\n)*class\s+(\w+)", re.MULTILINE)
    direct = re.compile(r"^DATASETS\.register\(\s*[\"']([^\"']+)[\"']", re.MULTILINE)
    found = []
    for module in modules:
        with open(os.path.join(package, module + ".py"), encoding="utf-8") as f:
            source = f.read()
        found += [name or cls for name, cls in decorated.findall(source)]
        found += direct.findall(source) if kind == "dataset" else []
    return found


BUILTIN_ALGORITHMS = _registered(ALGORITHMS_PACKAGE, algorithm_modules(), "algorithm")
BUILTIN_DATASETS = _registered(DATASETS_PACKAGE, _modules(DATASETS_PACKAGE), "dataset")

#: Every algorithm name in table order: DomainBed's, then dg_plugins' own, then those declared.
ALGORITHM_ORDER: list[str] = list(dict.fromkeys(DOMAINBED_ALGORITHMS + BUILTIN_ALGORITHMS))
#: Every dataset in table order with its environment labels: DomainBed's, then dg_plugins'.
DATASET_ENVIRONMENTS: dict[str, list[str]] = dict(DOMAINBED_DATASETS)
#: A dataset's default ``backbone`` hparam when it is not "auto" (e.g. LeNet for 32x32 digits).
DATASET_BACKBONES: dict[str, str] = {}
#: Hparams a dataset reads (``{dataset: {name: (default, random_fn[, check])}}``).
DATASET_HPARAMS: dict[str, dict[str, tuple]] = {}

#: Datasets declared at run time (:func:`declare_dataset`, e.g. a plugin's ``@register_dataset``).
DECLARED_DATASETS: list[str] = []


def declare_algorithm(name: str) -> None:
    if name not in ALGORITHM_ORDER:
        ALGORITHM_ORDER.append(name)


def declare_dataset(name: str, environments: list[str], backbone: str | None = None) -> None:
    known = DATASET_ENVIRONMENTS.get(name)
    if known is not None and list(known) != list(environments):
        raise ValueError(f"dataset {name!r} is declared with environments {known}, "
                         f"not {list(environments)}")
    DATASET_ENVIRONMENTS[name] = list(environments)
    if name not in DECLARED_DATASETS:
        DECLARED_DATASETS.append(name)
    if backbone is not None:
        DATASET_BACKBONES[name] = backbone


def declare_dataset_hparams(name: str, space: dict[str, tuple]) -> None:
    """Add hparams read by dataset ``name`` (a space's entries); another default raises."""
    known = DATASET_HPARAMS.setdefault(name, {})
    for hparam, entry in space.items():
        if hparam in known and known[hparam][0] != entry[0]:
            raise ValueError(f"dataset {name!r} already declares hparam {hparam!r} with default "
                             f"{known[hparam][0]!r}, not {entry[0]!r}")
        known[hparam] = entry


def dataset_hparam_space(name: str) -> dict[str, tuple]:
    """The hparams dataset ``name`` reads ({} for most datasets)."""
    return dict(DATASET_HPARAMS.get(name, {}))


def one_of(*choices):
    """An hparam check accepting only ``choices`` (:mod:`dg_plugins.hparams` imports it)."""
    return lambda value: (None if value in choices
                          else f"must be one of {', '.join(map(repr, choices))}")


#: Values of the image-folder hparam ``augmentation`` (the training transform: DomainBed's or
#: the DMG release's, ``dg_plugins.datasets.image_folder.training_transform``).
AUGMENTATIONS = ("domainbed", "dmg_pacs", "dmg_domainnet")
#: Values of PACS's hparam ``data_split``: DomainBed's random holdout or the official lists.
DATA_SPLITS = ("domainbed", "official")

#: Image-folder datasets: name -> the folder under ``--data_dir`` holding the domain folders
#: (None: ``--data_dir`` itself); ``make_image_folder_dataset``'s add themselves.
IMAGE_FOLDER_DATASETS: dict[str, str | None] = {
    "VLCS": "VLCS", "PACS": "PACS", "OfficeHome": "office_home",
    "TerraIncognita": "terra_incognita", "DomainNet": "domain_net", "DomainNet20": "domain_net",
    "ImageFolder": None,
}
#: The generic image-folder dataset: ``--data_dir`` is the tree, its environments are its folders.
GENERIC_IMAGE_FOLDER = "ImageFolder"

#: DomainBed's input size of the image-folder datasets, and the hparam that changes it.
IMAGE_SIZE, IMAGE_SIZE_HPARAM = 224, "image_size"
#: The largest ``image_size``: a batch of larger images would not fit in memory.
MAX_IMAGE_SIZE = 1024


def _image_size(value) -> str | None:
    return None if isinstance(value, int) and 32 <= value <= MAX_IMAGE_SIZE and value % 16 == 0 \
        else f"must be a multiple of 16 from 32 to {MAX_IMAGE_SIZE} (DomainBed's: 224)"


def declare_image_folder_dataset(name: str, folder_name: str | None) -> None:
    """Record ``name`` as read from ``<data_dir>/<folder_name>``; declare its hparams, not drawn:
    ``augmentation`` and ``image_size`` (the side of the transforms' square images)."""
    if (known := IMAGE_FOLDER_DATASETS.get(name, folder_name)) != folder_name:
        raise ValueError(f"image-folder dataset {name!r} is declared with folder {known!r}, "
                         f"not {folder_name!r}")
    IMAGE_FOLDER_DATASETS[name] = folder_name
    declare_dataset_hparams(name, {
        "augmentation": ("domainbed", lambda r: "domainbed", one_of(*AUGMENTATIONS)),
        IMAGE_SIZE_HPARAM: (IMAGE_SIZE, lambda r: IMAGE_SIZE, _image_size)})


#: The command that runs DomainBed's own datasets (and algorithms) with dg_plugins installed.
BRIDGE_SWEEP_COMMAND = "python -m dg_plugins.scripts.domainbed sweep ..."


def implemented_datasets() -> list[str]:
    """Every dataset our train can run, in table order (built-in, ``ImageFolder``, declared)."""
    implemented = set(BUILTIN_DATASETS) | set(DECLARED_DATASETS) | {GENERIC_IMAGE_FOLDER}
    ordered = [name for name in DATASET_ENVIRONMENTS if name in implemented]
    return ordered + sorted(implemented - set(ordered))


def domainbed_only_datasets() -> list[str]:
    """DomainBed's datasets that only run through the bridge (SVIRO, WILDS, Spawrious)."""
    implemented = set(implemented_datasets())
    return [name for name in DOMAINBED_DATASETS if name not in implemented]


def check_dataset_name(name: str, extra=()) -> None:
    """ValueError unless our train runs dataset ``name`` (naming the bridge or the choices)."""
    choices = list(dict.fromkeys([*implemented_datasets(), *extra]))
    if name in choices:
        return
    domainbed_only = domainbed_only_datasets()
    if name in domainbed_only:
        raise ValueError(
            f"{name} is a DomainBed dataset that dg_plugins does not implement; run it through "
            f"the bridge: {BRIDGE_SWEEP_COMMAND} (with a DomainBed checkout: set DOMAINBED_ROOT "
            "to the folder that contains domainbed/)")
    close = close_names(str(name), choices)
    hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
    bridged = close_names(str(name), domainbed_only)
    if bridged and not close:
        hint = (f"; did you mean {', '.join(map(repr, bridged))}? (DomainBed's own: run through "
                f"the bridge, {BRIDGE_SWEEP_COMMAND})")
    raise ValueError(f"unknown dataset {name!r}{hint} (choices: {', '.join(choices)}; your own "
                     f"image tree: {GENERIC_IMAGE_FOLDER} with --data_dir set to it)")


def image_folder_layout(dataset: str) -> str:
    """The layout image-folder dataset ``dataset`` expects, for error messages."""
    folder = IMAGE_FOLDER_DATASETS.get(dataset)
    base = os.path.join("<data_dir>", folder) if folder else "<data_dir>"
    return (f"{dataset} expects {os.path.join(base, '<domain>', '<class>', '<image>.jpg')} (one "
            "folder per domain, one subfolder per class)")


def nested_tree_error(dataset: str, root: str, domains: list[str]) -> ValueError | None:
    """The error for a ``--data_dir`` one level above an image tree, naming the tree; else None."""
    if len(domains) != 1:
        return None
    tree = os.path.join(root, domains[0])
    inner = visible_subfolders(tree)
    folders = [os.path.join(tree, d) for d in inner]
    if len(inner) < 2 or not all(visible_subfolders(f) and has_image(f) for f in folders):
        return None
    return ValueError(
        f"{dataset}: {root} holds one domain folder, {domains[0]}, whose class folders "
        f"({', '.join(inner)}) hold class folders themselves: the image tree is one level down; "
        f"did you mean --data_dir {tree}?")


def environments_of(dataset: str, data_dir: str | None) -> list[str]:
    """``dataset``'s environment labels as train will see them: image folders found on disk
    (layout checked, errors naming the fix), others as declared. Torch-free."""
    if dataset not in IMAGE_FOLDER_DATASETS:
        check_dataset_name(dataset)
        return list(DATASET_ENVIRONMENTS[dataset])
    layout = image_folder_layout(dataset)
    if not data_dir:
        raise FileNotFoundError(f"no data directory given for {dataset} (pass --data_dir). "
                                f"{layout}.")
    folder = IMAGE_FOLDER_DATASETS[dataset]
    root = os.path.join(data_dir, folder) if folder else data_dir
    if not os.path.isdir(root):
        raise FileNotFoundError((folder and inside_dataset_folder(dataset, data_dir, folder))
                                or f"{dataset}: dataset folder {root} does not exist. {layout}.")
    if not (domains := visible_subfolders(root)):
        raise FileNotFoundError(f"{dataset}: no domain folders in {root}. {layout}.")
    fixed = DATASET_ENVIRONMENTS.get(dataset) if dataset != GENERIC_IMAGE_FOLDER else None
    if fixed is None:
        if (nested := nested_tree_error(dataset, root, domains)) is not None:
            raise nested
        if (shallow := domain_folder_error(dataset, root, domains)) is not None:
            raise FileNotFoundError(shallow)
    elif len(domains) != len(fixed):
        raise ValueError(f"{dataset}: {root} has {len(domains)} domain folders "
                         f"({', '.join(domains)}) but {dataset} has {len(fixed)} environments "
                         f"({', '.join(fixed)}); remove stray folders. {layout}.")
    for domain in domains:
        path = os.path.join(root, domain)
        if not visible_subfolders(path):
            raise FileNotFoundError(f"{dataset}: no class folders in domain folder {path}. "
                                    f"{layout}.")
        if not has_image(path):
            raise FileNotFoundError(
                f"{dataset}: no image files ({', '.join(sorted(IMAGE_EXTENSIONS))}) in the class "
                f"folders of {path}. {layout}.")
    return list(fixed) if fixed is not None else domains


# dg_plugins' datasets, declared here so that collect_results labels them without torch (their
# classes re-declare the same labels)
declare_dataset("RotatedMNIST5k", ["0", "15", "30", "45", "60", "75"])
declare_dataset("DomainNet20", ["clip", "info", "paint", "quick", "real", "sketch"])
declare_dataset("Digits", ["mnist", "svhn", "mnist_m", "syn", "usps"], "lenet")
declare_dataset("DigitsOffline", ["mnist", "svhn", "mnist_m", "syn", "usps"], "lenet")
declare_dataset_hparams("DigitsOffline",
                        {"digits_color_jitter": (0.0, lambda r: 0.0, lambda v: None if 0 <= v <= 1
                                                 else "must be a probability in [0, 1]")})
for _name, _folder in list(IMAGE_FOLDER_DATASETS.items()):
    declare_image_folder_dataset(_name, _folder)
declare_dataset_hparams("PACS", {"data_split": ("domainbed", lambda r: "domainbed",
                                                one_of(*DATA_SPLITS))})
