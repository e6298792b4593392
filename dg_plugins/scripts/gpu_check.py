"""``python -m dg_plugins.scripts.gpu_check``: the test suite on CUDA and ``benchmark gpu``, in
one report naming the device (:mod:`dg_plugins.benchmarks.gpu_check`; ``--help``)."""

import sys

from dg_plugins.benchmarks.gpu_check import build_parser, main  # noqa: F401  (its surface)

if __name__ == "__main__":
    sys.exit(main())
