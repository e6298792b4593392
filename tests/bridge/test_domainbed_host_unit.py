"""DomainBed's algorithms on our host (dg_plugins.domainbed.host), against a tiny DomainBed-like
package written into tmp_path (no checkout needed): names, refusals, hparams from its registry,
train jobs, exact resume, and our featurizer in place of ``networks.Featurizer``. The real
checkout: test_domainbed_host.py."""

import os
import sys
import textwrap

import pytest

import dg_plugins.algorithms  # noqa: F401  (registers)
from dg_plugins.domainbed import bridge
from dg_plugins.domainbed import host as domainbed_host
from dg_plugins import hparams as dg_hparams
from dg_plugins.registry import ALGORITHMS, UnavailableError, UnknownNameError
from dg_plugins.scripts.train import main
from dg_plugins.seeds import seed_hash
from dg_plugins.sweep.checks import check_algorithms
from support.helpers import VOLATILE_KEYS, read_records

ALGORITHMS_PY = '''
    import copy

    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    try:
        import dg_plugins_test_no_such_package as backpack
    except ImportError:
        backpack = None

    ALGORITHMS = ["ERM", "Counter", "NeedsBackpack", "OnGPU"]


    def get_algorithm_class(name):
        if name not in globals():
            raise NotImplementedError(name)
        return globals()[name]


    class Algorithm(nn.Module):
        def __init__(self, input_shape, num_classes, num_domains, hparams):
            super().__init__()
            self.hparams = hparams


    class ERM(Algorithm):
        def __init__(self, input_shape, num_classes, num_domains, hparams):
            super().__init__(input_shape, num_classes, num_domains, hparams)
            self.network = nn.Sequential(nn.Flatten(), nn.Linear(3 * 28 * 28, num_classes))
            self.optimizer = torch.optim.Adam(self.network.parameters(), lr=hparams["lr"])

        def update(self, minibatches, unlabeled=None):
            x = torch.cat([x for x, y in minibatches])
            y = torch.cat([y for x, y in minibatches])
            loss = F.cross_entropy(self.predict(x), y)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            return {"loss": loss.item()}

        def predict(self, x):
            return self.network(x)


    class Average:
        def __init__(self):
            self.value = None
            self.count = 0


    class Counter(ERM):
        """State outside the state_dict: a step count (a Python int), an average object, and a
        submodule made at the first update, which predict uses; and a buffer registered empty
        and given its shape at the first update (GroupDRO's q)."""

        def __init__(self, input_shape, num_classes, num_domains, hparams):
            super().__init__(input_shape, num_classes, num_domains, hparams)
            self.steps = 0
            self.average = Average()
            self.register_buffer("q", torch.Tensor())

        def update(self, minibatches, unlabeled=None):
            if self.steps == 0:
                self.shadow = copy.deepcopy(self.network)
                self.q = torch.ones(len(minibatches))
            self.q = self.q * 0.5 + self.steps
            self.steps += 1
            values = super().update(minibatches)
            loss = torch.tensor([values["loss"]])
            self.average.value = loss if self.average.value is None else (
                self.hparams["counter_tau"] * self.average.value + loss)
            self.average.count += 1
            with torch.no_grad():
                for mine, theirs in zip(self.shadow.parameters(), self.network.parameters()):
                    mine.mul_(0.5).add_(theirs * 0.5 * self.steps)
            return {**values, "steps": float(self.steps), "q": float(self.q.sum()),
                    "average": float(self.average.value) / self.average.count}

        def predict(self, x):
            return self.shadow(x) if hasattr(self, "shadow") else self.network(x)


    class NeedsBackpack(ERM):
        def update(self, minibatches, unlabeled=None):
            assert backpack is not None
            return super().update(minibatches)


    class OnGPU(ERM):
        def update(self, minibatches, unlabeled=None):
            return super().update([(x.cuda(), y.cuda()) for x, y in minibatches])
'''

