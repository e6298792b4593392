"""The bridge against a real DomainBed checkout, named by $DOMAINBED_ROOT (skipped otherwise).

DomainBed's own scripts run unchanged in subprocesses through ``python -m
dg_plugins.scripts.domainbed``; the test-only plugins (tests/bridge/plugin_fixture_alg.py) reach
them through ``DG_PLUGINS_IMPORT``. Every DomainBed process imports torch, timm and wilds (~8 s
here), so the end-to-end part is kept to four subprocesses plus one sweep of three short jobs.
"""

import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # plugin_fixture_alg

import dg_plugins.algorithms  # noqa: E402,F401  (registers)
import dg_plugins.datasets  # noqa: E402,F401
from dg_plugins import catalog  # noqa: E402
from dg_plugins.domainbed import bridge  # noqa: E402
from dg_plugins import hparams as dg_hparams  # noqa: E402
from dg_plugins.registry import ALGORITHMS, DATASETS  # noqa: E402
from dg_plugins.seeds import seed_hash  # noqa: E402
from support.helpers import read_records

pytestmark = [
    pytest.mark.skipif(
        not os.environ.get(bridge.DOMAINBED_ROOT_ENV),
        reason=f"{bridge.DOMAINBED_ROOT_ENV} is not set: set it to a DomainBed checkout "
               f"(git clone {bridge.DOMAINBED_URL}) to test the bridge against DomainBed"),
    pytest.mark.filterwarnings("ignore:invalid escape sequence:DeprecationWarning"),  # DomainBed's
]

PLUGIN_MODULE = "plugin_fixture_alg"
TEST_ALGORITHM = "BridgeTestAlg"
TEST_DATASET = "BridgeTestData"
BENCHMARK = "RotatedMNIST5k"
#: Every built-in algorithm of ours that DomainBed lacks (a method joins by registering) + the
#: test one.
PLUGIN_ALGORITHMS = list(dict.fromkeys(
    [n for n in catalog.BUILTIN_ALGORITHMS if n not in catalog.DOMAINBED_ALGORITHMS]
    + [TEST_ALGORITHM]))
SWEEP_HPARAMS = '{"batch_size": 8}'  # Debug-sized environments: DomainBed hangs on bigger batches
TIMEOUT = 900


@pytest.fixture(scope="module")
def db():
    """DomainBed's modules after install() (twice), with the test-only plugins registered."""
    import plugin_fixture_alg

    pythonpath = os.environ.get("PYTHONPATH")
    plugin_fixture_alg.register()
    first = bridge.install()
    report = bridge.install()
    yield SimpleNamespace(first=first, report=report, **bridge.domainbed_modules())
    plugin_fixture_alg.unregister()
    if pythonpath is None:  # install() exported DomainBed's root for child processes
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = pythonpath


