"""Image-folder datasets (``domainbed/datasets.py``): VLCS, PACS, OfficeHome, TerraIncognita,
DomainNet, the generic ``ImageFolder``, and :func:`make_image_folder_dataset` for any other tree.

Layout: ``<dataset folder>/<domain>/<class>/<image>``. Differences from DomainBed, all deliberate:

* Environments are the sorted subfolders of the dataset folder, as in DomainBed, but hidden folders
  (names starting with ``.``) are ignored; any other stray folder still becomes an environment.
* Class indices come from the sorted UNION of class folder names over all domains, so a domain that
  lacks a class never shifts another class's label (DomainBed's per-domain ImageFolder would).
  ``num_classes`` is the size of that union.
* Images are decoded with PIL and converted to RGB, lazily, one item at a time (a train job
  reads them from the decoded-image cache, :mod:`dg_plugins.datasets.decoded`: the same pixels).
  Hidden files are skipped; extensions are :data:`IMAGE_EXTENSIONS`, case-insensitive.
* Missing or badly laid-out data raises FileNotFoundError / ValueError showing the expected layout.
* An image that cannot be decoded (truncated, garbage, zero bytes, unreadable) raises
  :class:`UnreadableImageError` naming the file, the dataset and environment, and the fix, also
  when raised in a DataLoader worker. ``python -m dg_plugins.scripts.check_data`` decodes every
  image of a dataset up front and lists the unreadable ones (:func:`image_error` is its check).

* High-bit-depth images (16-bit PNG/TIFF, 32-bit integer or float images) are scaled to 8 bits
  (:func:`to_rgb`); PIL's own conversion, which DomainBed uses, clips them (a 16-bit image turns
  almost white).
* The dataset hparam ``augmentation`` chooses the training transform (DomainBed's, or the DMG
  release's for PACS or DomainNet: :func:`training_transform`); PACS's ``data_split`` can use
  PACS's official split lists (:class:`PACS`).

Kept from DomainBed for compatibility: samples are ordered class by class, then by sorted path
(torchvision's ImageFolder order, so in/out splits match DomainBed's when every domain has every
class), and augmentation is chosen per environment before train splits in/out, so a training
environment's out (validation) split is augmented too (as DomainBed's
``MultipleEnvironmentImageFolder`` does; PACS's official split is the exception). Use
:meth:`ImageFolderEnvironment.with_transform` to get a differently transformed view.

No torchvision or PIL import at module import: both load when a transform or image is first needed.
"""

from __future__ import annotations

import copy
import os
import re
import sys
import warnings

import torch.utils.data

import dg_plugins.compat  # noqa: F401  (must precede any torchvision import)
from dg_plugins import catalog, layouts
from dg_plugins.datasets.base import MultipleDomainDataset, register_dataset
from dg_plugins.layouts import (  # noqa: F401  (the folder rules, shared with the downloader)
    IMAGE_EXTENSIONS, PACS_SPLITS_URL, OfficialSplitError, is_image_file, list_images,
    visible_subfolders,
)
from dg_plugins.registry import DATASETS

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
IMAGE_SIZE = catalog.IMAGE_SIZE


#: The dataset hparam choosing the training transform (values: :data:`AUGMENTATIONS`).
AUGMENTATION_HPARAM = "augmentation"
AUGMENTATIONS = catalog.AUGMENTATIONS


def plain_transform(size: int = IMAGE_SIZE):
    """DomainBed's evaluation transform (``domainbed/datasets.py``,
    ``MultipleEnvironmentImageFolder``): Resize to exactly 224x224 (``size``), ToTensor, ImageNet
    Normalize.
    The DMG release evaluates with the same three steps (prithv1/DMG@6b162b4 ``train_model.py``
    lines 129-144, its "val" and "test" transforms at input size 224)."""
    from torchvision import transforms

    return transforms.Compose([
        transforms.Resize((size, size)),
        transforms.ToTensor(),
        transforms.Normalize(mean=IMAGENET_MEAN, std=IMAGENET_STD),
    ])


def augment_transform(size: int = IMAGE_SIZE):
    """DomainBed's training transform (``domainbed/datasets.py``,
    ``MultipleEnvironmentImageFolder``): RandomResizedCrop(224, scale 0.7-1), horizontal flip,
    ColorJitter(0.3 x4), RandomGrayscale, ToTensor, ImageNet Normalize."""
    from torchvision import transforms

    return transforms.Compose([
        transforms.RandomResizedCrop(size, scale=(0.7, 1.0)),
        transforms.RandomHorizontalFlip(),
        transforms.ColorJitter(0.3, 0.3, 0.3, 0.3),
        transforms.RandomGrayscale(),
        transforms.ToTensor(),
        transforms.Normalize(mean=IMAGENET_MEAN, std=IMAGENET_STD),
    ])


