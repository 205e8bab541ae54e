"""Weight sources, the download cache and offline use.

A zoo entry lists its weights as tables ``{source, sha256, size, filename}``; ``source`` is one of

- ``https://...`` / ``http://...``: a ``.safetensors`` file, downloaded into the cache;
  ``sha256`` and ``size`` are mandatory.
- ``file://...`` or a plain local path: a ``.safetensors`` file or a bundle directory, used in
  place (checked against ``sha256`` / ``size`` when they are given).
- ``package:some_pkg/path/inside``: a file or bundle shipped inside an installed package.
- ``hf-hub:org/name[@revision]`` (a whole bundle repository, the layout ``save_pretrained``
  writes) or ``hf-hub:org/name[@revision]/path/in/repo.safetensors`` (one file).

Downloads go to ``cache_dir()`` (``$XMATCH_HOME``, default ``$XDG_CACHE_HOME/xmatch`` or
``~/.cache/xmatch``): URL files under ``weights/<sha256>/<filename>``, Hugging Face files in
the hub's own layout under ``huggingface/``, so copying that one directory carries everything
to an air-gapped machine. ``XMATCH_OFFLINE=1`` or ``HF_HUB_OFFLINE=1`` never touches the network.

A cached file is checked against its sha256 the first time a process uses it (then remembered
by device, inode, size and modification time, so later loads cost one ``stat``): a cache copied
between machines may be damaged. Online, a damaged file is downloaded again; offline, it is a
:class:`CorruptCacheError` that says what is wrong (truncated, wrong size, changed bytes).

Design choice. Plain URLs use the standard library (``urllib.request``) with ``filelock`` and
``tqdm``, both already required by huggingface_hub and torch. pooch was evaluated and rejected:
its HTTP downloader always writes a whole new file (no HTTP ``Range`` resumption), retries by
downloading again from zero, and takes no lock, so two processes download the same file twice;
it would also add ``requests``. huggingface_hub's ``http_get`` resumes, but it is an internal
helper tied to the Hub (its headers, Xet transfers) whose signature changes between releases.
What we need on top of one GET with a ``Range`` header — a size check against
``Content-Length``, sha256, ``os.replace`` into place, a lock, bounded retries with backoff — is
short enough to own and test against a local server. ``hf-hub:`` sources go through
``huggingface_hub`` (``hf_hub_download`` / ``snapshot_download``), which handles the Hub's API,
revisions, its cache layout and ``local_files_only``; we add the sha256 check when the entry
gives one, and pickle files are never downloaded from a repository.

Backbone weights (``weights=`` of the timm encoders, ``checkpoint=`` of VSE++'s CNN) go
through the same :func:`fetch`, so they take the same sources, checks and cache; they may also
be a local or packaged ``.pth`` state dict (``local_pickle=True``), read with
``torch.load(weights_only=True)``.

Security: only safetensors weights are fetched; a network source naming a pickle file
(``.pth``, ``.bin``, ...) is refused when the entry is validated, before any download.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import logging
import os
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xmatch.io.bundle import WEIGHTS_FILE
from xmatch.io.files import sha256_file
from xmatch.core.errors import XmatchError
from xmatch.core.sources import (
    COMMIT_HEX,
    FILE_URL,
    PICKLE_SUFFIXES,
    SHA256_HEX,
    WeightSource,
    parse_hf_source,
    resolve_local_source,
    validate_weight_source,
    warn_if_movable,
)

if TYPE_CHECKING:
    from tqdm import tqdm

    from xmatch.core.zoo import ZooEntry

ENV_HOME = "XMATCH_HOME"
ENV_OFFLINE = ("XMATCH_OFFLINE", "HF_HUB_OFFLINE")
ENV_TIMEOUT = "XMATCH_DOWNLOAD_TIMEOUT"
ENV_RETRIES = "XMATCH_DOWNLOAD_RETRIES"
ENV_MIN_RATE = "XMATCH_DOWNLOAD_MIN_RATE"
DEFAULT_TIMEOUT_S = 30.0
DEFAULT_RETRIES = 5
# bytes/s, averaged over each stretch of `timeout` seconds: below it a download counts as stalled
DEFAULT_MIN_RATE = 1024.0
RETRY_BACKOFF_S = 1.0  # first wait between attempts; doubles each time, capped at MAX_BACKOFF_S
MAX_BACKOFF_S = 30.0
CHUNK_BYTES = 1 << 20

_RETRY_STATUS = {408, 425, 429, 500, 502, 503, 504}

logger = logging.getLogger(__name__)

# sha256 of files hashed in this process, by (device, inode, size, mtime): a file is hashed
# once per process, and again only when it was replaced or rewritten
_DIGESTS: dict[tuple[int, int, int, int], str] = {}


class DownloadError(XmatchError, OSError):
    """A weight source could not be fetched (HTTP error, connection lost, retries exhausted)."""


class DownloadTimeoutError(DownloadError, TimeoutError):
    """The server did not answer within the timeout, on every attempt."""


class ChecksumError(XmatchError, ValueError):
    """A file's size or sha256 differs from what the weight source declares."""


class OfflineError(XmatchError, FileNotFoundError):
    """Offline mode is on and the weights are not in the cache."""


class CorruptCacheError(ChecksumError, OfflineError):
    """Offline mode is on and the cached copy of the weights is damaged (truncated, the wrong
    size, or bytes changed), so it can neither be used nor downloaded again."""


