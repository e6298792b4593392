"""``python -m benchmarks.gpu_check`` (from the checkout's root): one command for a GPU machine.
It checks that the packages the test suite needs are importable by the processes the tests
start, runs the whole suite with CUDA visible (so the GPU lane, ``tests/gpu/``, and every test
parametrized over devices run on it), runs ``benchmark gpu``, and writes one markdown report
naming the device: the suite's counts, each failure and skip reason, the GPU lane test by test,
and the benchmark's tables. Offline: nothing is downloaded (the hub and dg_plugins' own
downloads are set offline). It runs the checkout's ``tests/`` (beside this folder; another with
``--tests``)."""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

from dg_plugins.help_text import plain_text

#: What the suite imports beyond the package's own requirements (module: its pip name).
SUITE_MODULES = {"pytest": "pytest", "xdist": "pytest-xdist", "orjson": "orjson",
                 "open_clip": "open_clip_torch", "ftfy": "ftfy", "wcwidth": "wcwidth",
                 "mlxtend": "mlxtend", "submitit": "submitit", "matplotlib": "matplotlib",
                 "pandas": "pandas", "timm": "timm", "sklearn": "scikit-learn",
                 "kornia": "kornia"}
#: The environment of every process of the check: offline.
OFFLINE = {"HF_HUB_OFFLINE": "1", "DG_PLUGINS_OFFLINE": "1"}


def default_tests() -> Path | None:
    """The checkout's ``tests/`` beside ``benchmarks/``, if there."""
    folder = Path(__file__).resolve().parents[1] / "tests"
    return folder if (folder / "conftest.py").exists() else None


def missing_modules(env: dict) -> list[str]:
    """The pip names of :data:`SUITE_MODULES` a child process of this interpreter cannot import
    (as a test's subprocess sees the machine: its PYTHONPATH included)."""
    code = ("import importlib.util, sys; print(' '.join(m for m in sys.argv[1:] "
            "if importlib.util.find_spec(m) is None))")
    done = subprocess.run([sys.executable, "-c", code, *SUITE_MODULES], env=env,
                          capture_output=True, text=True, timeout=120)
    return [SUITE_MODULES[m] for m in done.stdout.split()]


def device_lines() -> list[str]:
    import torch

    if torch.cuda.is_available():
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        device = f"{len(names)} x {names[0]}" if len(set(names)) == 1 else ", ".join(names)
        device += f" (CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()})"
    else:
        device = "no CUDA device (a CPU run: the command's check, not a GPU's results)"
    return [f"Device: {device}",
            f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPU "
            f"cores; Python {platform.python_version()}, torch {torch.__version__}; "
            f"{datetime.datetime.now().isoformat(timespec='minutes')}"]


def read_junit(path: Path) -> list[dict]:
    """One dict per test case of pytest's JUnit XML: ``id``, ``outcome`` (passed, failed,
    error, skipped) and ``message`` (its first line)."""
    cases = []
    for case in ElementTree.parse(path).iter("testcase"):
        outcome, message = "passed", ""
        for kind in ("failure", "error", "skipped"):
            found = case.find(kind)
            if found is not None:
                outcome = {"failure": "failed"}.get(kind, kind)
                message = (found.get("message") or found.text or "").strip().splitlines()
                message = message[0] if message else ""
                break
        name = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
        cases.append({"id": name, "outcome": outcome, "message": message[:300]})
    return cases


def run_suite(args, tests: Path, env: dict, work: Path) -> tuple[list[dict], str, float]:
    junit = args.junitxml or work / "junit.xml"
    command = [sys.executable, "-m", "pytest", "-q", "-n", str(args.workers), "-p",
               "no:cacheprovider", f"--junitxml={junit}", str(tests)]
    start = time.monotonic()
    try:
        done = subprocess.run(command, cwd=tests.parent, env=env, capture_output=True,
                              text=True, timeout=args.suite_timeout)
        tail = done.stdout.strip().splitlines()[-1:] or ["(no output)"]
    except subprocess.TimeoutExpired:
        tail = [f"stopped after {args.suite_timeout} s (--suite_timeout)"]
    seconds = time.monotonic() - start
    cases = read_junit(junit) if junit.exists() else []
    return cases, f"`{shlex.join(command[1:])}`: {tail[0]}", seconds


def run_benchmark(args, env: dict, work: Path) -> str:
    out = work / "gpu.md"
    command = [sys.executable, "-m", "benchmarks", "gpu", "--out", str(out),
               *shlex.split(args.benchmark_args)]
    try:  # from the checkout's root, where ``benchmarks`` imports
        done = subprocess.run(command, cwd=Path(__file__).resolve().parents[1], env=env,
                              capture_output=True, text=True,
                              timeout=args.benchmark_timeout)
    except subprocess.TimeoutExpired:
        return f"`benchmark gpu` stopped after {args.benchmark_timeout} s (--benchmark_timeout)"
    if done.returncode != 0 or not out.exists():
        return f"`benchmark gpu` failed (exit {done.returncode}):\n\n```\n{done.stderr[-3000:]}```"
    import re

    return re.sub(r"^(#+) ", r"##\1 ", out.read_text(), flags=re.MULTILINE)  # under the report's


