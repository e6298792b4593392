"""The Algorithm contract (DomainBed's ``Algorithm``, ``domainbed/algorithms.py``), the
ERM-shaped base class, registration, and helpers every method shares (lr schedules, fp16-safe
optimizer steps). The contract and what a method file declares: ``docs/methods/README.md``."""

from __future__ import annotations

import contextlib
import math
import types

import torch
import torch.nn as nn

from dg_plugins import catalog
from dg_plugins import hparams as hparams_lib
from dg_plugins.registry import ALGORITHMS
from dg_plugins.runtime import swapped


def register_algorithm(name: str | None = None):
    """Class decorator: register an Algorithm and its ``hparam_space`` (default: class name)."""

    def add(cls):
        key = name or cls.__name__
        if (space_fn := getattr(cls, "hparam_space", None)) is not None:
            hparams_lib.declare_space(key, space_fn)
        catalog.declare_algorithm(key)
        ALGORITHMS.register(key, cls)
        return cls

    return add


def _collect(root: nn.Module, kind: type) -> dict[str, object]:
    """Instances of ``kind`` held by ``root``'s modules (also in lists, tuples, dicts) by
    attribute path (``disc.optimizer``, ``opts.0``)."""
    found: dict[int, tuple[str, object]] = {}
    for prefix, module in root.named_modules():
        for attr, value in vars(module).items():
            if attr.startswith("_"):
                continue
            items = [(attr, value)]
            if isinstance(value, (list, tuple)):
                items = [(f"{attr}.{i}", v) for i, v in enumerate(value)]
            elif isinstance(value, dict):
                items = [(f"{attr}.{k}", v) for k, v in value.items()]
            for name, item in items:
                if isinstance(item, kind):
                    found.setdefault(id(item), (f"{prefix}.{name}" if prefix else name, item))
    return dict(found.values())


class Algorithm(nn.Module):
    """DomainBed's contract plus :meth:`optimizers` / :meth:`schedulers` for resumable
    checkpoints (``docs/methods/README.md``)."""

    #: hparam overrides making the method CPU-test sized (contract tests, smoke benchmarks).
    TINY_TEST_HPARAMS: dict = {}
    #: ``{parameter-name prefix: reason}``: trainable parameters allowed to get no gradient.
    GRADIENT_EXEMPT: dict = {}
    #: Steps per epoch, set by dg_plugins' train job (None under DomainBed's own train); read by
    #: schedules in epochs (``lr_schedule``, DisMAE's domain classifier).
    epoch_steps: float | None = None
    #: Why the optimizer steps bypass :func:`optimizer_step` (train then refuses fp16); None: not.
    UNSCALED_STEPS: str | None = None

    def __init__(self, input_shape, num_classes, num_domains, hparams):
        super().__init__()
        # checked here too: DomainBed's train through the bridge does not validate
        hparams_lib.check_values(type(self).hparam_space(""), hparams)
        self.input_shape = tuple(input_shape)
        self.num_classes = num_classes
        self.num_domains = num_domains
        self.hparams = hparams

    @staticmethod
    def hparam_space(dataset: str) -> dict:
        return {}

    def update(self, minibatches, unlabeled=None) -> dict:
        raise NotImplementedError

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    # UDG protocol: self-supervised pretraining, then fine-tuning (udg_finetune)

    def pretrain_update(self, images: list[torch.Tensor]) -> dict:
        """One self-supervised step on unlabelled batches, one per source environment."""
        raise NotImplementedError(f"{type(self).__name__} has no self-supervised pretraining")

    def pretrained_state(self) -> dict[str, torch.Tensor]:
        """The weights fine-tuning starts from, in the fine-tuning model's key names."""
        raise NotImplementedError(f"{type(self).__name__} has no self-supervised pretraining")

    @classmethod
    def supports_pretraining(cls) -> bool:
        return cls.pretrain_update is not Algorithm.pretrain_update

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        """Every optimizer held, by attribute path (saved in resume checkpoints)."""
        return _collect(self, torch.optim.Optimizer)

    def schedulers(self) -> dict[str, torch.optim.lr_scheduler.LRScheduler]:
        return _collect(self, torch.optim.lr_scheduler.LRScheduler)

    def lr_schedule_exempt(self) -> set[str]:
        """Optimizers (named as by :meth:`optimizers`) whose lr ``lr_schedule`` leaves alone."""
        return set()

    def set_lr_factor(self, factor: float) -> None:
        """Every param group's lr = ``initial_lr`` x ``factor`` (but :meth:`lr_schedule_exempt`);
        refuses an optimizer a torch LR scheduler drives."""
        exempt = self.lr_schedule_exempt()
        optimizers = {name: opt for name, opt in self.optimizers().items() if name not in exempt}
        driven = {id(s.optimizer): name for name, s in self.schedulers().items()}
        if clash := [name for name, opt in optimizers.items() if id(opt) in driven]:
            raise ValueError(
                f"{type(self).__name__} schedules the lr of {', '.join(clash)} itself (torch LR "
                f"scheduler {', '.join(driven[id(optimizers[n])] for n in clash)}); the hparam "
                "lr_schedule must stay 'constant' for it")
        for opt in optimizers.values():
            for group in opt.param_groups:
                group.setdefault("initial_lr", group["lr"])
                group["lr"] = group["initial_lr"] * factor


