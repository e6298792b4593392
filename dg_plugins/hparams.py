"""Hyperparameter spaces, seeded per name exactly as DomainBed seeds them (protocol spec 4).

A space maps each hparam name to ``(default, random_fn)``; ``random_fn`` takes a
``numpy.random.RandomState`` seeded with ``seed_hash(random_seed, name)``, so a name's random draw
depends only on the seed and the name, never on which other hparams exist. The base space (every
algorithm, every dataset) reproduces DomainBed's base hparams and draws; each algorithm declares its
own space beside its class with :func:`algorithm_hparams`. Values are cast to JSON-native Python
types (DomainBed leaks ``numpy.int64`` from ``choice``; the values are identical).

No torch import here: sweeps and collect_results use this module without the deep-learning stack.
"""

from __future__ import annotations

import json
from typing import Any, Callable

import numpy as np

from dg_plugins.seeds import seed_hash

RandomFn = Callable[[np.random.RandomState], Any]
Space = dict[str, tuple[Any, RandomFn]]

#: Datasets that get DomainBed's small-image lr/batch/weight-decay rules (28x28 inputs).
SMALL_IMAGE_DATASETS = {"Debug28", "RotatedMNIST", "ColoredMNIST", "RotatedMNIST5k"}

#: Datasets whose 28x28 CNN is narrowed for CPUs (``mnist_cnn_width`` 32 instead of 128).
COMPACT_CNN_DATASETS = {"RotatedMNIST5k"}

_ALGORITHM_SPACES: dict[str, Callable[[str], Space]] = {}


def _constant(value: Any) -> RandomFn:
    return lambda r: value


def _log_uniform(low: float, high: float) -> RandomFn:
    return lambda r: 10 ** r.uniform(low, high)


def _choice(values: list) -> RandomFn:
    return lambda r: r.choice(values)


def _int_pow2(low: float, high: float) -> RandomFn:
    return lambda r: int(2 ** r.uniform(low, high))


def base_space(dataset: str) -> Space:
    """DomainBed's base hparams (protocol spec 4.3) plus dg_plugins' backbone options."""
    small = dataset in SMALL_IMAGE_DATASETS
    space: Space = {
        "data_augmentation": (True, _constant(True)),
        "resnet18": (False, _constant(False)),
        "resnet50_augmix": (True, _constant(True)),
        "dinov2": (False, _constant(False)),
        "vit": (False, _constant(False)),
        "vit_attn_tune": (False, _constant(False)),
        "freeze_bn": (False, _constant(False)),
        "lars": (False, _constant(False)),
        "linear_steps": (500, _constant(500)),
        "resnet_dropout": (0.0, _choice([0.0, 0.1, 0.5])),
        "vit_dropout": (0.0, _choice([0.0, 0.1, 0.5])),
        "class_balanced": (False, _constant(False)),
        "nonlinear_classifier": (False, _choice([False, False])),
        # dg_plugins additions (not in DomainBed): backbone weights and the timm ViT to build.
        "pretrained": (True, _constant(True)),
        "pretrained_path": (None, _constant(None)),
        "vit_arch": ("vit_small_patch16_224.augreg_in21k_ft_in1k",
                     _constant("vit_small_patch16_224.augreg_in21k_ft_in1k")),
    }
    cnn_width = 32 if dataset in COMPACT_CNN_DATASETS else 128
    space["mnist_cnn_width"] = (cnn_width, _constant(cnn_width))
    if small:
        space["lr"] = (1e-3, _log_uniform(-4.5, -2.5))
        space["weight_decay"] = (0.0, _constant(0.0))
        space["batch_size"] = (64, _int_pow2(3, 9))
    else:
        space["lr"] = (5e-5, _log_uniform(-5, -3.5))
        space["weight_decay"] = (0.0, _log_uniform(-6, -2))
        if dataset == "DomainNet":
            space["batch_size"] = (32, _int_pow2(3, 5))
        else:
            space["batch_size"] = (32, _int_pow2(3, 5.5))
    return space


def algorithm_hparams(algorithm: str):
    """Decorator declaring ``algorithm``'s own space: ``fn(dataset) -> {name: (default, fn)}``.

    Entries override base entries of the same name (e.g. a method's own default lr)."""

    def register(fn: Callable[[str], Space]) -> Callable[[str], Space]:
        if algorithm in _ALGORITHM_SPACES and _ALGORITHM_SPACES[algorithm] is not fn:
            raise ValueError(f"hparam space for algorithm {algorithm!r} is already declared")
        _ALGORITHM_SPACES[algorithm] = fn
        return fn

    return register


def has_algorithm_space(algorithm: str) -> bool:
    return algorithm in _ALGORITHM_SPACES


def space(algorithm: str, dataset: str) -> Space:
    merged = base_space(dataset)
    if algorithm in _ALGORITHM_SPACES:
        merged.update(_ALGORITHM_SPACES[algorithm](dataset))
    return merged


def _python(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def draw(algorithm: str, dataset: str, random_seed: int) -> dict[str, tuple[Any, Any]]:
    """DomainBed's ``_hparams``: ``{name: (default, random draw)}``; every draw is evaluated."""
    out = {}
    for name, (default, random_fn) in space(algorithm, dataset).items():
        rng = np.random.RandomState(seed_hash(random_seed, name))
        out[name] = (default, _python(random_fn(rng)))
    return out


def default_hparams(algorithm: str, dataset: str) -> dict[str, Any]:
    return {name: default for name, (default, _) in draw(algorithm, dataset, 0).items()}


def random_hparams(algorithm: str, dataset: str, seed: int) -> dict[str, Any]:
    return {name: value for name, (_, value) in draw(algorithm, dataset, seed).items()}


def parse_overrides(text: str | None) -> dict[str, Any]:
    """Parse ``--hparams`` JSON; a clear error names the problem and shows the expected form."""
    if text is None or text == "":
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(
            f"--hparams is not valid JSON ({err.msg} at character {err.pos}): {text!r}. "
            "Expected an object such as '{\"batch_size\": 8, \"lr\": 0.001}' (double quotes)."
        ) from None
    if not isinstance(value, dict):
        raise ValueError(
            f"--hparams must be a JSON object mapping names to values, got {type(value).__name__}: "
            f"{text!r}. Example: '{{\"batch_size\": 8}}'."
        )
    return value


def job_hparams(algorithm: str, dataset: str, hparams_seed: int, trial_seed: int,
                overrides: str | None = None) -> dict[str, Any]:
    """The hparams a train job uses (protocol spec 4.1): defaults for ``hparams_seed == 0``,
    otherwise the draw for ``seed_hash(hparams_seed, trial_seed)``; then the JSON overrides."""
    if hparams_seed == 0:
        hp = default_hparams(algorithm, dataset)
    else:
        hp = random_hparams(algorithm, dataset, seed_hash(hparams_seed, trial_seed))
    hp.update(parse_overrides(overrides))
    return hp
