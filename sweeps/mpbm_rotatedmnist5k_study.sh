#!/usr/bin/env bash
# MPBM offline single-source study on the built-in RotatedMNIST5k (CPU, no download):
# MPBM vs ERM, plus the paper's two ablations as separate runs (MPBM with mpbm_lambda_mix = 0,
# MPBM with mpbm_lambda_adv = 0), default hparams otherwise, 3 trials.
#
#   PYTHON=.venv/bin/python bash sweeps/mpbm_rotatedmnist5k_study.sh [OUTPUT_DIR]
#
# Each configuration is its own sweep folder (a result table shows one row per algorithm name, so
# two configurations of MPBM need two folders): OUTPUT_DIR/main (ERM and MPBM), OUTPUT_DIR/no_mix,
# OUTPUT_DIR/no_adv. The jobs are exactly those of
#   python -m dg_plugins.scripts.sweep launch --single_source --datasets RotatedMNIST5k \
#       --data_dir builtin --algorithms ERM MPBM --n_hparams 1 --n_trials 3 \
#       --steps $STEPS --checkpoint_freq 50 [--hparams JSON] --output_dir OUTPUT_DIR/<config>
# (same arguments, same md5 job folders) restricted to the source environments in $SOURCES
# (default "0": train on upright digits, test on 15..75 degrees), so that a machine with more time
# completes the other sources by running that sweep command into the same folders.
# Budget on 2 CPU cores: about 20 minutes with the defaults below (MPBM costs ~5-7 ERM steps per
# step after its 100-step warm-up).
set -euo pipefail
PYTHON=${PYTHON:-python}
OUT=${1:-/work/studies/mpbm}
STEPS=${STEPS:-301}
TRIALS=${TRIALS:-3}
SOURCES=${SOURCES:-0}

run_config() {  # run_config <folder> <algorithms,comma-separated> <hparams JSON or "">
    "$PYTHON" - "$OUT/$1" "$2" "$3" "$STEPS" "$TRIALS" "$SOURCES" <<'EOF'
import sys

from dg_plugins.engine import launchers, sweep

out, algorithms, hparams, steps, trials, sources = sys.argv[1:]
args_list = sweep.make_args_list(
    int(trials), ["RotatedMNIST5k"], algorithms.split(","), 0, 1, int(steps), "builtin",
    "domain_generalization", 0.2, False, hparams or None, single_source=True, checkpoint_freq=50)
n_envs = sweep.num_environments("RotatedMNIST5k")
wanted = [[e for e in range(n_envs) if e != int(s)] for s in sources.split()]
jobs = [job for job in sweep.make_jobs([a for a in args_list if a["test_envs"] in wanted], out)
        if job.state != sweep.DONE]
print(f"{out}: {len(jobs)} jobs to run")
if jobs:
    sweep.launch(jobs, launchers.local_launcher)
EOF
}

run_config main "ERM,MPBM" ""
run_config no_mix "MPBM" '{"mpbm_lambda_mix": 0.0}'
run_config no_adv "MPBM" '{"mpbm_lambda_adv": 0.0}'
for config in main no_mix no_adv; do
    echo "== $config"
    "$PYTHON" -m dg_plugins.scripts.collect_results --input_dir "$OUT/$config" \
        --single_source on --format markdown
done
