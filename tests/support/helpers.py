"""Helpers shared by the test modules: CPU-sized hparams, the test-only plugin modules, reading a
job's records, the DataFrame collect_results loads from given records, markdown tables' rows.
(A module, not ``conftest.py``: ``tests/alignment/conftest.py`` shadows ``from conftest import`` there.)"""

import os
from pathlib import Path

from dg_plugins.contract import tiny_hparams  # noqa: F401  (CPU-sized hparams, as the contract's)

#: The test-only plugin modules (``tests/plugins/``; conftest.py imports them before collection).
TEST_PLUGIN_MODULES = [p.stem for p in
                       sorted((Path(__file__).resolve().parents[1] / "plugins").glob("[!_]*.py"))]


#: Record keys that differ between two runs of the same job (wall clock, memory, the folder).
VOLATILE_KEYS = ("step_time", "mem_gb", "args")


def read_records(folder, drop=()) -> list[dict]:
    """The records of a job folder's ``results.jsonl`` (``[]`` when the job wrote none yet), each
    without the keys in ``drop`` (e.g. ``VOLATILE_KEYS`` to compare two runs)."""
    import json

    path = Path(folder) / "results.jsonl"
    if not path.exists():
        return []
    return [{k: v for k, v in json.loads(line).items() if k not in drop}
            for line in path.read_text().splitlines()]


def frame_of(records):
    """The DataFrame collect_results loads from a sweep holding ``records`` (one job folder)."""
    import json
    import tempfile

    from dg_plugins.collect.records import load_records

    with tempfile.TemporaryDirectory() as root:
        os.mkdir(os.path.join(root, "job"))
        with open(os.path.join(root, "job", "results.jsonl"), "w") as handle:
            handle.writelines(json.dumps(record) + "\n" for record in records)
        return load_records(root)


def markdown_rows(text: str, header: str) -> list[list[str]]:
    """The rows (stripped cells) of the first markdown table in ``text`` whose header row starts
    with ``header``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows
