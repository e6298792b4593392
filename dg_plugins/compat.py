"""Make ``import torchvision`` (and so timm and open_clip) work beside a mismatched torch build.

The only torchvision wheel matching torch 2.13.0 on the package registry is a CUDA build. Next to
the CPU build of torch its compiled extension (``torchvision/_C.so``) cannot load, and then
torchvision's import fails with ``RuntimeError: operator torchvision::nms does not exist``: at
import it registers fake (meta) kernels for ``torchvision::nms`` and ``torchvision::qnms``, which
needs those operator schemas to exist.

:func:`ensure_torchvision` does nothing when the extension loads. Otherwise it defines the two
schemas (no kernels), so torchvision's models, transforms and datasets import and work; its compiled
ops (nms, roi_align, image decoding) stay unavailable and raise if called. dg_plugins decodes
images with PIL, so it never needs them. Every dg_plugins module that imports torchvision, timm or
open_clip imports this module first.
"""

from __future__ import annotations

import importlib.util
import os
import sys

_SCHEMAS = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}
_library = None  # keeps the schema definitions alive for the life of the process
extension_loaded: bool | None = None  # None until ensure_torchvision() ran


def _torchvision_extension_path() -> str | None:
    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = list(spec.submodule_search_locations)[0]
    for name in os.listdir(folder):
        if name.startswith("_C.") and (name.endswith(".so") or name.endswith(".pyd")):
            return os.path.join(folder, name)
    return None


def ensure_torchvision() -> bool:
    """Prepare torch so that torchvision imports. Returns True if torchvision's own compiled
    extension is usable, False if the fallback schemas were defined. Idempotent."""
    global _library, extension_loaded
    if extension_loaded is not None:
        return extension_loaded
    import torch

    if "torchvision" in sys.modules or hasattr(torch.ops.torchvision, "nms"):
        extension_loaded = True  # already imported fine, or the schemas exist
        return True
    path = _torchvision_extension_path()
    if path is None:  # torchvision not installed: nothing to prepare
        extension_loaded = False
        return False
    try:
        torch.ops.load_library(path)
        extension_loaded = True
    except (OSError, RuntimeError):
        _library = torch.library.Library("torchvision", "DEF")
        for schema in _SCHEMAS.values():
            _library.define(schema)
        extension_loaded = False
    return extension_loaded


ensure_torchvision()