class FeatureClassifier(Algorithm):
    """An ERM-shaped algorithm: ``predict(x) = classifier(features(x))``; ``network`` is
    ``Sequential(featurizer, classifier)`` as in DomainBed."""

    def __init__(self, input_shape, num_classes, num_domains, hparams, featurizer=None):
        super().__init__(input_shape, num_classes, num_domains, hparams)
        from dg_plugins import networks

        self.featurizer = featurizer or networks.Featurizer(self.input_shape, hparams)
        self.classifier = networks.Classifier(self.featurizer.n_outputs, num_classes,
                                              hparams["nonlinear_classifier"])
        self.network = nn.Sequential(self.featurizer, self.classifier)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.featurizer(x)

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def lr_factor(hparams: dict, step: int, epoch_steps: float | None) -> float:
    """The factor on the initial lr at 0-based ``step`` under the hparam ``lr_schedule``
    (``constant``, ``exp_epoch``, ``inv_epoch``, ``inv_step``; ``docs/methods/README.md``)."""
    schedule = hparams.get("lr_schedule", "constant")
    if schedule == "constant":
        return 1.0
    if schedule == "inv_step":
        return (1 + hparams["lr_inv_gamma"] * step) ** -hparams["lr_inv_power"]
    if schedule not in ("exp_epoch", "inv_epoch"):
        raise ValueError(f"hparam 'lr_schedule' {schedule!r} is not one of "
                         f"{', '.join(hparams_lib.LR_SCHEDULES)}")
    if not epoch_steps:
        raise ValueError(f"lr_schedule {schedule!r} counts epochs, but the run's epoch length "
                         "(Algorithm.epoch_steps) is not known; use 'inv_step' or 'constant'")
    epoch = math.floor(step / epoch_steps + 1e-9)  # a boundary step is that epoch's first
    if schedule == "exp_epoch":
        return hparams["lr_decay"] ** epoch
    return (1 + hparams["lr_inv_gamma"] * epoch) ** -hparams["lr_inv_power"]


def positive_or_null(message: str):
    """An hparam check for a number > 0 (null is never checked), else ``message``."""
    return hparams_lib._check(lambda v: not isinstance(v, bool) and isinstance(v, (int, float))
                              and v > 0, message)


def split_minibatches(minibatches) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``[(x_0, y_0), ...]`` -> concatenated ``(x, y, domain)`` (a row's source environment)."""
    if not minibatches:
        raise ValueError("update() got no minibatches (one (x, y) pair per source environment)")
    xs, ys = zip(*minibatches)
    return torch.cat(xs), torch.cat(ys), domain_labels(ys)


def domain_labels(batches) -> torch.Tensor:
    """``[len(b_0) x 0, len(b_1) x 1, ...]``: the batch index of each row."""
    return torch.cat([torch.full((len(b),), i, dtype=torch.long, device=b.device)
                      for i, b in enumerate(batches)])


def adam(params, hparams, lr: float | None = None) -> torch.optim.Adam:
    """Adam with the job's ``lr`` and ``weight_decay``, as DomainBed's algorithms build it."""
    return torch.optim.Adam(params, lr=hparams["lr"] if lr is None else lr,
                            weight_decay=hparams["weight_decay"])


def decay_groups(named_params, weight_decay: float) -> list[dict]:
    """MAE's AdamW groups: weight decay on non-bias parameters of 2+ dimensions only."""
    decay, no_decay = [], []
    for name, p in named_params:
        if p.requires_grad:
            (no_decay if p.ndim <= 1 or name.endswith(".bias") else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


class GradScalingError(ValueError):
    """An optimizer stepped outside :func:`optimizer_step` while fp16's gradient scaler is on."""


_SCALING = types.SimpleNamespace(scaler=None, stepping=False)


def float32(device_type: str):
    """A block run in float32 (autocast off on ``device_type``)."""
    if not torch.is_autocast_enabled(device_type):
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, enabled=False)


def gradient_scaling(scaler):
    """Within the block :func:`optimizer_step` scales and steps through ``scaler`` (None: none)."""
    return swapped(_SCALING, "scaler", scaler)


def guard_scaled_steps(algorithm: nn.Module, fix: str = "") -> None:
    """``algorithm``'s optimizers raise :class:`GradScalingError` if stepped outside
    :func:`optimizer_step` under a scaler (never unscaled); ``fix``: other settings, said first."""
    name = type(algorithm).__name__

    def check(optimizer, args, kwargs):
        if _SCALING.scaler is not None and not _SCALING.stepping:
            raise GradScalingError(
                f"{name} steps an optimizer ({type(optimizer).__name__}) outside "
                "dg_plugins.algorithms.optimizer_step, so the gradient scaler cannot cover it; "
                f"{fix + ', or ' if fix else ''}step it through optimizer_step")

    for optimizer in algorithm.optimizers().values():
        optimizer.register_step_pre_hook(check)


def optimizer_step(optimizer, loss: torch.Tensor, inputs=None) -> None:
    """``zero_grad``, ``backward``, ``step`` of one optimizer or several, outside autocast;
    ``inputs``: the only tensors that get gradients. Scaled inside :func:`gradient_scaling`."""
    optimizers = optimizer if isinstance(optimizer, (list, tuple)) else (optimizer,)
    for opt in optimizers:
        opt.zero_grad(set_to_none=True)
    scaler = _SCALING.scaler
    with float32(loss.device.type):
        if scaler is None:
            loss.backward(inputs=inputs)
            for opt in optimizers:
                opt.step()
            return
        scaler.scale(loss).backward(inputs=inputs)
        with swapped(_SCALING, "stepping", True):
            for opt in optimizers:  # one without gradients would fail the scaler's checks
                if any(p.grad is not None for group in opt.param_groups
                       for p in group["params"]):
                    scaler.step(opt)
        scaler.update()
