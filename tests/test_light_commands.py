"""Command paths that neither train nor score import no torch (nor torchvision, timm, open_clip):
each run as a user runs it (``python -m dg_plugins.scripts.X ...``, a process of its own) under
``python -X importtime``, whose report names every module the process imported. Their output is
tested elsewhere (``test_scripts_help.py``); here only what they import."""

import subprocess
import sys

import pytest

from support.processes import command_env

#: Modules that cost seconds to import, which these paths do not need.
HEAVY = {"torch", "torchvision", "timm", "open_clip"}

#: ``(script, argv, exit status)``: the help and a usage error of commands whose logic needs torch.
LIGHT_PATHS = [
    ("alignment_scores", ["--help"], 0),  # its flags' defaults: the authors' CLIP model
    ("check_data", ["--help"], 0),  # its parser outside the datasets package
    ("check_data", ["--dataset", "PACS"], 2),  # a missing flag: a usage error
    ("plot_gmoe_routing", ["--help"], 0),  # outside the algorithms package
]


@pytest.mark.parametrize("script, argv, status", LIGHT_PATHS,
                         ids=[f"{s}-{a[-1]}" for s, a, _ in LIGHT_PATHS])
def test_a_light_command_path_imports_no_torch(tmp_path, script, argv, status):
    done = subprocess.run([sys.executable, "-X", "importtime", "-m",
                           f"dg_plugins.scripts.{script}", *argv], cwd=tmp_path,
                          env=command_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == status, done.stderr[-3000:]
    imported = [line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines()
                if line.startswith("import time:")]
    assert "dg_plugins.scripts" in imported, done.stderr[-3000:]  # the report was read
    assert not {name.split(".")[0] for name in imported} & HEAVY, \
        sorted(name for name in imported if name.split(".")[0] in HEAVY)[:10]
