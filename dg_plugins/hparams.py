"""Hyperparameter spaces, seeded per name exactly as DomainBed's
(``domainbed/hparams_registry.py``), and validation of user overrides. A space maps a name to
``(default, random_fn[, check])``, ``random_fn`` drawing from ``seed_hash(random_seed, name)``;
algorithms add theirs (``hparam_space``) or draw from another registry. Torch-free."""

from __future__ import annotations

import difflib
import json
import math
from typing import Any, Callable

import numpy as np

from dg_plugins import catalog
from dg_plugins.catalog import one_of
from dg_plugins.seeds import seed_hash

RandomFn = Callable[[np.random.RandomState], Any]
Check = Callable[[Any], "str | None"]
Space = dict[str, tuple]

#: Datasets that get DomainBed's small-image lr/batch/weight-decay rules (28x28 inputs).
SMALL_IMAGE_DATASETS = {"Debug28", "RotatedMNIST", "ColoredMNIST", "RotatedMNIST5k"}
#: Datasets whose 28x28 CNN is narrowed for CPUs (``mnist_cnn_width`` 32 instead of 128).
COMPACT_CNN_DATASETS = {"RotatedMNIST5k"}
#: Values of the ``backbone`` hparam (see ``dg_plugins.networks.Featurizer``).
BACKBONES = ("auto", "mnist_cnn", "lenet", "resnet", "vit")
#: Values of the ``batch_sampling`` hparam (see ``dg_plugins.train.batches``).
BATCH_SAMPLINGS = ("per_domain", "pooled")
#: Values of the ``lr_schedule`` hparam (see ``dg_plugins.algorithms.base.lr_factor``).
LR_SCHEDULES = ("constant", "exp_epoch", "inv_epoch", "inv_step")

_ALGORITHM_SPACES: dict[str, Callable[[str], Space]] = {}
#: Algorithms whose hparams another registry draws (:func:`declare_registry`).
_REGISTRIES: dict[str, Callable[[str, int], dict]] = {}


class HparamError(ValueError):
    """An hparam override with an unknown name, a wrong type or an out-of-range value."""


def _constant(value: Any) -> RandomFn:
    return lambda r: value


def _log_uniform(low: float, high: float) -> RandomFn:
    return lambda r: 10 ** r.uniform(low, high)


def _choice(values: list) -> RandomFn:
    return lambda r: r.choice(values)


def _int_pow2(low: float, high: float) -> RandomFn:
    return lambda r: int(2 ** r.uniform(low, high))


def _check(ok: Callable[[Any], bool], problem: str) -> Check:
    """A value check (the optional third element of a space entry): None, or ``problem``."""
    return lambda value: None if ok(value) else problem


positive = _check(lambda v: v > 0, "must be > 0")
non_negative = _check(lambda v: v >= 0, "must be >= 0")
probability = _check(lambda v: 0 <= v < 1, "must be in [0, 1)")
unit_interval = _check(lambda v: 0 <= v <= 1, "must be in [0, 1]")
decay_rate = _check(lambda v: 0 < v <= 1, "must be in (0, 1]")


def base_space(dataset: str) -> Space:
    """DomainBed's base hparams plus our backbone options and the hparams the dataset reads."""
    space: Space = {
        "data_augmentation": (True, _constant(True)),
        # resnet18 wins over resnet50_augmix (DomainBed builds a ResNet-50 unless both false)
        "resnet18": (False, _constant(False)),
        "resnet50_augmix": (True, _constant(True)),
        "dinov2": (False, _constant(False)),
        "vit": (False, _constant(False)),
        "vit_attn_tune": (False, _constant(False)),
        "freeze_bn": (False, _constant(False)),
        "lars": (False, _constant(False)),
        "linear_steps": (500, _constant(500), positive),
        "resnet_dropout": (0.0, _choice([0.0, 0.1, 0.5]), probability),
        "vit_dropout": (0.0, _choice([0.0, 0.1, 0.5]), probability),
        "class_balanced": (False, _constant(False)),
        "nonlinear_classifier": (False, _choice([False, False])),
        # dg_plugins additions (not in DomainBed)
        "pretrained": (True, _constant(True)),
        "pretrained_path": (None, _constant(None)),
        # every ViT of the package, by one rule (dg_plugins.networks.vit.resolve_vit_arch)
        "vit_arch": ("auto", _constant("auto")),
        "batch_sampling": ("per_domain", _constant("per_domain"), one_of(*BATCH_SAMPLINGS)),
        "lr_schedule": ("constant", _constant("constant"), one_of(*LR_SCHEDULES)),
        "lr_decay": (0.99, _constant(0.99), decay_rate),
        "lr_inv_gamma": (1e-4, _constant(1e-4), non_negative),
        "lr_inv_power": (0.75, _constant(0.75), non_negative),
    }
    backbone = catalog.DATASET_BACKBONES.get(dataset, "auto")
    space["backbone"] = (backbone, _constant(backbone), one_of(*BACKBONES))
    cnn_width = 32 if dataset in COMPACT_CNN_DATASETS else 128
    space["mnist_cnn_width"] = (cnn_width, _constant(cnn_width), _check(
        lambda v: v > 0 and v % 16 == 0, "must be a positive multiple of 16"))
    if dataset in SMALL_IMAGE_DATASETS:
        space["lr"] = (1e-3, _log_uniform(-4.5, -2.5), positive)
        space["weight_decay"] = (0.0, _constant(0.0), non_negative)
        space["batch_size"] = (64, _int_pow2(3, 9), positive)
    else:
        space["lr"] = (5e-5, _log_uniform(-5, -3.5), positive)
        space["weight_decay"] = (0.0, _log_uniform(-6, -2), non_negative)
        space["batch_size"] = (32, _int_pow2(3, 5 if dataset == "DomainNet" else 5.5), positive)
    space.update(catalog.dataset_hparam_space(dataset))  # e.g. DigitsOffline's colour jitter
    return space


