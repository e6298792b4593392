"""``sweeps/dmg_domainnet_paper.sh`` run as a user runs it, end to end, on DomainNet shaped like
its release after DomainBed's download (:func:`release_data.domain_net`: the duplicates removed,
DomainNet's own ``<domain>_train.txt`` / ``_test.txt`` lists beside the domain folders): the
default protocol (release: 10% validation holdout, epochs counted on the images on disk, pooled
batches, inverse lr decay) and PROTOCOL=domainbed, each shrunk only through the script's knobs
(in HPARAMS random init, small batches, 32x32 images), with the local launcher and default loader
workers; each ends with its tables and the paper's rows."""

from __future__ import annotations

import pytest

from support.paper_runs import assert_reproduced, run_script
from support import release_data

TIMEOUT_S = 400
#: DomainNet classes of the tree: two of DomainNet-20's and one other, 4 images per domain each
#: (11 after the duplicates in clipart and sketch: each domain keeps a validation image at the
#: release's 10% holdout).
CLASSES = ("airplane", "bee", "zigzag")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    release_data.domain_net(root, CLASSES, per_class=4)
    return root


@pytest.fixture(scope="module")
def runs(data_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dmg_domainnet")
    return {
        # the release protocol, the Aggregate baseline (ERM) with target clipart: a fifth of an
        # epoch of batches of 8 (one step; the table's batch of 64 would take all 54 images)
        "release": run_script("dmg_domainnet_paper.sh", tmp, data_dir, tag="default",
                              timeout=TIMEOUT_S, ALGORITHMS="ERM", TEST_ENVS="0", EPOCHS="0.2",
                              N_TRIALS="1",
                              HPARAMS='{"pretrained": false, "batch_size": 8, "image_size": 32}'),
        "domainbed": run_script("dmg_domainnet_paper.sh", tmp, data_dir, tag="domainbed",
                                timeout=TIMEOUT_S, PROTOCOL="domainbed", ALGORITHMS="ERM",
                                TEST_ENVS="5", STEPS="1", N_TRIALS="1",
                                HPARAMS='{"pretrained": false, "batch_size": 2, "image_size": 32}'),
    }


def test_release_protocol_counts_the_images_on_disk_and_prints_the_paper_rows(runs, data_dir):
    run = runs["release"]
    assert_reproduced(run, "dmg_domainnet", "release", ["ERM"], n_jobs=2)
    # the sources' in-splits (12 images, 11 in sketch, less int(n x 0.1)) / batch 8
    assert (f"54 training images (11+11+11+11+10; counted on disk in {data_dir / 'domain_net'}; "
            "in-split = images - int(images x 0.1)) / batch 8 = 7 steps per epoch x 0.2 epochs "
            "= 1 steps") in run.stdout


def test_domainbed_protocol_trains_and_prints_the_paper_rows(runs):
    assert_reproduced(runs["domainbed"], "dmg_domainnet", "domainbed", ["ERM"], n_jobs=2)
