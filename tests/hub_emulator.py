"""A local stand-in for the parts of the Hugging Face Hub that ``huggingface_hub`` uses.

Two HTTP servers on 127.0.0.1: the Hub (``HF_ENDPOINT``) and a CDN on another port, as on the
real Hub, where a large file's ``resolve`` answer is a redirect to another host. What the Hub
answers (read from huggingface_hub 2.x's ``file_download.py`` and ``_snapshot_download.py``):

- ``HEAD``/``GET /{org}/{name}/resolve/{revision}/{path}``: ``X-Repo-Commit`` (a branch resolves
  to its commit) and an ``ETag``; a small (non-LFS) file is answered here, its ``ETag`` the git
  blob sha1; an LFS file is a 302 to ``/blobs/...`` on the CDN with ``X-Linked-Etag`` (its
  sha256, quoted) and ``X-Linked-Size``. No ``X-Xet-*`` header is sent, so huggingface_hub
  downloads over plain HTTP even where hf-xet is installed.
- ``GET /blobs/...`` on the CDN: the bytes, with ``Range`` requests (206, ``Content-Range``).
- 404 with ``X-Error-Code`` ``RepoNotFound``, ``RevisionNotFound`` or ``EntryNotFound``
  (the last one with ``X-Repo-Commit``).
- ``GET /api/models/{org}/{name}/revision/{revision}`` (``repo_info``: ``sha`` and ``siblings``)
  and ``/api/models/{org}/{name}/tree/{revision}`` (``list_repo_tree``: ``oid``, ``size``,
  ``lfs``), for ``snapshot_download``.

Knobs for tests: :meth:`HubEmulator.tamper` (serve other bytes than the advertised sha256),
:meth:`HubEmulator.lie_about_size`, :meth:`HubEmulator.drop_after` (close the connection after
N bytes, once). Every request is logged in :attr:`HubEmulator.requests`.

The ``hub_emulator`` fixture starts one, points huggingface_hub at it in this process and gives
``env`` for subprocesses (``HF_ENDPOINT``, online).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

#: files stored with git LFS unless add_commit says otherwise (as the Hub's .gitattributes do)
LFS_SUFFIXES = (".safetensors", ".bin", ".model", ".pt", ".pth", ".msgpack", ".h5")


def git_blob_sha1(data: bytes) -> str:
    """The id git gives a file's content: the ``ETag`` of a small file on the Hub."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class HubFile:
    """One file of a commit: its bytes, whether it is stored with LFS, and the test knobs."""

    data: bytes
    lfs: bool
    served: bytes | None = None  # tamper: the CDN sends these instead of ``data``
    advertised_size: int | None = None  # lie: X-Linked-Size says this
    drops: list[int] = field(default_factory=list)  # per GET: close after N bytes (then served whole)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def etag(self) -> str:
        return self.sha256 if self.lfs else git_blob_sha1(self.data)


@dataclass(frozen=True)
class Request:
    """One request the emulator answered: which server, method, path, ``Range`` header."""

    server: str  # "hub" or "cdn"
    method: str
    path: str
    range: str | None


