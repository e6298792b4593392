"""A train job's compute settings (:data:`dg_plugins.job.flags.FLAGS`' ``compute`` rows) applied:
autocast (backward and optimizer steps outside it, torch's advice) and fp16's scaler, channels_last,
deterministic kernels, the device augmentation. One :class:`Compute` per train call."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field

import torch
import torch.nn as nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from dg_plugins.job.flags import AUGMENT_ON, COMPUTE_DEFAULTS, PRECISIONS, flag
from dg_plugins.seeds import deterministic_algorithms

#: cuBLAS's workspace setting for deterministic results (CUDA's reproducibility notes).
DETERMINISTIC_CUBLAS = ":4096:8"
#: The settings that run what fp16's gradient scaler cannot cover.
FP16_FIX = "use --precision bf16 (no scaler needed) or fp32"
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
#: ``/proc/cpuinfo``'s names of bfloat16 instructions: x86's AVX512-BF16 and AMX-BF16, Arm's BF16.
BF16_CPU_FEATURES = ("avx512_bf16", "amx_bf16", "bf16")
#: Why bf16 is slow on a CPU without them (the job's note, benchmark gpu's report).
BF16_EMULATED = ("this CPU has no bfloat16 instructions (" + ", ".join(BF16_CPU_FEATURES)
                 + " in /proc/cpuinfo), so torch emulates bfloat16")


def cpu_features(path: str = "/proc/cpuinfo") -> frozenset[str] | None:
    """The CPU's feature names (x86's ``flags``, Arm's ``Features``); None where not readable."""
    with contextlib.suppress(OSError), open(path) as handle:
        for line in handle:
            key, _, value = line.partition(":")
            if key.strip() in ("flags", "Features"):
                return frozenset(value.split())
    return None


def native_cpu_bf16() -> bool | None:
    """Whether this CPU has bfloat16 instructions (None: unknown); else torch emulates bf16."""
    features = cpu_features()
    return None if features is None else bool(features & set(BF16_CPU_FEATURES))


@dataclass(eq=False)
class Compute:
    """One job's compute settings (their defaults: :data:`COMPUTE_DEFAULTS`), checked here too:
    alignment_eval and the sweep's estimate build one from recorded args, not train's parser."""

    precision: str = "fp32"
    channels_last: bool = False
    deterministic: bool = True
    augment_on: str = "loader"
    inputs_channels_last: bool = field(default=False, init=False)  # set by prepare_model

    def __post_init__(self) -> None:
        for name, choices in (("precision", PRECISIONS), ("augment_on", AUGMENT_ON)):
            if getattr(self, name) not in choices:
                raise ValueError(f"--{name} {getattr(self, name)!r} is not one of "
                                 f"{', '.join(choices)}")
        self.channels_last, self.deterministic = bool(self.channels_last), bool(self.deterministic)

    @classmethod
    def of(cls, args) -> "Compute":
        return cls(**{name: flag(args, name) for name in COMPUTE_DEFAULTS})

    @property
    def dtype(self) -> torch.dtype | None:
        return DTYPES.get(self.precision)

    def check(self, device: torch.device, algorithm_class=None) -> None:
        """Raise ValueError naming the fix when ``device`` or ``algorithm_class`` (its
        ``UNSCALED_STEPS``, which fp16 cannot cover) cannot run these settings."""
        unscaled = getattr(algorithm_class, "UNSCALED_STEPS", None)
        if self.precision == "fp16" and unscaled:
            name = getattr(algorithm_class, "NAME", algorithm_class.__name__)
            raise ValueError(f"--precision fp16 cannot train {name}: {unscaled}, which fp16's "
                             f"gradient scaler cannot reach; {FP16_FIX}")
        if self.precision == "fp16" and device.type != "cuda":
            raise ValueError(f"--precision fp16 is for CUDA devices (this job runs on {device}, "
                             "and CPUs compute bfloat16 natively, float16 seldom, which also needs "
                             "a gradient scaler): use --precision bf16 here, or --device cuda on a "
                             "GPU machine")
        if self.dtype is not None and not torch.amp.is_autocast_available(device.type):
            raise ValueError(f"--precision {self.precision}: torch has no autocast on "
                             f"{device.type}; use --precision fp32 there")
        if (self.precision == "bf16" and device.type == "cuda"
                and not torch.cuda.is_bf16_supported(including_emulation=False)):
            raise ValueError(f"--precision bf16: {torch.cuda.get_device_name(device)} has no "
                             "native bfloat16; use --precision fp16 (with its gradient scaler)")
        if self.augment_on == "device":
            from dg_plugins.datasets.device_augment import require_kornia

            require_kornia()

    def device_note(self, device: torch.device) -> str | None:
        """A note for a setting ``device`` runs slowly (bf16 on a CPU without bf16), else None."""
        if (self.precision == "bf16" and torch.device(device).type == "cpu"
                and native_cpu_bf16() is False):
            return (f"note: --precision bf16: {BF16_EMULATED}: steps and evaluations take "
                    "several times as long as in fp32; --precision fp32 is faster here")
        return None

    def autocast(self, device: torch.device):
        return (contextlib.nullcontext() if self.dtype is None else
                torch.autocast(device_type=torch.device(device).type, dtype=self.dtype))

    def make_scaler(self, device: torch.device):
        """fp16's gradient scaler (None at fp32 and bf16, whose range is float32's)."""
        return torch.amp.GradScaler(device.type) if self.precision == "fp16" else None

    def prepare_model(self, model: nn.Module) -> None:
        """With ``channels_last``, a convolutional ``model`` and its inputs in it (each UDG model
        too, with the job's one Compute)."""
        # a Conv2d that is not a ViT's patch embedding
        self.inputs_channels_last = self.channels_last and any(
            isinstance(m, nn.Conv2d) and not (m.kernel_size == m.stride and m.padding in (
                (0, 0), "valid")) for m in model.modules())
        if self.inputs_channels_last:
            model.to(memory_format=torch.channels_last)
        elif self.channels_last:
            print(f"note: --channels_last: {type(model).__name__}'s network has no convolution "
                  "but a patch embedding (a ViT), so it stays in the default memory format "
                  "(channels_last speeds up convolutions only)")

    def model_input(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` as the model takes it (4-D: channels_last after :meth:`prepare_model`)."""
        return (x.contiguous(memory_format=torch.channels_last)
                if self.inputs_channels_last and x.dim() == 4 else x)

    def prepare_process(self) -> None:
        """cuBLAS's deterministic workspace, set before CUDA starts (a user's value is kept)."""
        if self.deterministic:
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", DETERMINISTIC_CUBLAS)

    def configure_backends(self) -> None:
        """cuDNN's flags (after the build's last ``seed_everything``, which sets them too)."""
        torch.backends.cudnn.benchmark = not self.deterministic
        torch.backends.cudnn.deterministic = self.deterministic

    @contextlib.contextmanager
    def active(self, device=None):
        with contextlib.ExitStack() as stack:
            if self.deterministic:
                stack.enter_context(deterministic_algorithms())
                if device is not None and torch.device(device).type == "cuda":
                    stack.enter_context(sdpa_kernel([SDPBackend.MATH]))
            yield self


#: The default settings (DomainBed's computation), for an evaluation outside a job.
DEFAULT_COMPUTE = Compute()
