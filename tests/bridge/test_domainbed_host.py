"""DomainBed's own algorithms on our host (dg_plugins.domainbed.host), against the DomainBed
checkout named by $DOMAINBED_ROOT (skipped otherwise): every class of its ``ALGORITHMS`` (read from
the checkout) trains on Debug28 through our train, on the featurizer our ERM gets, and resumes
exactly, or is refused with its reason; their hparams are DomainBed's registry's plus our network
hparams; DomainBed's CORAL on RotatedMNIST5k builds our ERM's CNN and says so; and a sweep of ERM,
CORAL and DMG gives folders that DomainBed's own collect_results reads as ours does. The
mechanism without a checkout: test_domainbed_host_unit.py."""

import ast
import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import dg_plugins.algorithms  # noqa: F401  (registers)
from dg_plugins import catalog, plugins
from dg_plugins.domainbed import bridge
from dg_plugins.domainbed import host as domainbed_host
from dg_plugins import hparams as dg_hparams
from dg_plugins import networks as dg_networks
from dg_plugins.registry import ALGORITHMS, UnavailableError
from dg_plugins.scripts.train import main
from dg_plugins.seeds import seed_hash
from support.helpers import VOLATILE_KEYS, read_records
from support.job_gate import gate_env, released, wait_at_gate
from support.processes import command_env, module_command, start

ROOT = os.environ.get(bridge.DOMAINBED_ROOT_ENV)
pytestmark = [
    pytest.mark.skipif(
        not ROOT, reason=f"{bridge.DOMAINBED_ROOT_ENV} is not set: set it to a DomainBed "
        f"checkout (git clone {bridge.DOMAINBED_URL}) to run DomainBed's algorithms on our host"),
    pytest.mark.filterwarnings("ignore:invalid escape sequence:DeprecationWarning"),  # DomainBed's
]
TINY = '{"batch_size": 4}'
TIMEOUT = 600


def checkout_algorithms() -> list[str]:
    """``ALGORITHMS`` of the checkout's ``domainbed/algorithms.py``, read without importing it."""
    if not ROOT:
        return []
    tree = ast.parse(Path(ROOT, "domainbed", "algorithms.py").read_text())
    return next(ast.literal_eval(node.value) for node in tree.body
                if isinstance(node, ast.Assign)
                and any(getattr(t, "id", None) == "ALGORITHMS" for t in node.targets))


def refusal(name: str) -> str | None:
    """Why our host refuses DomainBed's ``name`` on this machine (None: it runs)."""
    if name == "Fishr" and importlib.util.find_spec("backpack") is None:
        return ("Fishr (DomainBed's) needs the package 'backpack', which DomainBed could not "
                "import: pip install backpack-for-pytorch")
    if name == "Fishr" and domainbed_host.backpack_problem():
        return "Fishr (DomainBed's) cannot run here: backpack-for-pytorch"
    if name in ("TRM", "RDM") and not torch.cuda.is_available():
        return f"{name} runs only on a CUDA device: DomainBed's code for it calls .cuda()"
    return None


@pytest.fixture(scope="module", autouse=True)
def host():
    pythonpath = os.environ.get("PYTHONPATH")
    plugins.load()
    yield
    if pythonpath is None:  # the loader exported DomainBed's root for child processes
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = pythonpath


#: hparams that make a class change its state within 4 steps (after the cut at step 0): a penalty
#: switched on or a new optimizer at update 2, ERM++'s linear phase ending, a discriminator
#: stepping every other update.
STATE_SWITCHES = {
    "ERMPlusPlus": {"linear_steps": 2},
    "IRM": {"irm_penalty_anneal_iters": 2},
    "VREx": {"vrex_penalty_anneal_iters": 2},
    "RDM": {"rdm_penalty_anneal_iters": 2},
    "IB_ERM": {"ib_penalty_anneal_iters": 2},
    "IB_IRM": {"irm_penalty_anneal_iters": 2, "ib_penalty_anneal_iters": 2},
    "Fishr": {"penalty_anneal_iters": 2},
    "EQRM": {"eqrm_burnin_iters": 2},
    "TRM": {"iters": 2},
    "Transfer": {"d_steps_per_g": 2},
    "DANN": {"d_steps_per_g_step": 2},
    "CDANN": {"d_steps_per_g_step": 2},
}


