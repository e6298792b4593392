"""Fetching one file into ``<data_dir>/downloads/``: resumable HTTP(S) with Range requests
(``<file>.part``), Google Drive through the optional gdown, size and checksum verification, and
the output (log lines, or a tqdm bar on a terminal)."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import re
import shutil
import sys
import time
from typing import Callable

from dg_plugins.datasets.download.sources import (
    CHUNK, DATASET_SPECS, DownloadError, Source, human_size,
)

#: Seconds before the n-th retry of a cut transfer: RETRY_DELAY * 2**(n-1), at most 60.
RETRY_DELAY = 2.0
#: Socket timeout of each HTTP request, in seconds.
HTTP_TIMEOUT = 60.0


# --------------------------------------------------------------------------------------------
# Output


class Reporter:
    """Log lines on ``out``; a tqdm bar on stderr for transfers when ``progress``."""

    def __init__(self, out: Callable[[str], None] = print, progress: bool = False):
        self._out = out
        self.progress = progress
        self._said: set[str] = set()

    def first_time(self, text: str) -> bool:
        """True the first time ``text`` is asked about (a long note is printed once a run)."""
        new = text not in self._said
        self._said.add(text)
        return new

    def __call__(self, message: str) -> None:
        if self.progress:
            from tqdm import tqdm

            tqdm.write(message, file=sys.stdout)
            sys.stdout.flush()
        else:
            self._out(message)
            with contextlib.suppress(Exception):
                sys.stdout.flush()

    @contextlib.contextmanager
    def transfer(self, name: str, total: int | None, initial: int):
        """Yields ``update(n_bytes)``; a bar when attached to a terminal, else a line at every
        tenth of the file (or every 100 MB when the size is unknown)."""
        if self.progress:
            from tqdm import tqdm

            with tqdm(total=total, initial=initial, unit="B", unit_scale=True,
                      unit_divisor=1024, desc=name, file=sys.stderr, leave=False) as bar:
                yield bar.update
            return
        state = {"done": initial, "next": 0}
        step = max(total // 10, 1) if total else 100_000_000

        def update(n: int) -> None:
            state["done"] += n
            if state["done"] >= state["next"]:
                if state["next"]:
                    share = f"{100 * state['done'] / total:.0f}% " if total else ""
                    self(f"  {name}: {share}{human_size(state['done'])} of "
                         f"{human_size(total)}")
                state["next"] = (state["done"] // step + 1) * step

        update(0)
        yield update


# --------------------------------------------------------------------------------------------
# Fetching


def manual_fix(source: Source, url: str, path: str) -> str:
    return (f"To place it by hand: download {url} (or a mirror of it) on a machine with "
            f"internet, put it at {path}, then rerun this command; or pass "
            f"--url {source.name}=URL for a mirror.")


def check_free_space(folder: str, needed: int, what: str) -> None:
    """Raise :class:`DownloadError` when ``folder``'s file system has less than ``needed`` bytes
    free."""
    free = shutil.disk_usage(folder).free
    if needed > free:
        raise DownloadError(
            f"not enough free disk space in {folder} for {what}: needs {human_size(needed)}, "
            f"{human_size(free)} free. Free some space or choose another --data_dir, then rerun "
            "(what was already downloaded is kept).")


def is_google_drive(url: str) -> bool:
    from urllib.parse import urlsplit

    return (urlsplit(url).hostname or "") in {"drive.google.com", "docs.google.com"}


class _Restart(Exception):
    """The server's answer to a Range request cannot be appended: start the file over."""


class _Cut(Exception):
    """The transfer stopped early (retry with a Range request)."""


def _parse_content_range(value: str | None) -> tuple[int, int, int | None] | None:
    match = re.fullmatch(r"\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*", value or "")
    if not match:
        return None
    total = None if match.group(3) == "*" else int(match.group(3))
    return int(match.group(1)), int(match.group(2)), total


