"""The Algorithm contract (DomainBed's ``Algorithm`` in ``domainbed/algorithms.py``), the ERM-shaped
base class, registration, and small helpers every method shares.

The contract
------------
An ``Algorithm`` is an ``nn.Module`` built as ``(input_shape, num_classes, num_domains, hparams)``
(``num_domains`` = number of *training* environments; 1 in single-source runs).
``update(minibatches, unlabeled=None)`` does one optimisation step on one ``(x, y)`` batch per
source environment (its list index is the domain label, see :func:`split_minibatches`) and returns
a dict of Python floats whose keys are the same at every call (records need a fixed schema: return
0.0 for a term that is switched off or not started yet). ``predict(x)`` returns
``[N, num_classes]`` logits; the train loop calls it in eval mode (``algorithm.eval()``) and puts
the algorithm back in train mode after.

Every tensor a method keeps must be a parameter, buffer or submodule, so that ``.to(device)`` and
``state_dict()`` carry it (step counters are buffers, never Python ints), and every trainable
parameter must be in exactly one optimizer returned by :meth:`Algorithm.optimizers` (optimizers
and LR schedulers are found among the attributes of the algorithm and its submodules, also inside
lists and dicts; they are saved in resume checkpoints).

What a method file declares (see ``erm.py``, the template)
----------------------------------------------------------
* ``@register_algorithm("Name")`` on the class: the single act that makes the method known to
  train, sweep, collect_results, the bridge and every contract test.
* ``hparam_space(dataset)`` (a static method): ``{name: (default, random_fn[, check])}`` for the
  method's own hparams (see :mod:`dg_plugins.hparams`); attached at registration. Names must be
  unique to the method (prefix them: ``dmg_lambda_overlap``), except base names it overrides.
* ``TINY_TEST_HPARAMS``: overrides that make the method CPU-test sized (tiny backbones, few inner
  steps). The contract tests and the benchmark smoke test apply them on top of the defaults.
* ``GRADIENT_EXEMPT``: ``{parameter-name prefix: reason}`` for trainable parameters that
  legitimately get no gradient from a few ``update`` calls (the contract test checks the rest).
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn as nn

from dg_plugins import catalog
from dg_plugins import hparams as hparams_lib
from dg_plugins.registry import ALGORITHMS


def register_algorithm(name: str | None = None):
    """Class decorator: register an Algorithm under ``name`` (default: the class name), attach its
    ``hparam_space`` and add it to collect_results' row order."""

    def add(cls):
        key = name or cls.__name__
        space_fn = getattr(cls, "hparam_space", None)
        if space_fn is not None:
            hparams_lib.declare_space(key, space_fn)
        catalog.declare_algorithm(key)
        ALGORITHMS.register(key, cls)
        return cls

    return add


def _collect(root: nn.Module, kind: type) -> dict[str, object]:
    """Instances of ``kind`` held by ``root`` or its submodules, directly or in lists, tuples and
    dicts, named by attribute path (``optimizer``, ``disc.optimizer``, ``opts.0``, ``opts.gen``)."""
    found: dict[str, object] = {}
    seen: set[int] = set()
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
                if isinstance(item, kind) and id(item) not in seen:
                    seen.add(id(item))
                    found[f"{prefix}.{name}" if prefix else name] = item
    return found