HPARAMS_REGISTRY_PY = '''
    import hashlib

    import numpy as np


    def seed_hash(*args):
        return int(hashlib.md5(str(args).encode("utf-8")).hexdigest(), 16) % (2**31)


    def _hparams(algorithm, dataset, random_seed):
        small = dataset in ("Debug28", "RotatedMNIST", "ColoredMNIST")
        hparams = {}

        def _hparam(name, default, fn):
            hparams[name] = (default, fn(np.random.RandomState(seed_hash(random_seed, name))))

        _hparam("data_augmentation", True, lambda r: True)
        _hparam("class_balanced", False, lambda r: False)
        if algorithm == "Counter":
            _hparam("counter_tau", 1, lambda r: r.uniform(0.5, 1.0))
        _hparam("lr", 1e-3 if small else 5e-5, lambda r: 10 ** r.uniform(-4.5, -2.5))
        _hparam("weight_decay", 0.0, lambda r: 0.0)
        _hparam("batch_size", 64 if small else 32, lambda r: int(2 ** r.uniform(3, 9)))
        return hparams
'''


NETWORKS_PY = '''
    import torch.nn as nn


    class Wide(nn.Module):
        """DomainBed's own featurizer here: larger than ours for 28x28 images."""

        def __init__(self, input_shape):
            super().__init__()
            self.n_outputs = 256
            self.net = nn.Sequential(nn.Flatten(), nn.Linear(input_shape[0] * 28 * 28, 256))

        def forward(self, x):
            return self.net(x)


    def Featurizer(input_shape, hparams):
        return Wide(input_shape)
'''

NETWORKED_ALGORITHMS_PY = '''
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    from domainbed import networks

    ALGORITHMS = ["Plain", "Picky", "Cloning"]


    def get_algorithm_class(name):
        return globals()[name]


    class Plain(nn.Module):
        def __init__(self, input_shape, num_classes, num_domains, hparams):
            super().__init__()
            self.hparams, self.input_shape, self.num_classes = hparams, input_shape, num_classes
            self.featurizer = networks.Featurizer(input_shape, hparams)
            self.classifier = nn.Linear(self.featurizer.n_outputs, num_classes)
            self.network = nn.Sequential(self.featurizer, self.classifier)
            self.optimizer = torch.optim.Adam(self.network.parameters(), lr=hparams["lr"])

        def step(self, network, minibatches):
            x = torch.cat([x for x, y in minibatches])
            y = torch.cat([y for x, y in minibatches])
            loss = F.cross_entropy(network(x), y)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            return {"loss": loss.item()}

        def update(self, minibatches, unlabeled=None):
            return self.step(self.network, minibatches)

        def predict(self, x):
            return self.network(x)


    class Picky(Plain):
        """Takes DomainBed's featurizer only (as DomainBed's URM)."""

        def __init__(self, input_shape, num_classes, num_domains, hparams):
            super().__init__(input_shape, num_classes, num_domains, hparams)
            assert type(self.featurizer) is networks.Wide


    class Cloning(Plain):
        """Trains a copy of its network made at every update (as DomainBed's Fish)."""

        def update(self, minibatches, unlabeled=None):
            clone = nn.Sequential(networks.Featurizer(self.input_shape, self.hparams),
                                  nn.Linear(self.featurizer.n_outputs, self.num_classes))
            clone.to(minibatches[0][0].device)  # as Fish puts its clone on the batch's device
            clone.load_state_dict(self.network.state_dict())
            optimizer, self.optimizer = self.optimizer, torch.optim.SGD(clone.parameters(), 0.1)
            values = self.step(clone, minibatches)
            self.optimizer = optimizer
            self.network.load_state_dict(clone.state_dict())
            return values
'''


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))


def _forget_domainbed() -> dict:
    """Take every ``domainbed`` module out of sys.modules (returned, to put back)."""
    return {name: sys.modules.pop(name) for name in list(sys.modules)
            if name == "domainbed" or name.startswith("domainbed.")}


