"""The downloader's edges, each against a local HTTP server (127.0.0.1 only) that misbehaves as
asked: an archive without a top folder; two downloads sharing ``downloads/``; a server that
trickles; an HTML page, a short answer or a truncated zip instead of the file; a full disk; an
overstated Content-Length (416); what earlier runs left; ``file:`` URLs; ``download all`` without
gdown; unsafe archive members; the messages; a torch-free command; a file that changes between
two requests (If-Range). The tests wait for the run
through the server (a held response), never for a speed."""

from __future__ import annotations

import errno
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from archive_server import (
    PACS_CLASSES, PACS_DOMAINS, ArchiveServer, assert_one_clean_error, closed_port_url,
    domainnet_files, image_tree, leftovers, mnist_files, pacs_split_lists, pacs_zip, part_size,
    run_main, tar_gz_bytes, tiny_jpeg, vlcs_tar_gz, wait_for, zip_bytes,
)
from dg_plugins import download as lib
from dg_plugins.registry import DATASETS
from support.processes import REPO, as_from_a_terminal, command_env

MODULE = "dg_plugins.scripts.download"
QUOTA_PAGE = (b"<!DOCTYPE html><html><head><title>Google Drive - Quota exceeded</title></head>"
              b"<body>Too many users have viewed or downloaded this file recently.</body></html>")


@pytest.fixture(autouse=True)
def no_retry_wait(monkeypatch):
    monkeypatch.setattr(lib.fetch, "RETRY_DELAY", 0.0)


def pacs_ok(data_dir: Path) -> bool:
    return DATASETS.get("PACS")(str(data_dir), [], None).num_classes == 7


