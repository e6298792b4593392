"""The bridge's registration logic against minimal DomainBed-like module objects built here
(no DomainBed needed). The real checkout is exercised in test_bridge_domainbed.py."""

import shlex
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # plugin_fixture_alg

import dg_plugins.algorithms  # noqa: E402,F401  (registers)
import dg_plugins.datasets  # noqa: E402  (registers)
import dg_plugins.sweep.launchers  # noqa: E402,F401
from dg_plugins.domainbed import bridge  # noqa: E402
from dg_plugins import hparams as dg_hparams  # noqa: E402
from dg_plugins.registry import ALGORITHMS, DATASETS, LAUNCHERS  # noqa: E402
from dg_plugins.scripts import domainbed as entry  # noqa: E402


def _module(name: str, source: str) -> ModuleType:
    module = ModuleType(name)
    exec(textwrap.dedent(source), module.__dict__)
    return module


def make_domainbed_like():
    """Four tiny modules shaped like the parts of DomainBed the bridge patches: a name lookup in
    module globals, a names list, an ``_hparams`` table looked up at call time, a launcher dict."""
    algorithms = _module("fake.algorithms", """
        ALGORITHMS = ["ERM"]

        class ERM:
            pass

        def helper():
            pass

        def get_algorithm_class(name):
            if name not in globals():
                raise NotImplementedError(name)
            return globals()[name]
    """)
    datasets = _module("fake.datasets", """
        DATASETS = ["Debug28", "PACS"]

        class Debug28:
            ENVIRONMENTS = ["0", "1", "2"]

        class PACS:
            ENVIRONMENTS = ["A", "C", "P", "S"]

        def get_dataset_class(name):
            if name not in globals():
                raise NotImplementedError(name)
            return globals()[name]
    """)
    hparams_registry = _module("fake.hparams_registry", """
        CALLS = []

        def _hparams(algorithm, dataset, random_seed):
            CALLS.append((algorithm, dataset, random_seed))
            small = dataset in ("Debug28",)
            return {"lr": (1e-3 if small else 5e-5, random_seed), "origin": ("fake", "fake")}

        def default_hparams(algorithm, dataset):
            return {k: d for k, (d, r) in _hparams(algorithm, dataset, 0).items()}

        def random_hparams(algorithm, dataset, seed):
            return {k: r for k, (d, r) in _hparams(algorithm, dataset, seed).items()}
    """)
    launchers = _module("fake.command_launchers", """
        LAUNCHED = []

        def local(commands):
            LAUNCHED.extend(commands)

        REGISTRY = {"local": local}
    """)
    return algorithms, datasets, hparams_registry, launchers


@pytest.fixture
def plugin():
    """BridgeTestAlg / BridgeTestData in our registries for one test, plus a recording launcher."""
    import plugin_fixture_alg

    plugin_fixture_alg.register()
    recorded = []
    LAUNCHERS.register("bridge_test_recorder", recorded.extend)
    yield plugin_fixture_alg, recorded
    plugin_fixture_alg.unregister()
    LAUNCHERS.unregister("bridge_test_recorder")


@pytest.fixture
def fake():
    modules = make_domainbed_like()
    bridge.install_into(*modules)
    report = bridge.install_into(*modules)  # twice: idempotent
    return modules, report


def test_installs_missing_names_once_and_never_shadows(plugin, fake):
    (algorithms, datasets, _, launchers), report = fake
    alg, _ = plugin
    assert algorithms.get_algorithm_class("BridgeTestAlg") is alg.BridgeTestAlg
    # DomainBed's own list first, then every registered algorithm DomainBed lacks, once each
    assert algorithms.ALGORITHMS == ["ERM"] + [n for n in ALGORITHMS.list() if n != "ERM"]
    assert "BridgeTestAlg" in algorithms.ALGORITHMS
    assert algorithms.get_algorithm_class("ERM") is not ALGORITHMS.get("ERM")  # the host's stays
    assert "ERM" in report.skipped_algorithms and "ERM" not in report.algorithms
    assert datasets.get_dataset_class("Debug28") is not DATASETS.get("Debug28")
    assert datasets.DATASETS[:2] == ["Debug28", "PACS"]
    for name in ("RotatedMNIST5k", "BridgeTestData"):
        assert datasets.DATASETS.count(name) == 1
        assert issubclass(datasets.get_dataset_class(name), DATASETS.get(name))
    assert set(report.skipped_datasets) == {"Debug28", "PACS"}
    # Datasets without fixed environments (discovered from data) are not offered to DomainBed.
    assert all(getattr(DATASETS.get(n), "ENVIRONMENTS", None) for n in datasets.DATASETS[2:])


