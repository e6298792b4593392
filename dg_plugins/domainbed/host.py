"""DomainBed's own algorithms (CORAL, IRM, GroupDRO, ...) on dg_plugins' host, from a DomainBed
checkout, as a source of the algorithm registry: their classes and hparams as they are, plus what
our job loop asks of an algorithm, on the featurizer our algorithms get (docs/bridge.md)."""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import re
import sys
import traceback
import warnings
from types import ModuleType

import torch
import torch.nn as nn
from torch.utils._pytree import tree_leaves, tree_map

from dg_plugins import catalog
from dg_plugins.domainbed import bridge
from dg_plugins import hparams as hparams_lib
from dg_plugins.algorithms.base import Algorithm
from dg_plugins.registry import ALGORITHMS, Source, UnavailableError
from dg_plugins.runtime import pick_device, swapped
from dg_plugins.seeds import rng_state, set_rng_state

PREFIX = "DomainBed"
#: Our featurizers' hparams that DomainBed's registry lacks (its algorithms get the defaults).
NETWORK_HPARAMS = ("backbone", "mnist_cnn_width", "pretrained", "pretrained_path", "vit_arch")
#: The record key (from ``update``'s values) with the parameter count of the job's featurizer.
FEATURIZER_PARAMS_KEY = "featurizer_params"
#: Packages DomainBed imports optionally, with the command that installs them.
OPTIONAL_PACKAGES = {"backpack": "pip install backpack-for-pytorch (DomainBed pins 1.3.0, for "
                                 "torch < 2)"}


def class_source(cls: type) -> str:
    """The source of ``cls`` and of its bases in the same module, or ""."""
    parts = []
    for klass in cls.__mro__:
        if klass.__module__ == cls.__module__:
            with contextlib.suppress(OSError, TypeError):
                parts.append(inspect.getsource(klass))
    return "\n".join(parts)


def backpack_problem() -> str | None:
    """Why backpack gives no per-sample gradients as DomainBed's Fishr asks for them (tried on
    two tiny layers); None when it does."""
    import backpack
    from backpack.extensions import BatchGrad

    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # create_graph's reference-cycle warning
        body, head = nn.Linear(3, 3), backpack.extend(nn.Linear(3, 2))
        loss = backpack.extend(nn.CrossEntropyLoss(reduction="none"))(
            head(body(torch.ones(2, 3))), torch.tensor([0, 1])).sum()
        with backpack.backpack(BatchGrad()):
            loss.backward(inputs=list(head.parameters()), retain_graph=True, create_graph=True)
    if hasattr(head.weight, "grad_batch"):
        return None
    from importlib.metadata import version

    return (f"backpack-for-pytorch {version('backpack-for-pytorch')} gives no per-sample "
            f"gradients for DomainBed's backward pass under torch {torch.__version__} (DomainBed "
            "pins backpack-for-pytorch==1.3.0, which needs torch < 2)")


def domainbed_hparams(hparams_registry: ModuleType, name: str, dataset: str,
                      random_seed: int, network_hparams: bool = False) -> dict:
    """DomainBed's ``_hparams`` (our small-image datasets asked as ``bridge.SMALL_IMAGE_PROXY``),
    plus :data:`NETWORK_HPARAMS`' defaults with ``network_hparams`` (on our featurizer)."""
    small = (dataset in hparams_lib.SMALL_IMAGE_DATASETS
             and dataset not in catalog.DOMAINBED_DATASETS)
    hparams = hparams_registry._hparams(name, bridge.SMALL_IMAGE_PROXY if small else dataset,
                                        random_seed)
    if network_hparams:
        ours = hparams_lib.base_space(dataset)
        hparams.update({key: (ours[key][0], ours[key][0]) for key in NETWORK_HPARAMS
                        if key not in hparams})
    return hparams


def _count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


class FeaturizerSwap:
    """Stands in for DomainBed's ``networks.Featurizer`` while a host class's code runs: ours for
    image inputs (with ``ours``), else DomainBed's; keeps those built while ``recording``."""

    def __init__(self, networks: ModuleType, original, ours: bool = True,
                 recording: bool = True):
        self.networks, self.original, self.ours = networks, original, ours
        self.recording = recording
        self.built: list[nn.Module] = []
        self.failed = False  # our featurizer itself refused (the hparams' fault: no fallback)

    def __call__(self, input_shape, hparams):
        if self.ours and len(tuple(input_shape)) == 3:
            from dg_plugins import networks

            try:
                featurizer = networks.Featurizer(input_shape, hparams)
            except Exception:
                self.failed = True
                raise
        else:
            featurizer = self.original(input_shape, hparams)
        if self.recording:
            self.built.append(featurizer)
        return featurizer

    def active(self):
        return swapped(self.networks, "Featurizer", self)


