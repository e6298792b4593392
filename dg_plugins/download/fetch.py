"""Fetching one file into ``<data_dir>/downloads/``: resumable HTTP(S) (Range and If-Range,
RFC 9110), ``file:`` URLs, Google Drive through gdown; what arrived checked (its kind, size,
checksums); progress output; free-space checks (``docs/download.md``)."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import glob
import hashlib
import http.client
import json
import math
import os
import re
import shutil
import sys
import time
import urllib.error
import urllib.request
import zipfile
from email.utils import parsedate_to_datetime
from typing import Callable
from urllib.parse import unquote, urlsplit

from dg_plugins.download.sources import CHUNK, DATASET_SPECS, DownloadError, Source, human_size
from dg_plugins.files import DISK_FULL_ERRNOS, atomic_write_text

#: Seconds before the n-th retry of a cut transfer: RETRY_DELAY * 2**(n-1), at most 60.
RETRY_DELAY = 2.0
#: Socket timeout of each HTTP request (connecting, and each read), in seconds.
HTTP_TIMEOUT = 60.0
#: Under MIN_RATE bytes a second over RATE_WINDOW seconds, a transfer counts as cut and is resumed
#: (a server that trickles would hold the download forever, each read within HTTP_TIMEOUT).
MIN_RATE = 1024
RATE_WINDOW = 60.0
#: Without a terminal, a progress line at least this often while bytes arrive (and every tenth).
PROGRESS_INTERVAL = 30.0
#: Free space asked beyond an estimate (metadata, a short estimate, the system's own room).
FREE_MARGIN = 0.05
MIN_FREE_MARGIN = 100_000_000
#: Restarts from byte 0 of one file in one run (Range answers that cannot be appended).
MAX_RESTARTS = 2
#: The URL schemes ``--url`` accepts.
URL_SCHEMES = ("http", "https", "file")
#: ``<file>.part`` + this: the validators (ETag, Last-Modified, Date) of the response whose bytes
#: the ``.part`` holds, written when that response arrives, removed with the ``.part``.
VALIDATORS_SUFFIX = ".validators"
VALIDATORS = {"etag": "ETag", "last_modified": "Last-Modified", "date": "Date"}


@dataclasses.dataclass
class Reporter:
    """Log lines on ``out``; a tqdm bar on stderr for transfers when ``progress``."""

    out: Callable[[str], None] = print
    progress: bool = False
    clock: Callable[[], float] = time.monotonic
    said: set[str] = dataclasses.field(default_factory=set)  # long notes: printed once a run

    def __call__(self, message: str) -> None:
        if self.progress:
            from tqdm import tqdm

            tqdm.write(message, file=sys.stdout)
        else:
            self.out(message)
        with contextlib.suppress(Exception):
            sys.stdout.flush()

    @contextlib.contextmanager
    def transfer(self, name: str, total: int | None, initial: int):
        """Yields ``update(n_bytes)``: a tqdm bar, else a line with the rate every tenth."""
        if self.progress:
            from tqdm import tqdm

            with tqdm(total=total, initial=initial, unit="B", unit_scale=True,
                      unit_divisor=1024, desc=name, file=sys.stderr, leave=False) as bar:
                yield bar.update
            return
        step = max(total // 10, 1) if total else math.inf
        state = {"done": initial, "line_time": self.clock(), "line_done": initial}

        def update(n: int) -> None:
            state["done"] += n
            done, now = state["done"], self.clock()
            elapsed = now - state["line_time"]
            if done // step == state["line_done"] // step and elapsed < PROGRESS_INTERVAL:
                return  # neither a new tenth nor PROGRESS_INTERVAL since the last line
            shown = (f"{100 * done / total:.0f}% {human_size(done)} of {human_size(total)}"
                     if total else human_size(done))
            rate = (f", {human_size(int((done - state['line_done']) / elapsed))}/s"
                    if elapsed > 0 else "")
            self(f"  {name}: {shown}{rate}")
            state.update(line_time=now, line_done=done)

        yield update


def mount_point(path: str) -> str:
    """The mount point of the file system holding ``path``."""
    path = os.path.abspath(path)
    while not os.path.ismount(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def with_margin(needed: int) -> int:
    return needed + max(int(needed * FREE_MARGIN), MIN_FREE_MARGIN)


def check_free_space(folder: str, needed: int, what: str) -> None:
    """Raise :class:`DownloadError` when ``folder``'s disk lacks ``with_margin(needed)``."""
    free = shutil.disk_usage(folder).free
    asked = with_margin(needed)
    if asked > free:
        raise DownloadError(
            f"not enough free disk space in {folder} (the disk mounted at "
            f"{mount_point(folder)}) for {what}: needs {human_size(needed)} and a margin, "
            f"{human_size(asked)} in all; {human_size(free)} free. Free some space or choose "
            "another --data_dir, then rerun (what was already downloaded is kept).")


