"""The train command's start-up without the cyclic garbage collector
(:func:`dg_plugins.scripts.train.run_command`): off while it imports and builds, back on after
the job's first step with what start-up made frozen, and the records those of a job run with the
collector on throughout."""

from __future__ import annotations

import json
import textwrap

from support.processes import command_env, python_path, run

from dg_plugins.train import cli

JOB = ["--dataset", "Debug28", "--algorithm", "ERM", "--steps", "4", "--checkpoint_freq", "2",
       "--hparams", '{"batch_size": 4}', "--test_envs", "0"]
#: Keys that measure the run rather than compute the model.
TIMING_KEYS = {"step_time", "mem_gb"}

PROBE = textwrap.dedent('''
    """Records the collector's state at start-up (this plugin's import) and after each step."""
    import gc, json, os

    from dg_plugins.train.loop import add_step_hook

    STATES = [("import", gc.isenabled(), gc.get_freeze_count())]

    def probe(job, step):
        STATES.append((step, gc.isenabled(), gc.get_freeze_count()))
        with open(os.environ["GC_PROBE_OUT"], "w") as f:
            json.dump(STATES, f)

    add_step_hook(probe)
''')


def records(folder) -> list[dict]:
    """The job's records without their timings and output folder."""
    rows = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines()]
    for row in rows:
        del row["args"]["output_dir"]
    return [{k: v for k, v in row.items() if k not in TIMING_KEYS} for row in rows]


def test_collector_is_off_during_start_up_then_on_with_start_up_frozen(tmp_path, capsys):
    (tmp_path / "gc_probe.py").write_text(PROBE)
    out = tmp_path / "command"
    env = command_env(DG_PLUGINS_IMPORT="gc_probe", GC_PROBE_OUT=str(tmp_path / "states.json"))
    env["PYTHONPATH"] = python_path(tmp_path, env["PYTHONPATH"])
    code, text = run("dg_plugins.scripts.train", *JOB, "--output_dir", out, env=env,
                     timeout=300)
    assert code == 0, text[-3000:]
    states = json.loads((tmp_path / "states.json").read_text())
    assert states[0][:2] == ["import", False]  # plugins load during start-up (validate)
    # the command's hook runs first after each step: on, with start-up's objects frozen
    assert [s[:2] for s in states[1:]] == [[step, True] for step in range(4)]
    assert states[1][2] > 100_000  # frozen once (some leave as they are freed), not again
    assert all(s[2] <= states[1][2] for s in states[2:])

    assert cli.main([*JOB, "--output_dir", str(tmp_path / "in_process")]) == 0
    capsys.readouterr()
    assert records(out) == records(tmp_path / "in_process")