def declare_space(algorithm: str, space_fn: Callable[[str], Space]) -> None:
    """Attach ``space_fn(dataset)`` (overriding the base) to ``algorithm``, once."""
    current = _ALGORITHM_SPACES.get(algorithm)
    # where each was defined (the same after a module reload)
    origins = {(getattr(fn, "__module__", None), getattr(fn, "__qualname__", None))
               for fn in (current, space_fn)}
    if current is not None and len(origins) > 1:
        raise ValueError(f"hparam space for algorithm {algorithm!r} is already declared")
    _ALGORITHM_SPACES[algorithm] = space_fn


def algorithm_hparams(algorithm: str):
    """Decorator form of :func:`declare_space` (``register_algorithm``'s use ``hparam_space``)."""

    def register(fn: Callable[[str], Space]) -> Callable[[str], Space]:
        declare_space(algorithm, fn)
        return fn

    return register


def has_algorithm_space(algorithm: str) -> bool:
    return algorithm in _ALGORITHM_SPACES or algorithm in _REGISTRIES


def declare_registry(algorithm: str, registry_fn: Callable[[str, int], dict]) -> None:
    """Draw ``algorithm``'s hparams with ``registry_fn(dataset, random_seed)`` (DomainBed's
    ``_hparams`` shape), plus the dataset's own; no base space."""
    _REGISTRIES[algorithm] = registry_fn


def forget_registry(algorithm: str) -> None:
    _REGISTRIES.pop(algorithm, None)


def space(algorithm: str, dataset: str) -> Space:
    """``algorithm``'s space on ``dataset``; a :func:`declare_registry` algorithm's holds its
    defaults (its draws: :func:`draw`), then the dataset's hparams."""
    if algorithm in _REGISTRIES:
        merged: Space = {name: (_python(default), _constant(_python(default)))
                         for name, (default, _) in _REGISTRIES[algorithm](dataset, 0).items()}
        extra = catalog.dataset_hparam_space(dataset)
        return merged | {name: entry for name, entry in extra.items() if name not in merged}
    merged = base_space(dataset)
    if algorithm in _ALGORITHM_SPACES:
        merged.update(_ALGORITHM_SPACES[algorithm](dataset))
    return merged