def dmg_pacs_transform(size: int = IMAGE_SIZE):
    """The DMG release's PACS training transform (prithv1/DMG@6b162b4 ``train_model.py`` lines
    146-155): RandomResizedCrop(224, scale 0.8-1), horizontal flip, ColorJitter(0.4 x4) (no
    random grayscale), ToTensor, ImageNet Normalize."""
    from torchvision import transforms

    return transforms.Compose([
        transforms.RandomResizedCrop(size, scale=(0.8, 1.0)),
        transforms.RandomHorizontalFlip(),
        transforms.ColorJitter(0.4, 0.4, 0.4, 0.4),
        transforms.ToTensor(),
        transforms.Normalize(mean=IMAGENET_MEAN, std=IMAGENET_STD),
    ])


def dmg_domainnet_transform(size: int = IMAGE_SIZE):
    """The DMG release's DomainNet training transform (prithv1/DMG@6b162b4 ``train_model.py``
    lines 156-165): Resize(256) (shorter side, aspect kept), RandomCrop(224), horizontal flip,
    ToTensor, ImageNet Normalize (no colour augmentation)."""
    from torchvision import transforms

    return transforms.Compose([
        transforms.Resize(round(256 * size / IMAGE_SIZE)),
        transforms.RandomCrop(size),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize(mean=IMAGENET_MEAN, std=IMAGENET_STD),
    ])


_TRAINING_TRANSFORMS = {
    "domainbed": augment_transform,
    "dmg_pacs": dmg_pacs_transform,
    "dmg_domainnet": dmg_domainnet_transform,
}


def training_transform(augmentation: str = "domainbed", size: int = IMAGE_SIZE):
    """The training transform named by the dataset hparam ``augmentation`` (see
    :data:`AUGMENTATIONS`), making ``size`` x ``size`` images (the 224 of each transform scaled
    alike); an unknown name raises ValueError listing the choices."""
    try:
        make = _TRAINING_TRANSFORMS[augmentation]
    except (KeyError, TypeError):
        raise ValueError(f"unknown {AUGMENTATION_HPARAM} {augmentation!r}; choices: "
                         f"{', '.join(AUGMENTATIONS)}") from None
    return make(size)


def high_bit_depth_max(image) -> float | None:
    """The value that maps to white for a high-bit-depth PIL image (None for the 8-bit modes).

    * ``I;16`` / ``I;16L`` / ``I;16B`` / ``I;16N`` (16-bit grey, e.g. a 16-bit PNG or TIFF):
      65535.
    * ``I`` (32-bit signed integers in memory): from the file when it says: PNG and PGM/PPM hold
      at most 16 bits (65535); a TIFF's BitsPerSample and SampleFormat give ``2**bits - 1``
      (unsigned) or ``2**(bits - 1) - 1`` (signed); otherwise the mode's own ``2**31 - 1``.
    * ``F`` (32-bit float): 1.0 (float images are taken to lie in [0, 1]).
    """
    mode = image.mode
    if mode.startswith("I;16"):
        return 65535.0
    if mode == "F":
        return 1.0
    if mode != "I":
        return None
    if image.format in ("PNG", "PPM"):
        return 65535.0
    tags = getattr(image, "tag_v2", None)
    if image.format == "TIFF" and tags is not None and 258 in tags:
        bits = tags[258]
        bits = int(bits[0] if isinstance(bits, tuple) else bits)
        sample_format = tags.get(339, 1)
        signed = (sample_format[0] if isinstance(sample_format, tuple) else sample_format) == 2
        if 1 <= bits <= 32:
            return float(2 ** (bits - 1) - 1 if signed else 2 ** bits - 1)
    return float(2 ** 31 - 1)


def to_rgb(image):
    """``image`` as an 8-bit RGB PIL image.

    8-bit modes convert with PIL's ``convert("RGB")``, as torchvision's ImageFolder loader (hence
    DomainBed) does: L and 1-bit (0 -> black, 1 -> white) are repeated over the three channels,
    P maps through its palette, CMYK and YCbCr convert to RGB, and RGBA / LA / PA drop the alpha
    channel (the colour stored under transparent pixels is kept). High-bit-depth modes (16-bit
    grey ``I;16``, 32-bit ``I``, float ``F``) are scaled to 8 bits first, ``round(value * 255 /
    high_bit_depth_max)`` clipped to [0, 255] (:func:`high_bit_depth_max`). Deliberate fix over
    DomainBed: PIL's own conversion clips them instead, so a 16-bit image decodes almost white."""
    import numpy as np
    from PIL import Image

    maximum = high_bit_depth_max(image)
    if maximum is None:
        return image.convert("RGB")
    values = np.asarray(image, dtype=np.float64)
    grey = np.clip(np.round(values * (255.0 / maximum)), 0, 255).astype(np.uint8)
    return Image.fromarray(grey, mode="L").convert("RGB")