def _http_attempt(url: str, part: str, expected: int | None, report: Reporter,
                  name: str) -> None:
    """One request: continue ``part`` with a Range request when it has bytes, else fetch from
    the start. Raises :class:`_Restart`, :class:`_Cut`, or urllib's errors."""
    import http.client
    import urllib.error
    import urllib.request

    have = os.path.getsize(part) if os.path.exists(part) else 0
    if expected is not None and have == expected:
        return  # complete: a run stopped between the last byte and the rename
    if expected is not None and have > expected:
        raise _Restart(f"{part} is longer than {name} ({have} > {expected} bytes)")
    headers = {"User-Agent": "dg_plugins-download"}
    if have:
        headers["Range"] = f"bytes={have}-"
    request = urllib.request.Request(url, headers=headers)
    try:
        response = urllib.request.urlopen(request, timeout=HTTP_TIMEOUT)
    except urllib.error.HTTPError as err:
        if err.code == 416 and have:
            raise _Restart(f"the server refused to continue {name} from byte {have} "
                           "(416)") from err
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
        if have and status == 206:
            parsed = _parse_content_range(response.headers.get("Content-Range"))
            if parsed is None or parsed[0] != have or (
                    expected is not None and parsed[2] not in (None, expected)):
                raise _Restart(f"the server answered the Range request for {name} with "
                               f"Content-Range {response.headers.get('Content-Range')!r}, not "
                               f"bytes {have}-.../{expected or '*'}")
            total = parsed[2]
            mode = "ab"
        elif status == 200:
            if have:
                report(f"  {name}: the server does not resume (answered 200 to a Range "
                       f"request): fetching it again from byte 0")
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
        with open(part, mode) as handle, report.transfer(name, total, have) as update:
            while True:
                try:
                    block = response.read(CHUNK)
                except (OSError, http.client.HTTPException) as err:  # reset, timeout, ...
                    raise _Cut(f"{type(err).__name__}: {err}") from err
                if not block:
                    break
                handle.write(block)
                done += len(block)
                update(len(block))
        if total is not None and done < total:
            raise _Cut(f"the connection closed after {done} of {total} bytes")


def fetch_http(source: Source, url: str, path: str, expected: int | None, retries: int,
               report: Reporter) -> None:
    """Fetch ``url`` to ``path`` through ``path + '.part'``, resuming after a cut connection
    (up to ``retries`` more attempts in this run; the part file stays for the next run)."""
    import urllib.error

    part = path + ".part"
    attempt = 0
    while True:
        try:
            _http_attempt(url, part, expected, report, source.name)
            break
        except _Restart as why:
            report(f"  {source.name}: {why}; starting over")
            os.remove(part)
            continue
        except _Cut as why:
            attempt += 1
            kept = os.path.getsize(part) if os.path.exists(part) else 0
            if attempt > retries:
                raise DownloadError(
                    f"the transfer of {source.name} from {url} broke off ({why}) after "
                    f"{retries + 1} attempt(s); the {kept} bytes received are kept in {part}: "
                    "rerun this command to continue where it stopped.") from None
            delay = min(RETRY_DELAY * 2 ** (attempt - 1), 60.0)
            report(f"  {source.name}: transfer cut ({why}); continuing from byte {kept} in "
                   f"{delay:g} s (attempt {attempt + 1} of {retries + 1})")
            time.sleep(delay)
        except urllib.error.HTTPError as err:
            raise DownloadError(
                f"could not download {source.name} from {url}: HTTP {err.code} {err.reason}. "
                + manual_fix(source, url, path)) from None
        except (urllib.error.URLError, OSError, ValueError) as err:
            reason = getattr(err, "reason", err)
            raise DownloadError(
                f"could not download {source.name} from {url}: {reason} (offline, or a dead "
                f"link?). " + manual_fix(source, url, path)) from None
    os.replace(part, path)