def test_in_memory_datasets_declare_no_loader_workers():
    """DomainBed's train starts dataset.N_WORKERS loader processes per split: dg_plugins'
    in-memory datasets say 0 themselves (RotatedMNIST5k said DomainBed's default 8)."""
    in_memory = [n for n in DATASETS.list() if getattr(DATASETS.get(n), "IN_MEMORY", False)]
    assert {"RotatedMNIST5k", "RotatedMNIST", "ColoredMNIST", "Debug28", "Digits",
            "DigitsOffline"} <= set(in_memory)
    assert {n: DATASETS.get(n).N_WORKERS for n in in_memory} == {n: 0 for n in in_memory}
    assert DATASETS.get("PACS").N_WORKERS == 8  # image folders keep their workers


class _TensorData(dg_plugins.datasets.MultipleDomainDataset):
    """A plugin's in-memory dataset that leaves IN_MEMORY and N_WORKERS at their defaults."""

    ENVIRONMENTS = ["a", "b"]

    def __init__(self, root, test_envs, hparams):
        import torch

        self.datasets = [torch.utils.data.TensorDataset(torch.zeros(4, 1, 8, 8),
                                                        torch.zeros(4, dtype=torch.long))
                         for _ in self.ENVIRONMENTS]
        self.input_shape, self.num_classes = (1, 8, 8), 2


class _MarkedData(_TensorData):
    IN_MEMORY = True  # says so, but keeps N_WORKERS 8


class _FileData(_TensorData):
    """Environments that are not tensors (e.g. files read lazily): workers stay."""

    def __init__(self, root, test_envs, hparams):
        super().__init__(root, test_envs, hparams)
        self.datasets = [list(env) for env in self.datasets]


def test_plugin_datasets_in_memory_get_no_loader_workers_under_domainbed():
    (_, datasets, _, _) = make_domainbed_like()
    entries = {"DgTestTensorData": _TensorData, "DgTestMarkedData": _MarkedData,
               "DgTestFileData": _FileData, "RotatedMNIST5k": DATASETS.get("RotatedMNIST5k")}
    installed, _ = bridge.register_datasets(datasets, entries)
    assert sorted(installed) == sorted(entries)
    get = datasets.get_dataset_class
    assert get("RotatedMNIST5k") is DATASETS.get("RotatedMNIST5k")  # already 0: no view
    assert get("DgTestMarkedData").N_WORKERS == 0 and _MarkedData.N_WORKERS == 8
    tensors = get("DgTestTensorData")
    assert tensors.__name__ == "_TensorData" and issubclass(tensors, _TensorData)
    assert tensors.N_WORKERS == 8 and tensors(None, [0], {}).N_WORKERS == 0  # found in memory
    assert get("DgTestFileData")(None, [0], {}).N_WORKERS == 8
    assert bridge.domainbed_view(_TensorData) is tensors  # one view per class: idempotent


def test_hparams_ours_for_our_algorithms_hosts_otherwise(plugin, fake):
    (_, _, hp, _), _ = fake
    assert hp._hparams.dg_plugins_original.__module__ == "fake.hparams_registry"  # wrapped once
    for dataset in ("Debug28", "RotatedMNIST5k"):
        assert hp.default_hparams("BridgeTestAlg", dataset) == \
            dg_hparams.default_hparams("BridgeTestAlg", dataset)
        assert hp.random_hparams("BridgeTestAlg", dataset, 123) == \
            dg_hparams.random_hparams("BridgeTestAlg", dataset, 123)
    # DomainBed's own PACS does not read dg_plugins' PACS hparams: they are not offered there
    ours = dg_hparams.default_hparams("BridgeTestAlg", "PACS")
    assert {"augmentation", "data_split", "image_size"} <= set(ours)
    assert hp.default_hparams("BridgeTestAlg", "PACS") == {
        k: v for k, v in ours.items() if k not in ("augmentation", "data_split", "image_size")}
    hp.CALLS.clear()
    assert hp.default_hparams("ERM", "RotatedMNIST5k")["lr"] == 1e-3  # small-image rule via proxy
    assert hp.default_hparams("ERM", "BridgeTestData")["lr"] == 5e-5  # not small: its own name
    assert hp.random_hparams("ERM", "PACS", 7) == {"lr": 7, "origin": "fake"}
    assert hp.CALLS == [("ERM", bridge.SMALL_IMAGE_PROXY, 0), ("ERM", "BridgeTestData", 0),
                        ("ERM", "PACS", 7)]


