"""Launch (or dry-run) a single-source sweep restricted to some source environments.

``python -m dg_plugins.scripts.sweep launch --single_source`` makes one job per source
environment. Single-source DG benchmarks often train on one fixed source (Digits: MNIST), or a
budget allows only some sources. This helper builds exactly the sweep's jobs (same train args,
same md5 job folders, so ``collect_results`` and a later full ``sweep launch --single_source``
into the same folder treat them as the sweep's own) and keeps those whose source is in
``--sources``::

    python sweeps/mpbm_sources.py --dataset Digits --data_dir /data --sources 0 \
        --algorithms ERM MPBM --n_trials 3 --output_dir out/digits [--hparams JSON] \
        [--steps N] [--checkpoint_freq K] [--command_launcher local] [--dry_run]
"""

from __future__ import annotations

import argparse
import sys

from dg_plugins.engine import launchers, sweep
from dg_plugins.registry import LAUNCHERS


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", required=True)
    p.add_argument("--data_dir", required=True)
    p.add_argument("--algorithms", nargs="+", required=True)
    p.add_argument("--sources", nargs="+", type=int, required=True,
                   help="source environment indices to train on (one job set per source)")
    p.add_argument("--output_dir", required=True)
    p.add_argument("--n_trials", type=int, default=3)
    p.add_argument("--n_hparams_from", type=int, default=0)
    p.add_argument("--n_hparams", type=int, default=1)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--checkpoint_freq", type=int, default=None)
    p.add_argument("--holdout_fraction", type=float, default=0.2)
    p.add_argument("--hparams", default=None)
    p.add_argument("--command_launcher", default="local")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dry_run", action="store_true")
    args = p.parse_args(argv)

    sweep.check_algorithms(args.algorithms)
    sweep.check_hparams(args.hparams, args.algorithms, [args.dataset])
    n_envs = sweep.num_environments(args.dataset)
    bad = [s for s in args.sources if not 0 <= s < n_envs]
    if bad:
        p.error(f"--sources {bad}: {args.dataset} has environments 0..{n_envs - 1}")
    args_list = sweep.make_args_list(
        args.n_trials, [args.dataset], args.algorithms, args.n_hparams_from, args.n_hparams,
        args.steps, args.data_dir, "domain_generalization", args.holdout_fraction, False,
        args.hparams, single_source=True, checkpoint_freq=args.checkpoint_freq)
    wanted = [[e for e in range(n_envs) if e != s] for s in args.sources]
    jobs = sweep.make_jobs([a for a in args_list if a["test_envs"] in wanted], args.output_dir)
    print(sweep.summary_line(jobs))
    todo = [job for job in jobs if job.state != sweep.DONE]
    if args.dry_run:
        for job in todo:
            print(f"{job.state}: {job.command(resume=job.state == sweep.INCOMPLETE)}")
        return 0
    if todo:
        sweep.launch(todo, LAUNCHERS.get(args.command_launcher), seed=args.seed)
    return 0


if __name__ == "__main__":
    assert launchers  # registers the launchers
    sys.exit(main())