def is_disk_full(err: BaseException) -> bool:
    return isinstance(err, OSError) and err.errno in DISK_FULL_ERRNOS


def disk_full_message(folder: str, what: str) -> str:
    free = human_size(shutil.disk_usage(folder).free) if os.path.isdir(folder) else "unknown"
    return (f"no space left on the disk mounted at {mount_point(folder)} (holding {folder}, "
            f"{free} free now) while {what}")


def file_kind(name: str) -> str:
    """"a zip", "a gzip file" (``.tar.gz``, ``.tgz``, ``.gz``) or "a text file", by the name."""
    lower = name.lower()
    return "a zip" if lower.endswith(".zip") else "a gzip file" \
        if lower.endswith((".gz", ".tgz")) else "a text file"


_HTML = re.compile(rb"^\s*(<!doctype\s+html|<html|<head|<body|<!--|<\?xml[^>]*>\s*<html)",
                   re.IGNORECASE)


def html_page(url: str, head: bytes, path: str, name: str) -> tuple[str, str]:
    """What an HTML page that came instead of file ``name`` (to go at ``path``) is ("an HTML page
    ('its title'), not a zip"), and what to do."""
    match = re.search(rb"<title[^>]*>(.*?)</title>", head, re.IGNORECASE | re.DOTALL)
    title = match and " ".join(match.group(1).decode("utf-8", "replace").split())[:80]
    if is_google_drive(url) or "google" in (title or "").lower():
        guess = ("Google Drive's quota or virus-scan page? Google Drive limits the downloads of "
                 "a file per day: try again in a day, or open the URL in a browser")
    else:
        guess = "a login, error or mirror page? Open the URL in a browser to see it"
    return (f"an HTML page{f' ({title!r})' if title else ''}, not {file_kind(name)}",
            f"{guess}, download the file there and put it at {path}; or pass --url "
            f"{name}=URL of a mirror")


def manual_fix(source: Source, url: str, path: str) -> str:
    return (f"To place it by hand: download {url} (or a mirror of it) on a machine with "
            f"internet, put it at {path}, then rerun this command; or pass "
            f"--url {source.name}=URL for a mirror.")


def is_google_drive(url: str) -> bool:
    return (urlsplit(url).hostname or "") in {"drive.google.com", "docs.google.com"}


class _Restart(Exception):
    """A Range answer that cannot be appended: start over (``then``: what the line says next)."""

    def __init__(self, why: str, then: str = "starting over"):
        super().__init__(why)
        self.then = then


class _Cut(Exception):
    """The transfer stopped early (retry with a Range request)."""


def _content_range(value: str | None) -> tuple[int | None, int | None] | None:
    """(first byte, total) of a Content-Range value, None for a ``*``."""
    match = re.fullmatch(r"\s*bytes\s+(?:(\d+)-\d+|\*)/(\d+|\*)\s*", value or "")
    return tuple(int(g) if g and g != "*" else None for g in match.groups()) if match else None


def remove_part(part: str, validators_only: bool = False) -> None:
    """Remove ``part``'s validators (and a killed write's temporary file of them, named by
    :func:`dg_plugins.files.atomic_write_bytes`) and, unless ``validators_only``, ``part``."""
    folder, name = os.path.split(part + VALIDATORS_SUFFIX)
    leftovers = glob.glob(os.path.join(glob.escape(folder), f".tmp-*-{glob.escape(name)}"))
    for path in (part + VALIDATORS_SUFFIX, *leftovers, *(() if validators_only else (part,))):
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)


def read_validators(part: str) -> dict[str, str]:
    """The validators (``etag``, ``last_modified``, ``date``) stored for the bytes in ``part``."""
    with contextlib.suppress(OSError, ValueError), \
            open(part + VALIDATORS_SUFFIX, encoding="utf-8") as handle:
        stored = json.load(handle)
        return {key: value for key, value in stored.items() if key in VALIDATORS
                and isinstance(value, str) and value} if isinstance(stored, dict) else {}
    return {}


