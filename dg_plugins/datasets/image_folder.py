"""Image-folder datasets (``domainbed/datasets.py``): VLCS, PACS, OfficeHome, TerraIncognita,
DomainNet, the generic ``ImageFolder`` and :func:`make_image_folder_dataset` for any tree
``<dataset folder>/<domain>/<class>/<image>``, in DomainBed's order. Ours besides: hidden files
ignored, classes the union over domains, errors naming the fix, high-bit-depth images scaled
(:func:`to_rgb`), the hparams ``augmentation`` and ``data_split``; images decoded lazily (from
:mod:`dg_plugins.datasets.decoded` when attached)."""

from __future__ import annotations

import copy
import os
import re
import shlex
import sys
import warnings

import numpy as np
import torch.utils.data

import dg_plugins.compat  # noqa: F401  (must precede any torchvision import)
from dg_plugins import catalog, layouts
from dg_plugins.datasets.base import MultipleDomainDataset, register_dataset
from dg_plugins.layouts import (IMAGE_EXTENSIONS, PACS_SPLITS_URL, OfficialSplitError,
                                visible_subfolders)
from dg_plugins.registry import DATASETS
from dg_plugins.runtime import swapped

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
IMAGE_SIZE = catalog.IMAGE_SIZE
#: The dataset hparam choosing the training transform (values: catalog.AUGMENTATIONS).
AUGMENTATION_HPARAM = "augmentation"


def _compose(*steps):
    """``steps``, then ToTensor and ImageNet Normalize."""
    from torchvision import transforms as T

    return T.Compose([*steps, T.ToTensor(), T.Normalize(mean=IMAGENET_MEAN, std=IMAGENET_STD)])


def plain_transform(size: int = IMAGE_SIZE):
    """DomainBed's evaluation transform, also the DMG release's (prithv1/DMG@6b162b4
    ``train_model.py`` lines 129-144): Resize to size x size."""
    from torchvision import transforms as T

    return _compose(T.Resize((size, size)))


def training_transform(augmentation: str = "domainbed", size: int = IMAGE_SIZE):
    """The training transform named by the dataset hparam ``augmentation`` at ``size``:
    DomainBed's (``MultipleEnvironmentImageFolder``), or the DMG release's for PACS or DomainNet
    (prithv1/DMG@6b162b4 ``train_model.py`` lines 146-165); ValueError listing the choices."""
    from torchvision import transforms as T

    steps = {
        "domainbed": lambda: (T.RandomResizedCrop(size, scale=(0.7, 1.0)),
                              T.RandomHorizontalFlip(), T.ColorJitter(0.3, 0.3, 0.3, 0.3),
                              T.RandomGrayscale()),
        "dmg_pacs": lambda: (T.RandomResizedCrop(size, scale=(0.8, 1.0)),
                             T.RandomHorizontalFlip(), T.ColorJitter(0.4, 0.4, 0.4, 0.4)),
        "dmg_domainnet": lambda: (T.Resize(round(256 * size / IMAGE_SIZE)), T.RandomCrop(size),
                                  T.RandomHorizontalFlip()),
    }
    if not isinstance(augmentation, str) or augmentation not in steps:
        raise ValueError(f"unknown {AUGMENTATION_HPARAM} {augmentation!r}; choices: "
                         f"{', '.join(catalog.AUGMENTATIONS)}")
    return _compose(*steps[augmentation]())


def high_bit_depth_max(image) -> float | None:
    """The value that maps to white for a high-bit-depth PIL image (None for 8-bit modes)."""
    if image.mode == "F":
        return 1.0
    if image.mode.startswith("I;16") or (image.mode == "I" and image.format in ("PNG", "PPM")):
        return 65535.0
    if image.mode != "I":
        return None
    tags = getattr(image, "tag_v2", None)
    if image.format == "TIFF" and tags is not None and 258 in tags:  # bits, sample format
        bits, kind = (v[0] if isinstance(v, tuple) else v for v in (tags[258], tags.get(339, 1)))
        if 1 <= int(bits) <= 32:
            return float(2 ** (int(bits) - 1) - 1 if kind == 2 else 2 ** int(bits) - 1)
    return float(2 ** 31 - 1)