def report(args, cases, suite_line, suite_seconds, benchmark, missing) -> str:
    lines = ["# GPU check", "", *device_lines(),
             f"Command: `python -m benchmarks.gpu_check {shlex.join(args.argv)}`", ""]
    if missing:
        lines += ["Missing packages (the suite was not run): " + ", ".join(missing), ""]
    if cases:
        counts = {o: sum(c["outcome"] == o for c in cases)
                  for o in ("passed", "failed", "error", "skipped")}
        lines += ["## Test suite", "", suite_line, "",
                  f"{counts['passed']} passed, {counts['failed']} failed, {counts['error']} "
                  f"errors, {counts['skipped']} skipped in {suite_seconds:.0f} s.", ""]
        gpu = [c for c in cases if "/gpu/" in c["id"] or "cuda" in c["id"]]
        lines += ["### GPU lane (tests/gpu/ and every case parametrized on CUDA)", "",
                  "| test | outcome |", "|---|---|"]
        lines += [f"| {c['id']} | {' '.join(filter(None, [c['outcome'], c['message']]))} |"
                  for c in gpu]
        bad = [c for c in cases if c["outcome"] in ("failed", "error")]
        if bad:
            lines += ["", "### Failures", ""] + [f"- {c['id']}: {c['message']}" for c in bad]
        reasons: dict = {}
        for c in cases:
            if c["outcome"] == "skipped":
                reasons[c["message"]] = reasons.get(c["message"], 0) + 1
        if reasons:
            lines += ["", "### Skips", ""] + [f"- {n} x {r}" for r, n in sorted(reasons.items())]
    elif suite_line:
        lines += ["## Test suite", "", suite_line]
    if benchmark:
        lines += ["", "## Benchmark", "", benchmark.strip()]
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check",
                                description=plain_text(__doc__))
    p.add_argument("--tests", type=Path, default=None,
                   help="the checkout's tests/ folder (default: beside benchmarks/)")
    p.add_argument("--out", type=Path, default=Path("gpu_check.md"),
                   help="the report (default ./gpu_check.md)")
    p.add_argument("-n", "--workers", type=int, default=min(16, os.cpu_count() or 1),
                   help="pytest-xdist processes (default: the cores, at most 16)")
    p.add_argument("--junitxml", type=Path, default=None,
                   help="keep pytest's JUnit XML there (every failure's whole text; default: "
                        "a temporary file)")
    p.add_argument("--suite_timeout", type=float, default=None, help="seconds (default none)")
    p.add_argument("--benchmark_args", default="",
                   help="extra arguments of benchmark gpu (e.g. \"--steps 5\")")
    p.add_argument("--benchmark_timeout", type=float, default=None, help="seconds")
    p.add_argument("--no_suite", action="store_true", help="skip the test suite")
    p.add_argument("--no_benchmark", action="store_true", help="skip benchmark gpu")
    p.add_argument("--allow_cpu", action="store_true",
                   help="run on a machine without CUDA too (to check the command itself)")
    return p


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    import dg_plugins.compat  # noqa: F401
    import torch

    if not torch.cuda.is_available() and not args.allow_cpu:
        print("error: no CUDA device is visible: gpu_check is for a GPU machine (on a CPU run "
              "python -m pytest; --allow_cpu checks this command there)", file=sys.stderr)
        return 2
    tests = args.tests or default_tests()
    if not args.no_suite and (tests is None or not (tests / "conftest.py").exists()):
        print(f"error: no test suite at {tests or 'the checkout'}: pass --tests CHECKOUT/tests",
              file=sys.stderr)
        return 2
    env = {**os.environ, **OFFLINE}
    missing = [] if args.no_suite else missing_modules(env)
    cases, suite_line, seconds, benchmark = [], "", 0.0, ""
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        if missing:
            suite_line = ("not run: install them into this interpreter (not with pip --target, "
                          "which the tests' subprocesses may not see), e.g. from carried wheels: "
                          f"{sys.executable} -m pip install --no-index --find-links WHEELS "
                          + " ".join(missing))
        elif not args.no_suite:
            cases, suite_line, seconds = run_suite(args, tests, env, Path(tmp))
        if not args.no_benchmark:
            benchmark = run_benchmark(args, env, Path(tmp))
    text = report(args, cases, suite_line, seconds, benchmark, missing)
    args.out.write_text(text)
    print(text, end="")
    print(f"(written to {args.out})")
    failed = missing or any(c["outcome"] in ("failed", "error") for c in cases)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