def _store_validators(part: str, headers) -> None:
    """Store the validators of the response about to fill ``part``, atomically."""
    values = {key: value for key, field in VALIDATORS.items()
              if (value := (headers.get(field) or "").strip())}
    if "etag" not in values and "last_modified" not in values:
        return remove_part(part, validators_only=True)
    atomic_write_text(part + VALIDATORS_SUFFIX, json.dumps(values))


def _http_date(value: str | None):
    """An HTTP date as an aware datetime, or None."""
    with contextlib.suppress(TypeError, ValueError, IndexError):
        parsed = parsedate_to_datetime(value)
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=datetime.timezone.utc)
    return None


def if_range_value(held: dict[str, str]) -> str | None:
    """The If-Range value for the bytes held: their strong ETag, else a strong Last-Modified (RFC
    9110 section 8.8.2.2), else None."""
    if (etag := held.get("etag")) and not etag.startswith("W/"):
        return etag
    modified, date = _http_date(held.get("last_modified")), _http_date(held.get("date"))
    if modified is not None and date is not None and (date - modified).total_seconds() >= 1:
        return held["last_modified"]
    return None


def _version_change(held: dict[str, str], headers, have: int, status: int,
                    if_range: str | None) -> str | None:
    """Why the answer is another version than the ``have`` bytes held (the validator both have,
    ETag weakly else Last-Modified, differs; or a 200 to If-Range without one), else None."""
    for key, field, compared in (("etag", "ETag", lambda tag: tag.removeprefix("W/")),
                                 ("last_modified", "Last-Modified",
                                  lambda date: _http_date(date) or date)):
        old, new = held.get(key), (headers.get(field) or "").strip()
        if old and new:
            if compared(old) == compared(new):
                return None
            detail = (f"the server's {status} answer carries {field} {new}, the bytes held "
                      f"came with {old}")
            break
    else:
        if status != 200 or not if_range:
            return None
        detail = f"answered 200, not 206, to If-Range: {if_range}"
    return f"the remote file changed since the {have} bytes held were fetched ({detail})"


