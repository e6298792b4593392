"""Registry behaviour, DomainBed-compatible hparams (``domainbed/hparams_registry.py``) and the
validation of hparam overrides."""

import json

import numpy as np
import pytest

from dg_plugins import hparams
from dg_plugins.registry import Registry, Source, UnavailableError, UnknownNameError
from dg_plugins.seeds import seed_hash


def test_registry_register_get_list_and_duplicates():
    reg = Registry("widget")

    @reg.register()
    class Alpha:
        pass

    reg.register("Beta2", object())
    reg.register("Alpha", Alpha)  # re-registering the same object is a no-op
    assert reg.get("Alpha") is Alpha and "Beta2" in reg and len(reg) == 2
    assert reg.list() == ["Alpha", "Beta2"] and reg.list("B*") == ["Beta2"]
    with pytest.raises(ValueError, match="widget name 'Alpha' is already registered"):
        reg.register("Alpha", object())
    with pytest.raises(UnknownNameError, match="unknown widget 'Gamma'; registered widgets: "
                                               "Alpha, Beta2"):
        reg.get("Gamma")
    with pytest.raises(UnknownNameError, match=r"unknown widget 'Alpah' \(did you mean 'Alpha'\?\)"):
        reg.get("Alpah")


def test_seed_hash_golden_values():
    assert seed_hash(1, 0) == 785910682
    assert seed_hash(0, "lr") == 1017368932
    assert seed_hash("VLCS", "ERM", [1, 2], 1, 0) == 360234358


def test_base_defaults_are_domainbeds():
    small, large = hparams.default_hparams("ERM", "Debug28"), hparams.default_hparams("ERM", "PACS")
    assert (small["lr"], small["batch_size"], small["weight_decay"]) == (1e-3, 64, 0.0)
    assert (large["lr"], large["batch_size"], large["weight_decay"]) == (5e-5, 32, 0.0)
    for key, value in {"data_augmentation": True, "resnet18": False, "resnet50_augmix": True,
                       "dinov2": False, "vit": False, "vit_attn_tune": False, "freeze_bn": False,
                       "lars": False, "linear_steps": 500, "resnet_dropout": 0.0,
                       "vit_dropout": 0.0, "class_balanced": False,
                       "nonlinear_classifier": False}.items():
        assert large[key] == value, key
    assert large["pretrained"] is True and large["mnist_cnn_width"] == 128
    assert hparams.default_hparams("ERM", "RotatedMNIST5k")["mnist_cnn_width"] == 32


def test_random_draws_match_domainbed_golden_values():
    vlcs = hparams.random_hparams("ERM", "VLCS", seed_hash(1, 0))
    assert vlcs["batch_size"] == 39 and vlcs["resnet_dropout"] == 0.5
    assert vlcs["lr"] == 2.7028930742148706e-05
    assert vlcs["weight_decay"] == 0.00044832883881609976
    debug = hparams.random_hparams("ERM", "Debug28", seed_hash(1, 0))
    assert (debug["lr"], debug["batch_size"], debug["weight_decay"]) == (
        0.00011906162909279594, 372, 0.0)


def test_fixture_sweep_hparams_are_reproduced(shared_fixtures):
    """Every job of DomainBed's own sweep has the hparams our registry gives for its seeds."""
    folder = shared_fixtures / "domainbed_sweep_data"
    checked = 0
    for results in folder.glob("*/results.jsonl"):
        record = json.loads(results.read_text().splitlines()[0])
        a = record["args"]
        ours = hparams.job_hparams(a["algorithm"], a["dataset"], a["hparams_seed"],
                                   a["trial_seed"], a["hparams"])
        assert {k: ours[k] for k in record["hparams"]} == record["hparams"], results
        checked += 1
    assert checked >= 40


def test_draws_depend_only_on_seed_and_name_and_are_json_native():
    hparams.algorithm_hparams("TestOnlyAlgo")(lambda dataset: {
        "extra": (2, lambda r: r.choice([1, 2, 3])),
        "lr": (0.5, lambda r: 10 ** r.uniform(-5, -3.5)),  # overrides the base entry
    })
    with_extra = hparams.random_hparams("TestOnlyAlgo", "PACS", 7)
    base = hparams.random_hparams("ERM", "PACS", 7)
    assert with_extra["lr"] == base["lr"]  # same (seed, name) -> same draw
    assert with_extra["batch_size"] == base["batch_size"]
    assert type(with_extra["extra"]) is int
    json.dumps(with_extra)
    assert hparams.default_hparams("TestOnlyAlgo", "PACS")["lr"] == 0.5
    assert hparams.random_hparams("ERM", "PACS", 7) == base  # stable