def cache_dir() -> Path:
    """The download cache: ``$XMATCH_HOME``, else ``$XDG_CACHE_HOME/xmatch``, else
    ``~/.cache/xmatch``. It is created on the first download.

    Example:
        >>> os.environ["XMATCH_HOME"] = "/data/xmatch"
        >>> xmatch.io.hub.cache_dir()
        PosixPath('/data/xmatch')
    """
    home = os.environ.get(ENV_HOME)
    if home:
        return Path(home).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "xmatch"


def offline_mode() -> bool:
    """True when ``XMATCH_OFFLINE`` or ``HF_HUB_OFFLINE`` is set to 1/true/yes/on: fetches then
    use the cache only and never touch the network.

    Example:
        >>> os.environ["XMATCH_OFFLINE"] = "1"
        >>> xmatch.io.hub.offline_mode()
        True
    """
    return _offline_switch() is not None


def _offline_switch() -> str | None:
    """The environment variable that turned offline mode on, if any."""
    return next((v for v in ENV_OFFLINE if os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")), None)


def fetch(
    source: Mapping[str, Any] | str,
    *,
    cache_dir: str | os.PathLike | None = None,
    timeout: float | None = None,
    progress: bool = True,
    min_rate: float | None = None,
    local_pickle: bool = False,
) -> Path:
    """Return a local path for a weight source, downloading and verifying it if needed.

    Args:
        source: a weights table (``{"source": ..., "sha256": ..., "size": ...}``) or a source
            string (URLs need the table, for their checksum).
        cache_dir: cache root; default :func:`cache_dir`.
        timeout: seconds to wait for the server on each read; default
            ``$XMATCH_DOWNLOAD_TIMEOUT`` or 30.
        progress: show a progress bar on stderr while downloading.
        min_rate: bytes per second a URL download must average over every ``timeout``-second
            stretch; a slower one is abandoned as stalled (and retried, resuming from the
            partial file). Default ``$XMATCH_DOWNLOAD_MIN_RATE`` or 1024; 0 turns it off.
        local_pickle: also accept a local or packaged ``.pth`` file (backbone weights; see
            :func:`validate_weight_source`).

    Returns:
        The ``.safetensors`` (or local ``.pth``) file, or the bundle directory for ``hf-hub:org/name`` and for a
        local or package directory.

    Raises:
        DownloadError: the server failed (HTTP error, retries exhausted; a timeout or a stalled
            transfer raises ``DownloadTimeoutError``). A partial download is kept as
            ``<name>.part`` and the next call resumes from it.
        ChecksumError: size or sha256 mismatch; nothing is left in the cache.
        OfflineError: offline mode and the file is not cached (``CorruptCacheError``: it is
            cached but damaged).

    Example:
        >>> path = xmatch.io.hub.fetch({"source": "https://example.org/tiny.safetensors",
        ...                          "sha256": "3f5a...", "size": 203256})  # downloads  # doctest: +SKIP
    """
    limits = _Limits(_timeout(timeout), _min_rate(min_rate))
    return _fetch(validate_weight_source(source, local_pickle=local_pickle), _root(cache_dir), limits, progress, entry=None)


def download_entry(
    name: str | ZooEntry,
    *,
    cache_dir: str | os.PathLike | None = None,
    timeout: float | None = None,
    progress: bool = True,
    min_rate: float | None = None,
) -> Path:
    """Fetch the weights ``build(name, pretrained=True)`` loads: the first of the entry's
    sources that can be fetched (the others are mirrors). Run it on a machine with network
    access, then copy the cache directory to an offline one.

    Args:
        name: the zoo entry (or its name).
        cache_dir, timeout, progress, min_rate: as for :func:`fetch`.

    Raises:
        ValueError: the entry publishes no xmatch weights (the message says where the
            original checkpoints come from and how to convert them).
        DownloadError, ChecksumError, OfflineError: no source could be fetched; the message
            lists each source's failure.

    Example:
        >>> xmatch.io.hub.download_entry("my-entry")  # downloads  # doctest: +SKIP
        PosixPath('/home/me/.cache/xmatch/weights/3f5a.../model.safetensors')
    """
    from xmatch.core.zoo import ZooEntry

    if isinstance(name, ZooEntry):
        entry = name
    else:
        from xmatch.core.zoo import info

        entry = info(name)
    if not entry.weights:
        raise ValueError(f"zoo entry '{entry.name}' has no published xmatch weights. {entry.origin}")
    root = _root(cache_dir)
    limits = _Limits(_timeout(timeout), _min_rate(min_rate))
    errors: list[tuple[str, Exception]] = []
    for table in entry.weights:
        try:
            return _fetch(validate_weight_source(table), root, limits, progress, entry=entry.name)
        except (OSError, ValueError) as exc:
            errors.append((str(table.get("source")), exc))
    if len(errors) == 1:
        message = f"zoo entry '{entry.name}': {errors[0][1]}"
    else:
        reasons = "\n".join(f"  - {src}: {exc}" for src, exc in errors)
        message = f"zoo entry '{entry.name}': none of its {len(errors)} weight sources could be fetched:\n{reasons}"
    kinds = {type(exc) for _, exc in errors}
    raise (kinds.pop() if len(kinds) == 1 else DownloadError)(message) from errors[-1][1]


def _root(override: str | os.PathLike | None) -> Path:
    return Path(override).expanduser() if override is not None else cache_dir()


@dataclass(frozen=True)
class _Limits:
    """How long to wait for a server: ``timeout`` seconds per read, and at least ``min_rate``
    bytes/s over every ``timeout``-second stretch of a transfer (0: no minimum)."""

    timeout: float
    min_rate: float


def _fetch(src: WeightSource, root: Path, limits: _Limits, progress: bool, entry: str | None) -> Path:
    if src.kind == "url":
        return _fetch_url(src, root, limits, progress, entry)
    if src.kind == "hf-hub":
        return _fetch_hf(src, root, limits.timeout, progress, entry)
    if src.kind == "package":
        return _checked_local(src, Path(resolve_local_source(src.source)))
    path = src.source
    if path.startswith(FILE_URL):
        parts = urllib.parse.urlsplit(path)
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"weight source '{path}': file:// URLs must name a local file (file:///abs/path).")
        path = urllib.request.url2pathname(parts.path)
    return _checked_local(src, Path(path).expanduser())


def _timeout(value: float | None) -> float:
    if value is not None:
        return float(value)
    text = os.environ.get(ENV_TIMEOUT)
    try:
        return float(text) if text else DEFAULT_TIMEOUT_S
    except ValueError:
        raise ValueError(f"{ENV_TIMEOUT}={text!r} is not a number of seconds.") from None


def _min_rate(value: float | None) -> float:
    if value is None:
        text = os.environ.get(ENV_MIN_RATE)
        try:
            value = float(text) if text else DEFAULT_MIN_RATE
        except ValueError:
            raise ValueError(f"{ENV_MIN_RATE}={text!r} is not a number of bytes per second.") from None
    if not value >= 0:  # also refuses NaN
        raise ValueError(f"min_rate must be 0 (no minimum) or a positive number of bytes per second, got {value}.")
    return float(value)


def _retries() -> int:
    text = os.environ.get(ENV_RETRIES)
    try:
        return int(text) if text else DEFAULT_RETRIES
    except ValueError:
        raise ValueError(f"{ENV_RETRIES}={text!r} is not a whole number.") from None


def _checked_local(src: WeightSource, path: Path) -> Path:
    if not path.exists():
        raise FileNotFoundError(f"weight source '{src.source}': {path} does not exist.")
    weights = path / WEIGHTS_FILE if path.is_dir() else path
    if path.is_dir() and not weights.is_file():
        raise FileNotFoundError(
            f"weight source '{src.source}': {path} is a directory without {WEIGHTS_FILE}; "
            "a bundle is what xmatch.save_pretrained writes."
        )
    _verify(weights, src)
    return path


def _verify(path: Path, src: WeightSource) -> None:
    """Size first (free), then sha256; a mismatch raises ChecksumError."""
    if src.size is not None and (actual := path.stat().st_size) != src.size:
        raise ChecksumError(
            f"weight source '{src.source}': {path.name} has {actual} bytes, expected {src.size}."
        )
    if src.sha256 is not None and (digest := _digest(path)) != src.sha256:
        raise ChecksumError(
            f"weight source '{src.source}': sha256 mismatch for {path.name}: got {digest}, expected {src.sha256}. "
            "The file differs from the one the entry was published with."
        )


def _digest(path: Path) -> str:
    """sha256 of ``path``, hashed once per process per version of the file (see ``_DIGESTS``)."""
    before = path.stat()
    key = (before.st_dev, before.st_ino, before.st_size, before.st_mtime_ns)
    digest = _DIGESTS.get(key)
    if digest is None:
        digest = sha256_file(path)
        after = path.stat()
        if (after.st_dev, after.st_ino, after.st_size, after.st_mtime_ns) == key:  # not written meanwhile
            _DIGESTS[key] = digest
    return digest


def _damage(path: Path, src: WeightSource) -> str | None:
    """What is wrong with the cached copy ``path`` of ``src`` (None: it is the published file,
    as far as the source's size and sha256, when given, tell)."""
    size = path.stat().st_size
    if src.size is not None and size < src.size:
        return f"truncated ({size} of {src.size} bytes)"
    if src.size is not None and size > src.size:
        return f"the wrong size ({size} bytes, expected {src.size})"
    if src.sha256 is None:
        return None
    digest = _digest(path)
    if digest != src.sha256:
        return f"corrupted (sha256 mismatch: got {digest}, expected {src.sha256}; its bytes were changed)"
    return None


def _offline_error(
    src: WeightSource, expected: Path, root: Path, entry: str | None, damage: str | None = None
) -> OfflineError:
    what = f"zoo entry '{entry}' (source '{src.source}')" if entry else f"'{src.source}'"
    if damage is not None:
        return CorruptCacheError(
            f"offline mode ({_offline_switch()} is set): the cached file {expected} with the weights of "
            f"{what} is {damage}. Offline it cannot be downloaded again: delete it and copy it again "
            f"from a machine where `xmatch download {entry or 'ENTRY'}` (or xmatch.io.hub.fetch) completed, "
            "or turn offline mode off once to download it again."
        )
    return OfflineError(
        f"offline mode ({_offline_switch()} is set): the weights of {what} are not in the cache "
        f"(expected {expected}). Prefetch them on a machine with network access with "
        f"`xmatch download {entry or 'ENTRY'}` (or xmatch.io.hub.fetch), then copy that machine's cache "
        f"directory to {root} here (or point {ENV_HOME} at the copy)."
    )


# -- plain URLs ------------------------------------------------------------------------------


class _Retryable(Exception):
    """A transient failure: the next attempt resumes from the partial file."""

    def __init__(self, message: str, advice: str = "", timed_out: bool = False) -> None:
        super().__init__(message)
        self.advice = advice
        self.timed_out = timed_out


def _fetch_url(src: WeightSource, root: Path, limits: _Limits, progress: bool, entry: str | None) -> Path:
    assert src.sha256 is not None and src.size is not None  # validate_weight_source guarantees it
    target = root / "weights" / src.sha256 / src.filename
    damage = _damage(target, src) if target.is_file() else None
    if target.is_file() and damage is None:
        return target
    if offline_mode():
        raise _offline_error(src, target, root, entry, damage)
    if damage is not None:
        logger.warning("the cached file %s is %s; downloading it again from %s", target, damage, src.source)
    from filelock import FileLock, Timeout

    (root / "locks").mkdir(parents=True, exist_ok=True)
    lock = FileLock(root / "locks" / f"{src.sha256}.lock")
    try:
        lock.acquire(timeout=0)
    except Timeout:
        logger.info("waiting for another process downloading %s", src.filename)
        lock.acquire()
    try:
        if target.is_file():
            if _damage(target, src) is None:  # another process downloaded it meanwhile
                return target
            target.unlink()  # damaged: the cache never keeps a file known to be wrong
        part = target.with_name(target.name + ".part")
        try:
            _download(src, part, limits, progress)
            _verify(part, src)
        except ChecksumError:
            part.unlink(missing_ok=True)
            _remove_if_empty(part.parent)
            raise
        os.replace(part, target)
        return target
    finally:
        lock.release()


def _remove_if_empty(directory: Path) -> None:
    try:
        directory.rmdir()
    except OSError:
        pass  # not empty or already gone


def _download(src: WeightSource, part: Path, limits: _Limits, progress: bool) -> None:
    """Fill ``part`` up to ``src.size`` bytes, resuming what is there; retry transient
    failures with exponential backoff. An attempt that added bytes at ``limits.min_rate`` or
    faster on average does not count as a failure (so a stalled trickle does)."""
    from xmatch.core.progress import progress_bar

    assert src.size is not None
    retries, failures = _retries(), 0
    with progress_bar(
        total=src.size, unit="B", unit_scale=True, unit_divisor=1024, desc=src.filename,
        show=progress, file=sys.stderr, leave=False,
    ) as bar:
        while True:
            have = part.stat().st_size if part.exists() else 0
            if have > src.size:  # a stale partial of some other file: start again
                part.unlink()
                have = 0
            if have == src.size:
                return
            started = time.monotonic()
            try:
                _get(src, part, have, limits, bar)
            except _Retryable as exc:
                added = (part.stat().st_size if part.exists() else 0) - have
                progressed = added > 0 and added >= limits.min_rate * (time.monotonic() - started)
                failures = 0 if progressed else failures + 1
                if failures > retries:
                    kept = part.stat().st_size if part.exists() else 0
                    cls = DownloadTimeoutError if exc.timed_out else DownloadError
                    advice = f" ({exc.advice})" if exc.advice else ""
                    raise cls(
                        f"downloading {src.source} failed after {retries + 1} attempts without progress: "
                        f"{exc}{advice}. {kept} of {src.size} bytes are kept in {part}; "
                        "the next call resumes from there."
                    ) from None
                logger.info("downloading %s: %s; trying again", src.source, exc)
                if failures:
                    time.sleep(min(RETRY_BACKOFF_S * 2 ** (failures - 1), MAX_BACKOFF_S))


def _get(src: WeightSource, part: Path, have: int, limits: _Limits, bar: tqdm) -> None:
    """One GET from byte ``have``; appends to ``part``. Raises _Retryable on transient failures."""
    from xmatch.core.version import __version__

    timeout = limits.timeout
    timeout_advice = f"raise it with timeout= or {ENV_TIMEOUT}"
    headers = {"User-Agent": f"xmatch/{__version__}"}
    if have:
        headers["Range"] = f"bytes={have}-"
    request = urllib.request.Request(src.source, headers=headers)
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as exc:
        if exc.code == 416:  # our partial does not fit the server's file: start again
            part.unlink(missing_ok=True)
            raise _Retryable("the server refused to resume (HTTP 416)") from None
        if exc.code in _RETRY_STATUS:
            raise _Retryable(f"HTTP {exc.code} {exc.reason}") from None
        hint = " (the file is not at that address; check the entry's source URL)" if exc.code == 404 else ""
        raise DownloadError(f"downloading {src.source}: HTTP {exc.code} {exc.reason}{hint}.") from None
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, TimeoutError):
            raise _Retryable(f"timed out after {timeout} s", timeout_advice, timed_out=True) from None
        raise _Retryable(str(exc.reason)) from None
    except TimeoutError:
        raise _Retryable(f"timed out after {timeout} s", timeout_advice, timed_out=True) from None
    except (OSError, http.client.HTTPException) as exc:
        raise _Retryable(f"connection failed: {exc!r}") from None
    with response:
        start = _resume_offset(response, have)
        if start is None:  # a range we did not ask for: drop the partial and start again
            part.unlink(missing_ok=True)
            raise _Retryable(f"unexpected Content-Range {response.headers.get('Content-Range')!r} for bytes={have}-")
        length = response.headers.get("Content-Length")
        if length is not None and start + int(length) != src.size:
            raise ChecksumError(
                f"weight source '{src.source}': the server's file has {start + int(length)} bytes, "
                f"expected {src.size}; the file changed on the server or the entry is wrong."
            )
        bar.reset()
        bar.update(start)
        part.parent.mkdir(parents=True, exist_ok=True)
        with open(part, "ab" if start else "wb") as f:
            try:
                _copy_body(src, response, f, limits, bar)
            except TimeoutError:
                raise _Retryable(f"timed out after {timeout} s", timeout_advice, timed_out=True) from None
            except (OSError, http.client.HTTPException) as exc:
                raise _Retryable(f"connection lost: {exc!r}") from None
            received = f.tell()
    if received < src.size:
        raise _Retryable(f"connection closed after {received} of {src.size} bytes")