def load_rgb_image(path: str):
    """Decode an image file with PIL and convert it to 8-bit RGB (:func:`to_rgb`; the conversion
    decodes the whole image, so a truncated file fails here rather than later).

    Truncated files always fail, whatever PIL's process-wide ``ImageFile.LOAD_TRUNCATED_IMAGES``
    says: DomainBed's ``domainbed/datasets.py`` sets it to True when imported (e.g. through the
    bridge), which would otherwise turn a truncated image into silently padded pixels."""
    from PIL import Image, ImageFile

    saved = ImageFile.LOAD_TRUNCATED_IMAGES
    ImageFile.LOAD_TRUNCATED_IMAGES = False
    try:
        with Image.open(path) as image:
            return to_rgb(image)
    finally:
        ImageFile.LOAD_TRUNCATED_IMAGES = saved


def image_error(path: str) -> str | None:
    """None when ``path`` decodes as training decodes it (:func:`load_rgb_image`), else the error
    as ``"<ExceptionType>: <message>"``. Used by ``dg_plugins.scripts.check_data``."""
    try:
        load_rgb_image(path)
    except MemoryError:
        raise
    except Exception as err:  # noqa: BLE001  (PIL raises OSError, SyntaxError, ValueError, ...)
        return f"{type(err).__name__}: {err}"
    return None


def check_data_command(dataset: str, data_dir: str | None) -> str:
    """The command line that checks every image of ``dataset`` (for error messages)."""
    import shlex

    command = f"python -m dg_plugins.scripts.check_data --dataset {shlex.quote(dataset)}"
    return command + (f" --data_dir {shlex.quote(data_dir)}" if data_dir is not None else "")