def test_job_hparams_and_overrides():
    assert hparams.job_hparams("ERM", "PACS", 0, 5) == hparams.default_hparams("ERM", "PACS")
    assert hparams.job_hparams("ERM", "PACS", 1, 0) == hparams.random_hparams(
        "ERM", "PACS", seed_hash(1, 0))
    assert hparams.job_hparams("ERM", "PACS", 0, 0, '{"lr": 1, "batch_size": 8}') == {
        **hparams.default_hparams("ERM", "PACS"), "lr": 1.0, "batch_size": 8}
    with pytest.raises(hparams.HparamError, match="unknown hparam"):
        hparams.job_hparams("ERM", "PACS", 0, 0, '{"lr": 0.1, "new": 1}')
    with pytest.raises(ValueError, match="not valid JSON.*Expected an object"):
        hparams.parse_overrides("{'lr': 0.1}")


@pytest.mark.parametrize("overrides, message", [
    ({"lrr": 0.1}, r"unknown hparam\(s\) 'lrr' \(did you mean 'lr'\?\) for ERM on PACS\. "
                   r"Valid names: .*batch_size"),
    ({"batch_size": "64"}, "'batch_size' must be an integer like its default 32, got '64'"),
    ({"batch_size": 8.0}, "'batch_size' must be an integer"),
    ({"batch_size": True}, "'batch_size' must be an integer"),
    ({"batch_size": 0}, "hparam 'batch_size' must be > 0, got 0"),
    ({"lr": "0.1"}, "'lr' must be a number"),
    ({"lr": -1e-3}, "'lr' must be > 0"),
    ({"resnet18": 1}, "'resnet18' must be a boolean"),
    ({"resnet_dropout": 1.0}, r"'resnet_dropout' must be in \[0, 1\)"),
    ({"backbone": "vgg"}, "'backbone' must be one of 'auto', 'mnist_cnn', 'lenet', 'resnet', 'vit'"),
    ({"vit_arch": 3}, "'vit_arch' must be a string"),
    ({"batch_sampling": "uniform"}, "'batch_sampling' must be one of 'per_domain', 'pooled'"),
    ({"lr_schedule": "cosine"},
     "'lr_schedule' must be one of 'constant', 'exp_epoch', 'inv_epoch', 'inv_step'"),
    ({"lr_decay": 0}, r"'lr_decay' must be in \(0, 1\]"),
    ({"lr_inv_gamma": -1e-4}, "'lr_inv_gamma' must be >= 0"),
])
def test_bad_overrides_are_rejected_with_the_fix(overrides, message):
    with pytest.raises(hparams.HparamError, match=message):
        hparams.validate("ERM", "PACS", overrides)


def test_the_release_protocol_hparams_have_defaults_that_change_nothing():
    """Every algorithm on every dataset: DomainBed's per-domain batches and a constant lr."""
    for dataset in ("PACS", "Debug28", "DomainNet"):
        hp = hparams.default_hparams("ERM", dataset)
        assert (hp["batch_sampling"], hp["lr_schedule"]) == ("per_domain", "constant")
        assert (hp["lr_decay"], hp["lr_inv_gamma"], hp["lr_inv_power"]) == (0.99, 1e-4, 0.75)
        assert hparams.random_hparams("ERM", dataset, 3)["lr_schedule"] == "constant"
    assert hparams.validate("ERM", "PACS", {"batch_sampling": "pooled", "lr_schedule": "inv_step",
                                            "lr_decay": 1}) == {
        "batch_sampling": "pooled", "lr_schedule": "inv_step", "lr_decay": 1.0}


@pytest.mark.parametrize("text", ['{"lr": Infinity}', '{"lr": NaN}', '{"weight_decay": -Infinity}',
                                  '{"dmg_mask_lr": Infinity}'])
def test_non_finite_numbers_are_rejected(text):
    """Python's JSON reads Infinity and NaN, and every check of the form ``value > 0`` passes
    Infinity; records holding it would not be standard JSON (issue 31, item 14)."""
    import dg_plugins.algorithms  # noqa: F401  (registers DMG's space)

    name = next(iter(json.loads(text)))
    with pytest.raises(hparams.HparamError, match=f"hparam '{name}' must be a finite number"):
        hparams.job_hparams("DMG", "PACS", 0, 0, text)


def test_non_finite_list_items_and_built_hparams_are_rejected():
    hparams.declare_space("TestFiniteListAlgo", lambda dataset: {
        "betas": ((0.9, 0.95), lambda r: (0.9, 0.95))})
    with pytest.raises(hparams.HparamError, match=r"'betas\[1\]' must be a finite number"):
        hparams.validate("TestFiniteListAlgo", "PACS", {"betas": [0.5, float("nan")]})
    with pytest.raises(hparams.HparamError, match="'lr' must be a finite number"):
        hparams.check_values(hparams.space("ERM", "PACS"), {"lr": float("inf")})