class Algorithm(nn.Module):
    """Base class: DomainBed's contract plus :meth:`optimizers` / :meth:`schedulers` for resumable
    checkpoints. See the module docstring for what a method declares."""

    #: hparam overrides making the method CPU-test sized (contract tests, smoke benchmarks).
    TINY_TEST_HPARAMS: dict = {}
    #: ``{parameter-name prefix: reason}``: trainable parameters allowed to get no gradient.
    GRADIENT_EXEMPT: dict = {}
    #: Steps per epoch of the run, set by dg_plugins' train job once the data are known
    #: (DomainBed's: the smallest in-split over the batch; with ``batch_sampling`` "pooled" the
    #: batches of one pass over the source splits' union; in UDG pretraining, the pretraining
    #: set's); None where no job sets it (e.g. DomainBed's own train through the bridge). Read
    #: by schedules in epochs (the job's ``lr_schedule``, DisMAE's domain classifier).
    epoch_steps: float | None = None

    def __init__(self, input_shape, num_classes, num_domains, hparams):
        super().__init__()
        # the method's own hparams pass their checks here once, however they were made (train
        # validates overrides; DomainBed's train through the bridge does not)
        hparams_lib.check_values(type(self).hparam_space(""), hparams)
        self.input_shape = tuple(input_shape)
        self.num_classes = num_classes
        self.num_domains = num_domains
        self.hparams = hparams

    @staticmethod
    def hparam_space(dataset: str) -> dict:
        """The method's own hparams on ``dataset`` (none here)."""
        return {}

    def update(self, minibatches, unlabeled=None) -> dict:
        raise NotImplementedError

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    # Unsupervised DG (UDG) protocol: self-supervised pretraining on unlabelled source domains,
    # then fine-tuning on a labelled fraction (dg_plugins.algorithms.udg_finetune builds the fine-tuner).

    def pretrain_update(self, images: list[torch.Tensor]) -> dict:
        """One self-supervised step on unlabelled image batches, one per source environment (its
        list index is the domain label); returns a dict of floats like :meth:`update`. Only
        algorithms with a self-supervised phase (DisMAE, MAE) implement it."""
        raise NotImplementedError(f"{type(self).__name__} has no self-supervised pretraining")

    def pretrained_state(self) -> dict[str, torch.Tensor]:
        """The weights fine-tuning starts from after :meth:`pretrain_update` steps (e.g. the
        semantic encoder), in the key names of the fine-tuning model."""
        raise NotImplementedError(f"{type(self).__name__} has no self-supervised pretraining")

    @classmethod
    def supports_pretraining(cls) -> bool:
        return cls.pretrain_update is not Algorithm.pretrain_update

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        """Every optimizer the algorithm holds, by attribute path (saved in resume checkpoints)."""
        return _collect(self, torch.optim.Optimizer)

    def schedulers(self) -> dict[str, torch.optim.lr_scheduler.LRScheduler]:
        """Every LR scheduler the algorithm holds, by attribute path (saved in resume checkpoints)."""
        return _collect(self, torch.optim.lr_scheduler.LRScheduler)

    # The job's learning-rate schedule (hparam lr_schedule, see lr_factor)

    def lr_schedule_exempt(self) -> set[str]:
        """Names (attribute paths, as :meth:`optimizers` names them) of the optimizers whose lr
        the job's ``lr_schedule`` leaves alone (none here; DMG's mask optimizer, by default)."""
        return set()

    def set_lr_factor(self, factor: float) -> None:
        """Set every param group's lr to its initial lr x ``factor``, in every optimizer but
        those of :meth:`lr_schedule_exempt`. The initial lr is kept in the group's
        ``initial_lr`` (torch's schedulers' key; saved with the optimizer's state), so the lr is
        a pure function of the step and a resumed run sets the same values. An optimizer that a
        torch LR scheduler of the algorithm already drives is refused (two schedules would
        fight)."""
        exempt = self.lr_schedule_exempt()
        optimizers = {name: opt for name, opt in self.optimizers().items() if name not in exempt}
        driven = {id(s.optimizer): name for name, s in self.schedulers().items()}
        clash = [name for name, opt in optimizers.items() if id(opt) in driven]
        if clash:
            raise ValueError(
                f"{type(self).__name__} schedules the lr of {', '.join(clash)} itself (torch LR "
                f"scheduler {', '.join(driven[id(optimizers[n])] for n in clash)}); the hparam "
                "lr_schedule must stay 'constant' for it")
        for opt in optimizers.values():
            for group in opt.param_groups:
                group.setdefault("initial_lr", group["lr"])
                group["lr"] = group["initial_lr"] * factor


class FeatureClassifier(Algorithm):
    """An ERM-shaped algorithm: ``featurizer`` (``n_outputs`` features) then ``classifier``, with
    the features/head split of timm models: :meth:`features` and :meth:`predict` =
    ``classifier(features(x))``. ``network`` is ``Sequential(featurizer, classifier)`` as in
    DomainBed. Methods that extend ERM subclass this and override :meth:`update` (and
    :meth:`features` when they change the representation)."""

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
    """The factor on the initial lr at training step ``step`` (0-based) under the hparam
    ``lr_schedule``; ``epoch = step / epoch_steps`` (:attr:`Algorithm.epoch_steps`):

    * ``constant``: 1;
    * ``exp_epoch``: ``lr_decay ** floor(epoch)`` (the DMG release's PACS schedule:
      ``ExponentialLR(gamma=0.99)`` stepped after every epoch, ``train_model.py`` line 265 and
      ``trainers/subnetwork_supermask_trainer.py`` lines 532-538 of github.com/prithv1/DMG at
      6b162b4);
    * ``inv_epoch``: ``(1 + lr_inv_gamma * floor(epoch)) ** -lr_inv_power``;
    * ``inv_step``: ``(1 + lr_inv_gamma * step) ** -lr_inv_power`` (the release's DomainNet
      schedule: ``InvLR(gamma=1e-4, power=0.75)``, ``utils/inverse_lr_scheduler.py``, stepped
      after every iteration, ``configs/DomainNet/supermask_training.yml`` line 42 and the trainer's
      lines 196-203)."""
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