def test_launchers_added_under_new_names_and_rewrite(plugin, fake, monkeypatch):
    (_, _, _, launchers), report = fake
    _, recorded = plugin
    monkeypatch.delenv(bridge.PLUGINS_ENV, raising=False)
    assert "submitit" in report.launchers and "bridge_test_recorder" in report.launchers
    assert "local" in report.skipped_launchers
    assert launchers.REGISTRY["local"] is launchers.local  # the host's own, untouched by install
    launchers.REGISTRY["bridge_test_recorder"](["python -m domainbed.scripts.train --x 1"])
    assert recorded == [f"{shlex.quote(sys.executable)} -m dg_plugins.scripts.domainbed train --x 1"]


def test_route_launchers_through_entry_wraps_every_launcher_once(fake, monkeypatch):
    (_, _, _, launchers), _ = fake
    monkeypatch.setenv(bridge.PLUGINS_ENV, "my_plugins,other")
    bridge.route_launchers_through_entry(launchers)
    bridge.route_launchers_through_entry(launchers)  # no double wrapping
    launchers.REGISTRY["local"](["python -m domainbed.scripts.train --test_envs 0 1"])
    assert launchers.LAUNCHED == [
        f"{shlex.quote(sys.executable)} -m dg_plugins.scripts.domainbed --import my_plugins,other "
        "train --test_envs 0 1"]


@pytest.mark.parametrize("command, expected", [
    ("python -m domainbed.scripts.train --a 'b c'", "PY -m dg_plugins.scripts.domainbed train --a 'b c'"),
    ("CUDA_VISIBLE_DEVICES=0 python -m domainbed.scripts.train", "CUDA_VISIBLE_DEVICES=0 PY -m "
                                                                 "dg_plugins.scripts.domainbed train"),
    ("python -m domainbed.scripts.sweep launch", "python -m domainbed.scripts.sweep launch"),
    ("echo mypython -m domainbed.scripts.train", "echo mypython -m domainbed.scripts.train"),
])
def test_rewrite_command(command, expected):
    assert bridge.rewrite_command(command, python="PY", plugins=[]) == expected


def test_rewrite_quotes_the_interpreter():
    out = bridge.rewrite_command("python -m domainbed.scripts.train", python="/a b/python",
                                 plugins=["m"])
    assert shlex.split(out) == ["/a b/python", "-m", "dg_plugins.scripts.domainbed", "--import", "m",
                                "train"]


def test_name_clash_with_a_non_algorithm_global_warns_and_skips(fake):
    (algorithms, _, _, _), _ = fake

    class helper:  # noqa: N801  (the clashing name)
        pass

    ALGORITHMS.register("helper", helper)
    try:
        with pytest.warns(UserWarning, match="already defines 'helper'"):
            installed, skipped = bridge.register_algorithms(algorithms)
    finally:
        ALGORITHMS.unregister("helper")
    assert skipped.count("helper") == 1 and algorithms.helper is not helper


def test_reregistered_class_replaces_our_previous_install(fake):
    (algorithms, _, _, _), _ = fake

    class First:
        pass

    class Second:
        pass

    try:
        ALGORITHMS.register("BridgeSwap", First)
        bridge.register_algorithms(algorithms)
        ALGORITHMS.unregister("BridgeSwap")
        ALGORITHMS.register("BridgeSwap", Second)
        bridge.register_algorithms(algorithms)
    finally:
        ALGORITHMS.unregister("BridgeSwap")
    assert algorithms.get_algorithm_class("BridgeSwap") is Second
    assert algorithms.ALGORITHMS.count("BridgeSwap") == 1


@pytest.fixture
def no_domainbed(monkeypatch):
    monkeypatch.setitem(sys.modules, "domainbed", None)  # makes `import domainbed` fail
    monkeypatch.delenv(bridge.DOMAINBED_ROOT_ENV, raising=False)
    monkeypatch.delenv(bridge.PLUGINS_ENV, raising=False)


def test_missing_domainbed_error_names_domainbed_root(no_domainbed):
    with pytest.raises(ImportError, match="DOMAINBED_ROOT") as info:
        bridge.install()
    assert "git clone https://github.com/facebookresearch/DomainBed" in str(info.value)


def test_bad_domainbed_root_is_named(no_domainbed, monkeypatch, tmp_path):
    monkeypatch.setenv(bridge.DOMAINBED_ROOT_ENV, str(tmp_path))
    with pytest.raises(ImportError, match="is not a DomainBed checkout"):
        bridge.install()


def test_entry_exits_with_the_message(no_domainbed):
    with pytest.raises(SystemExit, match="DOMAINBED_ROOT"):
        entry.main(["info"])


def test_entry_parses_imports_then_script_then_its_args():
    args = entry.build_parser().parse_args(
        ["--import", "a,b", "--import", "c", "train", "--help", "--import", "z"])
    assert args.plugins == ["a,b", "c"] and args.script == "train"
    assert args.args == ["--help", "--import", "z"]  # the script's own, untouched


