"""Helpers shared by the test modules: reading a job's records, and the DataFrame collect_results
loads from given records."""

import os
from pathlib import Path

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

    from dg_plugins.engine.records import load_records

    with tempfile.TemporaryDirectory() as root:
        os.mkdir(os.path.join(root, "job"))
        with open(os.path.join(root, "job", "results.jsonl"), "w") as handle:
            handle.writelines(json.dumps(record) + "\n" for record in records)
        return load_records(root)