def to_rgb(image):
    """``image`` as 8-bit RGB as torchvision's loader makes it; high-bit-depth modes scaled first
    (PIL's conversion clips them: a 16-bit image would decode almost white)."""
    from PIL import Image

    if (maximum := high_bit_depth_max(image)) is None:
        return image.convert("RGB")
    values = np.asarray(image, dtype=np.float64)
    grey = np.clip(np.round(values * (255.0 / maximum)), 0, 255).astype(np.uint8)
    return Image.fromarray(grey, mode="L").convert("RGB")


def load_rgb_image(path: str):
    """An image file as 8-bit RGB; a truncated file fails even under DomainBed's
    ``ImageFile.LOAD_TRUNCATED_IMAGES = True``."""
    from PIL import Image, ImageFile

    with swapped(ImageFile, "LOAD_TRUNCATED_IMAGES", False), Image.open(path) as image:
        return to_rgb(image)


def image_error(path: str) -> str | None:
    """None when ``path`` decodes as training decodes it, else ``"<ExceptionType>: <message>"``."""
    try:
        load_rgb_image(path)
    except MemoryError:
        raise
    except Exception as err:  # noqa: BLE001  (PIL raises OSError, SyntaxError, ValueError, ...)
        return f"{type(err).__name__}: {err}"
    return None


class UnreadableImageError(OSError, ValueError):
    """An image file PIL cannot decode (``path``): an OSError and a ValueError (train's one line).
    Re-raised from a DataLoader worker, it keeps its message (the rest: ``worker_traceback``)."""

    _MARK = "UnreadableImageError: "

    def __init__(self, message: str, path: str | None = None):
        self.worker_traceback = None
        if message.startswith("Caught UnreadableImageError") and self._MARK in message:
            # "Caught <type> in DataLoader worker process <i>.\nOriginal Traceback ... <message>"
            where = message.split("\n", 1)[0][len("Caught UnreadableImageError "):].rstrip(".")
            self.worker_traceback = message
            message = f"{message.rsplit(self._MARK, 1)[1].strip()} (raised {where})"
        super().__init__(message)
        if path is None:
            match = re.match(r"cannot decode image file (.*?) \((?:dataset|environment) ", message)
            path = match.group(1) if match else None
        self.path = path

    def __reduce__(self):
        return type(self), (str(self), self.path)