def child_env() -> dict:
    """The environment of DomainBed's processes: this venv's python first on PATH (DomainBed's
    own launchers spawn plain `python`), the test plugin importable and imported."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(HERE), env.get("PYTHONPATH")] if p)
    env[bridge.PLUGINS_ENV] = PLUGIN_MODULE
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # leave the DomainBed checkout as it is
    env.setdefault("HF_HUB_OFFLINE", "1")
    return env


def run_entry(*args, cwd) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "dg_plugins.scripts.domainbed", *args],
                          cwd=cwd, env=child_env(), capture_output=True, text=True,
                          timeout=TIMEOUT)
    assert proc.returncode == 0, (
        f"{' '.join(args[:2])} failed ({proc.returncode})\n--- stdout\n{proc.stdout[-3000:]}\n"
        f"--- stderr\n{proc.stderr[-3000:]}")
    return proc


# ------------------------------------------------------------------------------------------------
# In-process: registries, hparams, launchers


def test_install_twice_then_domainbed_finds_ours_and_keeps_its_own(db):
    alg_class, ds_class = db.algorithms.get_algorithm_class, db.datasets.get_dataset_class
    assert alg_class(TEST_ALGORITHM) is ALGORITHMS.get(TEST_ALGORITHM)
    assert db.algorithms.ALGORITHMS.count(TEST_ALGORITHM) == 1
    assert alg_class("ERM").__module__ == "domainbed.algorithms"  # DomainBed's ERM stays
    assert db.algorithms.ALGORITHMS[:34] == catalog.DOMAINBED_ALGORITHMS
    for name in (BENCHMARK, TEST_DATASET):
        assert issubclass(ds_class(name), DATASETS.get(name))
        assert db.datasets.DATASETS.count(name) == 1
        assert db.datasets.num_environments(name) == len(DATASETS.get(name).ENVIRONMENTS)
    for name in ("Debug28", "RotatedMNIST", "PACS"):
        assert ds_class(name).__module__ == "domainbed.datasets"
    assert db.datasets.DATASETS[:18] == list(catalog.DOMAINBED_DATASETS)
    assert "submitit" in db.command_launchers.REGISTRY
    assert db.command_launchers.REGISTRY["local"].__module__ == "domainbed.command_launchers"
    assert db.report.algorithms == db.first.algorithms and db.report.datasets == db.first.datasets
    assert "ERM" in db.report.skipped_algorithms and "ERM" not in db.report.algorithms


def test_hparams_lookup(db):
    hp = db.hparams_registry
    for dataset in ("Debug28", "PACS", BENCHMARK):  # ours, seeded DomainBed's way
        # less the hparams that only dg_plugins' class of the dataset reads (DomainBed's PACS
        # ignores PACS's augmentation and data_split)
        ignored = set(catalog.dataset_hparam_space(dataset)) if dataset == "PACS" else set()
        assert hp.default_hparams(TEST_ALGORITHM, dataset) == {
            k: v for k, v in dg_hparams.default_hparams(TEST_ALGORITHM, dataset).items()
            if k not in ignored}
        seed = seed_hash(3, 1)  # train.py's seed for hparams_seed 3, trial_seed 1
        assert hp.random_hparams(TEST_ALGORITHM, dataset, seed) == {
            k: v for k, v in dg_hparams.random_hparams(TEST_ALGORITHM, dataset, seed).items()
            if k not in ignored}
    original = hp._hparams.dg_plugins_original
    # DomainBed's own algorithms: DomainBed's registry, small-image rules on our small datasets.
    for algorithm in ("ERM", "DANN", "URM"):
        assert hp.random_hparams(algorithm, BENCHMARK, 5) == \
            {k: r for k, (_, r) in original(algorithm, "Debug28", 5).items()}
        assert hp.random_hparams(algorithm, "PACS", 5) == \
            {k: r for k, (_, r) in original(algorithm, "PACS", 5).items()}
    erm = hp.default_hparams("ERM", BENCHMARK)
    assert (erm["lr"], erm["batch_size"], erm["weight_decay"]) == (1e-3, 64, 0.0)


def test_our_in_memory_datasets_load_without_workers_under_domainbed(db):
    """DomainBed's train.py gives every loader ``dataset.N_WORKERS`` processes."""
    for name in (BENCHMARK, TEST_DATASET):
        dataset = db.datasets.get_dataset_class(name)(None, [0], {})
        assert dataset.N_WORKERS == 0, name
    assert db.datasets.get_dataset_class("RotatedMNIST").N_WORKERS == 8  # DomainBed's own stays
    with pytest.raises(ValueError, match="DomainBed's own PACS ignores"):
        bridge.check_script_args("train", ["--dataset", "PACS", "--hparams",
                                           '{"augmentation": "dmg_pacs"}'])


def stray_tensors(algorithm: torch.nn.Module) -> list[str]:
    """Tensors and modules an algorithm holds outside its parameters, buffers and submodules
    (e.g. in a plain attribute or list): ``.to(device)`` and ``state_dict()`` would miss them."""
    found = []

    def visit(value, path, depth=0):
        if isinstance(value, (torch.Tensor, torch.nn.Module)):
            found.append(f"{path} ({type(value).__name__})")
        elif isinstance(value, (list, tuple, set)) and depth < 3:
            for i, item in enumerate(value):
                visit(item, f"{path}[{i}]", depth + 1)
        elif isinstance(value, dict) and depth < 3:
            for key, item in value.items():
                visit(item, f"{path}[{key!r}]", depth + 1)

    for module_name, module in algorithm.named_modules():
        for attr, value in vars(module).items():
            if attr.startswith("_"):  # torch's own bookkeeping (_parameters, _buffers, hooks)
                continue
            visit(value, f"{module_name or type(algorithm).__name__}.{attr}")
    return found


def optimizers_of(algorithm: torch.nn.Module) -> list[torch.optim.Optimizer]:
    return [v for m in algorithm.modules() for v in vars(m).values()
            if isinstance(v, torch.optim.Optimizer)]


