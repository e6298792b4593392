"""``python -m dg_plugins.scripts.benchmark gpu ARGS``: the benchmark that ships with the package.

* ``gpu``: the step, memory and images/s of the paper algorithms at 224x224 in fp32 and bf16, the
  training loader's and the evaluation's images/s, and the settings it recommends for this
  machine (``results/gpu_benchmarks.md``; on a CPU a reduced run that says so).

``python -m dg_plugins.scripts.benchmark gpu --help`` lists its options. The developer
benchmarks (per algorithm, collect, alignment, dismae, image_job, data_path, sweep_gpu) compare
against DomainBed or a baseline and run from the source checkout's root:
``python -m benchmarks KIND``.
"""

from __future__ import annotations

import importlib
import shlex
import sys

from dg_plugins.help_text import plain_text

#: The kinds this command runs (module ``dg_plugins.benchmarks.KIND``).
KINDS = ("gpu",)
#: The kinds of the source checkout's ``python -m benchmarks`` (``algorithms``: its default).
CHECKOUT_KINDS = ("algorithms", "collect", "alignment", "dismae", "image_job", "data_path",
                  "sweep_gpu")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["-h"], ["--help"]):
        print(plain_text(__doc__))
        return 0
    if not argv:
        print(f"error: name the benchmark: python -m dg_plugins.scripts.benchmark "
              f"{'|'.join(KINDS)} ARGS (--help)", file=sys.stderr)
        return 2
    kind = argv[0] if not argv[0].startswith("-") else "algorithms"
    if kind in CHECKOUT_KINDS:
        words = argv[1:] if kind == argv[0] else argv
        print(f"error: benchmark {kind} is a developer benchmark of the source checkout: from "
              f"its root, python -m benchmarks {shlex.join([kind, *words])}; this command runs "
              f"{', '.join(KINDS)}", file=sys.stderr)
        return 2
    if kind not in KINDS:
        import difflib

        close = difflib.get_close_matches(kind, KINDS + CHECKOUT_KINDS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        print(f"error: unknown benchmark {kind!r}{hint}; this command runs {', '.join(KINDS)}, "
              f"the source checkout's python -m benchmarks {', '.join(CHECKOUT_KINDS)}",
              file=sys.stderr)
        return 2
    return importlib.import_module(f"dg_plugins.benchmarks.{kind}").main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
