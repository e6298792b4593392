"""The ViT paper scripts run as a user runs them, end to end, on data shaped like the releases
(:mod:`release_data`): ``gmoe_domainbed.sh`` (TerraIncognita's layout; PACS),
``gmoe_single_source_domainnet.sh`` (DomainNet after DomainBed's download), ``dismae_dg.sh`` (the
PACS sample) and ``dismae_udg_domainnet20.sh`` (DomainNet with DomainNet-20's classes and others),
each protocol, each shrunk only through the script's knobs (one dataset, one algorithm, one test
set, one trial, one step or epoch; in HPARAMS random init, small batches, and the package's
2-block "tiny" ViT for GMoE's DeiT-S/16 and DisMAE's ViT-B/16), with the local launcher and
default loader workers; each ends with its tables and the paper's rows (or, where the paper's
numbers are not in our sources, what it claims). Each run's bash part runs as a subprocess and the
one command it hands the interpreter is replayed with the others' in one Python process
(:func:`paper_runs.run_scripts`; ``tests/test_paper_scripts_dmg_*.py`` run their two scripts
wholly)."""

from __future__ import annotations

import pytest

from dg_plugins.datasets.domainnet20 import CLASSES as DOMAINNET20_CLASSES
from support.paper_runs import assert_reproduced, run_scripts
from support import release_data

TIMEOUT_S = 400
#: The ViTs as the package's 2-block "tiny" ViT, random init, batches of 4 images per domain.
TINY_VIT = '{"vit_arch": "tiny", "batch_size": 4}'
TINY = {"GMoE": '{"pretrained": false, "vit_arch": "tiny", "gmoe_router_dim": 16, '
                '"batch_size": 4}',
        "ERM_ViT": '{"pretrained": false, "vit_arch": "tiny", "batch_size": 4}'}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """PACS, TerraIncognita and DomainNet (3 classes) in one data folder."""
    root = tmp_path_factory.mktemp("data")
    release_data.pacs(root)
    release_data.terra_incognita(root)
    release_data.domain_net(root, ("airplane", "bee", "zigzag"), per_class=4)
    return root


@pytest.fixture(scope="module")
def domainnet20_dir(tmp_path_factory):
    """DomainNet with DomainNet-20's 20 classes and one other, one image each per domain."""
    root = tmp_path_factory.mktemp("data20")
    release_data.domain_net(root, (*DOMAINNET20_CLASSES, "airplane"), per_class=1, duplicates=0)
    return root


#: The runs: (protocol, dataset, algorithm) of gmoe_domainbed.sh, (protocol, algorithm) of
#: gmoe_single_source_domainnet.sh, and (protocol, algorithm, test_envs) of
#: dismae_udg_domainnet20.sh.
GMOE = [("release", "TerraIncognita", "GMoE"), ("domainbed", "PACS", "ERM_ViT")]
GSS = [("release", "GMoE"), ("domainbed", "ERM_ViT")]
UDG = [("release", "DisMAE", "0,1,3"), ("domainbed", "ERM", "2,4,5")]


@pytest.fixture(scope="module")
def runs(data_dir, domainnet20_dir, tmp_path_factory):
    """Every run of the module, replayed in one process (the DomainNet-20 runs with their own
    DATA_DIR)."""
    tmp = tmp_path_factory.mktemp("vit")
    cases = {}
    for protocol, dataset, algorithm in GMOE:
        cases[f"gmoe_{protocol}"] = ("gmoe_domainbed.sh", dict(
            PROTOCOL=protocol, DATASETS=dataset, ALGORITHMS=algorithm, TEST_ENVS="0", STEPS="1",
            N_TRIALS="1", HPARAMS=TINY[algorithm]))
    for protocol, algorithm in GSS:
        cases[f"gss_{protocol}"] = ("gmoe_single_source_domainnet.sh", dict(
            PROTOCOL=protocol, ALGORITHMS=algorithm, STEPS="1", N_TRIALS="1",
            HPARAMS=TINY[algorithm]))
    cases["dismae_dg"] = ("dismae_dg.sh", dict(
        DATASETS="PACS", ALGORITHMS="DisMAE", TEST_ENVS="0", STEPS="1", N_TRIALS="1",
        HPARAMS=TINY_VIT))
    for protocol, algorithm, test_envs in UDG:
        cases[f"udg_{protocol}"] = ("dismae_udg_domainnet20.sh", dict(
            DATA_DIR=str(domainnet20_dir), PROTOCOL=protocol, ALGORITHMS=algorithm,
            TEST_ENVS=test_envs, EPOCHS="1", PRETRAIN_EPOCHS="1", N_TRIALS="1",
            HPARAMS=TINY_VIT))
    return run_scripts(cases, tmp, data_dir, timeout=TIMEOUT_S)


@pytest.mark.parametrize("protocol, dataset, algorithm", GMOE)
def test_gmoe_domainbed(protocol, dataset, algorithm, runs):
    assert_reproduced(runs[f"gmoe_{protocol}"], "gmoe_domainbed", protocol, [algorithm],
                      n_jobs=1)


@pytest.mark.parametrize("protocol, algorithm", GSS)
def test_gmoe_single_source_domainnet(protocol, algorithm, runs):
    sections = assert_reproduced(runs[f"gss_{protocol}"], "gmoe_single_source_domainnet",
                                 protocol, [algorithm], n_jobs=1)
    assert "single source: paint" in "".join(sections.values())


def test_dismae_dg(runs):
    assert_reproduced(runs["dismae_dg"], "dismae_dg", "domainbed", ["DisMAE"], n_jobs=1)


@pytest.mark.parametrize("protocol, algorithm, test_envs", UDG)
def test_dismae_udg_domainnet20(protocol, algorithm, test_envs, runs):
    """One pretraining (DisMAE) shared by the four label fractions' fine-tuning jobs."""
    sections = assert_reproduced(runs[f"udg_{protocol}"], "dismae_udg_domainnet20", protocol,
                                 [algorithm], n_jobs=4)
    text = "".join(sections.values())
    for fraction in ("1%", "5%", "10%", "100%"):
        assert f"| {algorithm} {fraction} |" in text