def _copy_body(src: WeightSource, response: http.client.HTTPResponse, f: Any, limits: _Limits, bar: tqdm) -> None:
    """Append the response body to ``f``. ``read1`` returns whatever has arrived, so the bar
    moves with every packet and a trickle is measured: fewer than ``min_rate`` bytes/s over a
    stretch of ``timeout`` seconds raises _Retryable (a per-read timeout alone never fires when
    the server sends one byte at a time)."""
    assert src.size is not None
    window_start, window_bytes = time.monotonic(), 0
    while chunk := response.read1(CHUNK_BYTES):
        if f.tell() + len(chunk) > src.size:
            raise ChecksumError(
                f"weight source '{src.source}': the server sent more than the expected {src.size} bytes."
            )
        f.write(chunk)
        bar.update(len(chunk))
        window_bytes += len(chunk)
        elapsed = time.monotonic() - window_start
        if limits.min_rate and elapsed >= limits.timeout:
            if window_bytes < limits.min_rate * elapsed:
                raise _Retryable(
                    f"stalled: {window_bytes} bytes in {elapsed:.1f} s, below the minimum of "
                    f"{limits.min_rate:g} bytes/s",
                    f"lower it with min_rate= or {ENV_MIN_RATE}; 0 turns the check off",
                    timed_out=True,
                )
            window_start, window_bytes = time.monotonic(), 0