class UnreadableImageError(OSError, ValueError):
    """An image file that PIL cannot decode (truncated, garbage, empty, unreadable).

    The message names the file, the dataset and environment when known, the decoder's error and
    the fix; ``path`` holds the file. It is an OSError (what PIL raises) and a ValueError (bad
    input data: train reports it as one line). DataLoader workers re-raise a worker's exception
    as ``type(msg)`` with the worker's formatted traceback as ``msg``; this class then keeps its
    own message (plus the worker named) and stores that traceback in ``worker_traceback``.
    """

    _MARK = "UnreadableImageError: "

    def __init__(self, message: str, path: str | None = None):
        self.worker_traceback = None
        if message.startswith("Caught UnreadableImageError") and self._MARK in message:
            # Re-raised from a DataLoader worker: "Caught <type> in DataLoader worker process
            # <i>.\nOriginal Traceback ... <module>.UnreadableImageError: <message>"
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
    """One domain: items are ``(transform(RGB PIL image), label)``, decoded lazily.

    ``classes`` is the dataset-wide class list (the union over domains), ``class_to_idx`` its index;
    ``samples`` lists ``(path, label)`` and ``targets`` the labels, as torchvision's ImageFolder.
    A class absent from this domain simply has no samples.
    """

    def __init__(self, root: str, classes: list[str], transform=None):
        self.root = root
        self.classes = classes
        self.class_to_idx = {name: index for index, name in enumerate(classes)}
        self.transform = transform
        #: Items decoded with ``eval_transform`` instead of ``transform`` (e.g. the validation
        #: items of an official split, which its release evaluates unaugmented).
        self.eval_indices: frozenset[int] = frozenset()
        self.eval_transform = None
        self.samples = layouts.image_samples(root, classes)
        self.targets = [label for _, label in self.samples]
        #: Set by MultipleEnvironmentImageFolder, for error messages: the dataset's name, this
        #: environment's label, and the data_dir to pass to the check command.
        self.dataset_name: str | None = None
        self.environment: str | None = None
        self.data_dir: str | None = None
        #: The decoded-image cache (:mod:`dg_plugins.datasets.decoded`), when a job attached it.
        self.decoded = None
        self.pixel_store = None
        #: ``(transform, its split)`` for the transform augmented on the job's device
        #: (``--augment_on device``): its pixel part is the crop, its finisher the device
        #: augmentation (:func:`dg_plugins.datasets.device_augment.pixel_transform`).
        self.device_split = None
        self._split_transforms: dict = {}

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int):
        image = self.image(index)
        transform = self.transform_of(index)
        if transform is not None:
            image = transform(image)
        return image, self.samples[index][1]

    def transform_of(self, index: int):
        """The transform of item ``index`` (``eval_transform`` for :attr:`eval_indices`)."""
        return self.eval_transform if index in self.eval_indices else self.transform

    def image(self, index: int):
        """Item ``index``'s RGB PIL image: from the decoded-image cache (the same pixels), else
        decoded from its file (:meth:`load`)."""
        if self.decoded is not None:
            image = self.decoded.image(index)
            if image is not None:
                return image
        return self.load(self.samples[index][0])

    # the transforms' pixel part and tensor part (dg_plugins.datasets.decoded.PixelTransform)

    def pixel_transform(self, transform):
        """``transform`` split into its pixel part and its finisher, or None: the exact split
        (:func:`dg_plugins.datasets.decoded.split_transform`, memoized), or for the transform of
        :attr:`device_split` that split (the crop and the device augmentation)."""
        from dg_plugins.datasets.decoded import split_transform

        if self.device_split is not None and transform is self.device_split[0]:
            return self.device_split[1]
        known = self._split_transforms.get(id(transform))
        if known is None or known[0] is not transform:
            known = (transform, split_transform(transform))
            self._split_transforms[id(transform)] = known
        return known[1]

    def item_transforms(self) -> list:
        """The transforms this environment's items use (``transform``, and ``eval_transform``
        when some items take it)."""
        return [self.transform] + ([self.eval_transform] if self.eval_indices else [])

    def finisher(self, positions=None):
        """What turns the uint8 pixels (:meth:`pixels`) of the items at ``positions`` (default:
        all) into the model's input (:class:`dg_plugins.datasets.decoded.TableFinisher`, or the
        device augmentation), when each of their transforms splits and they share it; else None
        (items are made by ``__getitem__``). Items augmented on the device beside items that
        are not raise ValueError (they cannot share a batch)."""
        import numpy as np

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
        """``(uint8 [3, H, W] pixels, label)`` of item ``index``: its transform's pixel part
        (random draws as ``__getitem__`` makes them), read from the cache's evaluation pixels
        when the transform is deterministic and they hold the item. Only when
        :meth:`finisher` is not None."""
        import torch

        transform = self.pixel_transform(self.transform_of(index))
        store = self.pixel_store
        if transform.deterministic and store is not None:
            entry = store.plain_entry(transform)
            if entry is not None and entry.covers(index):
                return torch.from_numpy(entry.read(index)), self.samples[index][1]
        return transform.pixels(self.image(index)), self.samples[index][1]

    def evaluation_pixel_transforms(self) -> list:
        """The deterministic split transforms among :meth:`item_transforms` (what the cache
        keeps evaluation pixels of)."""
        out = []
        for transform in self.item_transforms():
            split = self.pixel_transform(transform)
            if split is None:
                return []
            if split.deterministic and all(split.key != t.key for t in out):
                out.append(split)
        return out

    def attach_cache(self, store) -> None:
        """Read images and evaluation pixels from ``store``
        (:class:`dg_plugins.datasets.decoded.EnvCache`)."""
        self.pixel_store = store
        self.decoded = store.decoded

    def load(self, path: str):
        """The RGB PIL image of ``path``; a file PIL cannot decode raises
        :class:`UnreadableImageError` naming it."""
        try:
            return load_rgb_image(path)
        except MemoryError:
            raise
        except Exception as err:  # noqa: BLE001  (PIL raises OSError, SyntaxError, ValueError...)
            raise UnreadableImageError(self.describe_error(path, err), path) from err

    def describe_error(self, path: str, err: BaseException) -> str:
        """``cannot decode image file <path> (dataset D, environment E): <error>. <fix>``."""
        where = []
        if self.dataset_name:
            where.append(f"dataset {self.dataset_name}")
        folder = os.path.basename(os.path.normpath(self.root))
        if self.environment and self.environment != folder:
            where.append(f"environment {self.environment} ({folder})")
        else:
            where.append(f"environment {self.environment or folder}")
        fix = "Remove or replace this file"
        if self.dataset_name:
            fix += (f"; to list every unreadable image of the dataset before a run, use "
                    f"{check_data_command(self.dataset_name, self.data_dir)}")
        return (f"cannot decode image file {path} ({', '.join(where)}): "
                f"{type(err).__name__}: {err}. {fix}.")

    def with_transform(self, transform) -> "ImageFolderEnvironment":
        """A view of the same samples with ``transform`` for every item (e.g. an unaugmented out
        split)."""
        view = copy.copy(self)
        view.transform = transform
        view.eval_indices, view.eval_transform = frozenset(), None
        return view

    def relative_paths(self) -> list[str]:
        """Each item's path relative to the dataset folder (``<domain>/<class>/<file>``, with
        forward slashes), in item order."""
        return layouts.relative_paths(self.root, [path for path, _ in self.samples])