def _http_attempt(url: str, part: str, report: Reporter, source: Source) -> None:
    """One request continuing ``part`` (Range, If-Range) or from the start; returns complete."""
    name, expected = source.name, source.size
    have = os.path.getsize(part) if os.path.exists(part) else 0
    if expected is not None and have == expected:
        return  # complete: a run stopped between the last byte and the rename
    if expected is not None and have > expected:
        raise _Restart(f"{part} is longer than {name} ({have} > {expected} bytes)")
    held = read_validators(part) if have else {}
    if_range = if_range_value(held)  # None when nothing is held
    headers = {"User-Agent": "dg_plugins-download", "Range": f"bytes={have}-" if have else None,
               "If-Range": if_range}
    request = urllib.request.Request(url, headers={k: v for k, v in headers.items() if v})
    try:
        response = urllib.request.urlopen(request, timeout=HTTP_TIMEOUT)
    except urllib.error.HTTPError as err:
        if err.code == 416 and have:
            if _content_range(err.headers.get("Content-Range")) == (None, have):
                report(f"  {name}: the server holds {have} bytes, all of them received")
                return
            raise _Restart(f"the server refused to continue {name} from byte {have} "
                           f"(416, Content-Range {err.headers.get('Content-Range')!r})") from err
        if err.code >= 500:
            raise _Cut(f"HTTP {err.code} {err.reason}") from err
        raise
    except (ConnectionResetError, TimeoutError, http.client.HTTPException) as err:
        raise _Cut(f"{type(err).__name__}: {err}") from err
    except urllib.error.URLError as err:
        if isinstance(err.reason, (TimeoutError, ConnectionResetError)):
            raise _Cut(f"{err.reason}") from err
        raise
    with response:
        status = response.status
        if response.headers.get_content_type() == "text/html":  # none of the files is a web page
            page, fix = html_page(url, response.read(65536), part[:-len(".part")], name)
            raise DownloadError(f"{url} answered with {page}: {fix}.")
        if have and status == 206:
            parsed = _content_range(response.headers.get("Content-Range"))
            total = parsed[1] if parsed else None
            if parsed is None or parsed[0] != have or (
                    expected is not None and total not in (None, expected)):
                raise _Restart(f"the server answered the Range request for {name} with "
                               f"Content-Range {response.headers.get('Content-Range')!r}, not "
                               f"bytes {have}-.../{expected or '*'}")
            # a server that ignored If-Range (or got none) may send another version
            if changed := _version_change(held, response.headers, have, status, if_range):
                raise _Restart(changed, "downloading it again from the start")
            mode = "ab"
        elif status == 200:
            if have:
                changed = _version_change(held, response.headers, have, status, if_range)
                report(f"  {name}: {changed}; downloading it again from the start" if changed
                       else f"  {name}: the server does not resume (answered 200 to a Range "
                       "request): fetching it again from byte 0")
                have = 0
            length = response.headers.get("Content-Length")
            total = int(length) if length and length.isdigit() else None
            mode = "wb"
        else:
            raise DownloadError(f"unexpected HTTP status {status} for {url}")
        if expected is not None and total is not None and total != expected:
            raise DownloadError(
                f"{url} serves {total} bytes but {name} has {expected} bytes: a wrong or "
                f"changed file (pass --sha256 {name}=HEX for a mirror's own copy)")
        total = total if total is not None else expected
        if total is not None:
            check_free_space(os.path.dirname(part), total - have, name)
        done = have
        window_start, window_done = time.monotonic(), done
        try:  # unbuffered: every block reaches the file as it arrives
            with open(part, mode, buffering=0) as handle, \
                    report.transfer(name, total, have) as update:
                if mode == "wb":  # after the truncation: the validators never name older bytes
                    _store_validators(part, response.headers)
                while True:
                    try:
                        block = response.read1(CHUNK)
                    except (OSError, http.client.HTTPException) as err:  # reset, timeout, ...
                        raise _Cut(f"{type(err).__name__}: {err}") from err
                    if not block:
                        break
                    handle.write(block)
                    done += len(block)
                    update(len(block))
                    now = time.monotonic()
                    if (elapsed := now - window_start) >= RATE_WINDOW:
                        rate = (done - window_done) / elapsed
                        if rate < MIN_RATE:
                            raise _Cut(f"{human_size(int(rate))}/s over the last {elapsed:.3g} s, "
                                       f"below the minimum {human_size(MIN_RATE)}/s")
                        window_start, window_done = now, done
        except OSError as err:  # opening or writing the .part
            raise DownloadError(_write_failed_message(source, part, err, done, expected)) from None
        if total is not None and done < total:
            raise _Cut(f"the connection closed after {done} of {total} bytes")


def fetch_http(source: Source, url: str, path: str, retries: int, report: Reporter) -> None:
    """Fetch ``url`` to ``path`` through ``path + '.part'``, resuming after a cut (``retries``
    more attempts; the part stays for a rerun)."""
    part = path + ".part"
    folder = os.path.dirname(path)
    attempt = restarts = 0
    while True:
        try:
            _http_attempt(url, part, report, source)
            break
        except _Restart as why:
            restarts += 1
            remove_part(part)
            if restarts > MAX_RESTARTS:
                raise DownloadError(
                    f"the server of {url} cannot continue {source.name} ({why}) and starting "
                    f"over did not help {MAX_RESTARTS} times; " + manual_fix(source, url, path)
                ) from None
            report(f"  {source.name}: {why}; {why.then}")
        except _Cut as why:
            attempt += 1
            kept = os.path.getsize(part) if os.path.exists(part) else 0
            if not kept:
                remove_part(part)
            if attempt > retries:
                held = (f"the {kept} bytes received are kept in {part}: rerun this command to "
                        "continue where it stopped" if kept else
                        "no byte of it arrived: rerun this command to try again")
                raise DownloadError(
                    f"the transfer of {source.name} from {url} broke off ({why}) after "
                    f"{retries + 1} attempt(s); {held}.") from None
            delay = min(RETRY_DELAY * 2 ** (attempt - 1), 60.0)
            report(f"  {source.name}: transfer cut ({why}); continuing from byte {kept} in "
                   f"{delay:g} s (attempt {attempt + 1} of {retries + 1})")
            time.sleep(delay)
        except urllib.error.HTTPError as err:
            raise DownloadError(
                f"could not download {source.name} from {url}: HTTP {err.code} {err.reason}. "
                + manual_fix(source, url, path)) from None
        except (urllib.error.URLError, OSError, ValueError) as err:
            if not os.path.isdir(folder):
                raise DownloadError(f"could not write {part}: its folder {folder} is gone "
                                    "(removed while the download ran?); rerun") from None
            raise DownloadError(
                f"could not download {source.name} from {url}: {getattr(err, 'reason', err)} "
                "(offline, or a dead link?). " + manual_fix(source, url, path)) from None
    remove_part(part, validators_only=True)  # first: a .part left without them is complete
    os.replace(part, path)