class ImageFolderEnvironment(torch.utils.data.Dataset):
    """One domain: ``(transform(RGB PIL image), label)`` items, decoded lazily; ``samples`` as
    torchvision's ImageFolder's, ``classes`` the dataset's."""

    def __init__(self, root: str, classes: list[str], transform=None):
        self.root, self.classes, self.transform = root, classes, transform
        self.class_to_idx = {name: index for index, name in enumerate(classes)}
        #: Items decoded with ``eval_transform`` (e.g. an official split's validation items).
        self.eval_indices, self.eval_transform = frozenset(), None
        self.samples = layouts.image_samples(root, classes)
        self.targets = [label for _, label in self.samples]
        #: For error messages: the dataset's name, this environment's label, the data_dir.
        self.dataset_name = self.environment = self.data_dir = None
        #: The decoded-image cache (:mod:`dg_plugins.datasets.decoded`), when a job attached it.
        self.decoded = self.pixel_store = None
        #: ``(transform, its split)`` of the transform augmented on the device (``--augment_on``),
        #: and the splits of transforms already split (by id)
        self.device_split, self._split_transforms = None, {}

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int):
        image, transform = self.image(index), self.transform_of(index)
        return image if transform is None else transform(image), self.samples[index][1]

    def transform_of(self, index: int):
        return self.eval_transform if index in self.eval_indices else self.transform

    def image(self, index: int):
        """Item ``index``'s RGB PIL image: from the decoded-image cache, else its file."""
        image = None if self.decoded is None else self.decoded.image(index)
        return self.load(self.samples[index][0]) if image is None else image

    def pixel_transform(self, transform):
        """``transform`` as a memoized :class:`~dg_plugins.datasets.decoded.PixelTransform`, or
        None; for the transform of :attr:`device_split`, that split."""
        from dg_plugins.datasets.decoded import split_transform

        if self.device_split is not None and transform is self.device_split[0]:
            return self.device_split[1]
        known = self._split_transforms.get(id(transform))
        if known is None or known[0] is not transform:
            known = (transform, split_transform(transform))
            self._split_transforms[id(transform)] = known
        return known[1]

    def item_transforms(self) -> list:
        """``transform``, and ``eval_transform`` when some items take it."""
        return [self.transform] + ([self.eval_transform] if self.eval_indices else [])

    def finisher(self, positions=None):
        """The finisher shared by the items at ``positions`` (default: all), else None;
        ValueError for device-augmented items beside others."""
        used = self.item_transforms()
        if self.eval_indices and positions is not None and len(positions):
            evaluated = np.isin(np.asarray(positions, dtype=np.int64),
                                np.fromiter(self.eval_indices, dtype=np.int64))
            used = ([self.transform] * (not evaluated.all())
                    + [self.eval_transform] * bool(evaluated.any()))
        splits = [self.pixel_transform(t) for t in used]
        if any(s is None for s in splits):
            return None
        if any(s.finisher.key != splits[0].finisher.key for s in splits[1:]):
            if any(s.finisher.seeded for s in splits):
                raise ValueError(f"--augment_on device: a split of {self.environment or self.root}"
                                 " holds items augmented on the device and unaugmented items "
                                 "(an official split's validation images); use --augment_on "
                                 "loader")
            return None
        return splits[0].finisher

    def pixels(self, index: int):
        """``(uint8 [3, H, W] pixels, label)`` of item ``index`` after its transform's pixel part
        (from the cache when it holds them); only with a :meth:`finisher`."""
        transform, store = self.pixel_transform(self.transform_of(index)), self.pixel_store
        entry = store.plain_entry(transform) if transform.deterministic and store else None
        if entry is not None and entry.covers(index):
            return torch.from_numpy(entry.read(index)), self.samples[index][1]
        return transform.pixels(self.image(index)), self.samples[index][1]

    def evaluation_pixel_transforms(self) -> list:
        """The deterministic splits of :meth:`item_transforms` (the cache keeps their pixels)."""
        splits = [self.pixel_transform(t) for t in self.item_transforms()]
        if any(s is None for s in splits):
            return []
        return [s for k, s in enumerate(splits)
                if s.deterministic and all(s.key != t.key for t in splits[:k])]

    def attach_cache(self, store) -> None:
        self.pixel_store, self.decoded = store, store.decoded

    def load(self, path: str):
        """The RGB PIL image of ``path``; :class:`UnreadableImageError` when PIL cannot decode."""
        try:
            return load_rgb_image(path)
        except MemoryError:
            raise
        except Exception as err:  # noqa: BLE001  (PIL raises OSError, SyntaxError, ValueError...)
            raise UnreadableImageError(self.describe_error(path, err), path) from err

    def describe_error(self, path: str, err: BaseException) -> str:
        """``cannot decode image file <path> (dataset D, environment E): <error>. <fix>``."""
        folder = os.path.basename(os.path.normpath(self.root))
        env = (f"{self.environment} ({folder})" if self.environment and self.environment != folder
               else self.environment or folder)
        where = [f"dataset {self.dataset_name}"] * bool(self.dataset_name) + [f"environment {env}"]
        fix = "Remove or replace this file"
        if self.dataset_name:
            fix += ("; to list every unreadable image of the dataset before a run, use python -m "
                    f"dg_plugins.scripts.check_data --dataset {shlex.quote(self.dataset_name)}"
                    + (f" --data_dir {shlex.quote(self.data_dir)}" if self.data_dir is not None
                       else ""))
        return (f"cannot decode image file {path} ({', '.join(where)}): "
                f"{type(err).__name__}: {err}. {fix}.")

    def with_transform(self, transform) -> "ImageFolderEnvironment":
        view = copy.copy(self)
        view.transform, view.eval_indices, view.eval_transform = transform, frozenset(), None
        return view

    def relative_paths(self) -> list[str]:
        return layouts.relative_paths(self.root, [path for path, _ in self.samples])


