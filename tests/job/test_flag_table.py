"""The job contract (dg_plugins.job): train's flags as one table whose policies train's parser, the
records, the sweep's hashing and pass-through, the resume check and reproduce read; the split sizes
and record counts that train and reproduce share."""

import argparse

import pytest

from dg_plugins.job import flags, sizes
from dg_plugins.job.flags import (ALWAYS, EVERY, FLAGS, GIVEN, NEVER, NOT_DEFAULT, OPTIONAL,
                                  record_args, sweep_job_args)
from dg_plugins.sweep import cli as sweep_cli
from dg_plugins.sweep import jobs as sweep_jobs
from dg_plugins.train.cli import build_parser

#: DomainBed's train.py flags, exactly the keys of its records' ``args``.
DOMAINBED_KEYS = ["algorithm", "checkpoint_freq", "data_dir", "dataset", "holdout_fraction",
                  "hparams", "hparams_seed", "output_dir", "save_model_every_checkpoint", "seed",
                  "skip_model_save", "steps", "task", "test_envs", "trial_seed",
                  "uda_holdout_fraction"]


def parser_dests(parser) -> list[str]:
    return [a.dest for a in parser._actions if not isinstance(a, argparse._HelpAction)]


def test_train_parser_is_the_table():
    assert parser_dests(build_parser()) == [f.name for f in FLAGS]
    defaults = vars(build_parser().parse_args([]))
    for f in FLAGS:  # a compute setting parses to None at its default (not in the records)
        assert defaults[f.name] == (None if f.setting else f.default), f.name


def test_every_row_has_valid_policies():
    for f in FLAGS:
        assert f.records in (ALWAYS, GIVEN, NOT_DEFAULT, NEVER), f.name
        assert f.sweep in (flags.ENUMERATED, OPTIONAL, EVERY, flags.NOT_PASSED), f.name
        # a flag the sweep hashes enters the records too (a folder name follows from them)
        assert not f.hashed or f.records != NEVER, f.name
    assert sorted(flags.names(records=ALWAYS)) == DOMAINBED_KEYS


def test_the_sweep_has_every_flag_it_passes_to_its_jobs():
    sweep = set(parser_dests(sweep_cli.build_parser()))
    passed = flags.names(sweep=EVERY) + flags.names(sweep=OPTIONAL)
    assert set(passed) <= sweep, set(passed) - sweep
    assert set(sweep_jobs.UNHASHED_TRAIN_ARGS) == {"eval_splits", "n_workers"}
    assert not set(sweep_jobs.UNHASHED_TRAIN_ARGS) & set(sweep_jobs.OPTIONAL_TRAIN_ARGS)


def test_records_hold_domainbeds_keys_then_ours_when_given_then_non_defaults():
    args = build_parser().parse_args([])
    assert list(record_args(args)) == DOMAINBED_KEYS  # DomainBed's records, exactly
    args = build_parser().parse_args(
        ["--precision", "fp32", "--deterministic", "true", "--eval_splits", "all",
         "--eval_batch_size", "64", "--n_workers", "3", "--device", "cpu"])
    assert list(record_args(args)) == DOMAINBED_KEYS  # defaults given explicitly: the same job
    args = build_parser().parse_args(
        ["--eval_splits", "selection", "--deterministic", "false", "--alignment_scores", "s.csv",
         "--label_fraction", "0.1", "--eval_batch_size", "32", "--precision", "bf16"])
    extra = list(record_args(args))[len(DOMAINBED_KEYS):]
    assert extra == ["alignment_scores", "label_fraction", "precision", "deterministic",
                     "eval_splits", "eval_batch_size"]
    assert record_args(args)["deterministic"] is False


def test_sweep_hashes_and_passes_by_the_table(tmp_path):
    argv = ["launch", "--datasets", "Debug28", "--algorithms", "ERM", "--data_dir", "d",
            "--output_dir", str(tmp_path), "--n_hparams", "1", "--n_trials", "1",
            "--single_test_envs", "--eval_splits", "selection", "--n_workers", "2",
            "--precision", "bf16", "--eval_batch_size", "64", "--alignment_threshold", "0.3",
            "--alignment_scores", "s.csv"]
    args = sweep_cli.build_parser().parse_args(argv)
    hashed = sweep_job_args(args, hashed=True)
    assert hashed == {"precision": "bf16", "alignment_scores": "s.csv",
                      "alignment_threshold": 0.3}  # eval_batch_size at its default: left out
    assert sweep_cli.command_args(args) == {"n_workers": 2, "eval_splits": "selection"}
    job = sweep_jobs.make_jobs(sweep_cli.make_args_list(args), str(tmp_path),
                               command_args=sweep_cli.command_args(args))[0]
    assert "--eval_splits selection" in job.command_str and "--n_workers 2" in job.command_str
    hashed_args = {k: v for k, v in job.train_args.items() if k != "output_dir"}
    assert job.output_dir.endswith(sweep_jobs.job_folder_name(hashed_args))
    assert "eval_splits" not in hashed_args and hashed_args["precision"] == "bf16"