@pytest.fixture
def host(monkeypatch):
    """A fresh DomainBed source; afterwards the registry, hparams and sys.modules as before."""
    taken = _forget_domainbed()
    monkeypatch.setattr(sys, "path", [p for p in sys.path if not os.path.isfile(
        os.path.join(p or ".", "domainbed", "__init__.py"))])
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))  # locate() exports to it
    previous = ALGORITHMS.source(domainbed_host.PREFIX)
    ALGORITHMS.add_source(domainbed_host.DomainBedAlgorithms())
    yield
    for name in ALGORITHMS.loaded():
        dg_hparams.forget_registry(name)
    ALGORITHMS.remove_source(domainbed_host.PREFIX)
    if previous is not None:
        ALGORITHMS.add_source(previous)
    _forget_domainbed()
    sys.modules.update(taken)


@pytest.fixture
def fake_domainbed(tmp_path, monkeypatch, host):
    root = tmp_path / "DomainBed"
    _write(root / "domainbed" / "__init__.py", "")
    _write(root / "domainbed" / "algorithms.py", ALGORITHMS_PY)
    _write(root / "domainbed" / "hparams_registry.py", HPARAMS_REGISTRY_PY)
    monkeypatch.setenv(bridge.DOMAINBED_ROOT_ENV, str(root))
    return root


@pytest.fixture
def networked_domainbed(tmp_path, monkeypatch, host):
    """A DomainBed whose algorithms build their featurizers with ``networks.Featurizer``."""
    root = tmp_path / "DomainBed"
    _write(root / "domainbed" / "__init__.py", "")
    _write(root / "domainbed" / "networks.py", NETWORKS_PY)
    _write(root / "domainbed" / "algorithms.py", NETWORKED_ALGORITHMS_PY)
    _write(root / "domainbed" / "hparams_registry.py", HPARAMS_REGISTRY_PY)
    monkeypatch.setenv(bridge.DOMAINBED_ROOT_ENV, str(root))
    return root


def train(out, *argv, steps=6):
    return main(["--dataset", "Debug28", "--output_dir", str(out), "--steps", str(steps),
                 "--checkpoint_freq", "2", "--hparams", '{"batch_size": 4}', *argv])


def test_names_domainbeds_own_and_ours(fake_domainbed, capsys):
    """A name we do not register is DomainBed's (any case); ours stays ours, and DomainBed's of
    that name is DomainBed:NAME; unknown names list both, DomainBed's from the checkout."""
    assert ALGORITHMS.resolve("counter", say="--algorithm") == "Counter"
    assert "--algorithm counter: using 'Counter'" in capsys.readouterr().err
    counter = ALGORITHMS.get("Counter")
    assert issubclass(counter, domainbed_host.DomainBedHost)
    assert counter.__mro__[2].__module__ == "domainbed.algorithms"
    assert ALGORITHMS.get("ERM") is dg_plugins.algorithms.ERM
    assert ALGORITHMS.resolve("domainbed:erm") == "DomainBed:ERM"
    assert ALGORITHMS.get("DomainBed:ERM").DOMAINBED_NAME == "ERM"
    assert "Counter" not in dict(ALGORITHMS.items())  # so the bridge never installs it back
    with pytest.raises(UnknownNameError) as info:
        ALGORITHMS.get("Countr")
    assert str(info.value).startswith("unknown algorithm 'Countr' (did you mean 'Counter'?); "
                                      "registered algorithms: ERM,")
    assert str(info.value).endswith("; DomainBed's: Counter, NeedsBackpack, OnGPU, "
                                    "DomainBed:ERM")
    assert check_algorithms(["erm", "counter", "Counter", "DomainBed:ERM"]) == [
        "ERM", "Counter", "DomainBed:ERM"]


def test_without_a_checkout_domainbeds_names_say_how_to_get_one(host, monkeypatch, tmp_path,
                                                                capsys):
    monkeypatch.delenv(bridge.DOMAINBED_ROOT_ENV, raising=False)
    with pytest.raises(UnavailableError, match="CORAL is one of DomainBed's algorithms, which "
                                               "run from a DomainBed checkout: .*DOMAINBED_ROOT"):
        ALGORITHMS.resolve("coral")
    with pytest.raises(UnknownNameError, match=r"DomainBed's, with a checkout \(set "
                                               r"DOMAINBED_ROOT=/path/to/DomainBed\): .*CORAL"):
        ALGORITHMS.get("NoSuchAlgo")
    assert main(["--dataset", "Debug28", "--algorithm", "IRM", "--output_dir",
                 str(tmp_path / "job")]) == 2
    err = capsys.readouterr().err
    assert "error: IRM is one of DomainBed's algorithms" in err and len(err.splitlines()) == 1