class MultipleEnvironmentImageFolder(MultipleDomainDataset):
    """DomainBed's ``MultipleEnvironmentImageFolder`` (same signature): ``augment`` gives every
    environment not in ``test_envs`` :func:`training_transform`, the others
    :func:`plain_transform`; declared ``ENVIRONMENTS`` must match the domain folders."""

    CHECKPOINT_FREQ = 300
    INPUT_SHAPE = (3, IMAGE_SIZE, IMAGE_SIZE)
    #: Subfolder of data_dir holding the dataset (None: data_dir itself); for messages and lookup.
    FOLDER_NAME: str | None = None
    #: The domain folders of the standard release, in sorted order (for messages and a check).
    ENV_FOLDERS: tuple[str, ...] | None = None

    def __init__(self, root, test_envs, augment, hparams):
        self.test_envs = test_envs = list(test_envs or ())
        self.augmentation = (hparams or {}).get(AUGMENTATION_HPARAM, "domainbed")
        self.image_size = (hparams or {}).get(catalog.IMAGE_SIZE_HPARAM, IMAGE_SIZE)
        if self.augmentation not in catalog.AUGMENTATIONS:
            training_transform(self.augmentation)  # raises, naming the choices
        if not augment and self.augmentation != "domainbed":
            raise ValueError(
                f"{AUGMENTATION_HPARAM} {self.augmentation!r} asks for an augmentation but "
                "data_augmentation is false (no environment would be augmented): drop one of "
                "the two hparams")
        self.root, self.environment_folders = root, self._find_environment_folders(root)
        self.classes = sorted(set().union(*(self._find_class_folders(env)
                                            for env in self.environment_folders)))
        self.class_to_idx = {name: index for index, name in enumerate(self.classes)}
        self.plain_transform = plain_transform(self.image_size)
        self.augment_transform = (training_transform(self.augmentation, self.image_size)
                                  if augment else None)
        self.augmented_envs = [i for i in range(len(self.environment_folders))
                               if augment and i not in test_envs]
        if self.ENVIRONMENTS is None:  # the generic dataset: labels are the folder names
            self.ENVIRONMENTS = list(self.environment_folders)
        self.datasets = []
        for i, (label, env) in enumerate(zip(self.ENVIRONMENTS, self.environment_folders)):
            env_dataset = ImageFolderEnvironment(os.path.join(root, env), self.classes, (
                self.augment_transform if i in self.augmented_envs else self.plain_transform))
            if not env_dataset.samples:
                raise FileNotFoundError(
                    f"no image files ({', '.join(sorted(IMAGE_EXTENSIONS))}) in the class folders "
                    f"of {os.path.join(root, env)}. {self.expected_layout()}")
            env_dataset.dataset_name, env_dataset.environment = type(self).__name__, label
            env_dataset.data_dir = getattr(self, "data_dir", root)
            self.datasets.append(env_dataset)
        self.input_shape = (3, self.image_size, self.image_size)
        self.num_classes = len(self.classes)

    def augment_on_device(self, split) -> None:
        """``--augment_on device``: the augmented environments' training transform runs as
        ``split`` of it; ValueError when no environment is augmented."""
        if not self.augmented_envs:
            raise ValueError(f"--augment_on device: {type(self).__name__} is not augmented "
                             "(data_augmentation is false), so there is nothing to run on the "
                             "device; use --augment_on loader")
        device_split = (self.augment_transform, split(self.augment_transform))
        for i in self.augmented_envs:
            self.datasets[i].device_split = device_split

    @classmethod
    def expected_layout(cls) -> str:
        folder = os.path.join("<data_dir>", cls.FOLDER_NAME) if cls.FOLDER_NAME else "<data_dir>"
        pattern = os.path.join(folder, "<domain>", "<class>", "<image>.jpg")
        known = f"; domain folders: {', '.join(cls.ENV_FOLDERS)}" if cls.ENV_FOLDERS else ""
        return (f"{cls.__name__} expects the layout {pattern} (one folder per domain, one "
                f"subfolder per class{known}).")

    def _find_environment_folders(self, root) -> list[str]:
        name, layout = type(self).__name__, self.expected_layout()
        if root is None:
            raise FileNotFoundError(f"no data directory given (pass --data_dir). {layout}")
        if not os.path.isdir(root):
            data_dir = getattr(self, "data_dir", None)
            if inside := data_dir and self.FOLDER_NAME and layouts.inside_dataset_folder(
                    name, data_dir, self.FOLDER_NAME):
                raise FileNotFoundError(inside)
            from dg_plugins.download.sources import download_command

            command = download_command(name, data_dir)
            fetch = f" To download it: {command}" if command else ""
            raise FileNotFoundError(f"dataset folder {root} does not exist. {layout}{fetch}")
        if not (folders := visible_subfolders(root)):
            raise FileNotFoundError(f"no domain folders in {root}. {layout}")
        if self.ENVIRONMENTS is not None and len(folders) != len(self.ENVIRONMENTS):
            raise ValueError(
                f"{root} has {len(folders)} domain folders ({', '.join(folders)}) but {name} has "
                f"{len(self.ENVIRONMENTS)} environments ({', '.join(self.ENVIRONMENTS)}); remove "
                f"stray folders. {layout}")
        if self.ENV_FOLDERS and folders != sorted(self.ENV_FOLDERS):
            warnings.warn(f"{root}: domain folders {folders} differ from the standard "
                          f"{list(self.ENV_FOLDERS)}; using them in sorted order as environments "
                          f"{self.ENVIRONMENTS}", stacklevel=3)
        return folders

    def _find_class_folders(self, env: str) -> list[str]:
        classes = visible_subfolders(path := os.path.join(self.root, env))
        if not classes:
            raise FileNotFoundError(f"no class folders in domain folder {path}. "
                                    f"{self.expected_layout()}")
        return classes