def _write_failed_message(source: Source, part: str, err: OSError, held: int,
                          expected: int | None) -> str:
    """The message for a ``.part`` not written (on a full disk, one of unknown size removed)."""
    folder = os.path.dirname(part)
    if not is_disk_full(err):
        return f"could not write {part}: {err}"
    if expected is None:
        remove_part(part)
        return (f"{disk_full_message(folder, f'downloading {source.name}')}: its size is "
                f"unknown, and the {human_size(held)} received were removed to give the space "
                "back. Free some space or choose another --data_dir, then rerun.")
    return (f"{disk_full_message(folder, f'downloading {source.name}')}: "
            f"{human_size(expected - held)} more are needed; the {human_size(held)} received "
            f"are kept in {part} (delete it to give the space back). Free some space or "
            "choose another --data_dir, then rerun to continue.")


def fetch_file_url(source: Source, url: str, path: str, report: Reporter) -> None:
    parts = urlsplit(url)
    if parts.netloc not in ("", "localhost"):
        raise DownloadError(f"--url {source.name}={url}: a file: URL names a local file "
                            f"(file:///path/to/{source.name}), not host {parts.netloc!r}")
    local = urllib.request.url2pathname(unquote(parts.path))
    if not os.path.isfile(local):
        raise DownloadError(f"--url {source.name}={url}: {local} is not a file")
    part = path + ".part"
    remove_part(part, validators_only=True)  # an earlier HTTP attempt's: of other bytes
    try:
        shutil.copyfile(local, part)
    except OSError as err:
        raise DownloadError(_write_failed_message(source, part, err, 0, None)) from None
    os.replace(part, path)


def fetch_google_drive(source: Source, url: str, path: str, report: Reporter) -> None:
    try:
        import gdown
    except ImportError:
        raise DownloadError(
            f"{source.name} comes from Google Drive ({url}), which needs the optional package "
            f"gdown: pip install 'dg_plugins[download]'. Or pass --url {source.name}=URL of a "
            f"plain HTTP(S) mirror, or put the file at {path} by hand and rerun.") from None
    report(f"  {source.name}: fetching from Google Drive with gdown")
    try:
        result = gdown.download(url, output=path, quiet=not report.progress, resume=True)
    except Exception as err:  # noqa: BLE001  (gdown raises its own and requests' errors)
        if is_disk_full(err):
            raise DownloadError(
                f"{disk_full_message(os.path.dirname(path), f'downloading {source.name}')}. "
                "Free some space or choose another --data_dir, then rerun.") from None
        raise DownloadError(
            f"could not download {source.name} from {url}: {type(err).__name__}: "
            f"{str(err).strip().splitlines()[0] if str(err).strip() else ''} (Google Drive "
            "quota or permission, offline, or a dead link?). "
            + manual_fix(source, url, path)) from None
    if not result or not os.path.isfile(path):
        raise DownloadError(f"gdown did not download {source.name} from {url}. "
                            + manual_fix(source, url, path))


def check_content(source: Source, path: str, url: str, fetched: bool) -> None:
    """Move ``path`` to ``.corrupt`` and raise :class:`DownloadError` when not of its name's kind
    (an HTML page, a truncated zip, ...)."""
    name, kind = source.name, file_kind(source.name)
    with open(path, "rb") as handle:
        head = handle.read(65536)
    fix = f"pass --url {name}=URL of a mirror that serves the file, or put it at {path}"
    if not head:
        what = "an empty file"
    elif _HTML.match(head.lstrip(b"\xef\xbb\xbf")):
        what, fix = html_page(url, head, path, name)
    elif kind == "a zip" and head[:4] not in (b"PK\x03\x04", b"PK\x05\x06"):
        what = "a gzip file" if head[:2] == b"\x1f\x8b" else f"starts with {head[:8]!r}"
        what = f"not a zip ({what})"
    elif kind == "a zip" and not zipfile.is_zipfile(path):
        what = (f"a truncated zip ({os.path.getsize(path)} bytes: its end, the table of its "
                "members, is missing)")
        if fetched:
            fix = (f"the server's answer ended there (a rerun would fetch the same bytes): pass "
                   f"--url {name}=URL of another mirror, or put the whole file at {path}")
    elif kind == "a gzip file" and head[:2] != b"\x1f\x8b":
        what = "a zip" if head[:2] == b"PK" else f"starts with {head[:8]!r}"
        what = f"not a gzip file ({what})"
    else:
        return
    os.replace(path, path + ".corrupt")
    where = f"{url} sent" if fetched else f"{path} (found there) is"
    raise DownloadError(f"{where} {what}: {fix}. (What arrived was moved to {path}.corrupt.)")