def test_resume_check_reads_the_table():
    from dg_plugins.train.checkpoint import checkpoint_differences

    args = record_args(build_parser().parse_args([]))
    moved = dict(args, data_dir="/elsewhere", output_dir="/moved")  # resumable rows
    assert checkpoint_differences({"args": args, "hparams": {}}, moved, {}) == []
    changed = dict(args, precision="bf16")
    assert checkpoint_differences({"args": args, "hparams": {}}, changed, {}) == [
        "--precision: 'fp32' in the checkpoint (the default), 'bf16' now"]
    assert [f.name for f in FLAGS if f.resumable and f.records != NEVER] == ["data_dir",
                                                                             "output_dir"]


def test_train_argv_writes_what_trains_parser_reads_and_refuses_a_name_that_is_no_row():
    words = flags.train_argv(dataset="PACS", test_envs=[0, 2], hparams={"batch_size": 8},
                             steps=9, channels_last=True, deterministic=False, resume=True,
                             skip_model_save=False, precision="bf16", device=None)
    assert words[:7] == ["--dataset", "PACS", "--test_envs", "0", "2", "--hparams",
                         '{"batch_size": 8}']
    assert "--skip_model_save" not in words and "--device" not in words  # False switch, None
    parsed = build_parser().parse_args(words)
    assert (parsed.dataset, parsed.test_envs, parsed.steps, parsed.precision) == \
        ("PACS", [0, 2], 9, "bf16")
    assert parsed.channels_last is True and parsed.deterministic is False and parsed.resume
    with pytest.raises(ValueError, match="train has no flag --precison"):
        flags.train_argv(precison="bf16")


def test_a_borrowed_flag_takes_its_spelling_choices_and_default_from_the_row():
    """A benchmark that hands a flag's values to train jobs borrows train's row: a value the row
    refuses is refused there too, and a name that is no row fails when the parser is built
    (a benchmark's own parser: benchmarks/tests/test_image_job.py)."""
    p = argparse.ArgumentParser()
    flags.borrow(p, "precision")
    assert p.parse_args([]).precision == "fp32"
    assert p.parse_args(["--precision", "fp16"]).precision == "fp16"
    with pytest.raises(SystemExit):
        p.parse_args(["--precision", "fp8"])
    assert flags.option("eval_splits") == "--eval_splits"
    with pytest.raises(ValueError, match="train has no flag --precison"):
        flags.borrow(argparse.ArgumentParser(), "precison")


def test_value_and_flag_read_namespaces_and_dicts_alike():
    ns = argparse.Namespace(eval_batch_size=64, precision="bf16")
    record = {"eval_batch_size": 64, "precision": "bf16"}
    for args in (ns, record):
        assert flags.value(args, "eval_batch_size") is None  # the default: not recorded
        assert flags.value(args, "precision") == "bf16"
        assert flags.flag(args, "eval_splits") == "all"  # absent: the default
    assert flags.compute_settings(record) == {"precision": "bf16"}


@pytest.mark.parametrize("n_steps,freq", [(1, 1), (5, 2), (10, 5), (11, 5), (301, 50), (7, 10)])
def test_record_counts_are_the_steps_that_record(n_steps, freq):
    recorded = [s for s in range(n_steps) if sizes.is_recorded(s, n_steps, freq)]
    assert sizes.records_after(-1, n_steps, freq) == len(recorded)
    for step in range(n_steps):
        assert sizes.records_after(step, n_steps, freq) == len([s for s in recorded if s > step])


def test_split_sizes_are_the_splits_train_makes():
    """The sizes the contract derives from image counts alone equal the splits train draws."""
    from dg_plugins.registry import DATASETS
    from dg_plugins.train.splits import Splits

    dataset = DATASETS.get("Debug28")(None, [0, 2], {"data_augmentation": False})
    args = argparse.Namespace(test_envs=[0, 2], holdout_fraction=0.3, uda_holdout_fraction=0.25,
                              trial_seed=1, task="domain_generalization")
    splits = Splits(dataset, args, {"class_balanced": False})
    made = {name: len(split) for name, split, _ in splits.eval_named()}
    pairs = sizes.random_holdout_pairs([len(env) for env in dataset], 0.3)
    assert sizes.split_sizes(pairs, [0, 2], 0.25) == made
    assert list(made)[-2:] == ["env0_uda", "env1_uda"]  # uda splits named by position


def test_check_ranges_refuses_negative_workers_and_a_data_dir_that_is_a_file(tmp_path):
    """train and sweep both run check_ranges before anything is written: --n_workers -1 ran a job
    (in-memory datasets) or failed after the job folder was made, as did a file as --data_dir."""
    a_file = tmp_path / "data.zip"
    a_file.write_bytes(b"")
    with pytest.raises(ValueError, match=r"^--n_workers must be >= 0, got -1 \(0: load in"):
        flags.check_ranges(build_parser().parse_args(["--n_workers", "-1"]))
    with pytest.raises(ValueError, match=f"^--data_dir {a_file} is a file, not a folder"):
        flags.check_ranges(build_parser().parse_args(["--data_dir", str(a_file)]))
    flags.check_ranges(build_parser().parse_args(["--data_dir", str(tmp_path), "--n_workers",
                                                  "0"]))
    sweep = sweep_cli.build_parser().parse_args(["launch", "--data_dir", str(a_file),
                                                 "--output_dir", str(tmp_path / "sweep")])
    with pytest.raises(ValueError, match="is a file, not a folder"):
        flags.check_ranges(sweep)
