"""The logic of ``python -m dg_plugins.scripts.alignment_scores``: its flags and their checks,
scoring or importing the dataset's AlignmentScores, writing the score file and the summary.
Building the dataset (with plugins) and the error exit stay in the script."""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from dg_plugins.alignment import provenance, wrapper
from dg_plugins.alignment.provenance import DEFAULT_MODEL, DEFAULT_PRETRAINED, DEFAULT_PROMPT
from dg_plugins.alignment.rule import resolve_rule
from dg_plugins.alignment.scores_file import write_scores


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m dg_plugins.scripts.alignment_scores",
        description="CLIP AlignmentScore (raw image-text cosine for the true class) of every "
        "image of a dataset, for IP/OOP evaluation.")
    p.add_argument("--dataset", required=True, help="registered dataset name, e.g. PACS")
    p.add_argument("--data_dir", required=True,
                   help="the data folder, as for train (paths in the file are relative to it)")
    p.add_argument("--envs", nargs="+", default=None,
                   help="environments to score: indices, labels (e.g. A) or folder names "
                   "(default: all)")
    p.add_argument("--model", default=DEFAULT_MODEL, help="open_clip model name")
    p.add_argument("--model_config", default=None,
                   help="a JSON open_clip model config to register; --model defaults to its "
                   "file name stem")
    p.add_argument("--pretrained", default=DEFAULT_PRETRAINED,
                   help="open_clip pretrained tag, a local checkpoint file, or none (random "
                   "weights: for tests only)")
    p.add_argument("--pretrained_tag", default=None,
                   help="with a checkpoint file as --pretrained: the open_clip tag whose weights "
                   "it holds (e.g. laion400m_e32), recorded in the file's header so that a rule "
                   "defined for that tag (--alignment_preset teterwak2025) accepts it")
    p.add_argument("--prompt", default=DEFAULT_PROMPT,
                   help="text prompt; {} is replaced by the class folder name")
    p.add_argument("--transform", default="dataset", choices=["dataset", "clip"],
                   help="dataset: the dataset's evaluation transform (the authors'); clip: the "
                   "model's own preprocessing")
    p.add_argument("--batch_size", type=int, default=64)
    p.add_argument("--device", default=None, help="torch device (default: cuda if available)")
    p.add_argument("--num_workers", type=int, default=None,
                   help="image decoding workers (default: min(8, CPUs))")
    p.add_argument("--seed", type=int, default=0, help="seed of random weights (--pretrained none)")
    p.add_argument("--out", default=None, help="output CSV (default: "
                   "alignment_scores_<dataset>_<model>_<pretrained>.csv)")
    p.add_argument("--cache_dir", default=None, help="score cache folder (default: "
                   "$DG_PLUGINS_CACHE/alignment or ~/.cache/dg_plugins/alignment)")
    p.add_argument("--no_cache", action="store_true", help="neither read nor write the cache")
    rule = p.add_argument_group("split rule (for the printed counts)")
    rule.add_argument("--threshold", type=float, default=None,
                      help="IP if score >= threshold (default 0.4)")
    rule.add_argument("--drop_below", type=float, default=None)
    rule.add_argument("--drop_above", type=float, default=None)
    add_preset_flag(rule)
    imp = p.add_argument_group("import the authors' released splits instead of scoring")
    imp.add_argument("--import_score_arrays", metavar="DIR", default=None)
    imp.add_argument("--holdout_fraction", type=float, default=0.2,
                     help="of the run that wrote the arrays (authors: 0.2)")
    imp.add_argument("--trial_seed", type=int, default=0,
                     help="of the run that wrote the arrays (authors: 0)")
    imp.add_argument("--import_split_dirs", nargs=2, metavar=("IP_DIR", "OOP_DIR"), default=None)
    p.add_argument("--import", dest="plugins", nargs="*", default=[],
                   help="plugin modules registering datasets")
    return p


def add_preset_flag(group) -> None:
    """``--alignment_preset`` (as in train and alignment_eval), and its hidden deprecated alias."""
    group.add_argument("--alignment_preset", default=None,
                       help="named rule, e.g. teterwak2025 (as in train and alignment_eval)")
    group.add_argument("--preset", dest="deprecated_preset", default=None,
                       help=argparse.SUPPRESS)


def resolve_preset_flag(args, parser: argparse.ArgumentParser) -> str | None:
    """The preset of ``--alignment_preset`` or the deprecated ``--preset`` (which warns)."""
    old = args.deprecated_preset
    if old is None:
        return args.alignment_preset
    if args.alignment_preset is not None and args.alignment_preset != old:
        parser.error(f"--preset {old!r} and --alignment_preset {args.alignment_preset!r} name two "
                     "rules; give --alignment_preset only")
    print("warning: --preset is deprecated; use --alignment_preset (the name train and "
          "alignment_eval use)", file=sys.stderr)
    return old


