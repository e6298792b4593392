"""The sweep command's start-up without the cyclic garbage collector
(:func:`dg_plugins.runtime.pause_collector`): off while it checks and plans (here it imports
torch to check ``--hparams``), back on with what start-up made frozen when the launch begins;
the jobs forked by the local launcher's fork server start with the server's imports frozen
(:mod:`dg_plugins.train.preload`) and the collector on."""

from __future__ import annotations

import json
import textwrap

from support.processes import command_env, python_path, run

PROBE = textwrap.dedent('''
    """Writes the collector's state (on, frozen objects) when a process imports this plugin, when
    the sweep launches (a launcher around the local one) and after each training step."""
    import gc, json, os, sys

    from dg_plugins.registry import LAUNCHERS
    from dg_plugins.train.loop import add_step_hook

    def note(where):
        with open(os.environ["GC_PROBE_OUT"], "a") as f:
            f.write(json.dumps([os.getpid(), where, "torch" in sys.modules, gc.isenabled(),
                                gc.get_freeze_count()]) + "\\n")

    note("import")
    add_step_hook(lambda job, step: note(f"step {step}"))

    def probing_local(commands):
        note("launch")
        return LAUNCHERS.get("local")(commands)

    LAUNCHERS.register("probing_local", probing_local)
''')


def test_collector_is_off_during_start_up_and_jobs_start_with_the_preload_frozen(tmp_path):
    (tmp_path / "gc_probe.py").write_text(PROBE)
    states = tmp_path / "states.jsonl"
    env = command_env(DG_PLUGINS_IMPORT="gc_probe", GC_PROBE_OUT=str(states))
    env["PYTHONPATH"] = python_path(tmp_path, env["PYTHONPATH"])
    code, text = run("dg_plugins.scripts.sweep", "launch", "--datasets", "Debug28",
                     "--algorithms", "ERM", "--test_env_sets", "0", "--n_trials", "2",
                     "--n_hparams", "1", "--steps", "2", "--hparams", '{"batch_size": 4}',
                     "--data_dir", "builtin", "--output_dir", tmp_path / "sweep",
                     "--command_launcher", "probing_local", "--skip_confirmation", env=env,
                     timeout=300)
    assert code == 0, text[-3000:]
    rows = [json.loads(line) for line in states.read_text().splitlines()]
    sweep_pid = rows[0][0]
    sweep = [row[1:] for row in rows if row[0] == sweep_pid]
    # the plugin loads with the --hparams check, which imports torch: start-up, collector off
    assert sweep[0][:3] == ["import", True, False]
    assert sweep[1][:3] == ["launch", True, True] and sweep[1][3] > 100_000  # torch frozen
    jobs = {}
    for pid, where, _, enabled, frozen in rows:
        if pid != sweep_pid:
            jobs.setdefault(pid, []).append((where, enabled, frozen))
    assert len(jobs) == 2, rows  # two trials, each forked by the server
    for states_of_job in jobs.values():
        # the server's preload (torch, torch._dynamo) frozen before the fork: the job's
        # collections leave it out from its start
        assert [s[:2] for s in states_of_job] == [("import", True), ("step 0", True),
                                                  ("step 1", True)], states_of_job
        assert all(frozen > 100_000 for _, _, frozen in states_of_job)