def _restore(current, saved, device):
    """``saved`` put back into ``current`` in place where shapes match, else as loaded (tensors
    where they were saved from: :func:`~dg_plugins.train.checkpoint.read_checkpoint`), modules
    moved to ``device``."""
    if isinstance(current, nn.Module) and type(saved) is type(current):
        current.load_state_dict(saved.state_dict())
        return current
    if (isinstance(current, torch.Tensor) and isinstance(saved, torch.Tensor)
            and current.shape == saved.shape and current.dtype == saved.dtype):
        with torch.no_grad():
            current.copy_(saved)
        return current
    if isinstance(current, list) and isinstance(saved, list) and len(current) == len(saved):
        current[:] = [_restore(c, s, device) for c, s in zip(current, saved)]
        return current
    if isinstance(current, dict) and isinstance(saved, dict):
        restored = {k: _restore(current.get(k), v, device) for k, v in saved.items()}
        current.clear()
        current.update(restored)
        return current
    if (type(saved) is type(current) and hasattr(saved, "__dict__")
            and not isinstance(saved, (torch.optim.Optimizer, type))):
        for name, value in vars(saved).items():
            setattr(current, name, _restore(getattr(current, name, None), value, device))
        return current
    return tree_map(lambda v: v.to(device) if isinstance(v, nn.Module) else v, saved)