def in_thread(target, *args) -> tuple[threading.Thread, dict]:
    """Run ``target(*args)`` in a thread; the dict gets "result" or "error"."""
    outcome: dict = {}

    def run():
        try:
            outcome["result"] = target(*args)
        except BaseException as err:  # noqa: BLE001  (reported by the test)
            outcome["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


# --- 1. an archive without a top folder ------------------------------------------------------


def test_a_zip_whose_domain_folders_sit_at_its_root_is_accepted(tmp_path, capsys):
    """``cd kfold && zip -r ../PACS.zip .``: no top folder; taken as it is, nothing left."""
    data_dir = tmp_path / "data"
    members = {path.split("/", 1)[1]: data for path, data in image_tree(
        "kfold", PACS_DOMAINS, PACS_CLASSES).items()}
    with ArchiveServer({"PACS.zip": zip_bytes(members)}) as server:
        code, out, err = run_main(capsys, "--data_dir", data_dir, "PACS", *server.args())
    assert code == 0, err
    assert pacs_ok(data_dir)
    assert sorted(os.listdir(data_dir)) == ["PACS"]  # no staging, lock or downloads/ left


# --- 2. two downloads into one data_dir ----------------------------------------------------


def test_two_downloads_into_one_data_dir_do_not_break_each_other(tmp_path, capsys):
    """VLCS starts and waits for its server's answer (held by the test) while PACS runs to the
    end: PACS must leave the shared downloads/ folder to VLCS, which then completes and removes
    it."""
    data_dir = tmp_path / "data"
    release = threading.Event()
    files = {"PACS.zip": pacs_zip(), "VLCS.tar.gz": vlcs_tar_gz()}
    with ArchiveServer(files, hold={"VLCS.tar.gz": (0, release)}) as server:
        options = lib.Options(urls={"VLCS.tar.gz": server.url("VLCS.tar.gz")})
        vlcs_lines: list[str] = []
        thread, outcome = in_thread(lib.download, ["VLCS"], str(data_dir), options,
                                    lib.Reporter(out=vlcs_lines.append))
        try:
            wait_for(lambda: "VLCS.tar.gz" in server.holding, "VLCS's request")
            code, out, err = run_main(capsys, "--data_dir", data_dir, "PACS",
                                      *server.args(["PACS.zip"]))
            assert code == 0, err
            assert (data_dir / "downloads").is_dir()  # VLCS still uses it
        finally:
            release.set()
            thread.join(60)
    assert outcome == {"result": [("VLCS", "downloaded")]}, (outcome, vlcs_lines)
    assert pacs_ok(data_dir) and DATASETS.get("VLCS")(str(data_dir), [], None).num_classes == 5
    assert sorted(os.listdir(data_dir)) == ["PACS", "VLCS"]  # the last one out removed it


# --- 3. a server that trickles ---------------------------------------------------------------


def test_bytes_reach_the_part_file_as_they_arrive(tmp_path):
    """The server sends 300 bytes and holds the rest: the .part holds them (not after a whole
    1 MiB read)."""
    data_dir = tmp_path / "data"
    release = threading.Event()
    archive = pacs_zip()
    part = data_dir / "downloads" / "PACS.zip.part"
    with ArchiveServer({"PACS.zip": archive}, hold={"PACS.zip": (300, release)}) as server:
        options = lib.Options(urls={"PACS.zip": server.url("PACS.zip")})
        thread, outcome = in_thread(lib.download, ["PACS"], str(data_dir), options,
                                    lib.Reporter(out=lambda line: None))
        try:
            wait_for(lambda: part_size(part) == 300, "300 bytes in the .part file")
        finally:
            release.set()
            thread.join(60)
    assert outcome == {"result": [("PACS", "downloaded")]}, outcome
    assert [(r.range, r.status, r.body_bytes) for r in server.log] == [(None, 200, len(archive))]


def test_a_trickle_below_the_minimum_rate_is_cut_and_resumed_from_the_bytes_held(
        tmp_path, capsys, monkeypatch):
    """300 bytes, then one byte every 50 ms (20 B/s): below 1000 B/s over 0.4 s, the transfer
    counts as cut and continues with a Range request from the bytes in the .part; progress
    lines (bytes and rate) appear meanwhile."""
    monkeypatch.setattr(lib.fetch, "MIN_RATE", 1000)
    monkeypatch.setattr(lib.fetch, "RATE_WINDOW", 0.4)
    monkeypatch.setattr(lib.fetch, "PROGRESS_INTERVAL", 0.1)
    data_dir = tmp_path / "data"
    archive = pacs_zip()
    with ArchiveServer({"PACS.zip": archive}, trickle={"PACS.zip": (300, 0.05)}) as server:
        code, out, err = run_main(capsys, "--data_dir", data_dir, "PACS", *server.args())
    assert code == 0, err
    match = re.search(r"PACS.zip: transfer cut \(\d+ B/s over the last [\d.]+ s, below the "
                      r"minimum 1\.0 KB/s\); continuing from byte (\d+)", out)
    assert match, out
    held = int(match.group(1))
    assert held >= 300
    first, second = sorted(server.log, key=lambda r: r.status)  # logged as they end
    assert (first.range, first.status) == (None, 200)
    assert (second.range, second.status, second.body_bytes) == (
        f"bytes={held}-", 206, len(archive) - held)
    assert re.search(r"  PACS.zip: \d+% \d+ B of [\d.]+ KB, \d+ B/s", out), out
    assert pacs_ok(data_dir)


def test_on_a_terminal_the_bar_shows_bytes_and_rate(capsys):
    import time

    report = lib.Reporter(progress=True)
    with report.transfer("PACS.zip", total=4096, initial=0) as update:
        update(1024)
        time.sleep(0.2)  # past tqdm's minimum interval between two displays
        update(1024)
    err = capsys.readouterr().err
    assert "PACS.zip" in err and "2.00k/4.00k" in err
    assert re.search(r"\d[\d.]*[kM]?B/s", err), err


# --- 4. something else than the file --------------------------------------------------------


def test_an_html_page_is_named_with_the_fix_and_no_rerun(tmp_path, capsys):
    data_dir = tmp_path / "data"
    with ArchiveServer({"PACS.zip": QUOTA_PAGE},
                       content_type={"PACS.zip": "text/html; charset=utf-8"}) as server:
        code, out, err = run_main(capsys, "--data_dir", data_dir, "PACS", *server.args())
    assert code == 1
    assert_one_clean_error(err, "answered with an HTML page ('Google Drive - Quota exceeded'), "
                                "not a zip", "Google Drive's quota or virus-scan page?",
                           f"put it at {data_dir / 'downloads' / 'PACS.zip'}", "--url PACS.zip=")
    assert "rerun" not in err
    assert leftovers(data_dir) == [] and not (data_dir / "downloads").exists()


def test_an_html_page_served_as_a_binary_is_named_too(tmp_path, capsys):
    data_dir = tmp_path / "data"
    with ArchiveServer({"PACS.zip": QUOTA_PAGE},
                       content_type={"PACS.zip": "application/octet-stream"}) as server:
        code, out, err = run_main(capsys, "--data_dir", data_dir, "PACS", *server.args())
    assert code == 1
    assert_one_clean_error(err, "sent an HTML page ('Google Drive - Quota exceeded'), not a zip",
                           "Google Drive's quota", "PACS.zip.corrupt")
    assert "rerun" not in err and leftovers(data_dir) == []


@pytest.mark.parametrize("how", ["short Content-Length", "truncated file"])
def test_a_truncated_zip_is_named_and_a_rerun_is_not_offered(tmp_path, capsys, how):
    data_dir = tmp_path / "data"
    archive = pacs_zip()
    half = len(archive) // 2
    if how == "short Content-Length":  # announces and sends half of it
        server = ArchiveServer({"PACS.zip": archive}, content_length={"PACS.zip": half})
    else:
        server = ArchiveServer({"PACS.zip": archive[:half]})
    with server:
        code, out, err = run_main(capsys, "--data_dir", data_dir, "PACS", *server.args())
    assert code == 1
    assert_one_clean_error(err, f"sent a truncated zip ({half} bytes",
                           "a rerun would fetch the same bytes", "--url PACS.zip=URL")
    assert "tar" not in err.lower() and "rerun to" not in err
    assert (data_dir / "downloads" / "PACS.zip.corrupt").is_file() and leftovers(data_dir) == []


# --- 5. a full disk ----------------------------------------------------------------------------


def enospc() -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_the_free_space_check_counts_blocks_and_a_margin(tmp_path, capsys, monkeypatch):
    """308 images of ~0.6 KB take 308 blocks once extracted: a disk with room for their bytes
    and the margin, but not their blocks, is refused before extracting; the archive stays."""
    import collections

    data_dir = tmp_path / "data"
    archive = zip_bytes(image_tree("kfold", PACS_DOMAINS, PACS_CLASSES, per_class=11))
    data_dir.mkdir()
    block = lib.prepare.block_size(str(data_dir))
    content = 308 * len(tiny_jpeg())
    blocks = 308 * (-(-len(tiny_jpeg()) // block)) * block
    free = lib.fetch.with_margin(max(len(archive), content)) + 1000
    if lib.fetch.with_margin(blocks) <= free:
        pytest.skip(f"{block}-byte blocks: the images fill their blocks")
    usage = collections.namedtuple("usage", "total used free")
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(real(path).total, 0, free))
    with ArchiveServer({"PACS.zip": archive}) as server:
        code, out, err = run_main(capsys, "--data_dir", data_dir, "PACS", *server.args())
    assert code == 1
    assert_one_clean_error(err, "not enough free disk space", "extracting PACS.zip",
                           "the disk mounted at", f"{lib.human_size(free)} free")
    assert (data_dir / "downloads" / "PACS.zip").read_bytes() == archive  # kept, not .corrupt
    assert leftovers(data_dir) == [] and not (data_dir / "PACS").exists()


def test_a_disk_that_fills_during_extraction_is_named_and_the_staging_removed(
        tmp_path, capsys, monkeypatch):
    data_dir = tmp_path / "data"
    real = shutil.copyfileobj
    calls = []

    def fill_up(source, target, length=0):
        calls.append(target.name)
        if len(calls) == 3:
            raise enospc()
        return real(source, target, length)

    monkeypatch.setattr(lib.prepare.shutil, "copyfileobj", fill_up)
    with ArchiveServer({"PACS.zip": pacs_zip()}) as server:
        code, out, err = run_main(capsys, "--data_dir", data_dir, "PACS", *server.args())
    assert code == 1
    assert_one_clean_error(err, "PACS: no space left on the disk mounted at",
                           f"holding {data_dir}", "while extracting PACS",
                           "half-extracted files were removed",
                           f"kept in {data_dir / 'downloads'}")
    assert "corrupt" not in err and "offline" not in err
    assert os.listdir(data_dir / "downloads") == ["PACS.zip"]
    assert leftovers(data_dir) == [] and not (data_dir / "PACS").exists()


def test_a_disk_that_fills_during_a_transfer_of_unknown_size_is_named_and_the_part_removed(
        tmp_path, capsys, monkeypatch):
    data_dir = tmp_path / "data"
    real_open = open

    class FillingFile:
        def __init__(self, handle):
            self.handle, self.written = handle, 0

        def write(self, block):
            if self.written + len(block) > 1000:
                self.handle.write(block[:1000 - self.written])
                self.written = 1000
                raise enospc()
            self.written += len(block)
            return self.handle.write(block)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.handle.close()

    def filling_open(path, mode="r", *args, **kwargs):
        handle = real_open(path, mode, *args, **kwargs)
        return FillingFile(handle) if str(path).endswith(".part") else handle

    monkeypatch.setattr(lib.fetch, "open", filling_open, raising=False)
    with ArchiveServer({"PACS.zip": pacs_zip(per_class=3)}) as server:
        code, out, err = run_main(capsys, "--data_dir", data_dir, "PACS", *server.args())
    assert code == 1
    assert_one_clean_error(err, "no space left on the disk mounted at", "downloading PACS.zip",
                           "its size is unknown", "removed to give the space back")
    assert "offline" not in err and "dead link" not in err
    assert not (data_dir / "downloads" / "PACS.zip.part").exists() and leftovers(data_dir) == []


# --- 6. 416: the bytes held are the whole file ----------------------------------------------


def test_an_overstated_content_length_ends_with_416_and_counts_as_complete(tmp_path, capsys):
    data_dir = tmp_path / "data"
    archive = pacs_zip()
    with ArchiveServer({"PACS.zip": archive}, content_length={"PACS.zip": len(archive) + 100},
                       request_limit=6) as server:
        code, out, err = run_main(capsys, "--data_dir", data_dir, "PACS", *server.args())
    assert code == 0, err
    assert f"the server holds {len(archive)} bytes, all of them received" in out
    assert [(r.range, r.status) for r in server.log] == [
        (None, 200), (f"bytes={len(archive)}-", 416)]
    assert pacs_ok(data_dir)


def test_a_complete_part_of_an_unknown_size_file_is_not_fetched_again(tmp_path, capsys):
    data_dir = tmp_path / "data"
    archive = pacs_zip()
    (data_dir / "downloads").mkdir(parents=True)
    (data_dir / "downloads" / "PACS.zip.part").write_bytes(archive)
    with ArchiveServer({"PACS.zip": archive}, request_limit=4) as server:
        code, out, err = run_main(capsys, "--data_dir", data_dir, "PACS", *server.args())
    assert code == 0, err
    assert [(r.range, r.status) for r in server.log] == [(f"bytes={len(archive)}-", 416)]
    assert pacs_ok(data_dir)


# --- 7. what earlier runs left -------------------------------------------------------------


def test_a_run_stopped_after_its_final_rename_leaves_nothing_a_rerun_keeps(
        tmp_path, capsys, monkeypatch):
    """The run stops right after the dataset's folder is renamed into place (here: an
    interruption where the staging folder is removed; a kill -9 there leaves the same, plus the
    lock file): the rerun says "already present" and removes the archive."""
    data_dir = tmp_path / "data"
    real_rmtree = shutil.rmtree

    def interrupted(path, *args, **kwargs):
        if str(path).endswith(".PACS.download-tmp") and (data_dir / "PACS").exists():
            raise KeyboardInterrupt
        return real_rmtree(path, *args, **kwargs)

    with ArchiveServer({"PACS.zip": pacs_zip()}) as server:
        monkeypatch.setattr(shutil, "rmtree", interrupted)
        code, out, err = run_main(capsys, "--data_dir", data_dir, "PACS", *server.args())
        monkeypatch.setattr(shutil, "rmtree", real_rmtree)
        assert code == 130 and pacs_ok(data_dir)
        (data_dir / ".PACS.download-lock").write_text("")  # as a kill -9 leaves it
        requests = list(server.log)
        code, out, err = run_main(capsys, "--data_dir", data_dir, "PACS", *server.args())
    assert code == 0, err
    assert "PACS: already present" in out
    assert "left by an interrupted run, with PACS.zip (no longer needed)" in out
    assert server.log == requests
    assert sorted(os.listdir(data_dir)) == ["PACS"]  # no archive, staging, lock or downloads/


def test_files_kept_in_downloads_are_named_and_stale_parts_removed(tmp_path, capsys):
    data_dir = tmp_path / "data"
    with ArchiveServer({"PACS.zip": pacs_zip()}) as server:
        code, out, err = run_main(capsys, "--data_dir", data_dir, "PACS", "--keep_archives",
                                  *server.args())
        assert code == 0, err
        downloads = data_dir / "downloads"
        (downloads / "PACS.zip.part").write_bytes(b"x" * 10)
        (downloads / "PACS.zip.part.validators").write_text('{"etag": "\\"x\\""}')
        code, out, err = run_main(capsys, "--data_dir", data_dir, "PACS", *server.args())
    assert code == 0, err
    assert f"removed {downloads / 'PACS.zip'}.part, left by an interrupted run" in out
    assert f"{downloads / 'PACS.zip'} (" in out and "not needed any more" in out
    assert os.listdir(downloads) == ["PACS.zip"]  # kept: it may have been kept on purpose


def test_corrupt_files_go_after_a_later_success_and_failures_leave_no_lock(tmp_path, capsys):
    data_dir = tmp_path / "data"
    archive = pacs_zip()
    middle = len(archive) // 2  # bytes flipped inside an image: its CRC check fails
    broken = (archive[:middle] + bytes(b ^ 0xFF for b in archive[middle:middle + 64])
              + archive[middle + 64:])
    with ArchiveServer({"PACS.zip": broken}) as server:
        code, out, err = run_main(capsys, "--data_dir", data_dir, "PACS", *server.args())
        assert code == 1 and "a corrupted, incomplete or wrong archive" in err
        corrupt = data_dir / "downloads" / "PACS.zip.corrupt"
        assert corrupt.is_file() and leftovers(data_dir) == []
        server.files["PACS.zip"] = archive
        code, out, err = run_main(capsys, "--data_dir", data_dir, "PACS", *server.args())
    assert code == 0, err
    assert f"removed {corrupt}, set aside by an earlier run" in out
    assert sorted(os.listdir(data_dir)) == ["PACS"]


# --- 8. file: URLs ----------------------------------------------------------------------------


def test_a_file_url_is_copied(tmp_path, capsys):
    data_dir = tmp_path / "data"
    mirror = tmp_path / "mirror" / "PACS.zip"
    mirror.parent.mkdir()
    mirror.write_bytes(pacs_zip())
    code, out, err = run_main(capsys, "--data_dir", data_dir, "PACS",
                              "--url", f"PACS.zip={mirror.as_uri()}")
    assert code == 0, err
    assert pacs_ok(data_dir) and mirror.is_file() and sorted(os.listdir(data_dir)) == ["PACS"]

    missing = (tmp_path / "nowhere" / "VLCS.tar.gz").as_uri()
    code, out, err = run_main(capsys, "--data_dir", data_dir, "VLCS", "--url",
                              f"VLCS.tar.gz={missing}")
    assert code == 1
    assert_one_clean_error(err, f"--url VLCS.tar.gz={missing}", "is not a file")
    assert leftovers(data_dir) == []


def test_an_unsupported_url_scheme_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_main(capsys, "--data_dir", tmp_path, "PACS", "--url", "PACS.zip=ftp://host/PACS.zip")
    assert exit_info.value.code == 2
    assert "unsupported URL scheme 'ftp'" in capsys.readouterr().err
    assert not (tmp_path / "downloads").exists()


# --- 9. download all without gdown -----------------------------------------------------------


def test_all_without_gdown_goes_on_and_lists_what_failed(tmp_path, capsys, monkeypatch):
    """Google Drive sources fail (no gdown), TerraIncognita and DomainNet meet a refused
    connection; MNIST, last in the order, is still downloaded; every failure is listed."""
    monkeypatch.setitem(sys.modules, "gdown", None)
    data_dir = tmp_path / "data"
    refused = []
    for source in lib.sources_of("TerraIncognita") + lib.sources_of("DomainNet"):
        refused += ["--url", f"{source.name}={closed_port_url(source.name)}",
                    "--sha256", f"{source.name}=none"]
    with ArchiveServer(mnist_files()) as server:
        code, out, err = run_main(capsys, "--data_dir", data_dir, "all", *refused,
                                  *server.args(sha256=True))
    assert code == 1
    assert "PACS: failed (the reason is given at the end); going on with PACS_splits" in out
    assert "MNIST: done" in out
    lines = err.splitlines()
    assert len(lines) == 7 and all(line.startswith("error: ") for line in lines), err
    assert "pip install 'dg_plugins[download]'" in lines[0] and "PACS.zip" in lines[0]
    assert lines[1] == "error: PACS_splits: not attempted: its files join PACS, which failed"
    assert "VLCS.tar.gz" in lines[2] and "office_home.zip" in lines[3]
    assert "Connection refused" in lines[4] and "Connection refused" in lines[5]
    assert lines[6] == ("error: not downloaded: PACS, PACS_splits, VLCS, OfficeHome, "
                        "TerraIncognita, DomainNet (the reasons above); ready: MNIST")
    assert (data_dir / "MNIST" / "raw").is_dir() and leftovers(data_dir) == []


# --- 10. unsafe archive members --------------------------------------------------------------


def test_unsafe_zip_members_are_dropped_and_named(tmp_path, capsys):
    data_dir = tmp_path / "data"
    members = image_tree("kfold", PACS_DOMAINS, PACS_CLASSES)
    members["../escape.jpg"] = tiny_jpeg()
    members["/absolute.jpg"] = tiny_jpeg()
    archive = zip_bytes(members, symlinks={"kfold/photo/dog/link.jpg": "../../../../etc/passwd"})
    with ArchiveServer({"PACS.zip": archive}) as server:
        code, out, err = run_main(capsys, "--data_dir", data_dir, "PACS", *server.args())
    assert code == 0, err
    assert ("PACS.zip: dropped 3 unsafe member(s) (links, devices and paths outside the archive "
            "are never extracted): '../escape.jpg' (a path outside the archive's folder), "
            "'/absolute.jpg' (a path outside the archive's folder), "
            "'kfold/photo/dog/link.jpg' (a symbolic link)") in out
    assert not (data_dir / "PACS" / "photo" / "dog" / "link.jpg").exists()
    assert not (tmp_path / "escape.jpg").exists() and not (data_dir / "escape.jpg").exists()
    assert pacs_ok(data_dir)


def test_unsafe_tar_members_are_dropped_and_named_by_the_same_policy(tmp_path, capsys):
    data_dir = tmp_path / "data"
    from archive_server import VLCS_CLASSES, VLCS_DOMAINS

    members = image_tree("VLCS", VLCS_DOMAINS, VLCS_CLASSES)
    members["VLCS/../../escape.jpg"] = tiny_jpeg()
    archive = tar_gz_bytes(members, symlinks={"VLCS/SUN09/dog/link.jpg": "/etc/passwd"},
                           devices=("VLCS/LabelMe/car/null.jpg",))
    with ArchiveServer({"VLCS.tar.gz": archive}) as server:
        code, out, err = run_main(capsys, "--data_dir", data_dir, "VLCS", *server.args())
    assert code == 0, err
    assert ("VLCS.tar.gz: dropped 3 unsafe member(s) (links, devices and paths outside the "
            "archive are never extracted): 'VLCS/../../escape.jpg' (a path outside the archive's "
            "folder), 'VLCS/SUN09/dog/link.jpg' (a symbolic link), 'VLCS/LabelMe/car/null.jpg' "
            "(a device file)") in out
    assert not (data_dir / "VLCS" / "SUN09" / "dog" / "link.jpg").exists()
    assert not (data_dir / "VLCS" / "LabelMe" / "car" / "null.jpg").exists()
    assert DATASETS.get("VLCS")(str(data_dir), [], None).num_classes == 5


# --- 11. messages, and a torch-free command ---------------------------------------------------


def test_no_part_file_is_named_when_no_byte_arrived(tmp_path, capsys):
    data_dir = tmp_path / "data"
    with ArchiveServer({"PACS.zip": pacs_zip()}, cut_after={"PACS.zip": 0}) as server:
        code, out, err = run_main(capsys, "--data_dir", data_dir, "PACS", "--retries", 0,
                                  *server.args())
    assert code == 1
    assert_one_clean_error(err, "broke off", "no byte of it arrived", "rerun this command")
    assert ".part" not in err and "0 bytes" not in err
    assert not (data_dir / "downloads").exists() and leftovers(data_dir) == []


def test_the_command_never_imports_torch_and_a_second_ctrl_c_prints_no_traceback(tmp_path):
    """``-X importtime`` lists every module the command imports: no torch, for --list and for a
    download interrupted by two Ctrl-C while it waits for its server (held by the test)."""
    torch_import = re.compile(r"\|\s+torch(\.|\s*$)", re.MULTILINE)
    listed = subprocess.run([sys.executable, "-X", "importtime", "-m", MODULE, "--list"],
                            env=command_env(), cwd=REPO, capture_output=True, text=True,
                            timeout=120)
    assert listed.returncode == 0 and "PACS.zip" in listed.stdout
    assert "import time:" in listed.stderr and not torch_import.search(listed.stderr)

    release = threading.Event()
    with ArchiveServer({"PACS.zip": pacs_zip()}, hold={"PACS.zip": (100, release)}) as server:
        proc = subprocess.Popen(
            [sys.executable, "-X", "importtime", "-m", MODULE, "--data_dir", str(tmp_path / "d"),
             "PACS", *server.args()], env=command_env(), cwd=REPO, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True,
            preexec_fn=as_from_a_terminal)
        try:
            wait_for(lambda: "PACS.zip" in server.holding, "the command's request", 120)
            wait_for(lambda: part_size(tmp_path / "d" / "downloads" / "PACS.zip.part") == 100,
                     "100 bytes in the .part file")
            proc.send_signal(signal.SIGINT)
            output = []
            for line in proc.stdout:
                output.append(line)
                if line.startswith("interrupted"):
                    break
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
            output.append(proc.stdout.read())
            proc.wait(timeout=60)
        finally:
            release.set()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()
    output = "".join(output)
    assert "interrupted: partial downloads are kept" in output, output
    assert "Traceback" not in output and not torch_import.search(output), output
    assert part_size(tmp_path / "d" / "downloads" / "PACS.zip.part") == 100


def test_a_complete_download_its_rerun_and_a_broken_folder_never_import_torch(tmp_path):
    """Every check of a folder (the staged download, the rerun's "already present", a folder that
    does not check out) reads it by :mod:`dg_plugins.layouts`' rules, never through the dataset
    classes: ``-X importtime`` lists no torch. PACS with its official lists, MNIST's IDX files,
    and DomainNet-20's class check."""
    torch_import = re.compile(r"\|\s+torch(\.|\s*$)", re.MULTILINE)
    data_dir = tmp_path / "d"
    domainnet, _ = domainnet_files()
    files = {"PACS.zip": pacs_zip(), **pacs_split_lists(), **mnist_files(), **domainnet}
    names = ["PACS", "PACS_splits", "MNIST", "DomainNet20"]

    def command(*args) -> subprocess.CompletedProcess:
        done = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", MODULE, "--data_dir", str(data_dir),
             *args, *server.args(sha256=True)], env=command_env(), cwd=REPO,
            capture_output=True, text=True, timeout=300)
        assert "import time:" in done.stderr
        assert not torch_import.search(done.stderr), [
            line for line in done.stderr.splitlines() if torch_import.search(line)][:5]
        return done

    with ArchiveServer(files) as server:
        first = command(*names)
        assert first.returncode == 0, first.stderr[-3000:]
        assert first.stdout.count(": done") == 4, first.stdout
        requests = len(server.log)
        again = command(*names)
        assert again.returncode == 0, again.stderr[-3000:]
        for name in names:
            assert f"{name if name != 'DomainNet20' else 'DomainNet'}: already present" in (
                again.stdout), again.stdout
        assert len(server.log) == requests  # nothing fetched again
        (data_dir / "VLCS" / "stray").mkdir(parents=True)
        broken = command("VLCS")
    assert broken.returncode == 1
    assert "has the domain folders ['stray'], expected ['Caltech101', 'LabelMe', 'SUN09', " \
        "'VOC2007']" in broken.stderr, broken.stderr[-3000:]
    # what was checked without torch is what the dataset classes read
    assert DATASETS.get("PACS")(str(data_dir), [3], {"data_split": "official"}).num_classes == 7
    assert DATASETS.get("DomainNet20")(str(data_dir), [], None).num_classes == 20
    assert len(DATASETS.get("RotatedMNIST")(str(data_dir), [], None)[0]) == len(range(0, 17, 6))