def _resume_offset(response: http.client.HTTPResponse, have: int) -> int | None:
    """Where the body starts: ``have`` for a matching 206, 0 when the server sent the whole
    file (it ignored ``Range``: the partial is overwritten), None for any other range."""
    if response.status != 206:
        return 0
    match = re.fullmatch(r"bytes (\d+)-\d+/(\d+|\*)", response.headers.get("Content-Range", "").strip())
    return have if match is not None and int(match.group(1)) == have else None


# -- Hugging Face Hub ------------------------------------------------------------------------


def _fetch_hf(src: WeightSource, root: Path, timeout: float, progress: bool, entry: str | None) -> Path:
    import huggingface_hub
    from huggingface_hub.utils import LocalEntryNotFoundError

    from xmatch.core.version import __version__

    repo_id, revision, path = parse_hf_source(src.source)
    warn_if_movable(src.source)  # a zoo entry's references are pinned (refused otherwise): a user's may move
    if path is not None:
        return _fetch_hf_file(src, root, timeout, progress, entry)
    hf_cache = root / "huggingface"
    options: dict[str, Any] = {
        "revision": revision, "cache_dir": hf_cache, "local_files_only": offline_mode(),
        "etag_timeout": timeout, "library_name": "xmatch", "library_version": __version__,
    }

    def download(force: bool) -> tuple[Path, Path]:
        try:
            with _hf_progress_bars(progress):
                patterns = [f"*{suffix}" for suffix in PICKLE_SUFFIXES]
                local = Path(huggingface_hub.snapshot_download(
                    repo_id, ignore_patterns=patterns, force_download=force, **options))
        except LocalEntryNotFoundError as exc:
            if offline_mode():
                expected = hf_cache / f"models--{repo_id.replace('/', '--')}"
                raise _offline_error(src, expected, root, entry) from None
            raise DownloadError(f"weight source '{src.source}': {exc}") from exc
        except OSError as exc:  # huggingface_hub's HTTP errors (repository, revision, file not found)
            raise DownloadError(f"weight source '{src.source}': {exc}") from exc
        weights = local / WEIGHTS_FILE
        if not weights.is_file():
            raise DownloadError(
                f"weight source '{src.source}': the repository has no {WEIGHTS_FILE}; "
                "a bundle repository holds what xmatch.save_pretrained writes."
            )
        return local, weights

    local, weights = download(force=False)
    # huggingface_hub trusts its cache; without a sha256 in the entry, a blob named by its
    # sha256 (how the hub stores large files) is checked against its own name
    checked = replace(src, sha256=src.sha256 or _blob_sha256(weights))
    damage = _damage(weights, checked)
    if damage is None:
        return local
    if offline_mode():
        raise _offline_error(src, weights, root, entry, damage)
    logger.warning("the cached file %s is %s; downloading it again from %s", weights, damage, src.source)
    local, weights = download(force=True)
    _verify(weights, checked)
    return local


