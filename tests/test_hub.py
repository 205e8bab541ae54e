"""Weight sources and the download cache, against a real HTTP server on 127.0.0.1.

The server serves a real bundle written by ``save_pretrained`` and can resume (Range), ignore
Range, drop the connection mid-file, answer 404, stall, trickle, and counts every request.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

import xmatch
from xmatch.io import hub
from xmatch.cli.main import main
from xmatch.core.registry import models

from conftest import tiny_spec

REPO = Path(__file__).resolve().parents[1]
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class Served:
    body: bytes
    plan: list[int | None] = field(default_factory=list)  # per GET: drop after N body bytes (None: serve all)
    ignore_range: bool = False
    delay: float = 0.0  # seconds between the headers and the body
    chunk_delay: float = 0.0  # seconds between 16 KiB chunks
    trickle: float = 0.0  # seconds between single bytes (a stalled server); 0: normal chunks
    finished: list[float] = field(default_factory=list)  # when each full body was sent


class Server:
    def __init__(self) -> None:
        self.files: dict[str, Served] = {}
        self.requests: list[tuple[str, str | None]] = []
        self.lock = threading.Lock()
        state = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with state.lock:
                    state.requests.append((self.path, self.headers.get("Range")))
                    item = state.files.get(self.path)
                    cut = item.plan.pop(0) if item is not None and item.plan else None
                if item is None:
                    self.send_error(404, "Not Found")
                    return
                start, total = 0, len(item.body)
                match = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range") or "")
                if match and not item.ignore_range:
                    start = int(match.group(1))
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{total - 1}/{total}")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(total - start))
                self.end_headers()
                time.sleep(item.delay)
                data = item.body[start:] if cut is None else item.body[start : start + cut]
                step = 1 if item.trickle else 16384
                for i in range(0, len(data), step):
                    self.wfile.write(data[i : i + step])
                    time.sleep(item.trickle or item.chunk_delay)
                if cut is None:
                    item.finished.append(time.time())
                # a cut answer closes the connection short of Content-Length (HTTP/1.0)

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.handle_error = lambda *args: None  # the client hanging up on a stalled answer
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}{path}"

    def gets(self, path: str) -> list[str | None]:
        return [rng for p, rng in self.requests if p == path]


@pytest.fixture
def server():
    srv = Server()
    srv.thread.start()
    yield srv
    srv.httpd.shutdown()
    srv.httpd.server_close()


@pytest.fixture(scope="module")
def bundle(fixture_bert, tmp_path_factory):
    """A real bundle of a tiny model: (model, directory, weights bytes, sha256)."""
    torch.manual_seed(0)
    model = xmatch.build(tiny_spec(fixture_bert)).eval()
    directory = xmatch.save_pretrained(model, tmp_path_factory.mktemp("bundle") / "tiny")
    body = (directory / "model.safetensors").read_bytes()
    return model, directory, body, hashlib.sha256(body).hexdigest()


@pytest.fixture
def home(tmp_path, monkeypatch):
    """An empty cache, online (conftest turns HF_HUB_OFFLINE on for the whole suite), fast retries."""
    monkeypatch.setenv("XMATCH_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("XMATCH_OFFLINE", raising=False)
    monkeypatch.delenv("XMATCH_DOWNLOAD_TIMEOUT", raising=False)
    monkeypatch.delenv("XMATCH_DOWNLOAD_MIN_RATE", raising=False)
    monkeypatch.setenv("XMATCH_DOWNLOAD_RETRIES", "2")
    monkeypatch.setattr(hub, "RETRY_BACKOFF_S", 0.01)
    monkeypatch.setattr(hub, "_DIGESTS", {})  # what this "process" has verified so far
    return tmp_path / "cache"


def table(url: str, body: bytes, **changes) -> dict:
    return {"source": url, "sha256": hashlib.sha256(body).hexdigest(), "size": len(body), **changes}


def cached_files(home: Path) -> list[Path]:
    return sorted(p for p in (home / "weights").rglob("*") if p.is_file()) if (home / "weights").exists() else []


def assert_same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


def test_download_verifies_and_then_hits_the_cache(server, bundle, home):
    _, _, body, sha = bundle
    server.files["/w/model.safetensors"] = Served(body)
    source = table(server.url("/w/model.safetensors"), body)
    path = hub.fetch(source, progress=False)
    assert path == home / "weights" / sha / "model.safetensors"
    assert path.read_bytes() == body
    assert cached_files(home) == [path], "no .part left behind"
    assert hub.fetch(source, progress=False) == path
    assert server.gets("/w/model.safetensors") == [None], "the second fetch is a cache hit"


@pytest.mark.parametrize("wrong", ["sha256", "size"])
def test_mismatch_is_an_error_and_leaves_nothing(server, bundle, home, wrong):
    _, _, body, _ = bundle
    server.files["/w/model.safetensors"] = Served(body)
    bad = {"sha256": hashlib.sha256(b"other").hexdigest()} if wrong == "sha256" else {"size": len(body) + 1}
    with pytest.raises(hub.ChecksumError, match="sha256 mismatch" if wrong == "sha256" else "bytes, expected"):
        hub.fetch(table(server.url("/w/model.safetensors"), body, **bad), progress=False)
    assert cached_files(home) == []


def test_dropped_connection_resumes_with_range(server, bundle, home):
    _, _, body, _ = bundle
    third = len(body) // 3
    server.files["/w/model.safetensors"] = Served(body, plan=[third, third])
    path = hub.fetch(table(server.url("/w/model.safetensors"), body), progress=False)
    assert path.read_bytes() == body
    assert server.gets("/w/model.safetensors") == [None, f"bytes={third}-", f"bytes={2 * third}-"]


def test_exhausted_retries_keep_the_partial_and_the_next_call_resumes(server, bundle, home):
    _, _, body, sha = bundle
    server.files["/w/model.safetensors"] = Served(body, plan=[1000, 0, 0, 0])
    source = table(server.url("/w/model.safetensors"), body)
    with pytest.raises(hub.DownloadError, match="after 3 attempts without progress.*1000 of"):
        hub.fetch(source, progress=False)
    assert cached_files(home) == [home / "weights" / sha / "model.safetensors.part"]
    assert len(server.gets("/w/model.safetensors")) == 4  # one that made progress, then 1 + 2 retries
    path = hub.fetch(source, progress=False)  # the server is healthy again
    assert path.read_bytes() == body and cached_files(home) == [path]
    assert server.gets("/w/model.safetensors")[-1] == "bytes=1000-"


def test_server_ignoring_range_restarts_cleanly(server, bundle, home):
    _, _, body, _ = bundle
    server.files["/w/model.safetensors"] = Served(body, plan=[5000], ignore_range=True)
    path = hub.fetch(table(server.url("/w/model.safetensors"), body), progress=False)
    assert path.read_bytes() == body
    assert server.gets("/w/model.safetensors") == [None, "bytes=5000-"]  # answered 200 with the whole file


def test_404_is_a_clear_error_without_retries(server, bundle, home):
    _, _, body, _ = bundle
    with pytest.raises(hub.DownloadError, match="HTTP 404.*not at that address"):
        hub.fetch(table(server.url("/missing.safetensors"), body), progress=False)
    assert server.gets("/missing.safetensors") == [None]
    assert cached_files(home) == []


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_slow_server_times_out(server, bundle, home, monkeypatch, how):
    _, _, body, _ = bundle
    server.files["/w/model.safetensors"] = Served(body, delay=3.0)
    if how == "environment":
        monkeypatch.setenv("XMATCH_DOWNLOAD_TIMEOUT", "0.2")
    monkeypatch.setenv("XMATCH_DOWNLOAD_RETRIES", "1")
    with pytest.raises(hub.DownloadTimeoutError, match="timed out after 0.2 s") as info:
        hub.fetch(table(server.url("/w/model.safetensors"), body), timeout=0.2 if how == "argument" else None,
                  progress=False)
    assert isinstance(info.value, TimeoutError)
    assert len(server.gets("/w/model.safetensors")) == 2


@pytest.mark.parametrize("switch", ["XMATCH_OFFLINE", "HF_HUB_OFFLINE"])
def test_offline_mode_uses_only_the_cache(server, bundle, home, monkeypatch, switch):
    _, _, body, sha = bundle
    server.files["/w/model.safetensors"] = Served(body)
    source = table(server.url("/w/model.safetensors"), body)
    monkeypatch.setenv(switch, "1")
    expected = home / "weights" / sha / "model.safetensors"
    with pytest.raises(hub.OfflineError, match="xmatch download") as info:
        hub.fetch(source, progress=False)
    assert str(expected) in str(info.value) and switch in str(info.value)
    assert server.requests == []
    monkeypatch.delenv(switch)
    assert hub.fetch(source, progress=False) == expected
    monkeypatch.setenv(switch, "1")
    assert hub.fetch(source, progress=False) == expected
    assert len(server.requests) == 1


WORKER = """
import sys, time
from pathlib import Path
from xmatch.io import hub
url, go, ready, sha, size = sys.argv[1:]
Path(ready).touch()
while not Path(go).exists():
    time.sleep(0.01)