class DomainBedHost:
    """Mixed into a DomainBed algorithm class: our job loop's optimizers, schedulers, lr factor,
    checks and resume state. :func:`host_class` sets ``DOMAINBED_NAME``, ``NAME``,
    ``CUDA_ONLY``, and ``NETWORKS`` and ``DOMAINBED_FEATURIZER``: DomainBed's ``networks`` module
    and its own ``Featurizer`` (None: the checkout has none)."""

    TINY_TEST_HPARAMS: dict = {}
    GRADIENT_EXEMPT: dict = {}
    epoch_steps = None
    UNSCALED_STEPS = "DomainBed's update() steps its own optimizers"  # fp16 is refused

    optimizers = Algorithm.optimizers
    schedulers = Algorithm.schedulers
    lr_schedule_exempt = Algorithm.lr_schedule_exempt
    set_lr_factor = Algorithm.set_lr_factor
    pretrain_update = Algorithm.pretrain_update
    pretrained_state = Algorithm.pretrained_state
    supports_pretraining = classmethod(lambda cls: False)
    #: none: DomainBed's registry draws them (dg_plugins.hparams.declare_registry)
    hparam_space = staticmethod(lambda dataset: {})

    def __init__(self, input_shape, num_classes, num_domains, hparams):
        """DomainBed's ``__init__`` on our featurizer; a class whose code then fails is built again,
        from the same RNG state, on DomainBed's, with a note on stderr. Prints the network line."""
        arguments = (input_shape, num_classes, num_domains, hparams)
        swap, refused, ours = None, None, None
        if self.NETWORKS is None:
            super().__init__(*arguments)
        else:
            swap = FeaturizerSwap(self.NETWORKS, self.DOMAINBED_FEATURIZER)
            state = rng_state()
            try:
                with swap.active():
                    super().__init__(*arguments)
            except Exception as err:  # noqa: BLE001  (DomainBed's code refused our featurizer)
                if swap.failed or not swap.built:
                    raise
                # err in one line with the file, line and code that raised it
                frame = traceback.extract_tb(err.__traceback__)[-1]
                where = f"{os.path.basename(frame.filename)}:{frame.lineno}"
                message = " ".join(str(err).split()) or (frame.line or "").strip()
                ours, refused = swap.built[0], f"{type(err).__name__} at {where}: {message}"[:300]
                set_rng_state(state)
                vars(self).clear()
                swap = FeaturizerSwap(self.NETWORKS, self.DOMAINBED_FEATURIZER, ours=False)
                with swap.active():
                    super().__init__(*arguments)
        self._host_modules = frozenset(self._modules)
        #: Whether networks built later (in update or predict) get dg_plugins' featurizer.
        self._on_ours = swap is not None and refused is None
        self._network = self._describe_network(swap.built if swap else [], ours, refused,
                                               input_shape, hparams)
        # a refusal is a difference: a note on stderr (which a job's out.txt also gets)
        print(f"note: {self._network['line']}" if refused else self._network["line"],
              file=sys.stderr if refused else sys.stdout)

    def _describe_network(self, built: list, ours, refused: str | None, input_shape,
                          hparams) -> dict:
        """The job's network: ``line`` (its output line) and ``params`` (the first featurizer's
        parameter count; None when the class builds none with ``networks.Featurizer``)."""
        total, who = _count(self), f"{self.NAME} (DomainBed's)"
        if not built:
            return {"params": None, "line": f"Network: {who} builds its own networks, not "
                                            f"with networks.Featurizer; {total:,} parameters"}
        counts = list(dict.fromkeys(_count(f) for f in built))
        kind = f"featurizer {type(built[0]).__name__}"
        size = ", ".join(f"{n:,}" for n in counts) + " parameters"
        if len(built) > 1:
            kind = f"{len(built)} featurizers {type(built[0]).__name__}"
            size += " each" if len(counts) == 1 else ""
        if refused is None:
            from dg_plugins.networks import backbone_for

            line = (f"Network: {who} on dg_plugins' {kind} (backbone "
                    f"{backbone_for(input_shape, hparams)}, {size}), as dg_plugins' own "
                    "algorithms get it with these hparams, in place of DomainBed's "
                    f"networks.Featurizer; {total:,} parameters in all")
        else:
            line = (f"Network: {who} on DomainBed's {kind} ({size}), not on "
                    f"dg_plugins' {type(ours).__name__} ({_count(ours):,} parameters), which "
                    "dg_plugins' algorithms get: DomainBed's code refused it ("
                    f"{refused}); {total:,} parameters in all (the hparams "
                    f"{', '.join(n for n in NETWORK_HPARAMS if n in hparams)} are not read)")
        return {"params": counts[0], "line": line}

    def _featurizer_scope(self):
        """After ``__init__``: the featurizer ``__init__`` got."""
        if not self._on_ours:
            return contextlib.nullcontext()
        return FeaturizerSwap(self.NETWORKS, self.DOMAINBED_FEATURIZER, recording=False).active()

    def update(self, *args, **kwargs):
        """DomainBed's ``update`` (networks it builds get the featurizer of ``__init__``), plus
        :data:`FEATURIZER_PARAMS_KEY`."""
        with self._featurizer_scope():
            values = super().update(*args, **kwargs)
        if self._network["params"] is not None and isinstance(values, dict):
            values = {**values, FEATURIZER_PARAMS_KEY: float(self._network["params"])}
        return values

    def predict(self, *args, **kwargs):
        with self._featurizer_scope():
            return super().predict(*args, **kwargs)

    @classmethod
    def check_args(cls, args) -> None:
        """Refuse a CUDA-only class off CUDA, with the fix."""
        if cls.CUDA_ONLY and (device := pick_device(getattr(args, "device", None))).type != "cuda":
            raise UnavailableError(
                f"{cls.NAME} runs only on a CUDA device: DomainBed's code for it calls "
                f".cuda(); this job's device is {device}. Run it on a GPU machine "
                "(--device cuda)")

    def resume_state(self) -> dict:
        """What the resume file keeps beside ``state_dict()`` and the optimizers."""
        kinds = (torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler)
        attributes = {name: value for name, value in vars(self).items()
                      if not name.startswith("_") and name not in ("training", "hparams")
                      and not any(isinstance(v, kinds) for v in tree_leaves(value))}
        modules = {name: module for name, module in self._modules.items()
                   if name not in self._host_modules}
        return {"attributes": attributes, "modules": modules}

    def load_resume_state(self, state: dict, model_state: dict | None = None) -> None:
        """Put :meth:`resume_state`'s ``state`` back, buffers reshaped as ``model_state``'s
        (DomainBed fills some at the first update: GroupDRO's ``q``)."""
        device = next((p.device for p in self.parameters()), torch.device("cpu"))
        for name, module in state["modules"].items():
            setattr(self, name, module.to(device))
        for name, value in state["attributes"].items():
            setattr(self, name, _restore(vars(self).get(name), value, device))
        for name, saved in (model_state or {}).items():
            owner, _, leaf = name.rpartition(".")
            try:
                module = self.get_submodule(owner)
            except AttributeError:
                continue  # not this model's: load_state_dict names it
            current = module._buffers.get(leaf, saved)
            if current is None or current.shape != saved.shape:  # a None buffer, too
                module._buffers[leaf] = torch.empty_like(saved, device=device)