def _blob_sha256(path: Path) -> str | None:
    """The sha256 a huggingface_hub cache file is stored under, if its blob is named by one."""
    name = Path(os.path.realpath(path)).name
    return name if SHA256_HEX.fullmatch(name) else None


# -- one file of a hub repository: verified against the Hub's own metadata ---------------------


@dataclass(frozen=True)
class _Claim:
    """What a file must be, and who says so: a size, and its sha256 or its git blob sha1."""

    who: str
    size: int | None
    sha256: str | None = None
    git_sha1: str | None = None


def _claim_damage(path: Path, claim: _Claim) -> str | None:
    """What is wrong with ``path`` against ``claim`` (None: nothing), in the words of :func:`_damage`."""
    size = path.stat().st_size
    if claim.size is not None and size != claim.size:
        state = f"truncated ({size} of {claim.size} bytes" if size < claim.size else (
            f"the wrong size ({size} bytes, expected {claim.size}")
        return f"{state}, as {claim.who} states)"
    if claim.sha256 is not None and (digest := _digest(path)) != claim.sha256:
        return (f"corrupted (sha256 mismatch: got {digest}, expected {claim.sha256}, as {claim.who} states; "
                "its bytes were changed)")
    if claim.git_sha1 is not None and (digest := _git_blob_sha1(path)) != claim.git_sha1:
        return (f"corrupted (git blob sha1 mismatch: got {digest}, expected {claim.git_sha1}, as {claim.who} "
                "states; its bytes were changed)")
    return None