#: Every environment on its evaluation transform (no augmentation): what the scorer reads.
UNAUGMENTED = {"data_augmentation": False}


def resolve_envs(dataset, envs) -> list[int]:
    if envs is None:
        return list(range(len(dataset)))
    labels = list(getattr(dataset, "ENVIRONMENTS", None) or [])
    folders = [wrapper.env_folder_name(dataset[i]) for i in range(len(dataset))]
    out = []
    for env in envs:
        if env.lstrip("-").isdigit() and 0 <= int(env) < len(dataset):
            out.append(int(env))
        elif env in labels:
            out.append(labels.index(env))
        elif env in folders:
            out.append(folders.index(env))
        else:
            raise ValueError(f"--envs {env!r} is not an environment of the dataset: use an index "
                             f"0..{len(dataset) - 1}, a label {labels} or a folder name {folders}")
    return list(dict.fromkeys(out))


def check_flags(args):
    """``(model, rule)`` from the flags, or ValueError for a bad combination."""
    from dg_plugins.alignment import scoring

    model = args.model
    if args.model_config:
        registered = scoring.add_model_config(args.model_config)
        if model == scoring.DEFAULT_MODEL:
            model = registered
    if args.import_score_arrays and args.import_split_dirs:
        raise ValueError("give --import_score_arrays or --import_split_dirs, not both")
    rule_flags = (args.threshold, args.preset, args.drop_below, args.drop_above)
    if args.import_split_dirs and any(v is not None for v in rule_flags):
        raise ValueError("imported split folders carry fixed subsets; leave out --threshold, "
                         "--alignment_preset, --drop_below and --drop_above")
    rule = None if args.import_split_dirs else resolve_rule(*rule_flags)
    if args.pretrained_tag is not None and (args.import_score_arrays or args.import_split_dirs):
        raise ValueError("--pretrained_tag declares the weights of a checkpoint file to "
                         "score with; imported splits are not scored here: leave it out")
    return model, rule


def score_and_write(args, dataset, model, rule) -> None:
    """Score (or import) the ``--envs`` of ``dataset``, write the file, print the summary."""
    from dg_plugins.alignment import scoring

    imported = bool(args.import_score_arrays or args.import_split_dirs)
    envs = resolve_envs(dataset, args.envs)
    if args.import_score_arrays:
        table = wrapper.import_score_arrays(
            dataset, args.import_score_arrays, args.data_dir,
            envs if args.envs else None, args.holdout_fraction, args.trial_seed,
            dataset_name=args.dataset)
    elif args.import_split_dirs:
        table = wrapper.import_split_dirs(dataset, *args.import_split_dirs, args.data_dir,
                                          envs if args.envs else None, dataset_name=args.dataset)
    else:
        run = scoring.score_dataset(
            dataset, envs, args.data_dir, model=model, pretrained=args.pretrained,
            prompt=args.prompt, transform=args.transform, batch_size=args.batch_size,
            device=args.device, num_workers=args.num_workers, cache_dir=args.cache_dir,
            use_cache=not args.no_cache, seed=args.seed, dataset_name=args.dataset,
            pretrained_tag=args.pretrained_tag)
        table = run.table
    if imported:
        envs = sorted(set(table.frame["env"].tolist()))
    out = args.out or "alignment_scores_{}_{}_{}.csv".format(
        args.dataset, model.replace("/", "-"),
        "none" if scoring.is_random_init(args.pretrained) and not imported
        else os.path.splitext(os.path.basename(str(args.pretrained)))[0])
    write_scores(out, table.frame, table.meta)
    table.path = out
    if imported:
        print(f"wrote {len(table.frame)} rows to {out} ({table.meta['source']})")
    else:
        rate = (f" ({scoring.format_rate(run.n_computed, run.scoring_seconds)})"
                if run.n_computed else "")
        cache = (f"read {run.n_cached} from the cache {run.cache_path} ({run.cache_status})"
                 if run.cache_path else "cache disabled")
        print(f"wrote {run.n_images} scores to {out} in {run.seconds:.1f} s: computed "
              f"{run.n_computed}{rate}, {cache}")
        for note in run.notes:
            print(f"warning: {note}", file=sys.stderr)
    split = wrapper.AlignmentSplit(dataset, table, envs, rule, data_dir=args.data_dir,
                           verify_data=False)  # the table was just made from these images
    print(split.report())
    if not table.fixed_subsets:
        for env in envs:
            s = split.scores[env]
            print(f"  env {env}: score mean {np.mean(s):.4f}, min {np.min(s):.4f}, "
                  f"max {np.max(s):.4f}")
    for warning in split.warnings():
        print(f"warning: {warning}", file=sys.stderr)
    try:  # the file is still valid for other rules: say now what train will reject
        provenance.check_model(table, args.preset)
    except ValueError as err:
        print(f"warning: train and alignment_eval will reject this file with "
              f"--alignment_preset {args.preset}: {err}", file=sys.stderr)
