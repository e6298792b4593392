"""Opt-in training augmentation on the job's device: a training transform split in two, its
geometric steps run by loader workers on the PIL image (uint8 ``[3, H, W]`` out), the rest
(:class:`DeviceAugment`: flip, colour jitter, grayscale, scaling, Normalize, by ``kornia.enhance``)
on the batch with parameters drawn from the batch's seed alone. Same distributions as the PIL
path, not the same pixels (it rounds to 8 bits after every step)."""

from __future__ import annotations

import contextlib
import dataclasses
import math

import torch

import dg_plugins.compat  # noqa: F401  (must precede any torchvision import)
from dg_plugins.seeds import seed_hash

#: The torchvision transforms the loader part runs (geometry on the PIL image).
LOADER_STEPS = ("RandomResizedCrop", "Resize", "RandomCrop", "CenterCrop")
#: The torchvision transforms the device part runs.
DEVICE_STEPS = ("RandomHorizontalFlip", "ColorJitter", "RandomGrayscale", "ToTensor",
                "Normalize")
#: How to install what the device part needs.
INSTALL = "pip install 'dg_plugins[gpu]' (or pip install 'kornia>=0.7')"
#: What the device part calls: kornia's submodule and its functions (kornia 0.7 has them all).
KORNIA_NEEDS = {"enhance": ("adjust_brightness_accumulative",
                            "adjust_contrast_with_mean_subtraction",
                            "adjust_saturation_with_gray_subtraction", "adjust_hue"),
                "color": ("rgb_to_grayscale",)}


class KorniaLacks(ImportError):
    """kornia imports but lacks a function the device part calls."""


def _kornia():
    """kornia with every function of :data:`KORNIA_NEEDS`, else ImportError naming what lacks."""
    import importlib

    try:
        kornia = importlib.import_module("kornia")
    except ImportError:
        raise ImportError(f"augmenting on the device needs kornia: {INSTALL}") from None
    for module, functions in KORNIA_NEEDS.items():
        found = None
        with contextlib.suppress(ImportError):
            found = importlib.import_module(f"kornia.{module}")
        if missing := [f for f in functions if not hasattr(found, f)]:
            raise KorniaLacks(
                f"augmenting on the device needs kornia.{module}.{missing[0]}, which the kornia "
                f"this Python imports ({getattr(kornia, '__version__', 'of unknown version')}, "
                f"{getattr(kornia, '__file__', None) or '?'}) lacks: {INSTALL}")
    return kornia


def require_kornia() -> None:
    """ValueError (a train job's bad input) naming the fix when :func:`_kornia` fails."""
    try:
        _kornia()
    except KorniaLacks as err:
        raise ValueError(f"--augment_on device: {err}; or use --augment_on loader") from None
    except ImportError:
        raise ValueError(f"--augment_on device needs kornia, which this Python cannot import: "
                         f"{INSTALL}; or use --augment_on loader") from None


@dataclasses.dataclass(frozen=True)
class Flip:
    """RandomHorizontalFlip(p): each image flipped with probability ``p``."""

    p: float

    def draw(self, n: int, generator: torch.Generator) -> torch.Tensor:
        return torch.rand(n, generator=generator) < self.p

    def apply(self, x: torch.Tensor, flipped: torch.Tensor) -> torch.Tensor:
        flipped = flipped.to(x.device, non_blocking=True).view(-1, 1, 1, 1)
        return torch.where(flipped, x.flip(-1), x)


