"""The time left that the local launcher prints after each job: measured from the jobs that
finished (their wall time per training step), never claiming more precision than that; before
anything is measured, a rough estimate from a reference rate, saying how it was made. The jobs'
durations are injected (a fake clock), so no test races a job's speed."""

import os

import pytest

from dg_plugins.registry import LAUNCHERS
from dg_plugins.sweep import jobs as sweep_jobs
from dg_plugins.sweep import plan, progress
from dg_plugins.sweep.progress import JobOutputs
from dg_plugins.sweep.processes import ErrorLogs, command_output_dir


@pytest.mark.parametrize("seconds, text", [
    (3, "about 10 s"), (44, "about 40 s"), (100, "about 1 min 40 s"), (121, "about 2 min"),
    (275, "about 4 min 30 s"), (1490, "about 25 min"), (7790, "about 2 h 10 min"),
    (36000, "about 10 h"), (172000, "about 47 h 50 min"), (457200, "about 5 days 7 h"),
    (864000, "about 10 days"),
])
def test_durations_are_rounded_to_what_an_estimate_can_say(seconds, text):
    assert progress.format_duration(seconds) == text


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def run_jobs(outputs, clock, durations, folders):
    """Jobs that take ``durations`` seconds (injected) and finish (``done`` written)."""
    lines = []
    outputs.write = lines.append
    for index, seconds in enumerate(durations):
        outputs.started(index)
        clock.now += seconds
        open(os.path.join(folders[index], "done"), "w").close()
        outputs.ended(index, 0)
    return [line for line in lines if not line.startswith("[")]


def make_commands(tmp_path, steps):
    folders = []
    commands = []
    for i, n in enumerate(steps):
        folder = tmp_path / f"job{i}"
        folder.mkdir()
        folders.append(str(folder))
        commands.append(f"python -m dg_plugins.scripts.train --output_dir {folder} --steps {n}")
    return commands, folders


def test_the_time_left_follows_the_measured_jobs(tmp_path, monkeypatch):
    """Three jobs of 100, 100 and 200 steps: after the first (10 s) the rate is 0.1 s per step,
    so 300 steps are left: 30 s; the second takes 30 s: 40 s over 200 steps, 0.2 s per step, 200
    steps left: 40 s; after the last, all done."""
    commands, folders = make_commands(tmp_path, [100, 100, 200])
    clock = Clock()
    outputs = JobOutputs(commands, ErrorLogs(commands), clock=clock)
    assert run_jobs(outputs, clock, [10, 30, 50], folders) == [
        "  1/3 jobs done, about 30 s left (0.1 s per training step, measured over the 1 job(s) "
        "finished in this run; start-up and evaluation included)",
        "  2/3 jobs done, about 40 s left (0.2 s per training step, measured over the 2 job(s) "
        "finished in this run; start-up and evaluation included)",
        "  3/3 jobs done.",
    ]


def test_without_steps_the_estimate_is_per_job_and_a_failed_job_is_not_a_measure(
        tmp_path, monkeypatch):
    commands, folders = make_commands(tmp_path, [1, 1, 1])
    commands = [c.replace(" --steps 1", "") for c in commands]
    clock = Clock()
    lines = []
    outputs = JobOutputs(commands, ErrorLogs(commands), write=lines.append,
                         parallel=2, clock=clock)
    outputs.started(0)
    clock.now += 2
    outputs.ended(0, 1)  # failed after 2 s: no rate yet, and it is no longer left
    assert not [line for line in lines if not line.startswith("[")]
    outputs.started(1)
    clock.now += 60
    open(os.path.join(folders[1], "done"), "w").close()
    outputs.ended(1, 0)
    assert lines[-1] == ("  1/3 jobs done, about 30 s left (60 s per job, 2 at a time, measured "
                         "over the 1 job(s) finished in this run; start-up and evaluation "
                         "included)")


def debug_launch(out, *test_envs):
    return ["launch", "--datasets", "Debug28", "--algorithms", "ERM", "--data_dir", "builtin",
            "--output_dir", str(out), "--n_hparams", "1", "--n_trials", "1", "--steps", "100",
            "--test_env_sets", *test_envs]


