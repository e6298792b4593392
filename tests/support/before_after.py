"""A small sweep run as a user runs it, and what it leaves: the before/after proof that moving the
code (issue 35) changed nothing a user sees (``tests/test_before_after.py``).

:func:`run_all` runs, in a fresh folder and with relative paths (so that every job-folder hash is
the same on any machine), four ``python -m dg_plugins.scripts.sweep launch`` commands with the
``local`` launcher and the default loader workers, one train command, then
``python -m dg_plugins.scripts.collect_results`` in every format:

* multi-source DG: ERM and DMG on RotatedMNIST5k (``--data_dir builtin``), test environments 0
  and 1, 11 steps, a record after the first and the last (the 16-wide CNN);
* single-source DG: MPBM on Debug28 with ``--single_source`` (3 jobs);
* UDG: MAE on Debug28 with two label fractions sharing one pretraining (3 steps, a tiny ViT);
* an ImageFolder tree (``tests/support/image_tree.py``, decoded in loader workers): ERM (the
  ResNet-18 at 32x32) through the sweep, and one IP/OOP train job (``--alignment_scores``, a
  pseudo score file) in the same folder.

:func:`snapshot` reads back what a user gets: the job-folder names (the md5 hashes, and the UDG
pretraining's), every ``results.jsonl`` without its wall-clock fields (:data:`TIMING_KEYS`),
the sweeps' output with what the wall clock decides masked (:func:`wall_clock_masked`), and every
table (stdout, stderr, exit status). ``python tests/support/before_after.py write [FOLDER]``
stores a snapshot as the fixture ``tests/fixtures/before_after/`` (or in FOLDER): for a
deliberate change of the output, or with ``PYTHONPATH`` on a checkout of the code before a
change (its commands, and this script's own imports, then run that code; the fixture was
written so, from commit 38419c1).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
FIXTURE = TESTS / "fixtures" / "before_after"
#: Record keys measured on the wall clock or the device (removed before comparing).
TIMING_KEYS = ("step_time", "mem_gb")
SWEEP_OUT = "sweep"
TREE = "tree"

#: The image-folder jobs' hparams: the ResNet-18, untrained, at 32x32 (the smallest image_size).
RESNET_HPARAMS = '{"resnet18": true, "pretrained": false, "batch_size": 2, "image_size": 32}'
_COMMON = ["--n_hparams", "1", "--n_trials", "1", "--output_dir", SWEEP_OUT,
           "--command_launcher", "local", "--skip_confirmation"]
#: The sweep commands (arguments of ``python -m dg_plugins.scripts.sweep``), by name. A record
#: evaluates every split, which costs more than a step on RotatedMNIST5k's 5,000 images: so two
#: records a job (the first one, then a later one), the narrowest 28x28 CNN (``mnist_cnn_width``
#: 16), the ResNet-18 at 32x32, and UDG on Debug28 (3 environments of 16 images).
SWEEPS = {
    "multi_source": ["launch", "--datasets", "RotatedMNIST5k", "--algorithms", "ERM", "DMG",
                     "--test_env_sets", "0", "1", "--steps", "11", "--checkpoint_freq", "10",
                     "--hparams", '{"batch_size": 8, "mnist_cnn_width": 16}',
                     "--data_dir", "builtin", *_COMMON],
    "single_source": ["launch", "--datasets", "Debug28", "--algorithms", "MPBM",
                      "--single_source", "--steps", "11", "--checkpoint_freq", "10",
                      "--hparams", '{"batch_size": 8, "mnist_cnn_width": 16}',
                      "--data_dir", "builtin", *_COMMON],
    "udg": ["launch", "--datasets", "Debug28", "--algorithms", "MAE", "--test_env_sets", "0",
            "--label_fractions", "0.5", "1.0", "--pretrain_steps", "3", "--steps", "5",
            "--checkpoint_freq", "4", "--hparams",
            '{"batch_size": 4, "vit_arch": "tiny", "dismae_decoder_width": 32}',
            "--data_dir", "builtin", *_COMMON],
    "image_folder": ["launch", "--datasets", "ImageFolder", "--algorithms", "ERM",
                     "--test_env_sets", "0", "--steps", "3", "--checkpoint_freq", "2",
                     "--hparams", RESNET_HPARAMS, "--data_dir", f"{TREE}/PACS", *_COMMON],
}
#: The IP/OOP job (arguments of ``python -m dg_plugins.scripts.train``), in the sweep folder.
IPOOP_TRAIN = ["--dataset", "ImageFolder", "--data_dir", f"{TREE}/PACS", "--algorithm", "ERM",
               "--test_envs", "1", "--steps", "3", "--checkpoint_freq", "2", "--hparams",
               RESNET_HPARAMS, "--alignment_scores", "scores.csv", "--alignment_threshold", "0.25",
               "--output_dir", f"{SWEEP_OUT}/ipoop"]
#: The collect_results commands (arguments after ``--input_dir sweep``), by name.
COLLECTS = {
    "text": [],
    "latex": ["--latex"],
    "markdown": ["--format", "markdown", "--no_save"],
    "csv": ["--format", "csv", "--hparams_table", "--ipoop", "in", "--no_save"],
    "selection_order": ["--selection", "oracle", "loo", "iid", "--hparams_table", "--ipoop",
                        "pooled", "--no_save"],
    "single_source_on": ["--selection", "iid", "--single_source", "on", "--no_save"],
    "learning_check": ["--learning_check"],
}
TIMEOUT_S = 300


def environment(root: Path) -> dict:
    """The commands' environment: this one, on the CPU (a GPU would compute other numbers), one
    thread per process (as the suite), offline, with caches of the run's own."""
    env = dict(os.environ)
    env.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1",
               DG_PLUGINS_OFFLINE="1")
    for name in ("HF_HOME", "TORCH_HOME", "XDG_CACHE_HOME", "DG_PLUGINS_CACHE"):
        env[name] = str(root / "caches" / name.lower())
    env.pop("DG_SWEEP_RERUN_COMMAND", None)
    env.pop("DG_PLUGINS_IMPORT", None)
    return env


