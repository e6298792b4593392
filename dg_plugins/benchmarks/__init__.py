"""``benchmark gpu``, the one benchmark that ships (users run it on their own GPU; its
measurements are the GPU-hours estimates' numbers): ``gpu``, and what it needs, ``timing``,
``memory``, ``data``, each imported on its own. The developer benchmarks live in the source
checkout's ``benchmarks/``."""