def test_unknown_plugin_module_is_named(monkeypatch):
    monkeypatch.setenv(bridge.PLUGINS_ENV, "no_such_plugin_module_xyz")
    with pytest.raises(ImportError, match="no_such_plugin_module_xyz.*DG_PLUGINS_IMPORT"):
        bridge.import_plugins()


def test_add_plugin_modules_merges_into_the_environment(monkeypatch):
    monkeypatch.setenv(bridge.PLUGINS_ENV, "a")
    assert bridge.add_plugin_modules(["b", "a", ""]) == ["a", "b"]
    assert bridge.plugin_modules_from_env() == ["a", "b"]


def test_a_non_package_named_domainbed_is_refused(monkeypatch):
    impostor = ModuleType("domainbed")
    impostor.__file__ = "/somewhere/domainbed.py"
    monkeypatch.setitem(sys.modules, "domainbed", impostor)
    with pytest.raises(bridge.DomainBedImportError, match="not DomainBed's package"):
        bridge.locate_domainbed()


def test_hparams_that_domainbeds_own_dataset_ignores_are_refused(plugin, fake):
    (_, datasets, _, _), _ = fake
    with pytest.raises(ValueError, match=r"--hparams sets 'augmentation', 'data_split', which "
                                         r"DomainBed's own PACS ignores .*python -m "
                                         r"dg_plugins.scripts.train"):
        bridge.check_script_args("train", [
            "--dataset", "PACS", "--algorithm", "ERM", "--hparams",
            '{"augmentation": "dmg_pacs", "data_split": "official", "lr": 0.001}'], datasets)
    sweep_hparams = ["--hparams", '{"augmentation": "dmg_pacs"}']
    with pytest.raises(ValueError, match=r"'augmentation', which DomainBed's own PACS ignores "
                                         r".*dg_plugins.scripts.sweep"):
        bridge.check_script_args("sweep", ["launch", "--datasets", "RotatedMNIST5k", "PACS",
                                           *sweep_hparams], datasets)
    with pytest.raises(ValueError, match="DomainBed's own PACS"):  # sweep's default: every one
        bridge.check_script_args("sweep", ["launch", *sweep_hparams], datasets)
    for script, argv in (("train", ["--dataset", "PACS", "--hparams", '{"lr": 0.001}']),
                         ("train", ["--dataset", "PACS"]),
                         ("train", ["--dataset", "DigitsOffline", "--hparams",
                                    '{"digits_color_jitter": 0.5}']),
                         ("sweep", ["launch", "--datasets", "RotatedMNIST5k", *sweep_hparams]),
                         ("collect_results", ["--hparams", '{"augmentation": "dmg_pacs"}'])):
        bridge.check_script_args(script, argv, datasets)  # nothing ignored


def test_host_only_hparams_are_refused_unless_at_their_defaults(plugin, fake):
    """DomainBed's train loop draws one batch per source environment and never changes the lr:
    batch_sampling and the lr schedule hparams are refused for train and sweep, whatever the
    algorithm and dataset, unless left at their defaults."""
    (_, datasets, _, _), _ = fake
    with pytest.raises(ValueError, match=r"^--hparams sets lr_schedule='exp_epoch', "
                                         r"lr_decay=0.9, which DomainBed's own train loop "
                                         r"ignores .*python -m dg_plugins.scripts.train, or "
                                         r"leave them at the default$"):
        bridge.check_script_args("train", [
            "--dataset", "RotatedMNIST", "--algorithm", "ERM", "--hparams",
            '{"lr_decay": 0.9, "lr_schedule": "exp_epoch", "lr": 0.001}'], datasets)
    for overrides in ('{"batch_sampling": "pooled"}', '{"lr_inv_gamma": 0.001}',
                      '{"lr_inv_power": 0.5}', '{"lr_schedule": "inv_step"}'):
        name = overrides.split('"')[1]
        with pytest.raises(ValueError, match=rf"sets {name}=.*dg_plugins.scripts.sweep, or "
                                             r"leave it at the default"):
            bridge.check_script_args("sweep", ["launch", "--datasets", "RotatedMNIST5k",
                                               "--hparams", overrides], datasets)
    defaults = ('{"batch_sampling": "per_domain", "lr_schedule": "constant", "lr_decay": 0.99, '
                '"lr_inv_gamma": 0.0001, "lr_inv_power": 0.75}')
    for script, argv in (("train", ["--dataset", "PACS", "--hparams", defaults]),
                         ("sweep", ["launch", "--datasets", "RotatedMNIST5k", "--hparams",
                                    defaults]),
                         ("collect_results", ["--hparams", '{"lr_schedule": "exp_epoch"}'])):
        bridge.check_script_args(script, argv, datasets)  # nothing DomainBed ignores
