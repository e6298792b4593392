"""``python -m dg_plugins.scripts.download``: every dataset kind downloaded from a local HTTP
server (127.0.0.1 only; every file gets a ``--url`` override) serving tiny archives in the real
archive layouts; resume after a cut connection or a failed run (Range requests with If-Range,
asserted on the server log); corrupted archives; a kill during extraction; a rerun that does
nothing."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from archive_server import (
    ArchiveServer, DOMAINNET_DOMAINS, assert_one_clean_error, closed_port_url, domainnet_files,
    leftovers, mnist_files, office_home_zip, pacs_split_lists, pacs_zip, run_main, terra_files,
    vlcs_tar_gz,
)
from dg_plugins import download as lib
from dg_plugins.registry import DATASETS
from dg_plugins.scripts import download as cli
from support.processes import REPO, command_env

MODULE = "dg_plugins.scripts.download"


@pytest.fixture(autouse=True)
def no_retry_wait(monkeypatch):
    monkeypatch.setattr(lib.fetch, "RETRY_DELAY", 0.0)


def test_list_prints_the_table(capsys):
    code, out, _ = run_main(capsys, "--list")
    assert code == 0
    for source in lib.SOURCES:
        assert source.name in out and source.url in out
    assert "PACS.zip" in out and "unknown" in out  # no checksum known for the Drive copies
    assert "terra_incognita/" in out and "MNIST/raw/" in out
    assert "DomainNet20" in out and "(= DomainNet)" in out
    # the twelve PACS lists: one note for all, saying where the ids come from
    assert "the 12 files above: PACS's official split list" in out and "UNVERIFIED" in out


def test_pacs_download_checks_out_and_a_rerun_sends_no_request(tmp_path, capsys):
    data_dir = tmp_path / "data"
    with ArchiveServer({"PACS.zip": pacs_zip()}) as server:
        code, out, err = run_main(capsys, "--data_dir", data_dir, "PACS", *server.args())
        assert code == 0, err
        assert "no checksum known" in out and "extracted layout checks out" in out
        dataset = DATASETS.get("PACS")(str(data_dir), [], None)
        assert dataset.num_classes == 7 and len(dataset.datasets) == 4
        assert not (data_dir / "downloads").exists()  # archive deleted, folder removed
        assert leftovers(data_dir) == [] and sorted(os.listdir(data_dir)) == ["PACS"]
        requests = list(server.log)
        assert [(r.path, r.status) for r in requests] == [("PACS.zip", 200)]

        code, out, err = run_main(capsys, "--data_dir", data_dir, "PACS", *server.args())
        assert code == 0, err
        assert "PACS: already present" in out and "skipped" in out
        assert server.log == requests  # no request reached the server


def test_vlcs_tar_gz_and_office_home_zip(tmp_path, capsys):
    data_dir = tmp_path / "data"
    files = {"VLCS.tar.gz": vlcs_tar_gz(), "office_home.zip": office_home_zip()}
    with ArchiveServer(files) as server:
        code, out, err = run_main(capsys, "--data_dir", data_dir, "VLCS", "officehome",
                                  "--keep_archives", *server.args())
    assert code == 0, err
    vlcs = DATASETS.get("VLCS")(str(data_dir), [], None)
    assert (vlcs.environment_folders, vlcs.num_classes) == (
        ["Caltech101", "LabelMe", "SUN09", "VOC2007"], 5)
    office = DATASETS.get("OfficeHome")(str(data_dir), [], None)
    assert office.environment_folders[-1] == "Real World" and office.num_classes == 65
    assert (data_dir / "office_home" / "ImageInfo.csv").is_file()
    assert sorted(os.listdir(data_dir / "downloads")) == ["VLCS.tar.gz", "office_home.zip"]


def test_mnist_files_go_to_mnist_raw(tmp_path, capsys):
    from dg_plugins.datasets.mnist import load_mnist

    data_dir = tmp_path / "data"
    files = mnist_files()
    with ArchiveServer(files) as server:
        code, out, err = run_main(capsys, "--data_dir", data_dir, "RotatedMNIST", "ColoredMNIST",
                                  *server.args(sha256=True))
    assert code == 0, err
    assert "RotatedMNIST is built from MNIST's files" in out
    assert out.count("MNIST: downloading 4 file(s)") == 1  # both names need MNIST once
    assert out.count("sha256 verified") == 4
    raw = data_dir / "MNIST" / "raw"
    assert sorted(os.listdir(raw)) == sorted([*files, *(n[:-3] for n in files)])
    images, labels = load_mnist(str(data_dir))
    assert images.shape == (17, 28, 28) and labels.shape == (17,)


def test_terra_incognita_is_built_from_the_annotations(tmp_path, capsys):
    data_dir = tmp_path / "data"
    files, expected = terra_files()
    with ArchiveServer(files) as server:
        code, out, err = run_main(capsys, "--data_dir", data_dir, "TerraIncognita",
                                  *server.args(sha256=True))
    assert code == 0, err
    root = data_dir / "terra_incognita"
    found = {}
    for path in root.rglob("*.jpg"):
        found.setdefault(str(path.parent.relative_to(root)), set()).add(path.name)
    assert found == expected
    assert sorted(os.listdir(root)) == ["location_100", "location_38", "location_43",
                                        "location_46"]
    dataset = DATASETS.get("TerraIncognita")(str(data_dir), [], None)
    assert dataset.num_classes == 10
    # the image annotated "cat" and "dog" is in both folders; the doubly annotated one once
    both = expected["location_38/cat"] & expected["location_38/dog"]
    assert len(both) == 1
    # one image per (location, category), the two-category one twice, the doubly annotated
    # bird once, the location given as a string once; the deer and location 7 nowhere
    assert sum(len(v) for v in expected.values()) == 4 * 10 + 2 + 1 + 1


def test_domain_net_archives_duplicates_and_domainnet20(tmp_path, capsys):
    data_dir = tmp_path / "data"
    files, listed = domainnet_files()
    with ArchiveServer(files) as server:
        code, out, err = run_main(capsys, "--data_dir", data_dir, "DomainNet20",
                                  *server.args(sha256=True))
    assert code == 0, err
    assert "downloading DomainNet20 means downloading DomainNet" in out
    assert "removed 2 duplicate files of the 3" in out
    root = data_dir / "domain_net"
    assert sorted(os.listdir(root)) == list(DOMAINNET_DOMAINS)
    for path in listed:
        assert not (root / path).exists()
        assert (root / path.replace("_000001.jpg", "_000000.jpg")).exists()
    assert DATASETS.get("DomainNet")(str(data_dir), [], None).num_classes == 345
    assert DATASETS.get("DomainNet20")(str(data_dir), [], None).num_classes == 20
    assert "DomainNet20: its 20 classes are in" in out


def test_a_cut_connection_resumes_with_range(tmp_path, capsys):
    data_dir = tmp_path / "data"
    archive = pacs_zip(per_class=3)
    cut = len(archive) // 3
    with ArchiveServer({"PACS.zip": archive}, cut_after={"PACS.zip": cut}) as server:
        etag = server.validators("PACS.zip")[0]
        code, out, err = run_main(capsys, "--data_dir", data_dir, "PACS", *server.args())
    assert code == 0, err
    assert "transfer cut" in out and "remote file changed" not in out
    first, second = server.log
    assert (first.range, first.status, first.body_bytes) == (None, 200, cut)
    # If-Range names the version held: the file did not change, so the server continues it
    assert (second.range, second.if_range, second.status) == (f"bytes={cut}-", etag, 206)
    assert second.body_bytes == len(archive) - cut  # the bytes already there: not fetched again
    assert DATASETS.get("PACS")(str(data_dir), [], None).num_classes == 7


def test_a_failed_run_keeps_the_part_file_and_a_rerun_continues_it(tmp_path, capsys):
    data_dir = tmp_path / "data"
    archive = pacs_zip(per_class=3)
    cut = len(archive) // 2
    with ArchiveServer({"PACS.zip": archive}, cut_after={"PACS.zip": cut}) as server:
        code, out, err = run_main(capsys, "--data_dir", data_dir, "PACS", "--retries", 0,
                                  *server.args())
        assert code == 1
        part = data_dir / "downloads" / "PACS.zip.part"
        assert_one_clean_error(err, "broke off", str(part), "rerun")
        assert part.stat().st_size == cut and not (data_dir / "PACS").exists()
        assert (data_dir / "downloads" / "PACS.zip.part.validators").is_file()

        code, out, err = run_main(capsys, "--data_dir", data_dir, "PACS", *server.args())
    assert code == 0, err
    assert "continuing the partial download" in out
    etag = server.validators("PACS.zip")[0]
    assert [(r.range, r.if_range, r.status) for r in server.log] == [
        (None, None, 200), (f"bytes={cut}-", etag, 206)]
    assert server.log[1].body_bytes == len(archive) - cut
    assert DATASETS.get("PACS")(str(data_dir), [], None).num_classes == 7


@pytest.mark.parametrize("mode", ["ignore_range", "wrong_content_range"])
def test_a_server_that_does_not_resume_properly_restarts_the_file(tmp_path, capsys, mode):
    data_dir = tmp_path / "data"
    archive = pacs_zip()
    downloads = data_dir / "downloads"
    downloads.mkdir(parents=True)
    (downloads / "PACS.zip.part").write_bytes(b"\0" * 100)  # appending to it would corrupt
    with ArchiveServer({"PACS.zip": archive}, **{mode: {"PACS.zip"}}) as server:
        code, out, err = run_main(capsys, "--data_dir", data_dir, "PACS", *server.args())
    assert code == 0, err
    assert server.log[0].range == "bytes=100-"
    if mode == "ignore_range":
        assert "answered 200 to a Range request" in out and len(server.log) == 1
    else:
        assert "Content-Range" in out and server.log[1].range is None  # fresh, full request
        assert server.log[1].body_bytes == len(archive)
    assert DATASETS.get("PACS")(str(data_dir), [], None).num_classes == 7


@pytest.mark.parametrize("name", ["PACS.zip", "VLCS.tar.gz"])
def test_a_corrupted_archive_fails_cleanly(tmp_path, capsys, name):
    data_dir = tmp_path / "data"
    good = pacs_zip() if name == "PACS.zip" else vlcs_tar_gz()
    if name == "PACS.zip":  # flip bytes inside an image: the CRC check fails
        middle = len(good) // 2
        bad = good[:middle] + bytes(b ^ 0xFF for b in good[middle:middle + 64]) + good[
            middle + 64:]
    else:  # a truncated tarball
        bad = good[: len(good) * 2 // 3]
    dataset = "PACS" if name == "PACS.zip" else "VLCS"
    with ArchiveServer({name: bad}) as server:
        code, out, err = run_main(capsys, "--data_dir", data_dir, dataset, *server.args())
    assert code == 1
    assert_one_clean_error(err, name, "a corrupted, incomplete or wrong archive", ".corrupt", "rerun")
    assert not (data_dir / dataset).exists() and leftovers(data_dir) == []
    assert (data_dir / "downloads" / f"{name}.corrupt").is_file()
    assert not (data_dir / "downloads" / name).exists()


def test_a_checksum_mismatch_fails_cleanly(tmp_path, capsys):
    data_dir = tmp_path / "data"
    files = mnist_files()
    with ArchiveServer(files) as server:
        args = server.args(sha256=True)
        wrong = hashlib.sha256(b"something else").hexdigest()
        args += ["--sha256", f"t10k-labels-idx1-ubyte.gz={wrong}"]
        code, out, err = run_main(capsys, "--data_dir", data_dir, "MNIST", *args)
    assert code == 1
    assert_one_clean_error(err, "t10k-labels-idx1-ubyte.gz does not match --sha256", wrong,
                           ".corrupt")
    assert "the table" not in err and not (data_dir / "MNIST").exists()
    assert leftovers(data_dir) == []


def test_the_table_checksum_applies_to_a_mirror(tmp_path, capsys):
    """A --url mirror must serve the original bytes: the table's size is checked (no --sha256)."""
    data_dir = tmp_path / "data"
    with ArchiveServer(mnist_files()) as server:
        code, out, err = run_main(capsys, "--data_dir", data_dir, "MNIST", *server.args())
    assert code == 1
    assert_one_clean_error(err, "train-images-idx3-ubyte.gz", "serves", "9912422",
                           "--sha256 train-images-idx3-ubyte.gz=HEX")
    assert [r.path for r in server.log] == ["train-images-idx3-ubyte.gz"]


