"""The benchmarks as a developer runs them: ``python -m benchmarks ARGS`` (or another module) in a
subprocess on the CPU, the checkout first on its path, with a timeout."""

from __future__ import annotations

import os
import subprocess
import sys

from support.devices import cpu_only
from support.processes import REPO, python_path

TIMEOUT_S = 300


def run(*args, cwd, module: str = "benchmarks") -> subprocess.CompletedProcess:
    env = cpu_only(dict(os.environ, PYTHONPATH=python_path(REPO)))  # the CPU run
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True,
                          timeout=TIMEOUT_S, env=env, cwd=cwd)