def test_a_renamed_hparam_names_its_new_name():
    import dg_plugins.algorithms  # noqa: F401  (registers GMoE's space)

    with pytest.raises(hparams.HparamError,
                       match=r"'gmoe_arch_224' \(renamed: use vit_arch.*deit_small_patch16_224"):
        hparams.validate("GMoE", "PACS", {"gmoe_arch_224": "deit_small_patch16_224"})
    assert hparams.validate("GMoE", "PACS", {"vit_arch": "tiny"}) == {"vit_arch": "tiny"}


def test_valid_overrides_are_coerced_to_the_default_type():
    checked = hparams.validate("ERM", "PACS", {"lr": 1, "batch_size": 16, "pretrained_path": "w.pt",
                                              "weight_decay": 0})
    assert checked == {"lr": 1.0, "batch_size": 16, "pretrained_path": "w.pt",
                       "weight_decay": 0.0}
    assert type(checked["lr"]) is float and type(checked["weight_decay"]) is float
    assert hparams.validate("ERM", "PACS", {"pretrained_path": None}) == {"pretrained_path": None}


def test_list_defaults_check_length_and_items():
    hparams.declare_space("TestListAlgo", lambda dataset: {
        "betas": ((0.9, 0.95), lambda r: (0.9, 0.95))})
    assert hparams.validate("TestListAlgo", "PACS", {"betas": [0.5, 1]}) == {"betas": [0.5, 1.0]}
    with pytest.raises(hparams.HparamError, match="'betas' must be a list of 2 values"):
        hparams.validate("TestListAlgo", "PACS", {"betas": [0.5]})
    with pytest.raises(hparams.HparamError, match=r"'betas\[1\]' must be a number"):
        hparams.validate("TestListAlgo", "PACS", {"betas": [0.5, "x"]})


def test_an_algorithms_space_attaches_at_registration():
    import torch.nn as nn

    from dg_plugins.algorithms import Algorithm, register_algorithm
    from dg_plugins.registry import ALGORITHMS

    @register_algorithm("TestSpaceAlgo")
    class TestSpaceAlgo(Algorithm):
        @staticmethod
        def hparam_space(dataset):
            return {"test_weight": (0.5, lambda r: r.uniform(0, 1), hparams.unit_interval),
                    "lr": (0.123, lambda r: 0.123)}

    try:
        assert hparams.default_hparams("TestSpaceAlgo", "PACS")["test_weight"] == 0.5
        assert hparams.default_hparams("TestSpaceAlgo", "PACS")["lr"] == 0.123
        with pytest.raises(hparams.HparamError, match=r"'test_weight' must be in \[0, 1\]"):
            hparams.validate("TestSpaceAlgo", "PACS", {"test_weight": 2.0})
        assert isinstance(TestSpaceAlgo((3, 28, 28), 2, 2, {}), nn.Module)
    finally:
        ALGORITHMS.unregister("TestSpaceAlgo")


@pytest.mark.parametrize("algorithm, name, value", [
    ("DMG", "dmg_lambda_overlap", -1.0), ("DMG", "dmg_mask_layers", 3),
    ("MPBM", "mpbm_nb", 0), ("MPBM", "mpbm_clamp", "sometimes")])
def test_an_algorithm_checks_its_hparams_however_they_were_made(algorithm, name, value):
    """hparams that never went through validate (DomainBed's train via the bridge) still get the
    registry's checks, once, in the base class."""
    import dg_plugins.algorithms  # noqa: F401
    from dg_plugins import hparams as H
    from dg_plugins.registry import ALGORITHMS

    hparams = {**H.default_hparams(algorithm, "Debug28"), name: value}
    with pytest.raises(H.HparamError, match=f"hparam '{name}'"):
        ALGORITHMS.get(algorithm)((3, 28, 28), 2, 2, hparams)


def test_resolve_accepts_one_match_up_to_case_and_says_so(capsys):
    """Names users type (train's --algorithm, sweep's --algorithms) go through resolve(): the one
    name equal up to case is taken, with a note; get() stays exact; two names differing only in
    case are an error naming both."""
    reg = Registry("widget")
    reg.register("Alpha", object())
    reg.register("BETA", object())
    reg.register("Beta", object())
    assert reg.resolve("alpha", say="--widget") == "Alpha"
    assert "note: --widget alpha: using 'Alpha'" in capsys.readouterr().err
    assert reg.resolve("Alpha", say="--widget") == "Alpha" and not capsys.readouterr().err
    with pytest.raises(UnknownNameError, match=r"unknown widget 'alpha' \(did you mean 'Alpha'"):
        reg.get("alpha")
    with pytest.raises(UnknownNameError, match="'beta' matches 'BETA', 'Beta' up to case"):
        reg.resolve("beta")
    assert reg.resolve("Beta") == "Beta"


