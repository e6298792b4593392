"""Image-folder datasets (``domainbed/datasets.py``): VLCS, PACS, OfficeHome, TerraIncognita,
DomainNet, the generic ``ImageFolder``, and :func:`make_image_folder_dataset` for any other tree.

Layout: ``<dataset folder>/<domain>/<class>/<image>``. Differences from DomainBed, all deliberate:

* Environments are the sorted subfolders of the dataset folder, as in DomainBed, but hidden folders
  (names starting with ``.``) are ignored; any other stray folder still becomes an environment.
* Class indices come from the sorted UNION of class folder names over all domains, so a domain that
  lacks a class never shifts another class's label (DomainBed's per-domain ImageFolder would).
  ``num_classes`` is the size of that union.
* Images are decoded with PIL and converted to RGB, lazily, one item at a time. Hidden files are
  skipped; extensions are :data:`IMAGE_EXTENSIONS`, case-insensitive.
* Missing or badly laid-out data raises FileNotFoundError / ValueError showing the expected layout.
* An image that cannot be decoded (truncated, garbage, zero bytes, unreadable) raises
  :class:`UnreadableImageError` naming the file, the dataset and environment, and the fix, also
  when raised in a DataLoader worker. ``python -m dg_plugins.scripts.check_data`` decodes every
  image of a dataset up front and lists the unreadable ones (:func:`image_error` is its check).

Kept from DomainBed for compatibility: samples are ordered class by class, then by sorted path
(torchvision's ImageFolder order, so in/out splits match DomainBed's when every domain has every
class), and augmentation is chosen per environment before train splits in/out, so a training
environment's out (validation) split is augmented too (as DomainBed's ``MultipleEnvironmentImageFolder`` does). Use
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
from dg_plugins import catalog
from dg_plugins.datasets.base import MultipleDomainDataset, register_dataset
from dg_plugins.registry import DATASETS

IMAGE_EXTENSIONS = catalog.IMAGE_EXTENSIONS
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
IMAGE_SIZE = 224


def plain_transform():
    """Spec 5.5: Resize to exactly 224x224, ToTensor, ImageNet Normalize."""
    from torchvision import transforms

    return transforms.Compose([
        transforms.Resize((IMAGE_SIZE, IMAGE_SIZE)),
        transforms.ToTensor(),
        transforms.Normalize(mean=IMAGENET_MEAN, std=IMAGENET_STD),
    ])


def augment_transform():
    """Spec 5.5: RandomResizedCrop(224, scale 0.7-1), horizontal flip, ColorJitter(0.3 x4),
    RandomGrayscale, ToTensor, ImageNet Normalize."""
    from torchvision import transforms

    return transforms.Compose([
        transforms.RandomResizedCrop(IMAGE_SIZE, scale=(0.7, 1.0)),
        transforms.RandomHorizontalFlip(),
        transforms.ColorJitter(0.3, 0.3, 0.3, 0.3),
        transforms.RandomGrayscale(),
        transforms.ToTensor(),
        transforms.Normalize(mean=IMAGENET_MEAN, std=IMAGENET_STD),
    ])


def load_rgb_image(path: str):
    """Decode an image file with PIL and convert it to RGB (``convert`` decodes the whole image,
    so a truncated file fails here rather than later).

    Truncated files always fail, whatever PIL's process-wide ``ImageFile.LOAD_TRUNCATED_IMAGES``
    says: DomainBed's ``domainbed/datasets.py`` sets it to True when imported (e.g. through the
    bridge), which would otherwise turn a truncated image into silently padded pixels."""
    from PIL import Image, ImageFile

    saved = ImageFile.LOAD_TRUNCATED_IMAGES
    ImageFile.LOAD_TRUNCATED_IMAGES = False
    try:
        with Image.open(path) as image:
            return image.convert("RGB")
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


def visible_subfolders(folder: str) -> list[str]:
    """Sorted names of the subdirectories of ``folder``, hidden ones (``.name``) excluded."""
    with os.scandir(folder) as entries:
        return sorted(e.name for e in entries if e.is_dir() and not e.name.startswith("."))


def is_image_file(name: str) -> bool:
    return not name.startswith(".") and os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS


def list_images(folder: str) -> list[str]:
    """Image files under ``folder`` (recursively, following links, hidden entries skipped), in
    torchvision ImageFolder's order: sorted directories, then sorted file names."""
    found = []
    for dirpath, dirnames, filenames in sorted(os.walk(folder, followlinks=True)):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        found.extend(os.path.join(dirpath, f) for f in sorted(filenames) if is_image_file(f))
    return found


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
        self.samples = [
            (path, self.class_to_idx[name])
            for name in visible_subfolders(root)
            for path in list_images(os.path.join(root, name))
        ]
        self.targets = [label for _, label in self.samples]
        #: Set by MultipleEnvironmentImageFolder, for error messages: the dataset's name, this
        #: environment's label, and the data_dir to pass to the check command.
        self.dataset_name: str | None = None
        self.environment: str | None = None
        self.data_dir: str | None = None

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int):
        path, label = self.samples[index]
        image = self.load(path)
        if self.transform is not None:
            image = self.transform(image)
        return image, label

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
        """A view of the same samples with another transform (e.g. an unaugmented out split)."""
        view = copy.copy(self)
        view.transform = transform
        return view