def test_what_cannot_run_here_is_refused_before_anything_is_written(fake_domainbed, tmp_path,
                                                                    capsys):
    out = tmp_path / "job"
    for argv, message in [
            (["--algorithm", "NeedsBackpack"],
             "error: NeedsBackpack (DomainBed's) needs the package 'backpack', which DomainBed "
             "could not import: pip install backpack-for-pytorch"),
            (["--algorithm", "OnGPU", "--device", "cpu"],
             "error: OnGPU runs only on a CUDA device: DomainBed's code for it calls .cuda(); "
             "this job's device is cpu."),
            (["--algorithm", "Counter", "--precision", "fp16"],
             "error: --precision fp16 cannot train Counter: DomainBed's update() steps its own "
             "optimizers, which fp16's gradient scaler cannot reach; use --precision bf16")]:
        assert train(out, *argv) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
        assert not out.exists()
    assert not ALGORITHMS.get("Counter").CUDA_ONLY and ALGORITHMS.get("OnGPU").CUDA_ONLY


def test_hparams_are_domainbeds_registry_seeded_as_domainbed(fake_domainbed):
    """_hparams(name, dataset, seed_hash(hparams_seed, trial_seed)) of the checkout; our
    small-image datasets DomainBed lacks are asked as Debug28; numbers accept any number."""
    sys.path.insert(0, str(fake_domainbed))
    from domainbed import hparams_registry

    ALGORITHMS.resolve("Counter")
    drawn = {k: r for k, (d, r) in
             hparams_registry._hparams("Counter", "Debug28", seed_hash(3, 1)).items()}
    assert dg_hparams.job_hparams("Counter", "Debug28", 3, 1) == drawn
    assert dg_hparams.job_hparams("Counter", "RotatedMNIST5k", 0, 0)["batch_size"] == 64
    assert dg_hparams.job_hparams("Counter", "PACS", 0, 0)["batch_size"] == 32
    assert dg_hparams.job_hparams("Counter", "Debug28", 0, 0, '{"counter_tau": 0.75}')[
        "counter_tau"] == 0.75
    with pytest.raises(dg_hparams.HparamError, match="unknown hparam.*'backbone'"):
        dg_hparams.job_hparams("Counter", "Debug28", 0, 0, '{"backbone": "resnet"}')


def test_a_train_job_records_domainbeds_name_and_hparams(fake_domainbed, tmp_path, capsys):
    assert train(tmp_path / "db_erm", "--algorithm", "DomainBed:ERM", steps=2) == 0
    assert ("Network: DomainBed:ERM (DomainBed's) builds its own networks, not with "
            f"networks.Featurizer; {3 * 28 * 28 * 2 + 2:,} parameters") in capsys.readouterr().out
    assert train(tmp_path / "our_erm", "--algorithm", "ERM", steps=2) == 0
    db, ours = read_records(tmp_path / "db_erm")[-1], read_records(tmp_path / "our_erm")[-1]
    assert db["args"]["algorithm"] == "DomainBed:ERM" and ours["args"]["algorithm"] == "ERM"
    assert set(db["hparams"]) == {"data_augmentation", "class_balanced", "lr", "weight_decay",
                                  "batch_size"}
    assert "backbone" in ours["hparams"]
    assert (tmp_path / "db_erm" / "done").exists() and "env0_out_acc" in db


