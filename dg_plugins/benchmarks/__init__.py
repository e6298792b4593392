"""``benchmark gpu``, the one benchmark that ships (users run it on their own GPU; its
measurements are the GPU-hours estimates' numbers), and what it needs; its modules are imported
on their own. The developer benchmarks live in the source checkout's ``benchmarks/``."""

__all__ = ["data", "gpu", "memory", "timing"]