print(time.time(), flush=True)
print(hub.fetch({"source": url, "sha256": sha, "size": int(size)}, progress=False))
"""


def test_two_processes_download_once_and_both_succeed(server, bundle, home, tmp_path):
    _, _, body, sha = bundle
    server.files["/w/model.safetensors"] = Served(body, chunk_delay=0.1)  # about 1.3 s of transfer
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "XMATCH_OFFLINE")}
    go = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, server.url("/w/model.safetensors"), str(go),
             str(tmp_path / f"ready{i}"), sha, str(len(body))],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for i in range(2)
    ]
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"ready{i}").exists() for i in range(2)) and time.monotonic() < deadline:
        time.sleep(0.01)
    go.touch()
    outputs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err for _, err in outputs]
    started = [float(out.split()[0]) for out, _ in outputs]
    paths = {out.split()[1] for out, _ in outputs}
    assert paths == {str(home / "weights" / sha / "model.safetensors")}
    assert server.gets("/w/model.safetensors") == [None], "one download, no second request"
    assert max(started) < server.files["/w/model.safetensors"].finished[0], "both fetches overlapped"


@pytest.fixture
def zoo_entry(fixture_bert):
    """Register throwaway zoo entries; the registry is restored after the test."""

    def register(name: str, weights: list[dict]) -> str:
        models.register(name, xmatch.ZooEntry(
            name=name, spec=tiny_spec(fixture_bert), description="hub test", weights=weights,
            origin="a test server on 127.0.0.1",
        ))
        return name

    with models.restored():
        yield register


def test_build_pretrained_downloads_and_loads_bit_exact(server, bundle, home, zoo_entry):
    model, _, body, sha = bundle
    server.files["/mirror2/model.safetensors"] = Served(body)
    name = zoo_entry("hub-test-tiny", [
        table(server.url("/mirror1/model.safetensors"), body),  # 404: the next mirror is used
        table(server.url("/mirror2/model.safetensors"), body),
    ])
    assert_same_weights(xmatch.build(name, pretrained=True), model)
    assert hub.download_entry(name, progress=False) == home / "weights" / sha / "model.safetensors"
    assert server.gets("/mirror2/model.safetensors") == [None]


def test_entry_errors_name_the_entry_and_every_source(server, bundle, home, zoo_entry, monkeypatch):
    _, _, body, _ = bundle
    name = zoo_entry("hub-test-missing", [
        table(server.url("/a/model.safetensors"), body), table(server.url("/b/model.safetensors"), body)])
    with pytest.raises(hub.DownloadError, match=r"(?s)'hub-test-missing': none of its 2 .*/a/.*404.*/b/.*404"):
        xmatch.build(name, pretrained=True)
    monkeypatch.setenv("XMATCH_OFFLINE", "1")
    with pytest.raises(hub.OfflineError, match="xmatch download hub-test-missing"):
        hub.download_entry(name)


def test_file_and_package_sources(bundle, home, tmp_path, monkeypatch):
    _, directory, body, _ = bundle
    weights = directory / "model.safetensors"
    assert hub.fetch(table(weights.as_uri(), body)) == weights  # used in place, not copied
    assert hub.fetch(str(directory)) == directory  # a bundle directory
    with pytest.raises(hub.ChecksumError):
        hub.fetch(table(str(weights), body, sha256="0" * 64))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        hub.fetch(str(tmp_path / "nope.safetensors"))
    package = tmp_path / "site" / "xmatch_hubtest_weights"
    (package / "tiny").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "tiny" / "model.safetensors").write_bytes(body)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert hub.fetch(table("package:xmatch_hubtest_weights/tiny/model.safetensors", body)).read_bytes() == body
    assert hub.fetch("package:xmatch_hubtest_weights/tiny").is_dir()
    with pytest.raises(FileNotFoundError, match="pip install xmatch-not-installed"):
        hub.fetch("package:xmatch_not_installed/model.safetensors")
    assert cached_files(home) == []


def hf_cache_repo(home: Path, repo: str, files: dict[str, bytes]) -> Path:
    """A repository laid out as huggingface_hub caches it (refs/main -> snapshots/<commit>)."""
    root = home / "huggingface" / f"models--{repo.replace('/', '--')}"
    snapshot = root / "snapshots" / COMMIT
    for name, data in files.items():
        (snapshot / name).parent.mkdir(parents=True, exist_ok=True)
        (snapshot / name).write_bytes(data)
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(COMMIT)
    return snapshot


def test_hf_hub_bundle_from_the_cache_in_offline_mode(bundle, home, monkeypatch):
    model, directory, body, sha = bundle
    files = {p.relative_to(directory).as_posix(): p.read_bytes() for p in directory.rglob("*") if p.is_file()}
    snapshot = hf_cache_repo(home, "org/tiny", files)
    monkeypatch.setenv("XMATCH_OFFLINE", "1")
    assert hub.fetch("hf-hub:org/tiny") == snapshot
    assert hub.fetch({"source": f"hf-hub:org/tiny@{COMMIT}", "sha256": sha}) == snapshot
    assert hub.fetch({"source": "hf-hub:org/tiny/model.safetensors", "sha256": sha, "size": len(body)}) == (
        snapshot / "model.safetensors")
    assert_same_weights(xmatch.build("hf-hub:org/tiny", pretrained=True), model)
    with pytest.raises(hub.ChecksumError, match="sha256 mismatch"):
        hub.fetch({"source": "hf-hub:org/tiny", "sha256": "0" * 64})
    with pytest.raises(hub.OfflineError, match="xmatch download") as info:
        hub.fetch("hf-hub:org/absent@v2")
    assert str(home / "huggingface" / "models--org--absent") in str(info.value)
    with pytest.raises(ValueError, match="whole bundle repository"):
        xmatch.build("hf-hub:org/tiny/model.safetensors")


def test_hf_hub_online_uses_our_cache_and_refuses_pickle(bundle, home, monkeypatch):
    _, directory, _, sha = bundle
    import huggingface_hub
    from huggingface_hub.utils import are_progress_bars_disabled

    calls = []

    def fake_download(repo_id, filename, **options):
        calls.append((repo_id, filename, {**options, "quiet": are_progress_bars_disabled()}))
        return str(directory / filename)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    path = hub.fetch({"source": "hf-hub:org/tiny@v1/model.safetensors", "sha256": sha}, progress=False)
    assert path == directory / "model.safetensors"
    repo_id, filename, options = calls[0]
    assert (repo_id, filename, options["revision"]) == ("org/tiny", "model.safetensors", "v1")
    assert options["cache_dir"] == home / "huggingface" and options["local_files_only"] is False
    if "HF_HUB_DISABLE_PROGRESS_BARS" not in os.environ:  # the user's setting has priority
        assert options["quiet"] and not are_progress_bars_disabled(), "progress=False silences that one call"
    with pytest.raises(ValueError, match="pickle"):
        hub.fetch("hf-hub:org/tiny/pytorch_model.bin")
    assert len(calls) == 1, "a pickle file is refused before any download"


@pytest.mark.parametrize(("source", "message"), [
    ({"source": "https://example.org/m.safetensors"}, "a URL needs sha256 and size"),
    ({"source": "https://example.org/m.pth", "sha256": "a" * 64, "size": 3}, "pickle"),
    ({"source": "https://example.org/m.safetensors", "sha256": "xyz", "size": 3}, "64 hexadecimal"),
    ({"source": "https://example.org/m.safetensors", "sha256": "a" * 64, "size": True}, "positive number"),
    ({"source": "https://example.org/m.safetensors", "sha256": "a" * 64, "size": 3, "md5": "x"}, "unknown keys"),
    ({"source": "ftp://example.org/m.safetensors"}, "unsupported scheme"),
    ({"source": "hf-hub:justname"}, "hf-hub:org/name"),
    ({"source": "/weights/model_best.pth"}, "xmatch convert"),
])
def test_weight_source_schema(source, message):
    with pytest.raises(ValueError, match=message):
        hub.validate_weight_source(source)


def test_every_zoo_weight_source_is_valid():
    for name in xmatch.list_models():
        for source in xmatch.info(name).weights:
            hub.validate_weight_source(source)


def test_cache_dir_location(monkeypatch, tmp_path):
    monkeypatch.delenv("XMATCH_HOME", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hub.cache_dir() == tmp_path / "xdg" / "xmatch"
    monkeypatch.setenv("XMATCH_HOME", str(tmp_path / "mine"))
    assert hub.cache_dir() == tmp_path / "mine"


def test_download_command(server, bundle, home, zoo_entry, tmp_path, capsys):
    _, _, body, sha = bundle
    server.files["/w/model.safetensors"] = Served(body)
    name = zoo_entry("hub-test-cli", [table(server.url("/w/model.safetensors"), body)])
    assert main(["download", name, "--cache-dir", str(tmp_path / "elsewhere")]) == 0
    expected = tmp_path / "elsewhere" / "weights" / sha / "model.safetensors"
    assert capsys.readouterr().out.strip() == str(expected) and expected.read_bytes() == body
    assert main(["download", "teran-mrsw-coco"]) == 2
    err = capsys.readouterr().err
    assert "no published xmatch weights" in err and "xmatch convert" in err