def split_minibatches(minibatches) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``[(x_0, y_0), (x_1, y_1), ...]`` -> ``(x, y, domain)``, concatenated; ``domain[j]`` is the
    index of the minibatch (the source environment) sample ``j`` came from."""
    if not minibatches:
        raise ValueError("update() got no minibatches (one (x, y) pair per source environment)")
    x = torch.cat([xi for xi, _ in minibatches])
    y = torch.cat([yi for _, yi in minibatches])
    domain = torch.cat([torch.full((len(yi),), i, dtype=torch.long, device=yi.device)
                        for i, (_, yi) in enumerate(minibatches)])
    return x, y, domain


def adam(params, hparams, lr: float | None = None) -> torch.optim.Adam:
    """Adam with the job's ``lr`` and ``weight_decay``, as DomainBed's algorithms build it."""
    return torch.optim.Adam(params, lr=hparams["lr"] if lr is None else lr,
                            weight_decay=hparams["weight_decay"])


def decay_groups(named_params, weight_decay: float) -> list[dict]:
    """AdamW groups as MAE builds them: weight decay on parameters of 2+ dimensions that are not
    biases; none on biases, norms and other 1-D parameters."""
    decay, no_decay = [], []
    for name, p in named_params:
        if not p.requires_grad:
            continue
        (no_decay if p.ndim <= 1 or name.endswith(".bias") else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


class GradScalingError(ValueError):
    """An optimizer stepped outside :func:`optimizer_step` while fp16's gradient scaler is on."""


class _Scaling:
    """The gradient scaler :func:`optimizer_step` applies (None: none), and whether it is inside
    its steps (see :func:`guard_scaled_steps`)."""

    scaler = None
    stepping = False


_SCALING = _Scaling()


@contextlib.contextmanager
def gradient_scaling(scaler):
    """Within the block, :func:`optimizer_step` scales each loss with ``scaler`` (a
    ``torch.amp.GradScaler``; None: no scaling) before its backward pass, steps the optimizers
    through it (unscaled gradients; a step with inf/NaN gradients is skipped) and updates its
    scale once per call. The train job runs every step of an fp16 job in it."""
    previous, _SCALING.scaler = _SCALING.scaler, scaler
    try:
        yield
    finally:
        _SCALING.scaler = previous


def guard_scaled_steps(algorithm: nn.Module) -> None:
    """Make every optimizer of ``algorithm`` raise :class:`GradScalingError` when stepped outside
    :func:`optimizer_step` inside :func:`gradient_scaling` with a scaler: its gradients would be
    scaled or not as its own code decides, never unscaled by the scaler, so an fp16 job refuses it
    at its first step instead of training something else than asked."""
    name = type(algorithm).__name__

    def check(optimizer, args, kwargs):
        if _SCALING.scaler is not None and not _SCALING.stepping:
            raise GradScalingError(
                f"{name} steps an optimizer ({type(optimizer).__name__}) outside "
                "dg_plugins.algorithms.optimizer_step, so --precision fp16's gradient scaler "
                "cannot cover it; use --precision bf16 (no scaler needed) or fp32, or step it "
                "through optimizer_step")

    for optimizer in algorithm.optimizers().values():
        optimizer.register_step_pre_hook(check)


def optimizer_step(optimizer, loss: torch.Tensor, inputs=None) -> None:
    """``zero_grad``, ``backward``, ``step``: the three lines every update ends with.
    ``optimizer`` is one optimizer or a sequence of them (one backward, then every step).
    ``inputs``: the only tensors that get gradients (``Tensor.backward(inputs=...)``), e.g. a
    generator's parameters when the loss also flows through a model that must keep its own.
    The backward pass and the steps run outside autocast (a job's ``--precision``); inside
    :func:`gradient_scaling` the loss is scaled and the steps unscale (fp16)."""
    optimizers = optimizer if isinstance(optimizer, (list, tuple)) else (optimizer,)
    for opt in optimizers:
        opt.zero_grad(set_to_none=True)
    device_type = loss.device.type
    outside = (torch.autocast(device_type=device_type, enabled=False)
               if torch.is_autocast_enabled(device_type) else contextlib.nullcontext())
    scaler = _SCALING.scaler
    with outside:
        if scaler is None:
            loss.backward(inputs=inputs)
            for opt in optimizers:
                opt.step()
            return
        scaler.scale(loss).backward(inputs=inputs)
        _SCALING.stepping = True
        try:
            for opt in optimizers:  # one without gradients would fail the scaler's checks
                if any(p.grad is not None for group in opt.param_groups
                       for p in group["params"]):
                    scaler.step(opt)
        finally:
            _SCALING.stepping = False
        scaler.update()