def host_class(cls: type, name: str, networks: ModuleType | None = None) -> type:
    """DomainBed's ``cls`` with :class:`DomainBedHost` mixed in, run under ``name``, on our
    featurizer in place of ``networks.Featurizer`` when given."""
    return type(cls.__name__, (DomainBedHost, cls), {
        "NETWORKS": networks,
        "DOMAINBED_FEATURIZER": None if networks is None else staticmethod(networks.Featurizer),
        "__module__": __name__,
        "__qualname__": cls.__name__,
        "__doc__": f"DomainBed's {cls.__name__} ({cls.__module__}) on dg_plugins' host.\n\n"
                   + (cls.__doc__ or ""),
        "DOMAINBED_NAME": cls.__name__,
        "NAME": name,
        "CUDA_ONLY": re.search(r"\.cuda\(", class_source(cls)) is not None,
    })


class DomainBedAlgorithms(Source):
    """DomainBed's algorithms as a source of the registry: names from the checkout (without one,
    DomainBed b93c22a's, which then say how to get it)."""

    prefix = PREFIX
    _names: list[str] | None = None  # from the checkout, once found
    _error: Exception | None = None  # why the checkout's names could not be read

    def names(self) -> list[str]:
        if self._names is None and self._error is None:
            try:
                self._names = list(bridge.domainbed_module("algorithms").ALGORITHMS)
            except Exception as err:  # noqa: BLE001  (not found or broken: load() says which)
                self._error = err
        return list(catalog.DOMAINBED_ALGORITHMS) if self._names is None else list(self._names)

    def load(self, name: str, canonical: str) -> type:
        self.names()
        if self._names is None:
            raise UnavailableError(f"{canonical} is one of DomainBed's algorithms, which run "
                                   f"from a DomainBed checkout: {self._error}")
        algorithms = bridge.domainbed_module("algorithms")
        cls = algorithms.get_algorithm_class(name)
        source = class_source(cls)
        missing = [package for package in OPTIONAL_PACKAGES  # used, and DomainBed's import failed
                   if package in vars(algorithms) and vars(algorithms)[package] is None
                   and re.search(rf"\b{package}\b", source)]
        if missing:
            raise UnavailableError(
                f"{canonical} (DomainBed's) needs the package {missing[0]!r}, which DomainBed "
                f"could not import: {OPTIONAL_PACKAGES[missing[0]]}")
        if vars(algorithms).get("backpack") is not None and re.search(r"\bbackpack\(", source):
            if problem := backpack_problem():
                raise UnavailableError(f"{canonical} (DomainBed's) cannot run here: {problem}")
        registry = bridge.domainbed_module("hparams_registry")
        networks = vars(algorithms).get("networks")  # whose Featurizer its algorithms call
        networks = networks if callable(getattr(networks, "Featurizer", None)) else None
        hparams_lib.declare_registry(canonical, functools.partial(
            domainbed_hparams, registry, name, network_hparams=networks is not None))
        catalog.declare_algorithm(canonical)
        return host_class(cls, canonical, networks)

    def describe(self, shadowed: list[str]) -> str:
        names = [n for n in self.names() if n not in shadowed]
        listed = ", ".join(names + [f"{PREFIX}:{n}" for n in shadowed])
        if self._names is None:
            return (f"DomainBed's, with a checkout (set {bridge.DOMAINBED_ROOT_ENV}=/path/to/"
                    f"DomainBed): {listed}")
        return f"DomainBed's: {listed}"


def register() -> None:
    """Make DomainBed's algorithms a source of the algorithm registry (once)."""
    if not isinstance(ALGORITHMS.source(PREFIX), DomainBedAlgorithms):
        ALGORITHMS.add_source(DomainBedAlgorithms())