def test_offline_or_a_dead_link_is_one_clear_error(tmp_path, capsys):
    data_dir = tmp_path / "data"
    url = closed_port_url("PACS.zip")
    code, out, err = run_main(capsys, "--data_dir", data_dir, "PACS", "--url", f"PACS.zip={url}")
    assert code == 1
    place = str(data_dir / "downloads" / "PACS.zip")
    assert_one_clean_error(err, url, "Connection refused", f"put it at {place}", "rerun")
    with ArchiveServer({}) as server:  # a dead link: 404
        code, out, err = run_main(capsys, "--data_dir", data_dir, "PACS", "--url",
                                  f"PACS.zip={server.url('PACS.zip')}")
    assert code == 1
    assert_one_clean_error(err, "HTTP 404", f"put it at {place}")
    assert not (data_dir / "PACS").exists()


def test_a_file_placed_by_hand_is_used(tmp_path, capsys):
    data_dir = tmp_path / "data"
    (data_dir / "downloads").mkdir(parents=True)
    (data_dir / "downloads" / "PACS.zip").write_bytes(pacs_zip())
    code, out, err = run_main(capsys, "--data_dir", data_dir, "PACS", "--url",
                              f"PACS.zip={closed_port_url('PACS.zip')}")
    assert code == 0, err
    assert "PACS.zip: found in" in out
    assert DATASETS.get("PACS")(str(data_dir), [], None).num_classes == 7


