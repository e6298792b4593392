"""Make ``import torchvision`` (and so timm and open_clip) work beside a mismatched torch build:
the CUDA torchvision wheel's compiled extension cannot load beside the CPU torch, and then its
import fails registering fake kernels for ``torchvision::nms`` and ``qnms``.
:func:`ensure_torchvision` then defines those two schemas (no kernels): models and transforms
work, the compiled ops (unused: images decode with PIL) raise. Import it before torchvision."""

from __future__ import annotations

import importlib.util
import os
import sys

_SCHEMAS = [f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor"
            for op in ("nms", "qnms")]
_library = None  # keeps the schema definitions alive for the life of the process
extension_loaded: bool | None = None  # None until ensure_torchvision() ran


def ensure_torchvision() -> bool:
    """Prepare torch so that torchvision imports; whether torchvision's own extension loads."""
    global _library, extension_loaded
    if extension_loaded is not None:
        return extension_loaded
    import torch

    if "torchvision" in sys.modules or hasattr(torch.ops.torchvision, "nms"):
        extension_loaded = True  # already imported fine, or the schemas exist
        return True
    spec = importlib.util.find_spec("torchvision")
    folder = list(spec.submodule_search_locations)[0] if spec is not None and \
        spec.submodule_search_locations else None
    path = next((os.path.join(folder, name) for name in (os.listdir(folder) if folder else ())
                 if name.startswith("_C.") and name.endswith((".so", ".pyd"))), None)
    if path is None:  # torchvision not installed: nothing to prepare
        extension_loaded = False
        return False
    try:
        torch.ops.load_library(path)
        extension_loaded = True
    except (OSError, RuntimeError):
        _library = torch.library.Library("torchvision", "DEF")
        for schema in _SCHEMAS:
            _library.define(schema)
        extension_loaded = False
    return extension_loaded


ensure_torchvision()