class MultipleEnvironmentImageFolder(MultipleDomainDataset):
    """DomainBed's base (``MultipleEnvironmentImageFolder``) with the same signature: ``root`` is the dataset folder itself,
    ``augment`` selects the augment transform for every environment not in ``test_envs``.

    Instance attributes besides the contract: ``root``, ``environment_folders`` (the sorted domain
    folder names), ``classes`` / ``class_to_idx`` (union of class folders), ``augmented_envs``.
    When the class declares ``ENVIRONMENTS``, the number of domain folders must match it.
    """

    CHECKPOINT_FREQ = 300
    INPUT_SHAPE = (3, IMAGE_SIZE, IMAGE_SIZE)
    #: Subfolder of data_dir holding the dataset (None: data_dir itself); for messages and lookup.
    FOLDER_NAME: str | None = None
    #: The domain folders of the standard release, in sorted order (for messages and a check).
    ENV_FOLDERS: tuple[str, ...] | None = None

    def __init__(self, root, test_envs, augment, hparams):
        test_envs = list(test_envs or ())
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
        self.plain_transform = plain_transform()
        self.augment_transform = augment_transform() if augment else None
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
        self.input_shape = tuple(self.INPUT_SHAPE)
        self.num_classes = len(self.classes)

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
            raise FileNotFoundError(
                f"dataset folder {root} does not exist. {self.expected_layout()}")
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
    FOLDER_NAME = "VLCS"
    ENVIRONMENTS = ["C", "L", "S", "V"]
    ENV_FOLDERS = ("Caltech101", "LabelMe", "SUN09", "VOC2007")


@register_dataset()
class PACS(ImageFolderBenchmark):
    FOLDER_NAME = "PACS"
    ENVIRONMENTS = ["A", "C", "P", "S"]
    ENV_FOLDERS = ("art_painting", "cartoon", "photo", "sketch")


@register_dataset()
class OfficeHome(ImageFolderBenchmark):
    FOLDER_NAME = "office_home"
    ENVIRONMENTS = ["A", "C", "P", "R"]
    ENV_FOLDERS = ("Art", "Clipart", "Product", "Real World")


@register_dataset()
class TerraIncognita(ImageFolderBenchmark):
    FOLDER_NAME = "terra_incognita"
    ENVIRONMENTS = ["L100", "L38", "L43", "L46"]
    ENV_FOLDERS = ("location_100", "location_38", "location_43", "location_46")


@register_dataset()
class DomainNet(ImageFolderBenchmark):
    FOLDER_NAME = "domain_net"
    CHECKPOINT_FREQ = 1000
    ENVIRONMENTS = ["clip", "info", "paint", "quick", "real", "sketch"]
    ENV_FOLDERS = ("clipart", "infograph", "painting", "quickdraw", "real", "sketch")


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