def test_google_drive_without_gdown_names_the_extra(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "gdown", None)  # import gdown raises ImportError
    code, out, err = run_main(capsys, "--data_dir", tmp_path / "data", "PACS")
    assert code == 1
    assert_one_clean_error(err, "drive.google.com", "pip install 'dg_plugins[download]'",
                           "--url PACS.zip=URL")


def test_not_enough_disk_space_stops_before_any_request(tmp_path, capsys, monkeypatch):
    import collections
    import shutil

    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**6, 10**6 - 1000, 1000))
    data_dir = tmp_path / "data"
    with ArchiveServer(mnist_files()) as server:
        code, out, err = run_main(capsys, "--data_dir", data_dir, "MNIST", *server.args())
    assert code == 1
    needed = sum(s.size for s in lib.sources_of("MNIST")) + lib.DATASET_SPECS["MNIST"].extracted_size
    assert_one_clean_error(err, "not enough free disk space", f"needs {lib.human_size(needed)}",
                           f"{lib.human_size(lib.fetch.with_margin(needed))} in all",
                           f"{lib.human_size(1000)} free")
    assert server.log == [] and leftovers(data_dir) == []


def test_an_existing_folder_that_does_not_check_out_is_left_alone(tmp_path, capsys):
    data_dir = tmp_path / "data"
    (data_dir / "PACS" / "photos" / "dog").mkdir(parents=True)
    with ArchiveServer({"PACS.zip": pacs_zip()}) as server:
        code, out, err = run_main(capsys, "--data_dir", data_dir, "PACS", *server.args())
    assert code == 1
    assert_one_clean_error(err, "exists but its layout does not check out", "move it away")
    assert server.log == [] and os.listdir(data_dir / "PACS") == ["photos"]