class MultipleEnvironmentImageFolder(MultipleDomainDataset):
    """DomainBed's base (``MultipleEnvironmentImageFolder``) with the same signature: ``root`` is
    the dataset folder itself, ``augment`` selects the augment transform for every environment not
    in ``test_envs``.

    Which augment transform: the dataset hparam ``augmentation`` (``hparams["augmentation"]``,
    default "domainbed"; :func:`training_transform`): "domainbed" is DomainBed's, "dmg_pacs" and
    "dmg_domainnet" the DMG release's PACS and DomainNet training transforms. Evaluation (and
    every item when ``augment`` is false) uses :func:`plain_transform`, which is both DomainBed's
    and the DMG release's evaluation transform. A non-default ``augmentation`` with ``augment``
    false raises (the run would not be augmented at all).

    Instance attributes besides the contract: ``root``, ``environment_folders`` (the sorted domain
    folder names), ``classes`` / ``class_to_idx`` (union of class folders), ``augmented_envs``,
    ``augmentation``, ``test_envs``. When the class declares ``ENVIRONMENTS``, the number of
    domain folders must match it.
    """

    CHECKPOINT_FREQ = 300
    INPUT_SHAPE = (3, IMAGE_SIZE, IMAGE_SIZE)
    #: Subfolder of data_dir holding the dataset (None: data_dir itself); for messages and lookup.
    FOLDER_NAME: str | None = None
    #: The domain folders of the standard release, in sorted order (for messages and a check).
    ENV_FOLDERS: tuple[str, ...] | None = None

    def __init__(self, root, test_envs, augment, hparams):
        test_envs = list(test_envs or ())
        self.test_envs = test_envs
        self.augmentation = (hparams or {}).get(AUGMENTATION_HPARAM, "domainbed")
        self.image_size = (hparams or {}).get(catalog.IMAGE_SIZE_HPARAM, IMAGE_SIZE)
        if self.augmentation not in AUGMENTATIONS:
            training_transform(self.augmentation)  # raises, naming the choices
        if not augment and self.augmentation != "domainbed":
            raise ValueError(
                f"{AUGMENTATION_HPARAM} {self.augmentation!r} asks for an augmentation but "
                "data_augmentation is false (no environment would be augmented): drop one of "
                "the two hparams")
        self.root = root
        self.environment_folders = self._find_environment_folders(root)
        class_folders = {env: self._find_class_folders(env) for env in self.environment_folders}
        self.classes = sorted(set().union(*class_folders.values()))
        self.class_to_idx = {name: index for index, name in enumerate(self.classes)}
        self.datasets = []
        for env in self.environment_folders:
            env_dataset = ImageFolderEnvironment(os.path.join(root, env), self.classes)
            if not env_dataset.samples:
                raise FileNotFoundError(
                    f"no image files ({', '.join(sorted(IMAGE_EXTENSIONS))}) in the class folders "
                    f"of {os.path.join(root, env)}. {self.expected_layout()}"
                )
            self.datasets.append(env_dataset)
        self.plain_transform = plain_transform(self.image_size)
        self.augment_transform = (training_transform(self.augmentation, self.image_size)
                                  if augment else None)
        self.augmented_envs = [
            i for i in range(len(self.datasets)) if augment and i not in test_envs
        ]
        for i, env_dataset in enumerate(self.datasets):
            augmented = i in self.augmented_envs
            env_dataset.transform = self.augment_transform if augmented else self.plain_transform
        if self.ENVIRONMENTS is None:  # the generic dataset: labels are the folder names
            self.ENVIRONMENTS = list(self.environment_folders)
        data_dir = getattr(self, "data_dir", root)
        for label, env_dataset in zip(self.ENVIRONMENTS, self.datasets):
            env_dataset.dataset_name = type(self).__name__
            env_dataset.environment = label
            env_dataset.data_dir = data_dir
        self.input_shape = (3, self.image_size, self.image_size)
        self.num_classes = len(self.classes)

    def augment_on_device(self, split) -> None:
        """``--augment_on device``: every augmented environment's training transform runs as
        ``split`` of it (:func:`dg_plugins.datasets.device_augment.pixel_transform`: its crop in
        the loader, the rest on the job's device); the items of an official split's validation
        list keep the plain transform. ValueError, naming why, when no environment is augmented
        (``data_augmentation`` false) or the transform cannot be split."""
        if not self.augmented_envs:
            raise ValueError(f"--augment_on device: {type(self).__name__} is not augmented "
                             "(data_augmentation is false), so there is nothing to run on the "
                             "device; use --augment_on loader")
        pixels = split(self.augment_transform)
        for i in self.augmented_envs:
            self.datasets[i].device_split = (self.augment_transform, pixels)

    @classmethod
    def expected_layout(cls) -> str:
        """A description of the folder layout this dataset expects, for error messages."""
        folder = os.path.join("<data_dir>", cls.FOLDER_NAME) if cls.FOLDER_NAME else "<data_dir>"
        pattern = os.path.join(folder, "<domain>", "<class>", "<image>.jpg")
        text = (f"{cls.__name__} expects the layout {pattern}"
                " (one folder per domain, one subfolder per class")
        if cls.ENV_FOLDERS:
            text += f"; domain folders: {', '.join(cls.ENV_FOLDERS)}"
        return text + ")."

    def _find_environment_folders(self, root) -> list[str]:
        if root is None:
            raise FileNotFoundError(
                f"no data directory given (pass --data_dir). {self.expected_layout()}")
        if not os.path.isdir(root):
            data_dir = getattr(self, "data_dir", None)
            inside = data_dir and self.FOLDER_NAME and layouts.inside_dataset_folder(
                type(self).__name__, data_dir, self.FOLDER_NAME)
            if inside:
                raise FileNotFoundError(inside)
            from dg_plugins.download.sources import download_command

            command = download_command(type(self).__name__, data_dir)
            fetch = f" To download it: {command}" if command else ""
            raise FileNotFoundError(
                f"dataset folder {root} does not exist. {self.expected_layout()}{fetch}")
        folders = visible_subfolders(root)
        if not folders:
            raise FileNotFoundError(f"no domain folders in {root}. {self.expected_layout()}")
        if self.ENVIRONMENTS is not None and len(folders) != len(self.ENVIRONMENTS):
            raise ValueError(
                f"{root} has {len(folders)} domain folders ({', '.join(folders)}) but "
                f"{type(self).__name__} has {len(self.ENVIRONMENTS)} environments "
                f"({', '.join(self.ENVIRONMENTS)}); remove stray folders. {self.expected_layout()}"
            )
        if self.ENV_FOLDERS and folders != sorted(self.ENV_FOLDERS):
            warnings.warn(
                f"{root}: domain folders {folders} differ from the standard "
                f"{list(self.ENV_FOLDERS)}; "
                f"using them in sorted order as environments {self.ENVIRONMENTS}", stacklevel=3)
        return folders

    def _find_class_folders(self, env: str) -> list[str]:
        path = os.path.join(self.root, env)
        classes = visible_subfolders(path)
        if not classes:
            raise FileNotFoundError(
                f"no class folders in domain folder {path}. {self.expected_layout()}")
        return classes