def _git_blob_sha1(path: Path) -> str:
    """The id git gives the content of ``path`` (the Hub's ETag of a file not stored with LFS)."""
    digest = hashlib.sha1(b"blob %d\0" % path.stat().st_size)
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def _blob_claim(path: Path) -> _Claim | None:
    """What huggingface_hub's blob name says of a cached file: it names a blob by the ETag the
    Hub gave (the sha256 of an LFS file, the git blob sha1 of any other)."""
    name = Path(os.path.realpath(path)).name
    if SHA256_HEX.fullmatch(name):
        return _Claim("its blob name in huggingface_hub's cache", None, sha256=name)
    if COMMIT_HEX.fullmatch(name):
        return _Claim("its blob name in huggingface_hub's cache", None, git_sha1=name)
    return None


def _snapshot_commit(local: Path, hf_cache: Path, repo_id: str) -> str | None:
    """The commit of a file huggingface_hub cached (``snapshots/<commit>/...``), if it is one."""
    snapshots = hf_cache / f"models--{repo_id.replace('/', '--')}" / "snapshots"
    try:
        commit = local.relative_to(snapshots).parts[0]
    except (ValueError, IndexError):
        return None
    return commit if COMMIT_HEX.fullmatch(commit) else None


def _record_path(root: Path, repo_id: str, commit: str, path: str) -> Path:
    """xmatch's record of a file verified against the Hub's metadata: beside huggingface_hub's
    tree, never inside it (huggingface_hub may rewrite its own)."""
    return root / "verified" / f"models--{repo_id.replace('/', '--')}" / commit / f"{path}.json"


def _read_record(record: Path) -> _Claim | None:
    try:
        data = json.loads(record.read_text(encoding="utf-8"))
        sha256, size = data["sha256"], data["size"]
        if not (isinstance(sha256, str) and SHA256_HEX.fullmatch(sha256) and type(size) is int and size >= 0):
            raise ValueError("sha256 or size malformed")
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        # the record only speeds up and strengthens checks: without it the blob name still is one
        logger.warning("ignoring the unreadable record %s (%s); the next online load writes it again", record, exc)
        return None
    return _Claim(f"xmatch's record of its verified download ({record})", size, sha256=sha256)