def test_bad_names_are_usage_errors(tmp_path, capsys):
    for args, needle in ((["PAC"], "did you mean PACS"),
                         (["PACS", "--url", "PACS.zp=http://127.0.0.1:1/x"], "did you mean "
                                                                              "PACS.zip"),
                         (["PACS", "--sha256", "PACS.zip=abc"], "64 hex digits")):
        with pytest.raises(SystemExit) as exit_info:
            cli.main(["--data_dir", str(tmp_path), *args])
        assert exit_info.value.code == 2
        assert needle in capsys.readouterr().err
    code, out, _ = run_main(capsys, "--data_dir", tmp_path, "RotatedMNIST5k")
    assert code == 0 and "built in" in out and "nothing to download" in out


def test_a_kill_during_extraction_leaves_nothing_complete_and_a_rerun_completes(tmp_path):
    """The real command as a subprocess, slowed down while it extracts (a test-only hook), is
    killed with SIGKILL once it has written files into its staging folder; the dataset folder
    must not exist; the rerun removes the stale staging folder, reuses the downloaded archive
    (no request) and completes."""
    data_dir = tmp_path / "data"
    staging = data_dir / ".PACS.download-tmp"
    with ArchiveServer({"PACS.zip": pacs_zip()}) as server:
        args = ["--data_dir", str(data_dir), "PACS", *server.args()]
        env = command_env(**{lib.TEST_DELAY_ENV: "0.2"})
        proc = subprocess.Popen([sys.executable, "-m", MODULE, *args], env=env, cwd=REPO,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            seen = []
            for line in proc.stdout:  # the marker line, then files under the staging folder
                seen.append(line)
                if "extracting PACS.zip into" in line:
                    break
            else:
                raise AssertionError("no extraction marker:\n" + "".join(seen))
            deadline = time.monotonic() + 30
            while not any(p.is_file() for p in staging.rglob("*")):
                assert time.monotonic() < deadline, "nothing extracted within 30 s"
                time.sleep(0.02)
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()
        assert proc.returncode == -signal.SIGKILL
        assert not (data_dir / "PACS").exists() and staging.is_dir()
        requests = list(server.log)

        rerun = subprocess.run([sys.executable, "-m", MODULE, *args], env=command_env(),
                               cwd=REPO, capture_output=True, text=True, timeout=120)
        assert rerun.returncode == 0, rerun.stdout + rerun.stderr
        assert "left by an interrupted run" in rerun.stdout
        assert "PACS.zip: found in" in rerun.stdout
        assert server.log == requests  # the archive was complete: not fetched again
    assert leftovers(data_dir) == []
    assert DATASETS.get("PACS")(str(data_dir), [], None).num_classes == 7


def test_an_archive_whose_layout_does_not_check_out_leaves_nothing(tmp_path, capsys):
    """A PACS.zip without the class "person" (6 classes): the staged layout is rejected."""
    from archive_server import PACS_CLASSES, PACS_DOMAINS, image_tree, zip_bytes

    data_dir = tmp_path / "data"
    six = zip_bytes(image_tree("kfold", PACS_DOMAINS, PACS_CLASSES[:-1]))
    with ArchiveServer({"PACS.zip": six}) as server:
        code, out, err = run_main(capsys, "--data_dir", data_dir, "PACS", *server.args())
    assert code == 1
    assert_one_clean_error(err, "has 6 classes, the standard PACS has 7",
                           f"Nothing was put in {data_dir / 'PACS'}")
    assert not (data_dir / "PACS").exists() and leftovers(data_dir) == []


def test_without_a_terminal_progress_is_a_line_per_tenth_with_the_rate():
    """A line at every tenth of the file, with the rate since the last line (a clock the test
    sets: 0.5 s per 50 bytes, 100 B/s)."""
    lines, now = [], [0.0]
    report = lib.Reporter(out=lines.append, progress=False, clock=lambda: now[0])
    with report.transfer("PACS.zip", total=1000, initial=200) as update:
        for _ in range(16):
            now[0] += 0.5
            update(50)
    assert lines == [f"  PACS.zip: {p}% {lib.human_size(p * 10)} of 1.0 KB, 100 B/s"
                     for p in range(30, 101, 10)]


def test_a_data_dir_that_is_a_file_is_one_clear_error(tmp_path, capsys):
    (tmp_path / "data").write_text("")
    code, out, err = run_main(capsys, "--data_dir", tmp_path / "data", "PACS")
    assert code == 1
    assert_one_clean_error(err, str(tmp_path / "data"))


# --- PACS_splits: PACS's official split lists --------------------------------------------------

OFFICIAL = {"data_split": "official"}


def list_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith("_kfold.txt"))