def _python(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def draw(algorithm: str, dataset: str, random_seed: int) -> dict[str, tuple[Any, Any]]:
    """DomainBed's ``_hparams``: ``{name: (default, random draw)}``; every draw is evaluated."""
    drawn = _REGISTRIES[algorithm](dataset, random_seed) if algorithm in _REGISTRIES else {}
    out = {name: (_python(default), _python(value)) for name, (default, value) in drawn.items()}
    for name, (default, random_fn, *_) in space(algorithm, dataset).items():
        if name not in out:
            rng = np.random.RandomState(seed_hash(random_seed, name))
            out[name] = (default, _python(random_fn(rng)))
    return out


def default_hparams(algorithm: str, dataset: str) -> dict[str, Any]:
    return {name: entry[0] for name, entry in space(algorithm, dataset).items()}


def random_hparams(algorithm: str, dataset: str, seed: int) -> dict[str, Any]:
    return {name: value for name, (_, value) in draw(algorithm, dataset, seed).items()}


def parse_overrides(text: str | None) -> dict[str, Any]:
    """Parse ``--hparams`` JSON; a clear error names the problem and shows the expected form."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(
            f"--hparams is not valid JSON ({err.msg} at character {err.pos}): {text!r}. Expected "
            "an object such as '{\"batch_size\": 8, \"lr\": 0.001}' (double quotes).") from None
    if not isinstance(value, dict):
        raise ValueError(
            f"--hparams must be a JSON object mapping names to values, got {type(value).__name__}: "
            f"{text!r}. Example: '{{\"batch_size\": 8}}'.")
    return value


_TYPE_NAMES = {bool: "a boolean (true/false)", int: "an integer", float: "a number",
               str: "a string"}


def _coerce(name: str, value: Any, default: Any, any_number: bool = False) -> Any:
    """``value`` as ``default``'s type (int -> float only; ``any_number``: any number for a
    numeric default), or HparamError."""
    def wrong(expected: str) -> HparamError:
        return HparamError(f"hparam {name!r} must be {expected} like its default {default!r}, "
                           f"got {value!r} ({type(value).__name__})")

    if default is None:  # optional settings (e.g. a path): any JSON scalar, or null
        if value is not None and not isinstance(value, (str, int, float, bool)):
            raise wrong("null or a single value")
    elif isinstance(default, (bool, str)):
        if not isinstance(value, type(default)):
            raise wrong(_TYPE_NAMES[type(default)])
    elif isinstance(default, (int, float)):
        kind = int if isinstance(default, int) and not any_number else float
        if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
            raise wrong(_TYPE_NAMES[kind])
        return float(value) if isinstance(default, float) and not any_number else value
    elif isinstance(default, (list, tuple)):
        if not isinstance(value, (list, tuple)) or len(value) != len(default):
            raise wrong(f"a list of {len(default)} values")
        return [_coerce(f"{name}[{i}]", v, d) for i, (v, d) in enumerate(zip(value, default))]
    return value


def check_finite(name: str, value: Any) -> None:
    """Reject NaN and infinities (records holding them would not be standard JSON)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise HparamError(f"hparam {name!r} must be a finite number, got {value!r}; give a finite "
                          "value (e.g. 1e6 for a large one)")
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            check_finite(f"{name}[{i}]", item)


def check_values(entries: Space, hparams: dict[str, Any]) -> None:
    """Each entry's check on ``hparams``' value (not through :func:`validate`); HparamError."""
    for name, entry in entries.items():
        value = hparams.get(name)
        if name in hparams:
            check_finite(name, value)
        if len(entry) < 3 or entry[2] is None or value is None:
            continue
        try:
            problem = entry[2](value)
        except (TypeError, AttributeError, ValueError):
            problem = f"has the wrong type (its default is {entry[0]!r})"
        if problem:
            raise HparamError(f"hparam {name!r} {problem}, got {value!r}")


#: Hparams that an earlier version named otherwise: old name -> what to use now.
RENAMED = {
    "gmoe_vit_arch": "vit_arch (GMoE's 'auto' is still DeiT-S/16 at 224x224)",
    "gmoe_arch_224": "vit_arch, e.g. {\"vit_arch\": \"deit_small_patch16_224\"}",
}


def validate(algorithm: str, dataset: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """``overrides`` checked by ``algorithm``'s space on ``dataset``, ints made floats where due."""
    entries = space(algorithm, dataset)

    def hint(name: str) -> str:
        if name in RENAMED:
            return f"{name!r} (renamed: use {RENAMED[name]})"
        close = difflib.get_close_matches(name, list(entries), n=3, cutoff=0.6)
        return f"{name!r}" + (f" (did you mean {', '.join(map(repr, close))}?)"
                              if close else "")

    if unknown := [name for name in overrides if name not in entries]:
        raise HparamError(
            f"unknown hparam(s) {', '.join(map(hint, unknown))} for {algorithm} on {dataset}. "
            f"Valid names: {', '.join(sorted(entries))}. (" + (
                "Its hparams are its registry's: DomainBed's hparams_registry.py for DomainBed's "
                "algorithms.)" if algorithm in _REGISTRIES else
                "An algorithm's own hparams are declared in its hparam_space.)"))
    checked = {}
    for name, value in overrides.items():
        check_finite(name, value)
        checked[name] = _coerce(name, value, entries[name][0], any_number=algorithm in _REGISTRIES)
        check_values({name: entries[name]}, checked)
    return checked


def job_hparams(algorithm: str, dataset: str, hparams_seed: int, trial_seed: int,
                overrides: str | None = None) -> dict[str, Any]:
    """A train job's hparams as DomainBed's train.py computes them, then the overrides."""
    hp = default_hparams(algorithm, dataset) if hparams_seed == 0 else \
        random_hparams(algorithm, dataset, seed_hash(hparams_seed, trial_seed))
    return hp | validate(algorithm, dataset, parse_overrides(overrides))
