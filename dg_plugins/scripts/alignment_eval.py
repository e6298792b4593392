"""``python -m dg_plugins.scripts.alignment_eval --alignment_scores F JOB_DIR ...``: IP/OOP
accuracy of trained models without retraining (:mod:`dg_plugins.alignment.reevaluate`), the keys
train writes printed or added to the job's records. Models are read with
``torch.load(weights_only=False)``: only run it on your own files."""

from __future__ import annotations

import argparse
import sys

from dg_plugins.help_text import CommandParser
from dg_plugins.job import flags as job_flags


def build_parser() -> argparse.ArgumentParser:
    p = CommandParser(prog="python -m dg_plugins.scripts.alignment_eval",
                      description="IP/OOP accuracy of trained models (no retraining).")
    p.add_argument("jobs", nargs="+", help="train output folders (holding model.pkl)")
    p.add_argument("--alignment_scores", required=True, help="score file (alignment_scores)")
    job_flags.add_flags(p, "alignment", skip=("alignment_scores",))
    p.add_argument("--model", default=None,
                   help="model file to score instead of <job>/model.pkl (one job only)")
    p.add_argument("--data_dir", default=None, help="data folder (default: the job's)")
    p.add_argument("--device", default=None)
    p.add_argument("--n_workers", type=int, default=None, help="loader workers for evaluation")
    p.add_argument("--update_records", action="store_true",
                   help="add the keys to the job's records that a saved model can score")
    p.add_argument("--overwrite", action="store_true",
                   help="with --update_records: replace differing IP/OOP keys already there")
    p.add_argument("--acc_tolerance", type=float, default=0.0,
                   help="allowed difference between a record's accuracies and the re-evaluated "
                   "ones (default 0)")
    p.add_argument("--out", default=None, help="append one JSON line of keys per model here")
    p.add_argument("--predictions", default=None,
                   help="write per-image predictions of the scored models (CSV)")
    p.add_argument("--import", dest="plugins", nargs="*", default=[],
                   help="plugin modules registering algorithms or datasets")
    return p


def rebuild(job_dir: str, saved: dict, options, rule: dict):
    """The job's data and train's evaluation under the job's compute settings."""
    from dg_plugins.alignment import reevaluate
    from dg_plugins.runtime import pick_device
    from dg_plugins.train.compute import Compute
    from dg_plugins.train.evaluate import eval_batches, eval_seed, evaluate
    from dg_plugins.train.loop import build_job_data
    from dg_plugins.train.splits import env_indices

    args = argparse.Namespace(**reevaluate.job_args(saved["args"], options.data_dir, rule))
    device = pick_device(options.device)
    compute = Compute.of(args)  # once per job, as train builds it
    data = build_job_data(args, dict(saved["model_hparams"]), options.n_workers, compute)

    def evaluate_model(algorithm) -> dict:
        with compute.active(device):
            return evaluate(algorithm, data.splits, device, num_workers=data.workers,
                            compute=compute)

    def batches(name, split):
        return eval_batches(split, reevaluate.PREDICTION_BATCH, data.workers, eval_seed(name))

    return reevaluate.RebuiltJob(job_dir, args, data.dataset, data.splits, device,
                                 (args.steps or data.dataset.N_STEPS) - 1, evaluate_model,
                                 batches, env_indices)


def main(argv=None) -> int:
    options = build_parser().parse_args(argv)
    from dg_plugins import plugins as plugins_lib
    from dg_plugins.alignment import reevaluate
    from dg_plugins.train.run import user_errors

    rule = {flag: getattr(options, flag) for flag in job_flags.ALIGNMENT_ARGS}
    try:
        if options.model and len(options.jobs) != 1:
            raise ValueError("--model names one model file: give one job folder")
        if options.model and options.update_records:
            raise ValueError("--update_records uses the job's own model files; leave out --model")
        plugins_lib.load(options.plugins)
        reevaluate.reevaluate_jobs(
            options.jobs, lambda job, saved: rebuild(job, saved, options, rule),
            reevaluate.JobFiles(), rule, model=options.model, out=options.out,
            predictions_file=options.predictions, update=options.update_records,
            overwrite=options.overwrite, tolerance=options.acc_tolerance)
    except user_errors() as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