class ImageFolderBenchmark(MultipleEnvironmentImageFolder):
    """An image-folder dataset ``(data_dir, test_envs, hparams)`` reading
    ``<data_dir>/<FOLDER_NAME>``, augmented when the hparam ``data_augmentation`` is true."""

    def __init__(self, root, test_envs, hparams):
        self.data_dir = root  # the --data_dir of train and check_data
        super().__init__(os.path.join(root, self.FOLDER_NAME) if root is not None
                         and self.FOLDER_NAME else root, test_envs,
                         bool((hparams or {}).get("data_augmentation", False)), hparams)


def _release(name: str) -> tuple:
    """``FOLDER_NAME, ENVIRONMENTS, ENV_FOLDERS`` of one of DomainBed's image-folder datasets."""
    return (catalog.IMAGE_FOLDER_DATASETS[name], list(catalog.DOMAINBED_DATASETS[name]),
            layouts.DOMAIN_FOLDERS[name])


@register_dataset()
class VLCS(ImageFolderBenchmark):
    FOLDER_NAME, ENVIRONMENTS, ENV_FOLDERS = _release("VLCS")


#: The dataset hparam choosing PACS's in/out split (values: catalog.DATA_SPLITS).
DATA_SPLIT_HPARAM = "data_split"


@register_dataset()
class PACS(ImageFolderBenchmark):
    """PACS; the hparam ``data_split``: "domainbed" (train's random holdout) or "official", the
    lists of Li et al. (ICCV 2017) beside the domain folders (:data:`PACS_SPLITS_URL`) as the DMG
    release uses them (prithv1/DMG@6b162b4 ``train_model.py`` lines 179-214): in = a source's
    ``<domain>_train_kfold.txt``, a target's ``_test_kfold.txt`` (all of it), out =
    ``_crossval_kfold.txt``; validation items of augmented environments stay unaugmented."""

    FOLDER_NAME, ENVIRONMENTS, ENV_FOLDERS = _release("PACS")

    def __init__(self, root, test_envs, hparams):
        super().__init__(root, test_envs, hparams)
        self.data_split = (hparams or {}).get(DATA_SPLIT_HPARAM, "domainbed")
        if self.data_split not in catalog.DATA_SPLITS:
            raise ValueError(f"unknown {DATA_SPLIT_HPARAM} {self.data_split!r}; choices: "
                             f"{', '.join(catalog.DATA_SPLITS)}")
        self.official_splits: dict[int, tuple[list[int], list[int]]] = {}
        if self.data_split == "official":
            missing = [path for index in range(len(self.datasets))
                       for path in self.split_lists(index) if not os.path.isfile(path)]
            if missing:
                from dg_plugins.download.sources import download_command

                raise OfficialSplitError(
                    f"data_split 'official' needs PACS's official split lists; missing: "
                    f"{', '.join(missing)}. Put the twelve files <domain>_train_kfold.txt, "
                    f"<domain>_crossval_kfold.txt and <domain>_test_kfold.txt (domains "
                    f"{', '.join(self.environment_folders)}) in {self.root}: "
                    f"{download_command('PACS_splits', self.data_dir)} downloads them (from the "
                    f"'pacs_label' folder of the PACS authors' release: {PACS_SPLITS_URL}); or "
                    "use the default data_split 'domainbed'")
            for index, (folder, env) in enumerate(zip(self.environment_folders, self.datasets)):
                self.official_splits[index] = in_, out = tuple(
                    layouts.match_split_list(path, folder, env.root, env.samples, self.classes)
                    for path in self.split_lists(index))
                if index in self.augmented_envs:  # validation items stay unaugmented
                    env.eval_indices = frozenset(out) - frozenset(in_)
                    env.eval_transform = self.plain_transform

    def predefined_split(self, env_index: int):
        """``(in indices, out indices)`` from the official lists, else None (a random split)."""
        if self.data_split == "official":
            return tuple(map(list, self.official_splits[env_index]))
        return None

    def split_lists(self, env_index: int) -> tuple[str, str]:
        """The (in, out) list files of an environment: test (train for a source) and crossval."""
        kind = "test" if env_index in self.test_envs else "train"
        folder = self.environment_folders[env_index]
        return tuple(os.path.join(self.root, layouts.pacs_split_file(folder, k))
                     for k in (kind, "crossval"))