class ImageFolderBenchmark(MultipleEnvironmentImageFolder):
    """A registrable image-folder dataset: constructor ``(data_dir, test_envs, hparams)`` reads
    ``<data_dir>/<FOLDER_NAME>`` and augments when ``hparams['data_augmentation']`` is true
    (missing key or ``hparams=None``: no augmentation)."""

    def __init__(self, root, test_envs, hparams):
        self.data_dir = root  # the --data_dir of train and check_data
        if root is not None and self.FOLDER_NAME:
            root = os.path.join(root, self.FOLDER_NAME)
        augment = bool((hparams or {}).get("data_augmentation", False))
        super().__init__(root, test_envs, augment, hparams)


@register_dataset()
class VLCS(ImageFolderBenchmark):
    FOLDER_NAME = catalog.IMAGE_FOLDER_DATASETS["VLCS"]  # "VLCS"
    ENVIRONMENTS = ["C", "L", "S", "V"]
    ENV_FOLDERS = layouts.DOMAIN_FOLDERS["VLCS"]


#: The dataset hparam choosing PACS's in/out split (values: :data:`DATA_SPLITS`).
DATA_SPLIT_HPARAM = "data_split"
DATA_SPLITS = catalog.DATA_SPLITS


@register_dataset()
class PACS(ImageFolderBenchmark):
    """PACS (``domainbed/datasets.py``). The dataset hparam ``data_split`` chooses the in/out
    split of each environment:

    * "domainbed" (default): DomainBed's random holdout (``--holdout_fraction``), made by train.
    * "official": PACS's official lists (Li et al., ICCV 2017), as the DMG release uses them
      (prithv1/DMG@6b162b4 ``train_model.py`` lines 179-214 read each source domain's "train" and
      "val" part and the target's "test" part; ``dataloaders/domain_datasets.py`` lines 59-71
      picks the ``<domain>_<part>`` HDF5 files of this split, which the PACS authors also
      publish as HDF5). :meth:`predefined_split` returns them to train:

      - a training (source) environment: in = ``<domain>_train_kfold.txt``, out =
        ``<domain>_crossval_kfold.txt`` (the release's training and validation images);
      - a test (target) environment: in = ``<domain>_test_kfold.txt`` (every image of the domain:
        the release's target test set, "the official train+val as target test"), out =
        ``<domain>_crossval_kfold.txt``.

      So collect_results' target accuracy under training-domain validation (``env{t}_in_acc``)
      is the release's target test accuracy, and its validation accuracy (the sources'
      ``env{i}_out_acc``) the release's validation accuracy. The target's out split is a subset
      of its in split: test-domain (oracle) selection on an official split selects on test
      images. ``--holdout_fraction`` does not apply. The out (validation) items of augmented
      environments are decoded with the plain transform, as the release evaluates validation
      (``train_model.py`` lines 129-136); DomainBed's random split augments them.

      The twelve lists go in the PACS folder beside the domain folders:
      ``<data_dir>/PACS/<domain>_{train,crossval,test}_kfold.txt`` (see :data:`PACS_SPLITS_URL`).
      Each line is ``<domain>/<class>/<file> <label>``, the label counting classes from 1 in
      sorted order (dog = 1, ..., person = 7); a path is matched to an image by its part from the
      domain folder on, so a leading folder (``pacs_data/``, ``kfold/``) does not matter. Every
      line must match an image of its domain with the same class, else
      :class:`OfficialSplitError`; a line listed twice counts twice, as in the list.
    """

    FOLDER_NAME = catalog.IMAGE_FOLDER_DATASETS["PACS"]  # "PACS"
    ENVIRONMENTS = ["A", "C", "P", "S"]
    ENV_FOLDERS = layouts.DOMAIN_FOLDERS["PACS"]

    def __init__(self, root, test_envs, hparams):
        super().__init__(root, test_envs, hparams)
        self.data_split = (hparams or {}).get(DATA_SPLIT_HPARAM, "domainbed")
        if self.data_split not in DATA_SPLITS:
            raise ValueError(f"unknown {DATA_SPLIT_HPARAM} {self.data_split!r}; choices: "
                             f"{', '.join(DATA_SPLITS)}")
        self.official_splits: dict[int, tuple[list[int], list[int]]] = {}
        if self.data_split == "official":
            self._check_split_lists()
            for index in range(len(self.datasets)):
                self.official_splits[index] = tuple(
                    self._match_list(index, path) for path in self.split_lists(index))
                in_, out = self.official_splits[index]
                env = self.datasets[index]
                if index in self.augmented_envs:  # validation items stay unaugmented
                    env.eval_indices = frozenset(out) - frozenset(in_)
                    env.eval_transform = self.plain_transform

    def predefined_split(self, env_index: int):
        """``(in indices, out indices)`` of environment ``env_index`` from the official lists
        when ``data_split`` is "official" (see the class docstring), else None (train then makes
        DomainBed's random split)."""
        if self.data_split != "official":
            return None
        in_, out = self.official_splits[env_index]
        return list(in_), list(out)

    def split_list_path(self, env_index: int, kind: str) -> str:
        """``<dataset folder>/<domain folder>_<kind>_kfold.txt``."""
        return os.path.join(self.root,
                            layouts.pacs_split_file(self.environment_folders[env_index], kind))

    def split_lists(self, env_index: int) -> tuple[str, str]:
        """The (in, out) list files of environment ``env_index``: test and crossval for a test
        environment, train and crossval otherwise."""
        kind = "test" if env_index in self.test_envs else "train"
        return (self.split_list_path(env_index, kind), self.split_list_path(env_index, "crossval"))

    def _check_split_lists(self) -> None:
        from dg_plugins.download.sources import download_command

        missing = [path for index in range(len(self.datasets)) for path in self.split_lists(index)
                   if not os.path.isfile(path)]
        if missing:
            raise OfficialSplitError(
                f"data_split 'official' needs PACS's official split lists; missing: "
                f"{', '.join(missing)}. Put the twelve files <domain>_train_kfold.txt, "
                f"<domain>_crossval_kfold.txt and <domain>_test_kfold.txt (domains "
                f"{', '.join(self.environment_folders)}) in {self.root}: "
                f"{download_command('PACS_splits', self.data_dir)} downloads them (from the "
                f"'pacs_label' folder of the PACS authors' release: {PACS_SPLITS_URL}); or use "
                "the default data_split 'domainbed'")

    def _match_list(self, env_index: int, list_path: str) -> list[int]:
        """Item indices of environment ``env_index`` named by the lines of ``list_path``
        (:func:`dg_plugins.layouts.match_split_list`)."""
        env = self.datasets[env_index]
        return layouts.match_split_list(list_path, self.environment_folders[env_index], env.root,
                                        env.samples, self.classes)


