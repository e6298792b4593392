"""``python -m benchmarks [KIND] ARGS`` (from the checkout's root): the developer benchmarks.

KIND (default ``algorithms``):

* ``algorithms``: cost of registered algorithms relative to a baseline (step, predict, memory;
  ``--domainbed PATH`` adds train's wall time against DomainBed's);
* ``collect``: collect_results against DomainBed's on a generated sweep;
* ``alignment``: throughput of the CLIP alignment scorer;
* ``dismae``: DisMAE's and MAE's UDG pretraining step against ERM;
* ``gpu``: the step, memory and images/s of the paper algorithms at 224x224, and the settings
  it recommends (users run it on their GPU);
* ``image_job``: one image job, dg_plugins' train (``--eval_splits all`` and ``selection``)
  against DomainBed's ``train.py``;
* ``data_path``: images/s of training batches and full evaluations with the model left out,
  ours (image files, the decoded-image cache, each worker count) against DomainBed's loaders;
* ``sweep_gpu``: one small ResNet-50 sweep on the visible GPUs four ways (DomainBed's multi_gpu,
  ours one job per GPU, packed, packed with the opt-in settings) and their GPU-hours.

``python -m benchmarks KIND --help`` lists a kind's options. On a GPU machine,
``python -m benchmarks.gpu_check`` runs the test suite on CUDA and ``benchmark gpu`` in one report.
"""

from __future__ import annotations

import importlib
import sys

from dg_plugins.help_text import plain_text

#: Each kind and the module whose ``main(argv)`` runs it.
MODULES = {"algorithms": "benchmarks.algorithms", "collect": "benchmarks.collect",
           "alignment": "benchmarks.alignment", "dismae": "benchmarks.dismae",
           "gpu": "benchmarks.gpu", "image_job": "benchmarks.image_job",
           "data_path": "benchmarks.data_path", "sweep_gpu": "benchmarks.sweep_gpu"}
KINDS = tuple(MODULES)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    kind = "algorithms"
    if argv and not argv[0].startswith("-"):
        kind = argv.pop(0)
        if kind not in KINDS:
            import difflib

            close = difflib.get_close_matches(kind, KINDS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            print(f"error: unknown benchmark {kind!r}{hint}; kinds: {', '.join(KINDS)}",
                  file=sys.stderr)
            return 2
    elif argv[:1] in (["-h"], ["--help"]):
        print(plain_text(__doc__))
        return 0
    return importlib.import_module(MODULES[kind]).main(argv)


if __name__ == "__main__":
    sys.exit(main())
