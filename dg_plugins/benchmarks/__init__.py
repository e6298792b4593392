"""``benchmark gpu``, the one benchmark that ships (users run it on their own GPU; its
measurements are the GPU-hours estimates' numbers), and what it needs: timing, memory, data. The
developer benchmarks live in the source checkout's ``benchmarks/``."""