class _Source(Source):
    """Another package's widgets: Alpha (shadowed by the registered one), Gamma, Broken."""

    prefix = "Pkg"

    def __init__(self):
        self.loads = []

    def names(self):
        return ["Alpha", "Gamma", "Broken"]

    def load(self, name, canonical):
        self.loads.append((name, canonical))
        if name == "Broken":
            raise UnavailableError("Broken needs a part: install it")
        return f"pkg {name}"

    def describe(self, shadowed):
        return f"Pkg's: {', '.join(n for n in self.names() if n not in shadowed)}"


def test_a_sources_names_load_on_first_use_and_registered_names_win():
    reg = Registry("widget")
    ours = reg.register("Alpha", object())
    source = _Source()
    reg.add_source(source)
    assert source.loads == []  # nothing loaded until asked
    assert reg.get("Alpha") is ours and reg.resolve("alpha") == "Alpha"
    assert reg.resolve("gamma") == "Gamma" and reg.get("Gamma") == "pkg Gamma"
    assert reg.resolve("pkg:alpha") == "Pkg:Alpha" and reg.get("Pkg:Alpha") == "pkg Alpha"
    assert reg.resolve("Pkg:Gamma") == "Gamma"  # nothing shadows it: its plain name
    assert source.loads == [("Gamma", "Gamma"), ("Alpha", "Pkg:Alpha")]  # each once
    assert reg.list() == ["Alpha"] and dict(reg.items()) == {"Alpha": ours}
    assert "Gamma" in reg and reg.loaded() == ["Gamma", "Pkg:Alpha"]
    with pytest.raises(UnavailableError, match="Broken needs a part: install it"):
        reg.resolve("Broken")
    with pytest.raises(UnknownNameError, match="unknown widget 'Gama' \\(did you mean 'Gamma'"
                                               "\\?\\); registered widgets: Alpha; Pkg's: Gamma"):
        reg.get("Gama")
    with pytest.raises(UnknownNameError, match="unknown widget 'Pkg:Zeta': Pkg defines no 'Zeta'"):
        reg.resolve("Pkg:Zeta")
    reg.remove_source("Pkg")
    assert "Gamma" not in reg and reg.loaded() == []



def test_a_qualified_name_matching_two_of_a_sources_names_up_to_case_names_both():
    class Twins(_Source):
        def names(self):
            return ["Delta", "DELTA"]

    reg = Registry("widget")
    reg.add_source(Twins())
    with pytest.raises(UnknownNameError, match="widget name 'Pkg:delta' matches Pkg:Delta, "
                                               "Pkg:DELTA up to case; give the exact name"):
        reg.resolve("Pkg:delta")
    assert reg.resolve("Pkg:DELTA") == "DELTA"

def test_a_registry_of_another_package_draws_the_hparams():
    """An algorithm declared with declare_registry takes that registry's hparams (seeded by it),
    plus the dataset's own, and nothing of our base space; its numbers take any number."""
    def registry(dataset, seed):
        r = np.random.RandomState(seed_hash(seed, "tau"))
        return {"lr": (1e-3, 0.5 + seed), "tau": (1, r.uniform(0.5, 1.0)),
                "choice": (0.0, np.float64(0.1))}

    hparams.declare_registry("TestOnlyRegistry", registry)
    try:
        drawn = hparams.random_hparams("TestOnlyRegistry", "Debug28", 3)
        assert drawn["lr"] == 3.5 and type(drawn["choice"]) is float
        assert drawn["tau"] == np.random.RandomState(seed_hash(3, "tau")).uniform(0.5, 1.0)
        assert set(hparams.default_hparams("TestOnlyRegistry", "Debug28")) == {
            "lr", "tau", "choice"}
        pacs = hparams.default_hparams("TestOnlyRegistry", "PACS")
        assert pacs["augmentation"] == "domainbed" and "backbone" not in pacs
        assert hparams.validate("TestOnlyRegistry", "Debug28", {"tau": 0.7}) == {"tau": 0.7}
        with pytest.raises(hparams.HparamError, match="'backbone'.*registry's"):
            hparams.validate("TestOnlyRegistry", "Debug28", {"backbone": "resnet"})
        assert hparams.job_hparams("TestOnlyRegistry", "Debug28", 2, 1)["lr"] == 0.5 + seed_hash(
            2, 1)
    finally:
        hparams.forget_registry("TestOnlyRegistry")