def listed_paths(data: bytes) -> list[str]:
    return [line.split()[0] for line in data.decode().splitlines() if line.strip()]


def test_pacs_splits_come_after_pacs_are_read_by_the_official_split_and_a_rerun_does_nothing(
        tmp_path, capsys):
    data_dir = tmp_path / "data"
    lists = pacs_split_lists(per_class=2)
    assert len(lists) == 12 and set(lists) == {s.name for s in lib.sources_of("PACS_splits")}
    from dg_plugins.datasets.image_folder import PACS_SPLITS_URL

    assert lib.sources.PACS_AUTHORS_FOLDER == PACS_SPLITS_URL  # one folder named in both places
    with ArchiveServer({"PACS.zip": pacs_zip(per_class=2), **lists}) as server:
        # asked in the other order: PACS (whose images the lists name) comes first
        code, out, err = run_main(capsys, "--data_dir", data_dir, "PACS_splits", "PACS",
                                  *server.args())
        assert code == 0, err
        assert out.index("PACS: done") < out.index("PACS_splits: downloading 12 list(s)")
        assert out.count("every line names an image of PACS with its class") == 12
        assert out.count("UNVERIFIED") == 1  # the lists' long note once, then "as above"
        assert "--hparams '{\"data_split\": \"official\"}'" in out
        table_order = [source.name for source in lib.sources_of("PACS_splits")]
        assert [r.path for r in server.log] == ["PACS.zip", *table_order]
        folder = data_dir / "PACS"
        assert list_files(folder) == sorted(lists)
        assert all((folder / name).read_bytes() == data for name, data in lists.items())
        assert sorted(os.listdir(data_dir)) == ["PACS"]  # no downloads/, staging or lock left
        # PACS's data_split "official" reads them: sources train/crossval, target test/crossval
        dataset = DATASETS.get("PACS")(str(data_dir), [3], OFFICIAL)
        for index, domain in enumerate(dataset.environment_folders):
            paths = dataset.datasets[index].relative_paths()
            in_, out_ = dataset.predefined_split(index)
            kind = "test" if index == 3 else "train"
            assert [paths[i] for i in in_] == listed_paths(lists[f"{domain}_{kind}_kfold.txt"])
            assert [paths[i] for i in out_] == listed_paths(lists[f"{domain}_crossval_kfold.txt"])
        requests = list(server.log)

        code, out, err = run_main(capsys, "--data_dir", data_dir, "PACS", "PACS_splits",
                                  *server.args())
        assert code == 0, err
        assert "PACS: already present" in out
        assert "PACS_splits: already present (the 12 lists in" in out
        assert server.log == requests  # no request reached the server

        # lists missing from a complete set (e.g. a run killed while moving them into place):
        # only those are fetched, the others stay as they are
        kept = {name: (folder / name).stat().st_ino for name in lists}
        (folder / "sketch_test_kfold.txt").unlink()
        (folder / "cartoon_train_kfold.txt").unlink()
        code, out, err = run_main(capsys, "--data_dir", data_dir, "PACS_splits", *server.args())
        assert code == 0, err
        assert "2 of the 12 lists missing" in out and "downloading 2 list(s)" in out
        assert [r.path for r in server.log[len(requests):]] == [
            "cartoon_train_kfold.txt", "sketch_test_kfold.txt"]
        assert list_files(folder) == sorted(lists)
        assert all((folder / n).stat().st_ino == kept[n] for n in lists
                   if n not in ("sketch_test_kfold.txt", "cartoon_train_kfold.txt"))