def test_the_server_logs_a_sequential_clients_requests_in_their_order():
    """The loopback server's log is in arrival order even when a handler finishes after its
    client has gone on (on a 16-core machine the threads of two sequential requests finished in
    either order, and a test expecting the download order saw another)."""
    import urllib.request

    files = {"first.txt": b"1" * 100, "second.txt": b"2" * 100}
    with ArchiveServer(files, linger={"first.txt": 0.5}) as server:
        for name in files:
            with urllib.request.urlopen(server.url(name), timeout=10) as answer:
                assert answer.read() == files[name]
        assert [(r.path, r.status, r.body_bytes) for r in server.log] == [
            ("first.txt", 200, 100), ("second.txt", 200, 100)]


# --- 12. a file that changes on the server between two requests -------------------------------


def get(url: str, **headers) -> tuple[int, dict, bytes]:
    import urllib.request

    with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                timeout=10) as answer:
        return answer.status, dict(answer.headers), answer.read()


def test_the_loopback_server_serves_validators_and_honours_if_range():
    """RFC 9110 section 13.1.5 on the test server: Range applies when If-Range names the current
    version (its strong ETag, or its Last-Modified), else the whole file comes with 200; a weak
    tag never holds; replace_after swaps the bytes after the next response's headers."""
    from email.utils import formatdate

    old, new = b"a" * 100, b"b" * 120
    with ArchiveServer({"f.bin": old}, replace_after={"f.bin": new}) as server:
        status, headers, body = get(server.url("f.bin"))
        assert (status, body) == (200, old)  # the response under way keeps the old bytes
        etag, modified = headers["ETag"], headers["Last-Modified"]
        assert etag.startswith('"') and server.files["f.bin"] == new
        assert get(server.url("f.bin"))[1]["ETag"] != etag  # the next one sees the new ones
        server.files["f.bin"] = old  # back to the first version, whose tag is `etag` again
        _, now, _ = get(server.url("f.bin"))
        assert now["ETag"] == etag and now["Last-Modified"] != modified  # a later version
        modified = now["Last-Modified"]
        for if_range, expected in ((etag, (206, old[10:])), (modified, (206, old[10:])),
                                   ('"other"', (200, old)), (f"W/{etag}", (200, old)),
                                   (formatdate(0, usegmt=True), (200, old))):
            status, headers, body = get(server.url("f.bin"), Range="bytes=10-",
                                        **{"If-Range": if_range})
            assert (status, body) == expected, if_range
        assert server.log[-1].if_range == formatdate(0, usegmt=True)
    with ArchiveServer({"f.bin": old}, weak_etag={"f.bin"}) as server:
        weak = get(server.url("f.bin"))[1]["ETag"]
        assert weak.startswith('W/"') and get(server.url("f.bin"), Range="bytes=10-", **{
            "If-Range": weak})[0] == 200
    with ArchiveServer({"f.bin": old}, no_validators={"f.bin"}) as server:
        headers = get(server.url("f.bin"))[1]
        assert "ETag" not in headers and "Last-Modified" not in headers