def fetch_google_drive(source: Source, url: str, path: str, report: Reporter) -> None:
    """Fetch a Google Drive link with gdown (resumable: gdown keeps its own ``.part`` file)."""
    try:
        import gdown
    except ImportError:
        raise DownloadError(
            f"{source.name} comes from Google Drive ({url}), which needs the optional package "
            "gdown: pip install 'dg_plugins[download]'. Or pass --url "
            f"{source.name}=URL of a plain HTTP(S) mirror, or put the file at {path} by hand "
            "and rerun.") from None
    report(f"  {source.name}: fetching from Google Drive with gdown")
    try:
        result = gdown.download(url, output=path, quiet=not report.progress, resume=True)
    except Exception as err:  # noqa: BLE001  (gdown raises its own and requests' errors)
        raise DownloadError(
            f"could not download {source.name} from {url}: {type(err).__name__}: "
            f"{str(err).strip().splitlines()[0] if str(err).strip() else ''} (Google Drive "
            "quota or permission, offline, or a dead link?). "
            + manual_fix(source, url, path)) from None
    if not result or not os.path.isfile(path):
        raise DownloadError(f"gdown did not download {source.name} from {url}. "
                            + manual_fix(source, url, path))


def file_digests(path: str, want_md5: bool) -> tuple[str, str | None]:
    sha256 = hashlib.sha256()
    md5 = hashlib.md5() if want_md5 else None
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(CHUNK), b""):
            sha256.update(block)
            if md5 is not None:
                md5.update(block)
    return sha256.hexdigest(), md5.hexdigest() if md5 is not None else None


def verify_file(source: Source, path: str, expected: "Expected", report: Reporter) -> None:
    """Check size and checksums; a mismatch moves the file to ``<path>.corrupt`` and raises."""
    problems = []
    size = os.path.getsize(path)
    if expected.size is not None and size != expected.size:
        problems.append(f"{size} bytes, expected {expected.size}")
    else:
        sha256, md5 = file_digests(path, expected.md5 is not None)
        if expected.sha256 is not None and sha256 != expected.sha256:
            problems.append(f"sha256 {sha256}, expected {expected.sha256}")
        if expected.md5 is not None and md5 != expected.md5:
            problems.append(f"md5 {md5}, expected {expected.md5}")
    if problems:
        os.replace(path, path + ".corrupt")
        raise DownloadError(
            f"{source.name} does not match the table ({'; '.join(problems)}): a corrupted or "
            f"changed file. It was moved to {path}.corrupt; rerun to download it again (a "
            f"mirror's own copy: pass --sha256 {source.name}=HEX).")
    if expected.sha256 or expected.md5:
        kinds = " and ".join(k for k, v in (("size", expected.size), ("sha256", expected.sha256),
                                            ("md5", expected.md5)) if v)
        report(f"  {source.name}: {kinds} verified")
    else:
        why = expected.why if report.first_time(expected.why) else "as above"
        report(f"  {source.name}: no checksum known ({why}); "
               f"{DATASET_SPECS[source.dataset].unverified_check}")


@dataclasses.dataclass(frozen=True)
class Expected:
    size: int | None
    sha256: str | None
    md5: str | None
    why: str = ""


def expected_for(source: Source, sha256_overrides: dict[str, str | None]) -> Expected:
    """The table's size and checksums, or those of ``--sha256 NAME=HEX|none`` (which replace
    them all: a mirror's own copy)."""
    if source.name in sha256_overrides:
        value = sha256_overrides[source.name]
        return Expected(None, value, None,
                        "--sha256 none" if value is None else "given with --sha256")
    why = source.note if source.sha256 is None and source.md5 is None else ""
    return Expected(source.size, source.sha256, source.md5, why)


def obtain(source: Source, downloads: str, url: str, expected: Expected, retries: int,
           report: Reporter) -> str:
    """The verified file ``<downloads>/<name>``: used as it is when already there (placed by
    hand, or kept from an earlier run), else fetched."""
    path = os.path.join(downloads, source.name)
    if os.path.isfile(path):
        report(f"  {source.name}: found in {downloads}")
    else:
        part = path + ".part"
        have = os.path.getsize(part) if os.path.exists(part) else 0
        if have:
            report(f"  {source.name}: continuing the partial download ({have} bytes in {part})")
        report(f"  {source.name}: downloading {url}")
        if is_google_drive(url):
            fetch_google_drive(source, url, path, report)
        else:
            fetch_http(source, url, path, expected.size, retries, report)
    verify_file(source, path, expected, report)
    return path