class Jitter:
    """ColorJitter: per image, factors uniform in torchvision's ranges (``None``: off) and the
    four operations in a random order, by kornia; :meth:`apply` changes ``x`` in place."""

    NAMES = ("brightness", "contrast", "saturation", "hue")

    def __init__(self, brightness=None, contrast=None, saturation=None, hue=None):
        self.ranges = tuple(None if r is None else (float(r[0]), float(r[1]))
                            for r in (brightness, contrast, saturation, hue))

    def draw(self, n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """``(order, factors)``, ``[n, 4]`` each: per row, the operations' order and factors."""
        order = torch.rand(n, 4, generator=generator).argsort(dim=1)
        factors = torch.full((n, 4), math.nan)
        uniform = torch.rand(n, 4, generator=generator)
        for op, bounds in enumerate(self.ranges):
            if bounds is not None:
                factors[:, op] = bounds[0] + (bounds[1] - bounds[0]) * uniform[:, op]
        return order, factors

    def apply(self, x: torch.Tensor, params) -> torch.Tensor:
        enhance = _kornia().enhance
        functions = (enhance.adjust_brightness_accumulative,
                     enhance.adjust_contrast_with_mean_subtraction,
                     enhance.adjust_saturation_with_gray_subtraction,
                     lambda images, turns: enhance.adjust_hue(images, turns * (2 * math.pi)))
        order, factors = params
        # the rows of each (position, operation) pair, found on the CPU and sent in one copy
        groups = [(op, (order[:, position] == op).nonzero().flatten())
                  for position in range(4) for op in range(4) if self.ranges[op] is not None]
        groups = [(op, rows) for op, rows in groups if len(rows)]
        if not groups:
            return x
        rows = torch.cat([r for _, r in groups]).to(x.device, non_blocking=True)
        values = torch.cat([factors[r, op] for op, r in groups]).to(x.device, x.dtype,
                                                                     non_blocking=True)
        sizes = [len(r) for _, r in groups]
        for (op, _), index, factor in zip(groups, rows.split(sizes), values.split(sizes)):
            x.index_copy_(0, index, functions[op](x.index_select(0, index), factor))
        return x

    def __repr__(self) -> str:
        on = [f"{name}={bounds}" for name, bounds in zip(self.NAMES, self.ranges) if bounds]
        return f"Jitter({', '.join(on)})"


@dataclasses.dataclass(frozen=True)
class Grayscale(Flip):
    """RandomGrayscale(p): each image replaced with probability ``p`` by its luma (as PIL's)."""

    def apply(self, x: torch.Tensor, gray: torch.Tensor) -> torch.Tensor:
        luma = _kornia().color.rgb_to_grayscale(x).expand_as(x)
        return torch.where(gray.to(x.device, non_blocking=True).view(-1, 1, 1, 1), luma, x)


@dataclasses.dataclass(frozen=True)
class Normalize:
    """Normalize(mean, std) per channel (tuples of floats)."""

    mean: tuple
    std: tuple

    def draw(self, n: int, generator: torch.Generator) -> None:
        return None

    def apply(self, x: torch.Tensor, params=None) -> torch.Tensor:
        mean, std = (torch.tensor(v, dtype=x.dtype).view(-1, 1, 1).to(x.device, non_blocking=True)
                     for v in (self.mean, self.std))
        return (x - mean) / std


class DeviceAugment:
    """``augment(x, seed)``: a uint8 batch ``[B, 3, H, W]`` as the model's float32 batch on its
    device, its parameters drawn from ``seed_hash(seed, "device_augment")`` alone."""

    def __init__(self, steps):
        self.steps = tuple(steps)

    def draw(self, batch_size: int, seed: int) -> list:
        generator = torch.Generator().manual_seed(seed_hash(int(seed), "device_augment"))
        return [step.draw(batch_size, generator) for step in self.steps]

    def __call__(self, x: torch.Tensor, seed: int) -> torch.Tensor:
        if x.dtype != torch.uint8 or x.dim() != 4 or x.shape[1] != 3:
            raise ValueError(f"device augmentation takes a uint8 batch [B, 3, H, W], got "
                             f"{x.dtype} {list(x.shape)}: give it the batches of the split "
                             "transform's loader part (split_transform)")
        params = self.draw(len(x), seed)
        with torch.no_grad(), torch.autocast(x.device.type, enabled=False):
            x = x.float().div_(255)  # ToTensor's scaling
            for step, p in zip(self.steps, params):
                x = step.apply(x, p)
        return x

    def __repr__(self) -> str:
        return f"DeviceAugment({', '.join(map(repr, self.steps))})"


def split_transform(transform):
    """``(loader part, DeviceAugment)`` of a ``Compose`` of :data:`LOADER_STEPS` then
    :data:`DEVICE_STEPS` (the loader part ends in ``PILToTensor``); ValueError otherwise."""
    from torchvision import transforms as T

    loader, device, seen_tensor = [], [], False
    for t in getattr(transform, "transforms", [transform]):
        name = type(t).__name__
        if name in LOADER_STEPS and isinstance(t, getattr(T, name)):
            if device:
                raise ValueError(f"cannot augment on the device: {name} comes after "
                                 f"{device[-1]!r} in {transform}; the geometric steps "
                                 "must come first")
            loader.append(t)
        elif isinstance(t, T.RandomHorizontalFlip):
            device.append(Flip(float(t.p)))
        elif isinstance(t, T.ColorJitter):
            device.append(Jitter(t.brightness, t.contrast, t.saturation, t.hue))
        elif isinstance(t, T.RandomGrayscale):
            device.append(Grayscale(float(t.p)))
        elif isinstance(t, T.ToTensor):
            seen_tensor = True
        elif isinstance(t, T.Normalize) and seen_tensor:
            device.append(Normalize(tuple(map(float, t.mean)), tuple(map(float, t.std))))
        else:
            raise ValueError(f"cannot augment on the device: {name} ({t}) is not one of "
                             f"{', '.join(LOADER_STEPS + DEVICE_STEPS)} (Normalize after "
                             "ToTensor); use the loader's augmentation for this transform")
    if not seen_tensor:
        raise ValueError(f"cannot augment on the device: {transform} has no ToTensor step")
    return T.Compose([*loader, T.PILToTensor()]), DeviceAugment(device)


class DeviceFinisher:
    """A :class:`DeviceAugment` as a :class:`~dg_plugins.datasets.decoded.PixelTransform` part."""

    seeded = True

    def __init__(self, augment: DeviceAugment):
        self.augment = augment
        self.key = f"device:{augment!r}"

    def __call__(self, pixels: torch.Tensor, device, seed: int) -> torch.Tensor:
        if seed is None:
            raise ValueError("the device augmentation needs the batch's seed")
        return self.augment(pixels.to(device, non_blocking=True), seed)


def pixel_transform(transform):
    """A training transform as a :class:`~dg_plugins.datasets.decoded.PixelTransform`."""
    from dg_plugins.datasets.decoded import PixelTransform

    loader, device = split_transform(transform)
    return PixelTransform(loader.transforms[:-1], DeviceFinisher(device))


def use_device_augmentation(dataset, name: str) -> None:
    """``--augment_on device`` for ``dataset``; one without ``augment_on_device`` is refused."""
    method = getattr(dataset, "augment_on_device", None)
    if method is None:
        held = ("held in memory as tensors, with no image transform"
                if getattr(dataset, "IN_MEMORY", False) else "with no image-folder transform")
        raise ValueError(f"--augment_on device: {name} has no augmentation to run on the device "
                         f"(its images are {held}); use --augment_on loader")
    method(pixel_transform)


def device_augmentation(augmentation: str = "domainbed"):
    """:func:`split_transform` of the training transform named by ``augmentation``."""
    from dg_plugins.datasets.image_folder import training_transform

    loader, device = split_transform(training_transform(augmentation))
    _kornia()  # a missing kornia is named before any worker starts
    return loader, device

