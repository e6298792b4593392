"""Test helpers for the downloader: a local HTTP server (127.0.0.1 only) that serves files from
memory with an ETag and a Last-Modified, honours ``Range: bytes=N-`` requests (416 with
``Content-Range: bytes */N`` past the end) and If-Range (RFC 9110 section 13.1.5), logs every
request, and can be told to replace a file once a response has begun (a file that changes between
two requests), to serve weak ETags or no validators, to ignore If-Range, to cut the connection
after N bytes, to ignore Range,
to answer with a wrong Content-Range, to announce another Content-Length than it sends, to send
a Content-Type, to hold a response until the test releases it (before its first byte or after N
bytes), or to trickle; tiny archives in each dataset's real archive layout (DomainBed's
``domainbed/scripts/download.py``), with links and unsafe paths where asked; and the helpers the
download tests share.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import socket
import stat
import struct
import tarfile
import threading
import time
import zipfile
from dataclasses import dataclass, field
from email.utils import formatdate, parsedate_to_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np


#: How often the server loop looks for shutdown (seconds).
POLL_S = 0.01


@dataclass
class Request:
    path: str
    range: str | None
    status: int
    body_bytes: int  # bytes of the body actually sent
    if_range: str | None = None


@dataclass
class ArchiveServer:
    """``with ArchiveServer(files) as server``: ``server.url(name)``, ``server.log``."""

    files: dict[str, bytes]
    #: name -> N: the next response for name sends N body bytes, then the connection is cut.
    cut_after: dict[str, int] = field(default_factory=dict)
    ignore_range: set[str] = field(default_factory=set)
    wrong_content_range: set[str] = field(default_factory=set)
    #: name -> L: every response for name announces Content-Length L and sends at most L bytes
    #: of the body (less than the file: a short answer; more: an overstated length).
    content_length: dict[str, int] = field(default_factory=dict)
    #: name -> the Content-Type header of its responses.
    content_type: dict[str, str] = field(default_factory=dict)
    #: name -> (N, event): the next response for name sends N body bytes (0: nothing, not even
    #: its headers), then waits until the test sets event (at most 60 s).
    hold: dict[str, tuple[int, threading.Event]] = field(default_factory=dict)
    #: name -> (N, seconds): the next response for name sends N body bytes, then one byte every
    #: ``seconds`` (for at most 30 s) until the client goes away.
    trickle: dict[str, tuple[int, float]] = field(default_factory=dict)
    #: name -> seconds a handler stays busy after its response for name is sent (a server thread
    #: that finishes after its client has gone on to the next request).
    linger: dict[str, float] = field(default_factory=dict)
    #: name -> new bytes: once the next response for name has sent its headers (before its
    #: body), name's bytes are replaced (a new ETag and Last-Modified come with them).
    replace_after: dict[str, bytes] = field(default_factory=dict)
    #: names served without ETag and Last-Modified (If-Range never holds for them).
    no_validators: set[str] = field(default_factory=set)
    #: names whose ETag is weak (``W/"..."``: an If-Range naming it never holds).
    weak_etag: set[str] = field(default_factory=set)
    #: names whose Range requests are honoured whatever their If-Range says.
    ignore_if_range: set[str] = field(default_factory=set)
    #: Requests beyond this many get 404 (a client that would ask forever stops).
    request_limit: int | None = None
    #: Every request, in the order it arrived (appended before it is answered).
    log: list[Request] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: name -> set when a held response for name has sent its N bytes.
    holding: dict[str, threading.Event] = field(default_factory=dict)
    #: name -> (sha256 of its bytes, Last-Modified in seconds since the epoch): a file whose
    #: bytes change (replace_after, or ``files[name] = ...``) is a minute younger.
    versions: dict[str, tuple[str, int]] = field(default_factory=dict)

    def validators(self, name: str) -> tuple[str | None, int | None]:
        """(ETag, Last-Modified time) of name's current bytes; (None, None) without validators.
        The times lie an hour and more in the past: strong validators (RFC 9110 8.8.2.2)."""
        if name in self.no_validators:
            return None, None
        digest = hashlib.sha256(self.files[name]).hexdigest()
        with self.lock:
            old = self.versions.get(name)
            if old is None or old[0] != digest:
                modified = old[1] + 60 if old else int(time.time()) - 3600
                self.versions[name] = old = (digest, modified)
        etag = f'"{digest[:16]}"'
        return (f"W/{etag}" if name in self.weak_etag else etag), old[1]

    def if_range_holds(self, name: str, value: str) -> bool:
        """RFC 9110 section 13.1.5: an entity tag holds when it strongly equals the current one
        (neither weak), a date when it equals the current Last-Modified."""
        etag, modified = self.validators(name)
        value = value.strip()
        if value.startswith(('"', "W/")):
            return (etag is not None and not etag.startswith("W/")
                    and not value.startswith("W/") and value == etag)
        try:
            date = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return False
        return modified is not None and date is not None and date.timestamp() == modified

    def __enter__(self) -> "ArchiveServer":
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):
                name = self.path.lstrip("/")
                header = self.headers.get("Range")
                data = server.files.get(name)
                limit = server.request_limit
                if_range = self.headers.get("If-Range")
                # logged on arrival, so that the log holds the requests in the order they came
                # (a sequential client's order) and each one before its client has its answer
                with server.lock:
                    refused = data is None or (limit is not None and len(server.log) >= limit)
                    request = Request(name, header, 404 if refused else 0, 0, if_range)
                    server.log.append(request)
                if refused:
                    self.send_error(404)
                    return
                held = server.hold.pop(name, None)
                if held is not None and held[0] == 0:
                    server.holding.setdefault(name, threading.Event()).set()
                    held[1].wait(60)
                    held = None
                etag, modified = server.validators(name)

                def send_validators() -> None:
                    if etag is not None:
                        self.send_header("ETag", etag)
                        self.send_header("Last-Modified", formatdate(modified, usegmt=True))

                start = 0
                match = re.fullmatch(r"bytes=(\d+)-", header or "")
                if match and name not in server.ignore_range and (
                        if_range is None or name in server.ignore_if_range
                        or server.if_range_holds(name, if_range)):
                    start = int(match.group(1))
                    if start >= len(data):
                        request.status = 416
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(data)}")
                        self.send_header("Content-Length", "0")
                        send_validators()
                        self.end_headers()
                        return
                    request.status = 206
                    self.send_response(206)
                    first = 0 if name in server.wrong_content_range else start
                    self.send_header("Content-Range",
                                     f"bytes {first}-{len(data) - 1}/{len(data)}")
                else:
                    request.status = 200
                    self.send_response(200)
                body = data[start:]
                length = server.content_length.get(name, len(body))
                body = body[:length]
                self.send_header("Content-Length", str(length))
                if name in server.content_type:
                    self.send_header("Content-Type", server.content_type[name])
                send_validators()
                self.end_headers()
                if name in server.replace_after:  # before any byte of the body: the client's
                    server.files[name] = server.replace_after.pop(name)  # next request sees it
                cut = server.cut_after.pop(name, None)
                trickle = server.trickle.pop(name, None)

                def send(chunk: bytes) -> None:
                    """Write ``chunk``, counted in the log before the client can read it."""
                    request.body_bytes += len(chunk)
                    try:
                        self.wfile.write(chunk)
                    except OSError:
                        request.body_bytes -= len(chunk)
                        raise

                try:
                    if held is not None:
                        send(body[:held[0]])
                        server.holding.setdefault(name, threading.Event()).set()
                        held[1].wait(60)
                    if trickle is not None:
                        first, seconds = trickle
                        send(body[request.body_bytes:first])
                        deadline = time.monotonic() + 30
                        while request.body_bytes < len(body) and time.monotonic() < deadline:
                            time.sleep(seconds)
                            send(body[request.body_bytes:request.body_bytes + 1])
                    if cut is not None:
                        send(body[request.body_bytes:cut])
                        self.wfile.flush()
                        self.connection.shutdown(socket.SHUT_RDWR)
                        self.close_connection = True
                    else:
                        send(body[request.body_bytes:])
                    if length > len(body):  # an overstated length: close after the body
                        self.close_connection = True
                except OSError:  # the client went away
                    self.close_connection = True
                time.sleep(server.linger.get(name, 0))

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        # a short poll: shutdown() waits for the loop's next poll (0.5 s by default, per server)
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(POLL_S,),
                                        daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def url(self, name: str) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/{name}"

    def args(self, names=None, sha256: bool = False) -> list[str]:
        """``--url NAME=URL`` for every served file (or ``names``), plus ``--sha256
        NAME=<its sha256>`` when ``sha256`` (for files whose real checksum the table knows)."""
        out = []
        for name in names or self.files:
            out += ["--url", f"{name}={self.url(name)}"]
            if sha256:
                out += ["--sha256", f"{name}={hashlib.sha256(self.files[name]).hexdigest()}"]
        return out


def closed_port_url(name: str) -> str:
    """A URL on 127.0.0.1 where nothing listens (a refused connection, like being offline)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/{name}"