def minibatches(dataset, batch_size, envs, device):
    out = []
    for i in envs:
        items = [dataset[i][j] for j in range(batch_size)]
        out.append((torch.stack([x for x, _ in items]).to(device),
                    torch.as_tensor([y for _, y in items]).to(device)))
    return out


@pytest.mark.parametrize("name", PLUGIN_ALGORITHMS)
def test_plugin_algorithm_under_domainbeds_loop(db, name):
    """What DomainBed's train does with an algorithm: build with DomainBed's hparams lookup,
    ``.to(device)``, ``update``, ``predict``, ``state_dict()``; everything must follow ``.to()``."""
    cls = db.algorithms.get_algorithm_class(name)
    if cls is not ALGORITHMS.get(name):
        pytest.skip(f"this DomainBed defines {name} itself; DomainBed's stays authoritative")
    device = "cuda" if torch.cuda.is_available() else "cpu"  # as DomainBed's train chooses
    torch.manual_seed(0)
    dataset = db.datasets.get_dataset_class("Debug28")(None, [2], {})  # DomainBed's own data
    hparams = db.hparams_registry.default_hparams(name, "Debug28")
    hparams.update(batch_size=8, pretrained=False)
    algorithm = cls(dataset.input_shape, dataset.num_classes, 2, hparams)
    algorithm.to(device)
    assert stray_tensors(algorithm) == [], "kept outside parameters/buffers/submodules"
    parameters = {id(p) for p in algorithm.parameters()}
    for optimizer in optimizers_of(algorithm):
        assert all(id(p) in parameters for g in optimizer.param_groups for p in g["params"]), \
            "an optimizer steps tensors that are not the algorithm's parameters"
    batches = minibatches(dataset, 8, [0, 1], device)
    for _ in range(3):
        out = algorithm.update(batches, None)
        assert out and all(type(v) is float for v in out.values()), out
    for optimizer in optimizers_of(algorithm):
        for param, state in optimizer.state.items():
            assert all(v.device == param.device for v in state.values()
                       if isinstance(v, torch.Tensor) and v.dim() > 0)
    algorithm.eval()
    x = batches[0][0]
    with torch.no_grad():
        logits = algorithm.predict(x)
    assert logits.shape == (8, dataset.num_classes)
    restored = cls(dataset.input_shape, dataset.num_classes, 2, hparams)
    restored.load_state_dict(algorithm.state_dict())
    restored.to(device).eval()
    with torch.no_grad():
        assert torch.allclose(restored.predict(x), logits)


# ------------------------------------------------------------------------------------------------
# DomainBed's own scripts through our entry (subprocesses)


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("domainbed_bridge") / "sweep"


@pytest.fixture(scope="module")
def trained(sweep_dir):
    """DomainBed's train: DomainBed's ERM on our offline benchmark, one step."""
    output = sweep_dir / f"ERM_{BENCHMARK}"
    run_entry("train", "--dataset", BENCHMARK, "--algorithm", "ERM", "--test_envs", "0",
              "--steps", "1", "--hparams", SWEEP_HPARAMS, "--output_dir", str(output),
              cwd=sweep_dir.parent)
    return output


@pytest.fixture(scope="module")
def swept(db, sweep_dir):
    """DomainBed's sweep, local launcher: the plugin algorithm on the plugin dataset, hparams
    seed 1 (a random draw), one trial, one test env per job (3 jobs), 3 steps."""
    options = dict(n_trials=1, dataset_names=[TEST_DATASET], algorithms=[TEST_ALGORITHM],
                   n_hparams_from=1, n_hparams=2, steps=3, data_dir=str(sweep_dir.parent / "data"),
                   task="domain_generalization", holdout_fraction=0.2, single_test_envs=True,
                   hparams=SWEEP_HPARAMS)
    proc = run_entry(
        "sweep", "launch", "--datasets", TEST_DATASET, "--algorithms", TEST_ALGORITHM,
        "--data_dir", options["data_dir"], "--output_dir", str(sweep_dir),
        "--command_launcher", "local", "--n_hparams_from", "1", "--n_hparams", "2",
        "--n_trials", "1", "--steps", "3", "--single_test_envs", "--hparams", SWEEP_HPARAMS,
        "--skip_confirmation", cwd=sweep_dir.parent)
    from domainbed.scripts import sweep as domainbed_sweep  # its Job names the folders

    jobs = [domainbed_sweep.Job(args, str(sweep_dir))
            for args in domainbed_sweep.make_args_list(**options)]
    return SimpleNamespace(proc=proc, jobs=jobs)