class HubEmulator:
    """The Hub and its CDN on two local ports. See the module docstring."""

    def __init__(self) -> None:
        self.commits: dict[str, dict[str, dict[str, HubFile]]] = {}  # repo -> commit -> path -> file
        self.refs: dict[str, dict[str, str]] = {}  # repo -> branch -> commit
        self.requests: list[Request] = []
        self.lock = threading.Lock()
        self.hub = ThreadingHTTPServer(("127.0.0.1", 0), self._handler("hub"))
        self.cdn = ThreadingHTTPServer(("127.0.0.1", 0), self._handler("cdn"))
        for server in (self.hub, self.cdn):
            server.handle_error = lambda *args: None  # a client hanging up on a dropped answer
        self.threads = [threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
                        for s in (self.hub, self.cdn)]

    # -- set-up -------------------------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        """The Hub's address, for ``HF_ENDPOINT``."""
        return f"http://127.0.0.1:{self.hub.server_address[1]}"

    @property
    def cdn_url(self) -> str:
        return f"http://127.0.0.1:{self.cdn.server_address[1]}"

    def add_commit(
        self,
        repo: str,
        commit: str,
        files: dict[str, bytes],
        *,
        lfs: set[str] | Callable[[str], bool] | None = None,
        branch: str | None = "main",
    ) -> str:
        """Add a commit holding ``files`` (path -> bytes) to ``repo``; ``lfs`` names the LFS files
        (a set of paths or a rule; default: by suffix, as the Hub's ``.gitattributes``); the
        branch (None: none) then points at it. Returns the commit."""
        assert re.fullmatch(r"[0-9a-f]{40}", commit), "a commit is 40 hexadecimal digits"
        rule = lfs if callable(lfs) else (lambda p: p in lfs) if lfs is not None else (lambda p: p.endswith(LFS_SUFFIXES))
        with self.lock:
            self.commits.setdefault(repo, {})[commit] = {p: HubFile(d, bool(rule(p))) for p, d in files.items()}
            if branch is not None:
                self.refs.setdefault(repo, {})[branch] = commit
        return commit

    def file(self, repo: str, commit: str, path: str) -> HubFile:
        return self.commits[repo][commit][path]

    def tamper(self, repo: str, commit: str, path: str, served: bytes) -> None:
        """Serve ``served`` for that file while advertising the original's sha256 (or git blob
        sha1) and size."""
        self.file(repo, commit, path).served = served

    def lie_about_size(self, repo: str, commit: str, path: str, size: int) -> None:
        """Advertise ``size`` in ``X-Linked-Size`` (the bytes served are the real ones)."""
        self.file(repo, commit, path).advertised_size = size

    def drop_after(self, repo: str, commit: str, path: str, nbytes: int) -> None:
        """Close the connection after ``nbytes`` of the next GET of that file (once)."""
        self.file(repo, commit, path).drops.append(nbytes)

    def gets(self, server: str = "cdn") -> list[Request]:
        """The GET requests one server answered, in order."""
        return [r for r in self.requests if r.server == server and r.method == "GET"]

    # -- answers ------------------------------------------------------------------------------

    def _resolve(self, repo: str, revision: str) -> str | None:
        commits = self.commits.get(repo, {})
        if revision in commits:
            return revision
        return self.refs.get(repo, {}).get(revision)

    def _handler(self, server: str) -> type[BaseHTTPRequestHandler]:
        emulator = self

        class Handler(BaseHTTPRequestHandler):
            def do_HEAD(self) -> None:
                self._answer(body=False)

            def do_GET(self) -> None:
                self._answer(body=True)

            def log_message(self, *args: object) -> None:
                pass

            def _answer(self, body: bool) -> None:
                with emulator.lock:
                    emulator.requests.append(Request(server, self.command, self.path, self.headers.get("Range")))
                path = urllib.parse.urlsplit(self.path).path
                if server == "cdn":
                    self._blob(path, body)
                elif path.startswith("/api/models/"):
                    self._api(path[len("/api/models/") :])
                elif (match := re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)) is not None:
                    repo, revision, name = (urllib.parse.unquote(g) for g in match.groups())
                    self._file(repo, revision, name, body)
                else:
                    self._error(404, "", "not a path of the Hub's API")

            def _error(self, status: int, code: str, message: str, commit: str | None = None) -> None:
                self.send_response(status)
                if code:
                    self.send_header("X-Error-Code", code)
                self.send_header("X-Error-Message", message)
                if commit is not None:
                    self.send_header("X-Repo-Commit", commit)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def _lookup(self, repo: str, revision: str) -> str | None:
                """The commit, or None after answering the Hub's 404."""
                if repo not in emulator.commits:
                    self._error(404, "RepoNotFound", "Repository not found")
                    return None
                commit = emulator._resolve(repo, revision)
                if commit is None:
                    self._error(404, "RevisionNotFound", "Invalid rev id: " + revision)
                return commit

            def _file(self, repo: str, revision: str, name: str, body: bool) -> None:
                commit = self._lookup(repo, revision)
                if commit is None:
                    return
                item = emulator.commits[repo][commit].get(name)
                if item is None:
                    self._error(404, "EntryNotFound", f"{name} does not exist on \"{revision}\"", commit)
                    return
                if not item.lfs:  # small files come from the Hub itself
                    data = item.data if item.served is None else item.served
                    self.send_response(200)
                    self.send_header("X-Repo-Commit", commit)
                    self.send_header("ETag", f'"{item.etag}"')
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    if body:
                        self.wfile.write(data)
                    return
                quoted = urllib.parse.quote(repo, safe="")
                self.send_response(302)
                self.send_header("Location", f"{emulator.cdn_url}/blobs/{quoted}/{commit}/{urllib.parse.quote(name)}")
                self.send_header("X-Repo-Commit", commit)
                self.send_header("X-Linked-Etag", f'"{item.sha256}"')
                self.send_header("X-Linked-Size", str(item.advertised_size or len(item.data)))
                self.send_header("ETag", f'"{git_blob_sha1(item.data)}"')  # the LFS pointer's id
                self.send_header("Content-Length", "0")
                self.end_headers()

            def _blob(self, path: str, body: bool) -> None:
                match = re.fullmatch(r"/blobs/([^/]+)/([0-9a-f]{40})/(.+)", path)
                if match is None:
                    self._error(404, "", "no such blob")
                    return
                repo, commit, name = (urllib.parse.unquote(g) for g in match.groups())
                item = emulator.commits.get(repo, {}).get(commit, {}).get(name)
                if item is None:
                    self._error(404, "", "no such blob")
                    return
                data = item.data if item.served is None else item.served
                start = 0
                wanted = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range") or "")
                if wanted is not None:
                    start = int(wanted.group(1))
                    if start >= len(data):
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(data)}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(len(data) - start))
                self.end_headers()
                if not body:
                    return
                with emulator.lock:
                    cut = item.drops.pop(0) if item.drops else None
                self.wfile.write(data[start:] if cut is None else data[start : start + cut])
                # a cut answer closes the connection short of its Content-Length (HTTP/1.0)

            def _api(self, rest: str) -> None:
                match = re.fullmatch(r"([^/]+/[^/]+)/(revision|tree)/([^/]+)(?:/(.*))?", rest)
                if match is None:
                    self._error(404, "", "not a path of the Hub's API")
                    return
                repo, kind, revision = (urllib.parse.unquote(g) for g in match.groups()[:3])
                commit = self._lookup(repo, revision)
                if commit is None:
                    return
                files = emulator.commits[repo][commit]
                if kind == "revision":
                    answer: object = {
                        "id": repo, "sha": commit,
                        "siblings": [{"rfilename": p, "size": len(f.data),
                                      **({"lfs": {"sha256": f.sha256, "size": len(f.data), "pointerSize": 134}}
                                         if f.lfs else {})} for p, f in sorted(files.items())],
                    }
                else:
                    answer = [{"type": "file", "path": p, "size": len(f.data), "oid": git_blob_sha1(f.data),
                               **({"lfs": {"oid": f.sha256, "size": len(f.data), "pointerSize": 134}} if f.lfs else {})}
                              for p, f in sorted(files.items())]
                data = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler

    # -- life cycle ---------------------------------------------------------------------------

    def start(self) -> HubEmulator:
        for thread in self.threads:
            thread.start()
        return self

    def stop(self) -> None:
        for server in (self.hub, self.cdn):
            server.shutdown()
            server.server_close()

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a subprocess that talks to this emulator (online)."""
        env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "XMATCH_OFFLINE", "TRANSFORMERS_OFFLINE")}
        return {**env, "HF_ENDPOINT": self.endpoint, "HF_HUB_DISABLE_TELEMETRY": "1", **extra}


@pytest.fixture
def hub_emulator(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[HubEmulator]:
    """A started :class:`HubEmulator`; huggingface_hub in this process talks to it, online
    (huggingface_hub reads ``HF_ENDPOINT`` and ``HF_HUB_OFFLINE`` once, at import), and
    ``XMATCH_HOME`` is an empty cache under ``tmp_path``."""
    from huggingface_hub import constants

    emulator = HubEmulator().start()
    monkeypatch.setenv("HF_ENDPOINT", emulator.endpoint)
    monkeypatch.setattr(constants, "ENDPOINT", emulator.endpoint)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", emulator.endpoint + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    for name in ("HF_HUB_OFFLINE", "XMATCH_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XMATCH_HOME", str(tmp_path / "xmatch-cache"))
    try:
        yield emulator
    finally:
        emulator.stop()