# ---------------------------------------------------------------------------------------------
# Archives in the real layouts

_JPEG: bytes | None = None


def tiny_jpeg() -> bytes:
    global _JPEG
    if _JPEG is None:
        from PIL import Image

        buffer = io.BytesIO()
        Image.new("RGB", (8, 8), (200, 40, 90)).save(buffer, format="JPEG")
        _JPEG = buffer.getvalue()
    return _JPEG


def zip_bytes(members: dict[str, bytes], symlinks: dict[str, str] | None = None) -> bytes:
    """A zip of ``members``, plus symbolic links ``name -> target`` stored as Unix zips store
    them (a member holding the target, with the link's mode in its external attributes)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
        for name, target in (symlinks or {}).items():
            info = zipfile.ZipInfo(name)
            info.create_system = 3
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            archive.writestr(info, target)
    return buffer.getvalue()


def tar_gz_bytes(members: dict[str, bytes], symlinks: dict[str, str] | None = None,
                 devices: tuple[str, ...] = ()) -> bytes:
    """A tar.gz of ``members``, plus symbolic links ``name -> target`` and character devices."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
        for name, target in (symlinks or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            archive.addfile(info)
        for name in devices:
            info = tarfile.TarInfo(name)
            info.type, info.devmajor, info.devminor = tarfile.CHRTYPE, 1, 3
            archive.addfile(info)
    return buffer.getvalue()


PACS_DOMAINS = ("art_painting", "cartoon", "photo", "sketch")
PACS_CLASSES = ("dog", "elephant", "giraffe", "guitar", "horse", "house", "person")
VLCS_DOMAINS = ("Caltech101", "LabelMe", "SUN09", "VOC2007")
VLCS_CLASSES = ("bird", "car", "chair", "dog", "person")
OFFICE_DOMAINS = ("Art", "Clipart", "Product", "Real World")
DOMAINNET_DOMAINS = ("clipart", "infograph", "painting", "quickdraw", "real", "sketch")


def image_tree(top: str, domains, classes, per_class: int = 1) -> dict[str, bytes]:
    return {f"{top}/{d}/{c}/img_{k}.jpg": tiny_jpeg()
            for d in domains for c in classes for k in range(per_class)}


def pacs_zip(per_class: int = 1) -> bytes:
    """DomainBed's PACS.zip: ``kfold/<domain>/<class>/<image>``."""
    return zip_bytes(image_tree("kfold", PACS_DOMAINS, PACS_CLASSES, per_class))


def pacs_split_lists(per_class: int = 1, every: int = 3) -> dict[str, bytes]:
    """PACS's twelve official split lists for the images of :func:`pacs_zip` in the official
    format (``<domain>/<class>/<file> <label>``, labels counting the seven classes from 1): per
    domain every ``every``-th image is in ``<domain>_crossval_kfold.txt``, the others in
    ``<domain>_train_kfold.txt``, all of them in ``<domain>_test_kfold.txt``."""
    files = {}
    for domain in PACS_DOMAINS:
        images = sorted(path.split("/", 1)[1] for path in image_tree(
            "kfold", [domain], PACS_CLASSES, per_class))
        crossval = images[::every]
        parts = {"train": [p for p in images if p not in crossval], "crossval": crossval,
                 "test": images}
        for kind, paths in parts.items():
            lines = [f"{p} {PACS_CLASSES.index(p.split('/')[1]) + 1}\n" for p in paths]
            files[f"{domain}_{kind}_kfold.txt"] = "".join(lines).encode()
    return files


def vlcs_tar_gz() -> bytes:
    """DomainBed's VLCS.tar.gz: ``VLCS/<domain>/<class>/<image>``."""
    return tar_gz_bytes(image_tree("VLCS", VLCS_DOMAINS, VLCS_CLASSES))


def office_home_zip() -> bytes:
    """DomainBed's office_home.zip: ``OfficeHomeDataset_10072016/<domain>/<class>/<image>``
    (65 classes) and the release's two index files beside the domain folders."""
    top = "OfficeHomeDataset_10072016"
    members = image_tree(top, OFFICE_DOMAINS, [f"Class_{i:02d}" for i in range(65)])
    members[f"{top}/ImageInfo.csv"] = b"artist,source,...\n"
    members[f"{top}/imagelist.txt"] = b"Art/Class_00/img_0.jpg\n"
    return zip_bytes(members)


def domainnet_classes() -> list[str]:
    from dg_plugins.datasets.domainnet20 import CLASSES

    return sorted(list(CLASSES) + [f"filler_{i:03d}" for i in range(345 - len(CLASSES))])


def domainnet_files() -> tuple[dict[str, bytes], list[str]]:
    """The six domain zips (``<domain>/<class>/<domain>_<n>.jpg``, two images per class in
    clipart) and a duplicates list; returns (files, the listed paths that exist)."""
    files = {}
    for domain in DOMAINNET_DOMAINS:
        per_class = 2 if domain == "clipart" else 1
        members = {f"{domain}/{c}/{domain}_{i:03d}_{k:06d}.jpg": tiny_jpeg()
                   for i, c in enumerate(domainnet_classes()) for k in range(per_class)}
        files[f"{domain}.zip"] = zip_bytes(members)
    classes = domainnet_classes()
    listed = [f"clipart/{classes[0]}/clipart_000_000001.jpg",
              f"clipart/{classes[5]}/clipart_005_000001.jpg"]
    absent = "sketch/not_there/sketch_999_000001.jpg"  # listed but absent: skipped
    files["domain_net_duplicates.txt"] = ("\n".join(listed + [absent]) + "\n").encode()
    return files, listed


TERRA_CATEGORIES = ("bird", "bobcat", "cat", "coyote", "dog", "empty", "opossum", "rabbit",
                    "raccoon", "squirrel")


def terra_files() -> tuple[dict[str, bytes], dict[str, set[str]]]:
    """The Caltech Camera Traps images tarball (``eccv_18_all_images_sm/<file>``) and the
    annotation tarball (``eccv_18_annotation_files/<5 json files>``), with images of kept and
    other locations, kept and other categories, an image annotated with two categories and one
    annotated twice with the same; returns (files, expected ``location_X/category`` -> file
    names)."""
    categories = [{"id": i, "name": n} for i, n in enumerate(TERRA_CATEGORIES + ("deer",))]
    cat_id = {c["name"]: c["id"] for c in categories}
    images, annotations, expected = [], [], {}
    n = 0

    def add(location, names):
        nonlocal n
        n += 1
        file_name = f"{n:04d}aaaa-23d2-11e8-a6a3-ec086b02610b.jpg"
        images.append({"id": f"img{n}", "file_name": file_name, "location": location,
                       "width": 8, "height": 8})
        for name in names:
            annotations.append({"id": f"ann{len(annotations)}", "image_id": f"img{n}",
                                "category_id": cat_id[name]})
            if str(location) in ("38", "46", "100", "43") and name in TERRA_CATEGORIES:
                expected.setdefault(f"location_{location}/{name}", set()).add(file_name)
        return file_name

    for location in (38, 46, 100, 43):
        for name in TERRA_CATEGORIES:
            add(location, [name])
    add(38, ["cat", "dog"])  # two categories: in both folders
    add(46, ["bird", "bird"])  # the same category twice: once
    add(100, ["deer"])  # a category not kept
    add(7, ["cat"])  # a location not kept
    add("43", ["rabbit"])  # a location stored as a string
    image_members = {f"eccv_18_all_images_sm/{image['file_name']}": tiny_jpeg()
                     for image in images}
    splits = {name: {"images": [], "annotations": [], "categories": categories, "info": {}}
              for name in ("cis_test", "cis_val", "train", "trans_test", "trans_val")}
    order = list(splits)
    for index, image in enumerate(images):  # spread images (and their annotations) over splits
        split = splits[order[index % len(order)]]
        split["images"].append(image)
        split["annotations"] += [a for a in annotations if a["image_id"] == image["id"]]
    annotation_members = {f"eccv_18_annotation_files/{name}_annotations.json":
                          json.dumps(data).encode() for name, data in splits.items()}
    files = {"eccv_18_all_images_sm.tar.gz": tar_gz_bytes(image_members),
             "eccv_18_annotations.tar.gz": tar_gz_bytes(annotation_members)}
    return files, expected


def idx_bytes(array: np.ndarray) -> bytes:
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(
        f">{array.ndim}I", *array.shape)
    return header + array.astype(np.uint8).tobytes()


def mnist_files(n_train: int = 12, n_test: int = 5) -> dict[str, bytes]:
    """The four gzipped IDX files, with random digits."""
    rng = np.random.RandomState(0)
    arrays = {
        "train-images-idx3-ubyte.gz": rng.randint(0, 256, (n_train, 28, 28)),
        "train-labels-idx1-ubyte.gz": rng.randint(0, 10, n_train),
        "t10k-images-idx3-ubyte.gz": rng.randint(0, 256, (n_test, 28, 28)),
        "t10k-labels-idx1-ubyte.gz": rng.randint(0, 10, n_test),
    }
    return {name: gzip.compress(idx_bytes(a), mtime=0) for name, a in arrays.items()}


# ---------------------------------------------------------------------------------------------
# Shared by the download tests


def run_main(capsys, *args) -> tuple[int, str, str]:
    """``python -m dg_plugins.scripts.download ARGS`` in-process: (exit code, stdout, stderr)."""
    from dg_plugins.scripts import download as cli

    code = cli.main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_clean_error(err: str, *needles: str) -> None:
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def leftovers(data_dir: Path) -> list[str]:
    """Hidden staging folders and lock files (a kill or a failure must not leave one)."""
    return sorted(p.name for p in data_dir.iterdir()
                  if p.name.endswith((".download-tmp", ".download-lock")))


def wait_for(condition, what: str, timeout: float = 30.0) -> None:
    """Wait until ``condition()`` holds (the test waits for the run, never the other way)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.01)


def part_size(path: Path) -> int:
    return os.path.getsize(path) if os.path.exists(path) else -1