def test_domainbed_train_runs_erm_on_our_benchmark(trained):
    assert (trained / "done").exists() and (trained / "model.pkl").exists()
    (record,) = read_records(trained)
    assert record["args"]["dataset"] == BENCHMARK and record["args"]["algorithm"] == "ERM"
    assert {f"env{i}_{s}_acc" for i in range(6) for s in ("in", "out")} <= set(record)
    assert record["hparams"]["lr"] == 1e-3  # DomainBed's small-image rule, via the proxy


def test_domainbed_sweep_completes_plugin_algorithm_jobs(swept, sweep_dir):
    assert "Launched 3 jobs!" in swept.proc.stdout
    assert len(swept.jobs) == 3
    expected_draw = dg_hparams.random_hparams(TEST_ALGORITHM, TEST_DATASET, seed_hash(1, 0))
    for job in swept.jobs:  # DomainBed's own folder names (md5 of the job's arguments)
        folder = Path(job.output_dir)
        assert (folder / "done").exists(), (folder / "err.txt").read_text()[-3000:]
        last = read_records(folder)[-1]
        assert last["step"] == 2 and last["args"]["algorithm"] == TEST_ALGORITHM
        assert "domain_loss" in last  # the plugin's own update key
        assert last["hparams"]["bridge_test_scale"] == expected_draw["bridge_test_scale"]
        assert last["hparams"]["lr"] == expected_draw["lr"]


def test_domainbed_collect_results_reports_plugin_rows(trained, swept, sweep_dir):
    proc = run_entry("collect_results", "--input_dir", str(sweep_dir), cwd=sweep_dir.parent)
    lines = proc.stdout.splitlines()

    def row(dataset, algorithm, method="training-domain validation set"):
        """The cells of ``algorithm``'s row in DomainBed's per-dataset table."""
        start = lines.index(f"-------- Dataset: {dataset}, model selection method: {method}")
        for line in lines[start + 2:]:
            cells = re.split(r"\s{2,}", line.strip())
            if cells[0] == algorithm:
                return cells[1:]
        raise AssertionError(f"no {algorithm} row in the {dataset} table:\n{proc.stdout}")

    erm = row(BENCHMARK, "ERM")  # the train job: test env 0 only
    assert erm[0] != "X" and len(erm) == len(DATASETS.get(BENCHMARK).ENVIRONMENTS) + 1
    plugin = row(TEST_DATASET, TEST_ALGORITHM)  # the sweep: every test env, and the average
    assert len(plugin) == 4 and "X" not in plugin, plugin
    assert any(line.split()[:3] == ["Algorithm", BENCHMARK, TEST_DATASET] for line in lines)


def test_domainbeds_own_hparams_tests_include_ours(db, tmp_path):
    """DomainBed's test_hparams_registry, run with our pytest plugin, also covers our algorithms
    and datasets (it expands ALGORITHMS x DATASETS when imported)."""
    pytest.importorskip("parameterized", reason="DomainBed's test modules import 'parameterized' "
                        "(pip install parameterized)")
    test_file = Path(db.algorithms.__file__).parent / "test" / "test_hparams_registry.py"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "-p", "dg_plugins.domainbed.pytest_plugin", str(test_file), "-k", TEST_ALGORITHM],
        cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"{len(db.datasets.DATASETS)} passed" in proc.stdout  # our algorithm x every dataset


def test_the_entry_refuses_dataset_hparams_domainbeds_own_dataset_ignores():
    """``python -m dg_plugins.scripts.domainbed train --dataset PACS --hparams
    '{"augmentation": ...}'`` would train DomainBed's PACS without the asked-for transform: the
    entry stops first with one line naming the hparam and the fix."""
    result = subprocess.run(
        [sys.executable, "-m", "dg_plugins.scripts.domainbed", "train", "--dataset", "PACS",
         "--data_dir", "unused", "--hparams", '{"augmentation": "dmg_pacs"}'],
        capture_output=True, text=True, timeout=TIMEOUT)
    assert result.returncode != 0
    assert "error:" in result.stderr and "augmentation" in result.stderr
    assert "Traceback" not in result.stderr
