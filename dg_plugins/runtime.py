"""The torch device a run uses (train, the CLIP scorer, alignment_eval, the benchmarks). No torch
import at module import."""

from __future__ import annotations


def pick_device(name: str | None = None):
    """``torch.device(name)``, or cuda when available and cpu otherwise. A cuda device asked for on
    a machine without one raises with the fix, instead of failing at the first tensor move."""
    import torch

    if not name:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as err:
        raise ValueError(f"--device {name!r} is not a torch device ({err}); use cpu, cuda or "
                         "cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name!r} asked for CUDA but no CUDA device is available; "
                         "use --device cpu (or leave --device out to pick automatically)")
    return device