def test_which_validator_goes_into_if_range():
    from email.utils import formatdate

    then = formatdate(1_700_000_000, usegmt=True)
    later = formatdate(1_700_000_001, usegmt=True)
    assert lib.fetch.if_range_value({"etag": '"a"', "last_modified": then}) == '"a"'
    assert lib.fetch.if_range_value({"etag": 'W/"a"', "last_modified": then,
                                     "date": later}) == then  # a weak tag cannot go
    assert lib.fetch.if_range_value({"last_modified": then, "date": then}) is None  # same second
    assert lib.fetch.if_range_value({"last_modified": then}) is None  # no Date: not strong
    assert lib.fetch.if_range_value({}) is None


CHANGED = "PACS.zip: the remote file changed since the {} bytes held were fetched ("


@pytest.mark.parametrize("validator", ["ETag", "Last-Modified (the ETag is weak)"])
def test_a_file_that_changes_before_the_resume_is_fetched_again_from_the_start(
        tmp_path, capsys, validator):
    """The connection is cut after a third of the file, which then changes on the server: the
    resume's If-Range names the old version, the server answers 200 with the new file, which
    replaces the bytes held (appending would join two versions into a corrupt zip)."""
    from email.utils import formatdate

    data_dir = tmp_path / "data"
    old, new = pacs_zip(per_class=3), pacs_zip(per_class=2)
    cut = len(old) // 3
    weak = {"PACS.zip"} if validator.startswith("Last") else set()
    with ArchiveServer({"PACS.zip": old}, cut_after={"PACS.zip": cut},
                       replace_after={"PACS.zip": new}, weak_etag=weak) as server:
        etag, modified = server.validators("PACS.zip")
        code, out, err = run_main(capsys, "--data_dir", data_dir, "PACS", "--keep_archives",
                                  *server.args())
    assert code == 0, err
    sent = formatdate(modified, usegmt=True) if weak else etag
    assert [(r.range, r.if_range, r.status, r.body_bytes) for r in server.log] == [
        (None, None, 200, cut), (f"bytes={cut}-", sent, 200, len(new))]
    line = [line for line in out.splitlines() if "remote file changed" in line]
    assert len(line) == 1 and line[0].strip().startswith(CHANGED.format(cut)), out
    assert line[0].endswith("; downloading it again from the start")
    downloads = data_dir / "downloads"
    assert (downloads / "PACS.zip").read_bytes() == new
    assert os.listdir(downloads) == ["PACS.zip"]  # the validators went with the .part
    assert len(os.listdir(data_dir / "PACS" / "photo" / "dog")) == 2 and pacs_ok(data_dir)


