"""DomainBed's own collect_results reads a sweep folder written by dg_plugins' train (needs a
DomainBed checkout in DOMAINBED_ROOT, plus wilds, which DomainBed imports)."""

import importlib.util
import os
import subprocess

import pytest

from dg_plugins.domainbed.bridge import unpatched_script_command
from dg_plugins.sweep.jobs import SweepJob, make_args_list

DOMAINBED_ROOT = os.environ.get("DOMAINBED_ROOT")
pytestmark = [
    pytest.mark.skipif(not DOMAINBED_ROOT, reason="DOMAINBED_ROOT is not set (path to a "
                       "DomainBed checkout)"),
    pytest.mark.skipif(importlib.util.find_spec("wilds") is None,
                       reason="DomainBed needs the wilds package (pip install wilds)"),
]


def test_domainbed_collect_results_reads_our_jobs(tmp_path):
    sweep_dir = tmp_path / "sweep"
    jobs = make_args_list(n_trials=1, dataset_names=["Debug28"], algorithms=["ERM"],
                          n_hparams_from=0, n_hparams=1, steps=3, data_dir="unused",
                          task="domain_generalization", holdout_fraction=0.2,
                          single_test_envs=True, hparams='{"batch_size": 8}')
    for train_args in jobs:
        job = SweepJob(train_args, str(sweep_dir))
        subprocess.run(job.command_str, shell=True, check=True, capture_output=True, timeout=300)
        assert os.path.exists(os.path.join(job.output_dir, "done"))
    cmd, env = unpatched_script_command("collect_results", ["--input_dir", str(sweep_dir)],
                                        DOMAINBED_ROOT)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Total records: 6" in proc.stdout  # 3 jobs x records at steps 0 and 2
    lines = proc.stdout.splitlines()
    header = lines.index("-------- Dataset: Debug28, model selection method: training-domain "
                         "validation set")
    erm_row = lines[header + 2]
    assert erm_row.startswith("ERM ") and "X" not in erm_row, proc.stdout
    assert erm_row.count("+/-") == 3, erm_row  # a number for each of the 3 environments