def test_resume_is_exact_for_state_outside_the_state_dict(fake_domainbed, tmp_path):
    """Counter's step count, average object, late submodule and the buffer it gives a shape at
    the first update are in the resume file: an interrupted and resumed job writes the records
    of an uninterrupted one."""
    from dg_plugins.train import run as train_run
    from dg_plugins.train.cli import build_parser

    def args(out, *extra):
        return build_parser().parse_args([
            "--dataset", "Debug28", "--algorithm", "Counter", "--output_dir", str(out),
            "--steps", "6", "--checkpoint_freq", "2", "--hparams", '{"batch_size": 4}', *extra])

    full, cut = tmp_path / "full", tmp_path / "cut"
    assert train_run.run(args(full)) == "done"
    assert train_run.run(args(cut), stop_after_step=2) == "stopped"
    assert train_run.run(args(cut, "--resume")) == "done"
    records = read_records(full, drop=VOLATILE_KEYS)
    assert [r["steps"] for r in records] == [1.0, 2.5, 4.5, 6.0]  # means since the last record
    assert read_records(cut, drop=VOLATILE_KEYS) == records


def _parameters(module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_domainbeds_classes_get_our_featurizer_or_the_job_says_why_not(networked_domainbed,
                                                                      tmp_path, capsys):
    """``networks.Featurizer`` builds the featurizer our ERM gets (also for the networks a class
    builds while it trains, which take its weights), with our network hparams; a class whose
    code refuses ours keeps DomainBed's and the job says why; the records carry the
    featurizer's parameter count."""
    from dg_plugins import networks

    ours = _parameters(networks.Featurizer((3, 28, 28),
                                           dg_hparams.job_hparams("ERM", "Debug28", 0, 0)))
    for name in ("Plain", "Cloning"):
        assert train(tmp_path / name, "--algorithm", name, steps=2) == 0
        out = capsys.readouterr().out
        assert (f"Network: {name} (DomainBed's) on dg_plugins' featurizer MNIST_CNN (backbone "
                f"mnist_cnn, {ours:,} parameters), as dg_plugins' own algorithms get it") in out
        record = read_records(tmp_path / name)[-1]
        assert record[domainbed_host.FEATURIZER_PARAMS_KEY] == ours
        assert record["hparams"]["backbone"] == "auto"
        assert record["hparams"]["mnist_cnn_width"] == 128

    assert train(tmp_path / "lenet", "--algorithm", "Plain", "--hparams",
                 '{"batch_size": 4, "backbone": "lenet"}', steps=1) == 0
    assert "on dg_plugins' featurizer LeNet (backbone lenet, " in capsys.readouterr().out

    assert train(tmp_path / "Picky", "--algorithm", "Picky", steps=2) == 0
    err = (tmp_path / "Picky" / "err.txt").read_text()
    wide = 3 * 28 * 28 * 256 + 256
    line = (f"Network: Picky (DomainBed's) on DomainBed's featurizer Wide ({wide:,} parameters), "
            f"not on dg_plugins' MNIST_CNN ({ours:,} parameters), which dg_plugins' algorithms "
            "get: DomainBed's code refused it (AssertionError at algorithms.py:")
    assert f"note: {line}" in err
    assert f"note: {line}" in (tmp_path / "Picky" / "out.txt").read_text()
    assert "assert type(self.featurizer) is networks.Wide); " in err
    assert read_records(tmp_path / "Picky")[-1][domainbed_host.FEATURIZER_PARAMS_KEY] == wide
    # DomainBed's module is left as it was
    assert sys.modules["domainbed.networks"].Featurizer((3, 28, 28), {}).n_outputs == 256


def test_a_class_that_refuses_ours_gets_the_weights_domainbed_gives_it(networked_domainbed):
    """The class that refuses our featurizer is built again from the RNG state it started
    from: the weights DomainBed's class gets without our host, from the same seed."""
    import torch

    picky = ALGORITHMS.get("Picky")
    from domainbed import algorithms

    hparams = dg_hparams.job_hparams("Picky", "Debug28", 0, 0)
    torch.manual_seed(0)
    hosted = picky((3, 28, 28), 2, 2, hparams)
    torch.manual_seed(0)
    own = algorithms.Picky((3, 28, 28), 2, 2, hparams)
    assert hosted.state_dict().keys() == own.state_dict().keys()
    assert all(torch.equal(hosted.state_dict()[k], v) for k, v in own.state_dict().items())