def test_the_validators_of_a_part_file_serve_a_resume_in_a_later_process(tmp_path, capsys):
    """A run cut off keeps the ETag beside the .part; the file changes; the rerun, a new
    process, sends it as If-Range and fetches the new version from the start."""
    import json

    data_dir = tmp_path / "data"
    old, new = pacs_zip(per_class=3), pacs_zip(per_class=2)
    cut = len(old) // 2
    downloads = data_dir / "downloads"
    with ArchiveServer({"PACS.zip": old}, cut_after={"PACS.zip": cut}) as server:
        etag = server.validators("PACS.zip")[0]
        code, out, err = run_main(capsys, "--data_dir", data_dir, "PACS", "--retries", 0,
                                  *server.args())
        assert code == 1 and "broke off" in err
        stored = json.loads((downloads / "PACS.zip.part.validators").read_text())
        assert stored["etag"] == etag and "last_modified" in stored and "date" in stored
        server.files["PACS.zip"] = new
        rerun = subprocess.run(
            [sys.executable, "-m", MODULE, "--data_dir", str(data_dir), "PACS",
             "--keep_archives", *server.args()], env=command_env(), cwd=REPO,
            capture_output=True, text=True, timeout=120)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert CHANGED.format(cut) in rerun.stdout, rerun.stdout
    assert [(r.range, r.if_range, r.status) for r in server.log] == [
        (None, None, 200), (f"bytes={cut}-", etag, 200)]
    assert (downloads / "PACS.zip").read_bytes() == new
    assert os.listdir(downloads) == ["PACS.zip"]