@register_dataset()
class OfficeHome(ImageFolderBenchmark):
    FOLDER_NAME, ENVIRONMENTS, ENV_FOLDERS = _release("OfficeHome")


@register_dataset()
class TerraIncognita(ImageFolderBenchmark):
    FOLDER_NAME, ENVIRONMENTS, ENV_FOLDERS = _release("TerraIncognita")


@register_dataset()
class DomainNet(ImageFolderBenchmark):
    FOLDER_NAME, ENVIRONMENTS, ENV_FOLDERS = _release("DomainNet")
    CHECKPOINT_FREQ = 1000


class ImageFolder(ImageFolderBenchmark):
    """Generic dataset: ``--data_dir`` itself holds ``<domain>/<class>/*``; for sweeps, name the
    tree with :func:`make_image_folder_dataset`."""

    ENVIRONMENTS = None


DATASETS.register("ImageFolder", ImageFolder)


def make_image_folder_dataset(name: str, folder_name: str | None = None, environments=None, *,
                              data_dir: str | None = None, checkpoint_freq: int = 300,
                              n_steps: int = 5001, register: bool = True) -> type:
    """Create (and register under ``name``) a dataset class for a tree
    ``<data_dir>/<folder_name>/<domain>/<class>/<image>`` (``folder_name=None``: data_dir), labels
    from ``environments`` or ``data_dir``'s domain folders; call it when a plugin module imports."""
    env_folders = None
    if environments is not None:
        labels = list(environments)
    elif data_dir is not None:
        dataset_dir = os.path.join(data_dir, folder_name) if folder_name else data_dir
        if not os.path.isdir(dataset_dir):
            raise FileNotFoundError(f"cannot discover the environments of {name}: {dataset_dir} "
                                    "does not exist")
        labels = list(env_folders := visible_subfolders(dataset_dir))
    else:
        raise ValueError(f"{name}: give environments or data_dir to discover them from")
    if not labels:
        raise ValueError(f"{name}: no environments")
    dataset_class = type(name, (ImageFolderBenchmark,), dict(
        FOLDER_NAME=folder_name, ENVIRONMENTS=labels,
        ENV_FOLDERS=tuple(env_folders) if env_folders else None,
        CHECKPOINT_FREQ=checkpoint_freq, N_STEPS=n_steps,
        __module__=sys._getframe(1).f_globals.get("__name__", __name__),
        __doc__=f"Image-folder dataset {name} (made by make_image_folder_dataset)."))
    if register:
        catalog.declare_image_folder_dataset(name, folder_name)
        register_dataset(name)(dataset_class)
    return dataset_class