@register_dataset()
class OfficeHome(ImageFolderBenchmark):
    FOLDER_NAME = catalog.IMAGE_FOLDER_DATASETS["OfficeHome"]  # "office_home"
    ENVIRONMENTS = ["A", "C", "P", "R"]
    ENV_FOLDERS = layouts.DOMAIN_FOLDERS["OfficeHome"]


@register_dataset()
class TerraIncognita(ImageFolderBenchmark):
    FOLDER_NAME = catalog.IMAGE_FOLDER_DATASETS["TerraIncognita"]  # "terra_incognita"
    ENVIRONMENTS = ["L100", "L38", "L43", "L46"]
    ENV_FOLDERS = layouts.DOMAIN_FOLDERS["TerraIncognita"]


@register_dataset()
class DomainNet(ImageFolderBenchmark):
    FOLDER_NAME = catalog.IMAGE_FOLDER_DATASETS["DomainNet"]  # "domain_net"
    CHECKPOINT_FREQ = 1000
    ENVIRONMENTS = ["clip", "info", "paint", "quick", "real", "sketch"]
    ENV_FOLDERS = layouts.DOMAIN_FOLDERS["DomainNet"]


class ImageFolder(ImageFolderBenchmark):
    """Generic dataset ``ImageFolder``: ``--data_dir`` itself is ``<data_dir>/<domain>/<class>/*``,
    and the environments (labels = folder names) are discovered at construction and set on the
    instance as ``ENVIRONMENTS``. The class has none, so it is registered without a catalog entry
    and ``num_environments('ImageFolder')`` raises: it suits single train runs. For sweeps and
    result tables, give the tree a fixed name with :func:`make_image_folder_dataset`."""

    ENVIRONMENTS = None