def test_a_server_without_validators_still_resumes_with_range_only(tmp_path, capsys):
    data_dir = tmp_path / "data"
    archive = pacs_zip(per_class=3)
    cut = len(archive) // 2
    part = data_dir / "downloads" / "PACS.zip.part"
    with ArchiveServer({"PACS.zip": archive}, cut_after={"PACS.zip": cut},
                       no_validators={"PACS.zip"}) as server:
        code, out, err = run_main(capsys, "--data_dir", data_dir, "PACS", "--retries", 0,
                                  *server.args())
        assert code == 1 and part.stat().st_size == cut
        assert os.listdir(part.parent) == ["PACS.zip.part"]  # nothing to keep beside it
        code, out, err = run_main(capsys, "--data_dir", data_dir, "PACS", *server.args())
    assert code == 0, err
    assert [(r.range, r.if_range, r.status, r.body_bytes) for r in server.log] == [
        (None, None, 200, cut), (f"bytes={cut}-", None, 206, len(archive) - cut)]
    assert "remote file changed" not in out and pacs_ok(data_dir)


@pytest.mark.parametrize("server_ignores", ["If-Range", "Range"])
def test_a_server_that_ignores_if_range_or_range(tmp_path, capsys, server_ignores):
    """Ignoring If-Range, the server answers the resume with 206 and the new file's ETag: the
    bytes are not appended, the file starts over. Ignoring Range, it answers 200 with the same
    ETag: the file did not change, the server just does not resume."""
    data_dir = tmp_path / "data"
    old, new = pacs_zip(per_class=3), pacs_zip(per_class=2)
    cut = len(old) // 3
    if server_ignores == "If-Range":
        options = {"ignore_if_range": {"PACS.zip"}, "replace_after": {"PACS.zip": new}}
    else:
        options = {"ignore_range": {"PACS.zip"}}
    with ArchiveServer({"PACS.zip": old}, cut_after={"PACS.zip": cut}, **options) as server:
        etag = server.validators("PACS.zip")[0]
        code, out, err = run_main(capsys, "--data_dir", data_dir, "PACS", "--keep_archives",
                                  *server.args())
        new_etag = server.validators("PACS.zip")[0]
    assert code == 0, err
    log = [(r.range, r.if_range, r.status) for r in server.log]
    if server_ignores == "If-Range":
        assert log == [(None, None, 200), (f"bytes={cut}-", etag, 206), (None, None, 200)]
        assert (f"{CHANGED.format(cut)}the server's 206 answer carries ETag {new_etag}, the "
                f"bytes held came with {etag}); downloading it again from the start") in out
        assert (data_dir / "downloads" / "PACS.zip").read_bytes() == new
    else:
        assert log == [(None, None, 200), (f"bytes={cut}-", etag, 200)]
        assert "answered 200 to a Range request" in out and "remote file changed" not in out
        assert (data_dir / "downloads" / "PACS.zip").read_bytes() == old
    assert os.listdir(data_dir / "downloads") == ["PACS.zip"] and pacs_ok(data_dir)