def _write_record(record: Path, src: WeightSource, repo_id: str, commit: str, path: str, local: Path) -> None:
    record.parent.mkdir(parents=True, exist_ok=True)
    data = {"source": src.source, "repo": repo_id, "commit": commit, "path": path,
            "sha256": _digest(local), "size": local.stat().st_size}
    tmp = record.with_name(f"{record.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, record)


def _forget_hf_file(local: Path, hf_cache: Path) -> None:
    """Delete a cached file known to be wrong: its snapshot link and the blob it points at."""
    link, blob = Path(os.path.abspath(local)), Path(os.path.realpath(local))
    if Path(os.path.abspath(hf_cache)) in link.parents:  # never a file outside the cache
        link.unlink(missing_ok=True)
    if Path(os.path.realpath(hf_cache)) in blob.parents:
        blob.unlink(missing_ok=True)


def _hf_what(src: WeightSource, entry: str | None, repo_id: str, commit: str | None, path: str) -> str:
    owner = f"zoo entry '{entry}' (source '{src.source}')" if entry else f"weight source '{src.source}'"
    at = f"commit {commit}" if commit else "the revision it names"
    return f"{owner}: {path} at {at} of {repo_id}"


def _hub_claim(
    src: WeightSource, repo_id: str, revision: str | None, path: str, timeout: float, entry: str | None
) -> tuple[str, _Claim] | None:
    """The commit and what the Hub states of the file (a HEAD of ``resolve/REVISION/PATH``:
    ``X-Repo-Commit``, the sha256 in ``X-Linked-Etag`` and ``X-Linked-Size`` for an LFS file,
    else the git blob sha1 in ``ETag``). None when the Hub cannot be reached: then
    huggingface_hub's cache answers, checked by blob name. A file, revision or repository the
    Hub does not have is a DownloadError that says so."""
    import huggingface_hub
    from huggingface_hub.utils import EntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError

    from xmatch.core.version import __version__

    what = _hf_what(src, entry, repo_id, revision, path)
    url = huggingface_hub.hf_hub_url(repo_id, path, revision=revision)
    try:
        meta = huggingface_hub.get_hf_file_metadata(url, timeout=timeout, library_name="xmatch", library_version=__version__)
    except EntryNotFoundError:
        raise DownloadError(
            f"{what}: the file is not at that {'commit' if revision and COMMIT_HEX.fullmatch(revision) else 'revision'} "
            "(the Hub answers 404 EntryNotFound). Pin a commit that holds it: HfApi().list_repo_files(repo, "
            "revision=COMMIT) lists a commit's files."
        ) from None
    except RevisionNotFoundError:
        raise DownloadError(f"{what}: the Hub has no revision '{revision}' in {repo_id} (404 RevisionNotFound).") from None
    except RepositoryNotFoundError:
        raise DownloadError(
            f"{what}: the Hub has no repository {repo_id}, or it is private or gated (set HF_TOKEN if you have access)."
        ) from None
    except _network_errors() as exc:  # unreachable, offline switch, a server error
        logger.info("%s: the Hub's metadata could not be read (%s); using huggingface_hub's cache", what, exc)
        return None
    commit = meta.commit_hash or ""
    what = _hf_what(src, entry, repo_id, commit, path)
    if revision is not None and COMMIT_HEX.fullmatch(revision) and commit != revision:
        raise ChecksumError(f"{what}: the Hub answered for commit {commit or '(none)'}, not the pinned {revision}.")
    etag = (meta.etag or "").lower()
    who = f"the Hub's metadata for commit {commit}"
    if SHA256_HEX.fullmatch(etag):
        claim = _Claim(who, meta.size, sha256=etag)
    elif COMMIT_HEX.fullmatch(etag):
        claim = _Claim(who, meta.size, git_sha1=etag)
    else:
        raise DownloadError(
            f"{what}: the Hub's answer names neither a sha256 nor a git blob sha1 (ETag {meta.etag!r}), so the "
            "download could not be verified; is HF_ENDPOINT a Hugging Face Hub?"
        )
    if src.sha256 is not None and claim.sha256 is not None and src.sha256 != claim.sha256:
        raise ChecksumError(
            f"{what}: the entry's sha256 {src.sha256} differs from the Hub's {claim.sha256} for that commit; "
            "one of them is wrong (nothing was downloaded)."
        )
    if src.size is not None and claim.size is not None and src.size != claim.size:
        raise ChecksumError(
            f"{what}: the entry's size {src.size} differs from the Hub's {claim.size} bytes for that commit; "
            "one of them is wrong (nothing was downloaded)."
        )
    return commit, claim


def _network_errors() -> tuple[type[BaseException], ...]:
    """What huggingface_hub raises when the Hub cannot be reached: OSError (requests' errors
    are OSErrors, in huggingface_hub before 1.0) and the HTTP client's own error class (httpx
    in 1.x, httpx2 in 2.x), whichever is installed."""
    import importlib

    errors: list[type[BaseException]] = [OSError]
    for module in ("httpx2", "httpx"):
        try:
            errors.append(importlib.import_module(module).HTTPError)
        except (ImportError, AttributeError):
            continue
    return tuple(errors)


def _fetch_hf_file(src: WeightSource, root: Path, timeout: float, progress: bool, entry: str | None) -> Path:
    """One file of a hub repository. Online, it is verified against the Hub's own metadata for
    its commit, and the verified sha256 and size are recorded under ``root/verified``; every
    later load re-checks the file against that record (and the entry's sha256 / size), offline
    too; without a record, against its blob name. A file known to be wrong is deleted."""
    import huggingface_hub
    from huggingface_hub.utils import LocalEntryNotFoundError

    from xmatch.core.version import __version__

    repo_id, revision, path = parse_hf_source(src.source)
    assert path is not None
    hf_cache = root / "huggingface"
    pinned = revision is not None and COMMIT_HEX.fullmatch(revision) is not None
    entry_claim = _Claim("the entry", src.size, sha256=src.sha256)

    def damage(local: Path, hub_claim: _Claim | None) -> str | None:
        claims = [entry_claim]
        if hub_claim is not None:
            claims.append(hub_claim)
        commit = _snapshot_commit(local, hf_cache, repo_id)
        record = _read_record(_record_path(root, repo_id, commit, path)) if commit else None
        if record is not None:
            claims.append(record)
        elif hub_claim is None and (blob := _blob_claim(local)) is not None:
            claims.append(blob)
        return next((d for c in claims if (d := _claim_damage(local, c)) is not None), None)

    found = huggingface_hub.try_to_load_from_cache(repo_id, path, cache_dir=hf_cache, revision=revision)
    cached = Path(found) if isinstance(found, str) else None
    if cached is not None and (pinned or offline_mode()):
        wrong = damage(cached, None)
        if wrong is None:
            return cached  # an immutable commit, checked against its record: no request
        if offline_mode():
            raise _offline_error(src, cached, root, entry, wrong)
    elif offline_mode():
        raise _offline_error(src, hf_cache / f"models--{repo_id.replace('/', '--')}", root, entry)

    answer = _hub_claim(src, repo_id, revision, path, timeout, entry)
    commit, hub_claim = answer if answer is not None else (revision, None)
    what = _hf_what(src, entry, repo_id, commit, path)

    def download(force: bool) -> Path:
        try:
            with _hf_progress_bars(progress):
                return Path(huggingface_hub.hf_hub_download(
                    repo_id, path, revision=commit, cache_dir=hf_cache, force_download=force, local_files_only=False,
                    etag_timeout=timeout, library_name="xmatch", library_version=__version__,
                ))
        except LocalEntryNotFoundError as exc:
            raise DownloadError(f"{what}: {exc}") from exc
        except OSError as exc:  # huggingface_hub's HTTP errors, and its size check
            if "consistency check failed" in str(exc).lower():
                raise ChecksumError(f"{what}: the download's size differs from the size the Hub states ({exc}).") from exc
            raise DownloadError(f"{what}: {exc}") from exc

    had = huggingface_hub.try_to_load_from_cache(repo_id, path, cache_dir=hf_cache, revision=commit)
    local = download(force=False)
    wrong = damage(local, hub_claim)
    if wrong is not None and isinstance(had, str):  # a damaged cache: downloaded again
        logger.warning("the cached file %s is %s; downloading it again from %s", local, wrong, src.source)
        _forget_hf_file(local, hf_cache)
        local = download(force=True)
        wrong = damage(local, hub_claim)
    if wrong is not None:
        _forget_hf_file(local, hf_cache)  # the cache never keeps a file known to be wrong
        raise ChecksumError(f"{what}: the downloaded file is {wrong}. It was deleted from the cache.")
    snapshot_commit = _snapshot_commit(local, hf_cache, repo_id)
    if hub_claim is not None and snapshot_commit is not None:
        _write_record(_record_path(root, repo_id, snapshot_commit, path), src, repo_id, snapshot_commit, path, local)
    return local


def fetch_hf_files(
    source: str, allow_patterns: list[str], *, cache_dir: str | os.PathLike | None = None, progress: bool = True
) -> Path:
    """The snapshot folder of the files of ``hf-hub:org/name[@revision]`` that match
    ``allow_patterns`` (a tokenizer's files, say), in xmatch's cache; each file is checked
    against the name huggingface_hub stores it under, the ETag the Hub gave (the sha256 of an
    LFS file, the git blob sha1 of any other). A revision that is not a commit is warned about
    (:class:`~xmatch.core.sources.MovableRevisionWarning`).

    Raises:
        OfflineError: offline and not cached (``CorruptCacheError``: cached but damaged).
        ChecksumError: a file downloaded again is still not what the Hub named; it is deleted.
        DownloadError: the Hub refused (unknown repository or revision) or could not be reached.

    Example:
        >>> folder = xmatch.io.hub.fetch_hf_files("hf-hub:org/name@" + "0" * 40, ["tokenizer.json"])  # downloads  # doctest: +SKIP
    """
    import huggingface_hub
    from huggingface_hub.utils import LocalEntryNotFoundError

    from xmatch.core.version import __version__

    warn_if_movable(source)
    repo_id, revision, _ = parse_hf_source(source)
    root = _root(cache_dir)
    hf_cache = root / "huggingface"

    def download() -> Path:
        try:
            with _hf_progress_bars(progress):
                return Path(huggingface_hub.snapshot_download(
                    repo_id, revision=revision, cache_dir=hf_cache, allow_patterns=allow_patterns,
                    local_files_only=offline_mode(), library_name="xmatch", library_version=__version__,
                ))
        except LocalEntryNotFoundError as exc:
            if offline_mode():
                raise _offline_error(WeightSource("hf-hub", source, None, None, ""), hf_cache / f"models--{repo_id.replace('/', '--')}", root, None) from None
            raise DownloadError(f"'{source}': {exc}") from exc
        except OSError as exc:  # huggingface_hub's HTTP errors: unknown repository or revision
            raise DownloadError(f"'{source}': {exc}") from exc

    def damaged(folder: Path) -> dict[Path, str]:
        found = {}
        for file in sorted(p for p in folder.rglob("*") if p.is_file()):
            claim = _blob_claim(file)
            if claim is not None and (wrong := _claim_damage(file, claim)) is not None:
                found[file] = wrong
        return found

    folder = download()
    wrong = damaged(folder)
    if wrong and offline_mode():
        file, damage = next(iter(wrong.items()))
        raise _offline_error(WeightSource("hf-hub", source, None, None, ""), file, root, None, damage)
    if wrong:
        for file, damage in wrong.items():
            logger.warning("the cached file %s is %s; downloading it again from %s", file, damage, source)
            _forget_hf_file(file, hf_cache)
        folder = download()
        wrong = damaged(folder)
        for file in wrong:
            _forget_hf_file(file, hf_cache)
        if wrong:
            file, damage = next(iter(wrong.items()))
            raise ChecksumError(f"'{source}': {file.relative_to(folder)} is {damage}. It was deleted from the cache.")
    return folder


@contextlib.contextmanager
def _hf_progress_bars(enabled: bool) -> Iterator[None]:
    """Silence huggingface_hub's progress bars for one call when ``progress=False`` (its
    ``tqdm_class`` argument is missing from hf_hub_download in older releases). A user's
    ``HF_HUB_DISABLE_PROGRESS_BARS`` setting has priority, as in huggingface_hub."""
    from huggingface_hub.utils import (
        are_progress_bars_disabled,
        disable_progress_bars,
        enable_progress_bars,
    )

    if enabled or "HF_HUB_DISABLE_PROGRESS_BARS" in os.environ or are_progress_bars_disabled():
        yield
        return
    disable_progress_bars()
    try:
        yield
    finally:
        enable_progress_bars()