DATASETS.register("ImageFolder", ImageFolder)


def make_image_folder_dataset(name: str, folder_name: str | None = None, environments=None, *,
                              data_dir: str | None = None, env_folders=None,
                              checkpoint_freq: int = 300, n_steps: int = 5001,
                              register: bool = True) -> type:
    """Create (and by default register under ``name``) a dataset class for a user's tree
    ``<data_dir>/<folder_name>/<domain>/<class>/<image>`` (``folder_name=None``: data_dir itself).

    Environment labels, in sorted domain-folder order, come from ``environments``; else from
    ``env_folders`` (the folder names); else they are discovered now from ``data_dir``. Given both
    labels and folder names, pairs are ordered by folder name. Call it at import time of a plugin
    module (``MyData = make_image_folder_dataset("MyData", "my_data", ["a", "b", "c"])``) so that
    train/sweep subprocesses that import the plugin see the same class.
    """
    if env_folders is not None:
        env_folders = list(env_folders)
        labels = list(environments) if environments is not None else list(env_folders)
        if len(labels) != len(env_folders):
            raise ValueError(f"{len(labels)} environment labels for {len(env_folders)} env_folders")
        env_folders, labels = map(list, zip(*sorted(zip(env_folders, labels))))
    elif environments is not None:
        labels = list(environments)
    elif data_dir is not None:
        dataset_dir = os.path.join(data_dir, folder_name) if folder_name else data_dir
        if not os.path.isdir(dataset_dir):
            raise FileNotFoundError(
                f"cannot discover the environments of {name}: {dataset_dir} does not exist")
        env_folders = visible_subfolders(dataset_dir)
        labels = list(env_folders)
    else:
        raise ValueError(
            f"{name}: give environments, env_folders or data_dir to discover them from")
    if not labels:
        raise ValueError(f"{name}: no environments")
    attributes = {
        "FOLDER_NAME": folder_name,
        "ENVIRONMENTS": labels,
        "ENV_FOLDERS": tuple(env_folders) if env_folders else None,
        "CHECKPOINT_FREQ": checkpoint_freq,
        "N_STEPS": n_steps,
        "__module__": sys._getframe(1).f_globals.get("__name__", __name__),
        "__doc__": f"Image-folder dataset {name} (made by make_image_folder_dataset).",
    }
    dataset_class = type(name, (ImageFolderBenchmark,), attributes)
    if register:
        catalog.declare_image_folder_dataset(name, folder_name)
        register_dataset(name)(dataset_class)
    return dataset_class