# --- a --data_dir that already is the dataset's folder ----------------------------------------

def test_a_data_dir_that_is_the_datasets_own_folder_names_the_one_meant_and_downloads_nothing(
        tmp_path):
    """``download --data_dir TREE/PACS PACS`` with PACS already in TREE/PACS (its domain folders
    there): the real command names the --data_dir meant, absolute or relative as typed, exits 2
    and writes nothing, where it would have put a second PACS in TREE/PACS/PACS. A folder that
    lacks a domain folder is not taken for PACS's."""
    tree = tmp_path / "tree" / "PACS"
    for domain in ("art_painting", "cartoon", "photo", "sketch"):
        (tree / domain / "dog").mkdir(parents=True)
    for given, cwd, meant in ((tree, None, tree.parent), (".", tree, "..")):
        # --url: were the check to fail, the download would go to this machine only
        proc = subprocess.run([sys.executable, "-m", MODULE, "--data_dir", str(given), "--url",
                               "PACS.zip=http://127.0.0.1:9/PACS.zip", "PACS"],
                              capture_output=True, text=True, timeout=60, cwd=cwd,
                              env=command_env())
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert proc.stderr.endswith(
            f"error: {given} already holds PACS's domain folders (art_painting, cartoon, photo, "
            f"sketch): it is PACS's own folder, and --data_dir is the one holding it "
            f"(<data_dir>/PACS); did you mean --data_dir {meant}? Nothing was downloaded.\n")
        assert sorted(p.name for p in tree.iterdir()) == ["art_painting", "cartoon", "photo",
                                                          "sketch"]
    from dg_plugins.download.run import check_not_inside

    shutil.rmtree(tree / "sketch")
    check_not_inside("PACS", str(tree))  # three of four domains: not PACS's folder