@pytest.mark.parametrize("name", checkout_algorithms())
def test_every_domainbed_algorithm_trains_and_resumes_exactly_on_our_host(name, tmp_path, capsys):
    """Four steps (updates), three records (predict on every split), done; a job stopped at its
    first checkpoint and resumed writes the same records (its buffers, e.g. GroupDRO's ``q``
    made at the first update, counters, moving averages, late networks and optimizers put back);
    or refused up front with the reason and fix in one line, nothing written."""
    from dg_plugins.train import run as train_run
    from dg_plugins.train.cli import build_parser

    hparams = json.dumps({"batch_size": 4, **STATE_SWITCHES.get(name, {})})
    argv = ["--dataset", "Debug28", "--algorithm", f"DomainBed:{name}", "--steps", "4",
            "--checkpoint_freq", "2", "--hparams", hparams]
    full, cut = tmp_path / "full", tmp_path / "cut"
    code = main([*argv, "--output_dir", str(full)])
    out, err = capsys.readouterr()
    if refusal(name):
        assert code == 2 and f"error: {refusal(name)}" in err and not full.exists(), err
        return
    assert code == 0, err
    records = read_records(full)
    canonical = "DomainBed:ERM" if name == "ERM" else name
    # on our featurizer (the one our ERM gets; ARM's takes its context channel too), or on
    # DomainBed's where its code refuses ours (URM asserts DomainBed's types), said in out.txt,
    # and noted on stderr (err.txt) when it is DomainBed's
    if name == "URM":
        line = f"note: Network: {canonical} (DomainBed's) on DomainBed's featurizer MNIST_CNN"
        assert line in out and line in (full / "err.txt").read_text(), out
    else:
        assert f"Network: {canonical} (DomainBed's) on dg_plugins' " in out, out
    shape = (4, 28, 28) if name == "ARM" else (3, 28, 28)
    hparams_of_ours = dg_hparams.job_hparams("ERM", "Debug28", 0, 0)
    assert records[-1][domainbed_host.FEATURIZER_PARAMS_KEY] == sum(
        p.numel() for p in dg_networks.Featurizer(shape, hparams_of_ours).parameters())
    assert [r["step"] for r in records] == [0, 2, 3]
    assert records[0]["args"]["algorithm"] == canonical
    assert all(0 <= records[-1][f"env{i}_{split}_acc"] <= 1
               for i in range(3) for split in ("in", "out"))
    assert (full / "done").exists() and (full / "model.pkl").exists()
    assert ALGORITHMS.get(canonical).DOMAINBED_NAME == name

    def args(*extra):
        return build_parser().parse_args([*argv, "--output_dir", str(cut), *extra])

    assert train_run.run(args(), stop_after_step=0) == "stopped"
    assert len(read_records(cut)) == 1
    assert train_run.run(args("--resume")) == "done", capsys.readouterr().err[-2000:]
    assert read_records(cut, drop=VOLATILE_KEYS) == read_records(full, drop=VOLATILE_KEYS)


@pytest.mark.parametrize("dataset", ["Debug28", "PACS", "RotatedMNIST5k"])
def test_hparams_are_domainbeds_as_domainbed_seeds_them(dataset):
    """For every DomainBed algorithm: the defaults and a random draw of its train.py
    (``random_hparams(name, dataset, seed_hash(hparams_seed, trial_seed))``), plus those of our
    featurizer (which they run on) at our defaults for the dataset; our small-image dataset
    DomainBed lacks gets Debug28's rules; our own ERM keeps ours."""
    hparams_registry = bridge.domainbed_module("hparams_registry")
    asked = "Debug28" if dataset == "RotatedMNIST5k" else dataset
    # and the hparams our class of the dataset reads (PACS: augmentation, data_split), at their
    # defaults
    read = {name: entry[0] for name, entry in catalog.dataset_hparam_space(dataset).items()}
    # and those of our featurizer, which they run on, at our defaults for the dataset
    # (RotatedMNIST5k's narrower CNN)
    network = {name: dg_hparams.base_space(dataset)[name][0]
               for name in domainbed_host.NETWORK_HPARAMS}
    assert network["mnist_cnn_width"] == (32 if dataset == "RotatedMNIST5k" else 128)
    for name in checkout_algorithms():
        try:
            canonical = ALGORITHMS.resolve(f"DomainBed:{name}")
        except UnavailableError:  # Fishr without backpack
            continue
        assert dg_hparams.job_hparams(canonical, dataset, 0, 0) == {
            **hparams_registry.default_hparams(name, asked), **network, **read}, name
        domainbeds = hparams_registry.random_hparams(name, asked, seed_hash(3, 1))
        assert dg_hparams.job_hparams(canonical, dataset, 3, 1) == {
            **{k: v.item() if hasattr(v, "item") else v for k, v in domainbeds.items()},
            **network, **read}, name
    assert "backbone" in dg_hparams.job_hparams("ERM", dataset, 0, 0)