def test_several_sweeps_run_as_one_queue_estimated_as_a_whole(tmp_path, capsys):
    """The quick start's way (``python -m dg_plugins.sweep.plan``): two sweep calls, 3 jobs, one
    done already, handed to one launcher call with the 2 left. Nothing is measured yet: a rough
    estimate from the reference rate, saying how it was made; then the launcher counts the whole
    run's jobs (their durations injected). A call that is not a launch is refused before anything
    starts."""
    out = tmp_path / "out"
    first = sweep_jobs.make_jobs(
        sweep_jobs.make_args_list(1, ["Debug28"], ["ERM"], 0, 1, 100, "builtin",
                                  "domain_generalization", 0.2, False, None,
                                  test_env_sets=[[0]], n_envs=lambda d: 3), str(out))
    os.makedirs(first[0].output_dir)
    open(os.path.join(first[0].output_dir, "done"), "w").close()
    launched = []

    def stand_in(commands):  # the local launcher's lines, with jobs of 20 s each
        clock = Clock()
        outputs = JobOutputs(commands, ErrorLogs(commands), clock=clock)
        launched.append((list(commands), run_jobs(outputs, clock, [20, 20], [
            command_output_dir(c) for c in commands])))

    LAUNCHERS.register("queue_stand_in", stand_in)
    flags = ["--command_launcher", "queue_stand_in", "--skip_confirmation"]
    try:
        assert plan.main(["--name", "quick start", "--reference_rate", "0.05",
                          "--reference_note", "measured on machine X", "::",
                          *debug_launch(out, "0"), *flags, "::",
                          *debug_launch(out, "1", "2"), *flags]) == 0
        with pytest.raises(SystemExit):
            plan.main(["::", *debug_launch(out, "0"), "--dry_run"])
    finally:
        LAUNCHERS.unregister("queue_stand_in")
    text = capsys.readouterr()
    assert text.out.startswith(
        "quick start: 3 jobs, 1 done; rough estimate: about 10 s for the 2 left (200 training "
        "steps at 0.05 s per step: measured on machine X; nothing is measured on this machine "
        "yet). Updated as jobs finish.\n")
    assert "error: --dry_run: a queue only launches its sweep calls (to list their jobs: " \
        "DRY_RUN=1" in text.err
    (commands, lines), = launched
    assert sorted(map(command_output_dir, commands)) == sorted(
        job.output_dir for job in sweep_jobs.make_jobs(sweep_jobs.make_args_list(
            1, ["Debug28"], ["ERM"], 0, 1, 100, "builtin", "domain_generalization", 0.2, False,
            None, test_env_sets=[[1], [2]], n_envs=lambda d: 3), str(out)))
    assert lines == [
        "  quick start: 2/3 jobs done, about 20 s left (0.2 s per training step, measured over "
        "the 1 job(s) finished in this run; start-up and evaluation included)",
        "  quick start: 3/3 jobs done.",
    ]
    assert progress.RUN is None  # the plan went with the run
    # a rerun of the finished run says so, with no estimate
    assert progress.Progress({c: 100 for c in [first[0].output_dir, *map(
        command_output_dir, commands)]}, [0.05, "x"], name="quick start").first_line() == \
        "quick start: 3/3 jobs done."
    # a launcher whose jobs the run's plan does not hold estimates its own
    commands, others = make_commands(tmp_path, [100])
    assert progress.Progress.for_commands(commands, others).planned == {others[0]: 100}


def test_a_queue_names_each_jobs_own_call_in_one_sweep_folder(tmp_path):
    """The quick start's calls share one sweep folder: after a failure, each job's
    ``delete_incomplete`` line is its own call's, so it deletes that job (one call's line would
    not enumerate the other call's jobs)."""
    from dg_plugins.sweep import actions

    out = tmp_path / "out"
    calls = [[*debug_launch(out, *envs), "--command_launcher", "dummy"]
             for envs in (["0"], ["1", "2"])]
    _, jobs, command_lines = plan.queue_calls(calls)
    by_env = {tuple(job.train_args["test_envs"]): job.output_dir for job in jobs}
    lines = actions.sweep_commands(command_lines, [by_env[(0,)], by_env[(2,)], by_env[(1,)]],
                                   "delete_incomplete")
    assert len(lines) == 2 and lines[0].endswith("--test_env_sets 0 --command_launcher dummy")
    assert lines[1].endswith("--test_env_sets 1 2 --command_launcher dummy")
    assert all(" delete_incomplete " in line for line in lines)