def test_pacs_splits_without_pacs_fail_before_any_request(tmp_path, capsys):
    data_dir = tmp_path / "data"
    with ArchiveServer(pacs_split_lists()) as server:
        code, out, err = run_main(capsys, "--data_dir", data_dir, "PACS_splits", *server.args())
    assert code == 1
    assert_one_clean_error(
        err, "PACS_splits: the lists name PACS's images", f"{data_dir / 'PACS'} does not exist",
        f"python -m dg_plugins.scripts.download --data_dir {data_dir} PACS PACS_splits")
    assert server.log == [] and not (data_dir / "PACS").exists()


def test_malformed_lists_put_no_list_in_place_and_a_rerun_fetches_only_them(tmp_path, capsys):
    """A line naming no image, and a line whose label is not its class: PACS's list reader
    refuses both; none of the twelve lists goes into PACS/ (nothing looks complete), the two
    go to .corrupt, the ten good ones are kept; a rerun fetches only the two."""
    data_dir = tmp_path / "data"
    good = pacs_split_lists()
    bad = dict(good)
    bad["photo_train_kfold.txt"] = good["photo_train_kfold.txt"] + b"photo/dog/not_there.jpg 1\n"
    bad["sketch_crossval_kfold.txt"] = (good["sketch_crossval_kfold.txt"]
                                        + b"sketch/dog/img_0.jpg 3\n")  # dog is class 1
    with ArchiveServer({"PACS.zip": pacs_zip(), **bad}) as server:
        code, out, err = run_main(capsys, "--data_dir", data_dir, "PACS", "PACS_splits",
                                  *server.args())
        assert code == 1
        downloads = data_dir / "downloads"
        first, summary = err.splitlines()
        assert summary == "error: not downloaded: PACS_splits (the reasons above); ready: PACS"
        assert_one_clean_error(
            first, "PACS_splits: 1 of the", f"{downloads / 'photo_train_kfold.txt'} name no image",
            "photo/dog/not_there.jpg", "and 1 other list(s): sketch_crossval_kfold.txt",
            f"Nothing was put in {data_dir / 'PACS'}", "rerun")
        assert list_files(data_dir / "PACS") == [] and leftovers(data_dir) == []
        assert sorted(p for p in os.listdir(downloads) if p.endswith(".corrupt")) == [
            "photo_train_kfold.txt.corrupt", "sketch_crossval_kfold.txt.corrupt"]
        assert len([p for p in os.listdir(downloads) if p.endswith("_kfold.txt")]) == 10
        # the PACS images themselves are in place, and the official split still refuses to run
        assert DATASETS.get("PACS")(str(data_dir), [], None).num_classes == 7
        with pytest.raises(FileNotFoundError, match="missing"):
            DATASETS.get("PACS")(str(data_dir), [0], OFFICIAL)
        requests = len(server.log)

        server.files.update(good)
        code, out, err = run_main(capsys, "--data_dir", data_dir, "PACS_splits", *server.args())
    assert code == 0, err
    assert sorted(r.path for r in server.log[requests:]) == [
        "photo_train_kfold.txt", "sketch_crossval_kfold.txt"]
    assert out.count("_kfold.txt: found in") == 10
    assert list_files(data_dir / "PACS") == sorted(good)
    DATASETS.get("PACS")(str(data_dir), [0], OFFICIAL)