def test_groupdro_killed_then_resumed_by_the_command_writes_the_uninterrupted_records(tmp_path):
    """The issue's command: DomainBed's GroupDRO killed (-9) after its checkpoint of step 2,
    then ``--resume``: exit 0, the records of an uninterrupted run (its ``q``, made at the
    first update, was a size mismatch that exited 2)."""
    common = ["--dataset", "Debug28", "--algorithm", "GroupDRO", "--steps", "6",
              "--checkpoint_freq", "2", "--hparams", TINY]
    full, cut, gate = tmp_path / "full", tmp_path / "cut", tmp_path / "gate"
    gate.mkdir()
    assert main([*common, "--output_dir", str(full)]) == 0
    job = start("dg_plugins.scripts.train", *common, "--output_dir", cut,
                env=gate_env(gate, step=3))
    with released(gate):
        wait_at_gate(gate, job, TIMEOUT)
        job.send_signal(signal.SIGKILL)
        job.communicate(timeout=60)
    assert len(read_records(cut)) == 2 and not (cut / "done").exists()
    resumed = subprocess.run(module_command("dg_plugins.scripts.train", *common, "--output_dir",
                                            cut, "--resume"),
                             env=command_env(), capture_output=True, text=True, timeout=TIMEOUT)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Resuming from step 3 (2 records kept)" in resumed.stdout
    assert read_records(cut, drop=VOLATILE_KEYS) == read_records(full, drop=VOLATILE_KEYS)


def test_coral_trains_on_the_featurizer_our_erm_gets_and_says_so(tmp_path):
    """What a user ran: DomainBed's CORAL beside our ERM on RotatedMNIST5k. A real train job
    builds the CNN our ERM builds there (mnist_cnn_width 32; DomainBed's own Featurizer is 15x
    larger), says which in out.txt and records its parameter count."""
    out = tmp_path / "coral"
    job = subprocess.run(module_command(
        "dg_plugins.scripts.train", "--dataset", "RotatedMNIST5k", "--algorithm", "coral",
        "--steps", "1", "--test_envs", "0", "--hparams", TINY, "--output_dir", out),
        env=command_env(), capture_output=True, text=True, timeout=TIMEOUT)
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    hparams = dg_hparams.job_hparams("ERM", "RotatedMNIST5k", 0, 0)
    our_erm = ALGORITHMS.get("ERM")((1, 28, 28), 10, 5, hparams)
    ours = sum(p.numel() for p in our_erm.featurizer.parameters())
    domainbeds = sum(p.numel() for p in bridge.domainbed_module("networks").Featurizer(
        (1, 28, 28), hparams).parameters())
    assert domainbeds > 10 * ours  # what the user's sweep compared
    record = read_records(out)[-1]
    assert record[domainbed_host.FEATURIZER_PARAMS_KEY] == ours
    assert record["hparams"]["mnist_cnn_width"] == hparams["mnist_cnn_width"] == 32
    line = (f"Network: CORAL (DomainBed's) on dg_plugins' featurizer MNIST_CNN (backbone "
            f"mnist_cnn, {ours:,} parameters), as dg_plugins' own algorithms get it")
    assert line in job.stdout and line in (out / "out.txt").read_text()


def test_a_sweep_of_erm_coral_and_dmg_is_read_by_domainbeds_collect_results(tmp_path):
    """``--algorithms ERM coral DMG``: DomainBed's CORAL beside our ERM and DMG in one sweep;
    DomainBed's own collect_results prints the same tables as ours, one row each."""
    out = tmp_path / "sweep"
    env = command_env(OMP_NUM_THREADS="1")
    sweep = subprocess.run(module_command(
        "dg_plugins.scripts.sweep", "launch", "--data_dir", tmp_path / "data", "--datasets",
        "Debug28", "--algorithms", "ERM", "coral", "DMG", "--test_env_sets", "0", "--n_hparams",
        "1", "--n_trials", "1", "--steps", "3", "--checkpoint_freq", "2", "--hparams", TINY,
        "--output_dir", out, "--command_launcher", "local", "--skip_confirmation"),
        env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert sweep.returncode == 0, sweep.stdout[-3000:] + sweep.stderr[-3000:]
    assert "note: --algorithms coral: using 'CORAL'" in sweep.stderr
    ours = subprocess.run(module_command("dg_plugins.scripts.collect_results", "--input_dir",
                                         out, "--all_columns"),  # DomainBed's layout
                          env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert ours.returncode == 0, ours.stderr
    lines = ours.stdout.splitlines()
    first = lines.index(next(line for line in lines if line.startswith("Algorithm")))
    assert [line.split()[0] for line in lines[first + 1:first + 4]] == ["ERM", "CORAL", "DMG"]
    if importlib.util.find_spec("wilds") is None:
        pytest.skip("DomainBed's collect_results imports wilds (pip install wilds)")
    command, db_env = bridge.unpatched_script_command("collect_results",
                                                      ["--input_dir", str(out)], ROOT)
    domainbeds = subprocess.run(command, env={**env, **db_env, "OMP_NUM_THREADS": "1"},
                                capture_output=True, text=True, timeout=TIMEOUT)
    assert domainbeds.returncode == 0, domainbeds.stderr[-3000:]
    assert domainbeds.stdout == ours.stdout