def command(root: Path, module: str, args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=root, env=environment(root),
                          capture_output=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)


def write_scores(root: Path) -> None:
    """A pseudo score file for the tree (``tests/alignment/alignment_helpers.fake_table``)."""
    sys.path.insert(0, str(TESTS / "alignment"))
    try:
        from alignment_helpers import fake_table
    finally:
        sys.path.remove(str(TESTS / "alignment"))
    import dg_plugins.datasets  # noqa: F401  (registers ImageFolder)
    from dg_plugins.alignment import write_scores as write
    from dg_plugins.registry import DATASETS

    data_dir = f"{TREE}/PACS"
    cwd = os.getcwd()
    os.chdir(root)
    try:
        dataset = DATASETS.get("ImageFolder")(data_dir, [1], {"data_augmentation": False})
        table = fake_table(dataset, data_dir)
        write("scores.csv", table.frame, table.meta)
    finally:
        os.chdir(cwd)


def wall_clock_masked(text: str) -> str:
    """A sweep's output with what the wall clock decides masked: the seconds a job took, and the
    time left and step time of the launcher's estimate."""
    text = re.sub(r" in \d+ s:", " in N s:", text)
    return re.sub(r", about [^()]*? left \([^ ]+ s per training step",
                  ", about T left (S s per training step", text)


def run_all(root: Path) -> dict:
    """Run the sweeps, the IP/OOP job and every collect_results command in ``root``; returns
    ``{"sweeps": {name: output}, "tables": {name: {"stdout", "stderr", "code"}}}``."""
    sys.path.insert(0, str(TESTS))
    from support.image_tree import make_pacs_tree

    make_pacs_tree(root / TREE, per_class=1, size=16)
    outputs: dict = {"sweeps": {}, "tables": {}}
    for name, args in SWEEPS.items():
        done = command(root, "dg_plugins.scripts.sweep", args)
        text = (done.stdout + done.stderr).decode()
        if done.returncode != 0:
            raise AssertionError(f"sweep {name} exited {done.returncode}:\n{text[-4000:]}")
        outputs["sweeps"][name] = wall_clock_masked(text)
    write_scores(root)
    done = command(root, "dg_plugins.scripts.train", IPOOP_TRAIN)
    if done.returncode != 0:
        raise AssertionError(f"train exited {done.returncode}:\n{done.stderr.decode()[-4000:]}")
    for name, args in COLLECTS.items():
        done = command(root, "dg_plugins.scripts.collect_results",
                       ["--input_dir", SWEEP_OUT, *args])
        outputs["tables"][name] = {"stdout": done.stdout.decode(),
                                   "stderr": done.stderr.decode(), "code": done.returncode}
    return outputs


def records_of(path: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING_KEYS}
            for line in path.read_text().splitlines() if line.strip()]


def snapshot(root: Path, outputs: dict) -> dict:
    """What the user got: folder names, records (timing removed), sweep output, tables."""
    sweep = root / SWEEP_OUT
    folders = sorted(str(p.parent.relative_to(sweep)) for p in sweep.rglob("results.jsonl"))
    return {"folders": folders,
            "records": {f: records_of(sweep / f / "results.jsonl") for f in folders},
            **outputs}


def read_fixture(folder: Path = FIXTURE) -> dict:
    folders = (folder / "folders.txt").read_text().split()
    tables = {}
    for name in COLLECTS:
        tables[name] = {"stdout": (folder / "tables" / f"{name}.out").read_text(),
                        "stderr": (folder / "tables" / f"{name}.err").read_text(),
                        "code": int((folder / "tables" / f"{name}.code").read_text())}
    return {"folders": folders,
            "records": {f: records_of(folder / "records" / f / "results.jsonl") for f in folders},
            "sweeps": {name: (folder / "sweeps" / f"{name}.txt").read_text() for name in SWEEPS},
            "tables": tables}


def write_fixture(snap: dict, folder: Path = FIXTURE) -> None:
    if folder.exists():
        shutil.rmtree(folder)
    (folder / "tables").mkdir(parents=True)
    (folder / "sweeps").mkdir()
    (folder / "folders.txt").write_text("".join(f"{f}\n" for f in snap["folders"]))
    for f, records in snap["records"].items():
        path = folder / "records" / f / "results.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
    for name, text in snap["sweeps"].items():
        (folder / "sweeps" / f"{name}.txt").write_text(text)
    for name, table in snap["tables"].items():
        (folder / "tables" / f"{name}.out").write_text(table["stdout"])
        (folder / "tables" / f"{name}.err").write_text(table["stderr"])
        (folder / "tables" / f"{name}.code").write_text(f"{table['code']}\n")


if __name__ == "__main__":
    if sys.argv[1:2] != ["write"] or len(sys.argv) > 3:
        sys.exit(f"usage: {sys.argv[0]} write [FOLDER]   (stores a new fixture in FOLDER, "
                 f"default {FIXTURE})")
    target = Path(sys.argv[2]).resolve() if len(sys.argv) == 3 else FIXTURE
    with tempfile.TemporaryDirectory(prefix="before_after_") as tmp:
        write_fixture(snapshot(Path(tmp), run_all(Path(tmp))), target)
    print(f"wrote {target}")