def verify_file(source: Source, path: str, from_option: bool, report: Reporter) -> None:
    """Check ``source``'s size and checksums (``from_option``: those of ``--sha256``); a mismatch
    moves the file to ``<path>.corrupt`` and raises."""
    if source.size is not None and (size := os.path.getsize(path)) != source.size:
        problems = [f"{size} bytes, expected {source.size}"]
    else:
        wanted = {kind: getattr(source, kind) for kind in ("sha256", "md5")}
        digests = {kind: hashlib.new(kind) for kind, want in wanted.items() if want is not None}
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(CHUNK), b""):
                for digest in digests.values():
                    digest.update(block)
        problems = [f"{kind} {digest.hexdigest()}, expected {wanted[kind]}"
                    for kind, digest in digests.items() if digest.hexdigest() != wanted[kind]]
    if problems:
        os.replace(path, path + ".corrupt")
        if from_option:
            raise DownloadError(
                f"{source.name} does not match --sha256 {source.name}=... ({'; '.join(problems)}). "
                f"It was moved to {path}.corrupt. If that file is the right one, its sha256 is the "
                f"one to pass; else pass --url {source.name}=URL of a good copy.")
        raise DownloadError(
            f"{source.name} does not match the table ({'; '.join(problems)}): a corrupted or "
            f"changed file. It was moved to {path}.corrupt; rerun to download it again (a "
            f"mirror's own copy: pass --sha256 {source.name}=HEX).")
    if source.sha256 or source.md5:
        kinds = " and ".join(k for k, v in (("size", source.size), ("sha256", source.sha256),
                                            ("md5", source.md5)) if v)
        report(f"  {source.name}: {kinds} verified")
    else:
        why = "as above" if source.note in report.said else source.note
        report.said.add(source.note)
        report(f"  {source.name}: no checksum known ({why}); "
               f"{DATASET_SPECS[source.dataset].unverified_check}")


@dataclasses.dataclass
class Options:
    """What the command line asks beside the datasets (``--url``, ``--sha256``, ...)."""

    urls: dict[str, str] = dataclasses.field(default_factory=dict)
    sha256: dict[str, str | None] = dataclasses.field(default_factory=dict)
    keep_archives: bool = False
    retries: int = 3


def to_check(source: Source, options: Options) -> Source:
    """``source`` with the size and checksums to check: the table's, or (no size) those of
    ``--sha256 NAME=HEX|none``."""
    if source.name not in options.sha256:
        return source
    value = options.sha256[source.name]
    return dataclasses.replace(source, size=None, sha256=value, md5=None,
                               note="--sha256 none" if value is None else "given with --sha256")


def obtain(source: Source, downloads: str, options: Options, report: Reporter) -> str:
    """``<downloads>/<name>``, fetched when not there, then checked (kind, size, checksums);
    ``source`` as :func:`to_check` gives it."""
    path = os.path.join(downloads, source.name)
    url = options.urls.get(source.name, source.url)
    fetched = not os.path.isfile(path)
    if not fetched:
        report(f"  {source.name}: found in {downloads}")
    else:
        part = path + ".part"
        if have := (os.path.getsize(part) if os.path.exists(part) else 0):
            report(f"  {source.name}: continuing the partial download ({have} bytes in {part})")
        report(f"  {source.name}: downloading {url}")
        if urlsplit(url).scheme == "file":  # urlsplit lowercases the scheme
            fetch_file_url(source, url, path, report)
        elif is_google_drive(url):
            fetch_google_drive(source, url, path, report)
        else:
            fetch_http(source, url, path, options.retries, report)
    check_content(source, path, url, fetched)
    verify_file(source, path, source.name in options.sha256, report)
    return path