def test_a_list_already_there_that_does_not_read_is_left_alone(tmp_path, capsys):
    data_dir = tmp_path / "data"
    with ArchiveServer({"PACS.zip": pacs_zip(), **pacs_split_lists()}) as server:
        code, out, err = run_main(capsys, "--data_dir", data_dir, "PACS", *server.args())
        assert code == 0, err
        wrong = data_dir / "PACS" / "cartoon_crossval_kfold.txt"
        wrong.write_text("cartoon/dog/img_0.jpg 2\n")  # dog is class 1
        requests = list(server.log)
        code, out, err = run_main(capsys, "--data_dir", data_dir, "PACS_splits", *server.args())
    assert code == 1
    assert_one_clean_error(err, f"{wrong}", "disagree with the class folders",
                           "were left as they are", "move the list that does not read away")
    assert wrong.read_text() == "cartoon/dog/img_0.jpg 2\n" and server.log == requests


def test_the_datasets_errors_name_the_command_that_fixes_them(tmp_path, capsys):
    """The commands that PACS's missing-folder and missing-lists errors print, run as given
    (plus this server's --url), make the dataset and then its official split read."""
    import re
    import shlex

    data_dir = tmp_path / "data"
    pacs = DATASETS.get("PACS")
    command = re.compile(r"python -m dg_plugins\.scripts\.download (--data_dir \S+ \w+)")
    with ArchiveServer({"PACS.zip": pacs_zip(), **pacs_split_lists()}) as server:
        for fixes in ("PACS", "PACS_splits"):
            with pytest.raises(FileNotFoundError) as error:
                pacs(str(data_dir), [0], OFFICIAL)
            found = command.findall(str(error.value))
            assert found == [f"--data_dir {data_dir} {fixes}"], str(error.value)
            code, out, err = run_main(capsys, *shlex.split(found[0]), *server.args())
            assert code == 0, err
    assert len(pacs(str(data_dir), [0], OFFICIAL).predefined_split(0)[0]) > 0
