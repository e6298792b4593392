"""torchvision (and timm, open_clip) import and work after dg_plugins.compat, in a fresh process."""

import subprocess
import sys

CODE = """
import dg_plugins.compat as compat
import torch, torchvision, timm, open_clip
from torchvision import transforms
net = torchvision.models.resnet18(weights=None)
assert net(torch.randn(1, 3, 64, 64)).shape == (1, 1000)
x = transforms.RandomResizedCrop(32)(torch.rand(3, 40, 40))
assert x.shape == (3, 32, 32)
assert timm.create_model("resnet18", pretrained=False, num_classes=0)(torch.randn(2, 3, 32, 32)).shape == (2, 512)
if not compat.extension_loaded:  # schemas only: the compiled ops stay unavailable
    try:
        torchvision.ops.nms(torch.rand(2, 4), torch.rand(2), 0.5)
    except RuntimeError:
        pass
    else:
        raise AssertionError("nms should be unavailable without the extension")
print("ok", compat.extension_loaded)
"""


def test_torchvision_timm_open_clip_import_in_a_fresh_process():
    proc = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("ok")


def test_ensure_torchvision_is_idempotent():
    from dg_plugins import compat

    first = compat.ensure_torchvision()
    assert compat.ensure_torchvision() is first
