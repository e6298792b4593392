"""Before launching anything, ``reproduce`` (the body of every paper script in ``sweeps/``) checks
what every sweep of the setting needs (data folder, datasets, PACS's split lists, pretrained and
CLIP weights) and names each missing piece with its fix: a real run then launches nothing (exit
2), a dry run lists its jobs and warns (exit 0). Run as a user does (``bash sweeps/<script>``),
offline with empty download caches."""

from __future__ import annotations

import pytest

from image_tree import make_pacs_sample
from paper_runs import run_script
import release_data

TIMEOUT_S = 120


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("prerequisites")


@pytest.fixture(scope="module")
def pacs_without_lists(tmp_path_factory):
    return make_pacs_sample(tmp_path_factory.mktemp("pacs"))


def problems(text: str, kind: str) -> list[str]:
    return [line[len(kind) + 2:] for line in text.splitlines() if line.startswith(f"{kind}: ")]


@pytest.fixture(scope="module")
def real(tmp, pacs_without_lists):
    return run_script("dmg_pacs_paper.sh", tmp, pacs_without_lists, tag="real",
                      timeout=TIMEOUT_S)


def test_a_real_run_names_every_missing_piece_and_launches_nothing(real, pacs_without_lists):
    """PACS present, no split lists, no cached weights: the default (release) protocol of
    dmg_pacs_paper.sh names the lists and both backbones' weights at once, each with its fix,
    and starts no sweep, no job and no launcher process, and writes nothing."""
    data, run = pacs_without_lists, real
    assert run.returncode == 2, run.report()
    errors = problems(run.stderr, "error")
    lists = [e for e in errors if "official split lists" in e]
    assert len(lists) == 1 and lists[0].endswith(
        f"python -m dg_plugins.scripts.download --data_dir {data} PACS_splits"), errors
    for backbone in ("resnet18", "resnet50"):
        (line,) = [e for e in errors if f"torchvision {backbone} " in e]
        assert "pretrained_path" in line and '"pretrained": false' in line
    assert len(errors) == 3, errors
    assert "Nothing was launched: 3 prerequisite(s) of dmg_pacs (release) missing" in run.stderr
    assert "-- sweep" not in run.stdout
    assert not run.started_anything(), run.processes
    assert not run.output_dir.exists()


def test_a_dry_run_lists_the_jobs_and_warns_of_the_same_pieces(tmp, pacs_without_lists, real):
    dry = run_script("dmg_pacs_paper.sh", tmp, pacs_without_lists, tag="dry", timeout=TIMEOUT_S,
                     DRY_RUN="1")
    assert dry.returncode == 0, dry.report()
    assert "Total: 48 jobs" in dry.stdout and "Dry run: nothing launched or written." in dry.stdout
    warnings = problems(dry.stderr, "warning")
    assert warnings[:-1] == problems(real.stderr, "error")
    assert warnings[-1] == ("3 prerequisite(s) of dmg_pacs (release) missing (above): a real run "
                            "would launch nothing until they are there.")
    assert not dry.started_anything() and not dry.output_dir.exists()


def test_nothing_missing_no_warning(tmp, tmp_path_factory):
    data = release_data.pacs(tmp_path_factory.mktemp("complete"))
    dry = run_script("dmg_pacs_paper.sh", tmp, data, tag="complete", timeout=TIMEOUT_S,
                     DRY_RUN="1", HPARAMS='{"pretrained": false}')
    assert dry.returncode == 0 and "warning" not in dry.stderr, dry.report()


def test_a_missing_data_folder_is_named(tmp):
    absent = tmp / "no_such_folder"
    run = run_script("dmg_pacs_paper.sh", tmp, absent, tag="absent", timeout=TIMEOUT_S,
                     HPARAMS='{"pretrained": false}', DRY_RUN="1")
    assert run.returncode == 0, run.report()
    found = problems(run.stderr, "warning")
    assert found[0] == (f"the data folder {absent} (--data_dir, DATA_DIR) does not exist: point "
                        "it at the folder that holds the datasets, or download them there: "
                        f"python -m dg_plugins.scripts.download --data_dir {absent} PACS"), found
    assert [f for f in found if "PACS_splits" in f]  # the lists too
    assert not run.started_anything() and not run.output_dir.exists()


def test_ip_oop_names_the_clip_weights_and_the_knob_for_a_local_copy(tmp, pacs_without_lists):
    run = run_script("ipoop_domainbed.sh", tmp, pacs_without_lists, tag="clip",
                     timeout=TIMEOUT_S, DATASETS="PACS", HPARAMS='{"pretrained": false}')
    assert run.returncode == 2, run.report()
    (line,) = problems(run.stderr, "error")
    assert line.startswith("scoring images for IP/OOP (ViT-B-16 laion400m_e32): CLIP weights")
    assert line.endswith("With reproduce: --clip_checkpoint FILE (sweeps/*.sh: "
                         "CLIP_CHECKPOINT=FILE).")
    missing = tmp / "absent.bin"
    run = run_script("ipoop_domainbed.sh", tmp, pacs_without_lists, tag="clip_file",
                     timeout=TIMEOUT_S, DATASETS="PACS", HPARAMS='{"pretrained": false}',
                     CLIP_CHECKPOINT=str(missing))
    assert run.returncode == 2, run.report()
    (line,) = problems(run.stderr, "error")
    assert f"--pretrained {str(missing)!r}: no such checkpoint file" in line
    assert not run.started_anything() and not run.output_dir.exists()
