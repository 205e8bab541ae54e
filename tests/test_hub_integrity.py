"""The download cache is trusted only after its sha256 is checked; a stalled server is given up.

Uses the local HTTP server and the real tiny bundle of ``test_hub.py``. A new process is
simulated by emptying ``hub._DIGESTS`` (what this process has verified so far).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import struct
import sys
import threading
from pathlib import Path

import pytest
import torch

import xmatch
from xmatch.io import hub

from conftest import random_regions
from test_hub import (  # noqa: F401 (server, bundle, home and zoo_entry are fixtures)
    COMMIT,
    Served,
    assert_same_weights,
    bundle,
    cached_files,
    hf_cache_repo,
    home,
    server,
    table,
    zoo_entry,
)

PATH = "/w/model.safetensors"


def flip_one_byte(data: bytes) -> bytes:
    middle = len(data) // 2
    return data[:middle] + bytes([data[middle] ^ 0x01]) + data[middle + 1 :]


def zero_the_tensors(data: bytes) -> bytes:
    """Same header, same size, every tensor byte 0: a model that scores every pair 0.0."""
    start = 8 + struct.unpack("<Q", data[:8])[0]
    return data[:start] + bytes(len(data) - start)


DAMAGES = {"flipped-byte": flip_one_byte, "zeroed-tensors": zero_the_tensors}


def rewrite(path: Path, data: bytes) -> None:
    """Damage a cached file the way a bad copy does: a new file in its place."""
    tmp = path.with_name("copy.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def downloaded(server, body: bytes) -> tuple[dict, Path]:
    server.files[PATH] = Served(body)
    source = table(server.url(PATH), body)
    return source, hub.fetch(source, progress=False)


def scores(model: torch.nn.Module) -> torch.Tensor:
    regions, boxes, mask = random_regions(2, 4, 12)
    with torch.no_grad():
        return model.similarity(model.encode_images(xmatch.RegionInputs(regions, boxes, mask)), model.encode_texts(["a man", "a pan"]))


# -- a damaged cache: downloaded again online, a named error offline --------------------------


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_cached_file_is_downloaded_again_online(server, bundle, home, damage, caplog):
    _, _, body, _ = bundle
    source, path = downloaded(server, body)
    rewrite(path, DAMAGES[damage](body))
    hub._DIGESTS.clear()  # a new process
    with caplog.at_level(logging.WARNING, logger="xmatch.io.hub"):
        assert hub.fetch(source, progress=False) == path
    assert path.read_bytes() == body
    assert server.gets(PATH) == [None, None], "downloaded again, from the start"
    assert cached_files(home) == [path]
    assert "corrupted (sha256 mismatch" in caplog.text and "downloading it again" in caplog.text


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_cached_file_is_a_named_error_offline(server, bundle, home, monkeypatch, damage):
    _, _, body, sha = bundle
    source, path = downloaded(server, body)
    rewrite(path, DAMAGES[damage](body))
    hub._DIGESTS.clear()
    monkeypatch.setenv("XMATCH_OFFLINE", "1")
    with pytest.raises(hub.CorruptCacheError, match=r"is corrupted \(sha256 mismatch") as info:
        hub.fetch(source, progress=False)
    message = str(info.value)
    assert str(path) in message and "XMATCH_OFFLINE" in message and "not in the cache" not in message
    assert isinstance(info.value, hub.ChecksumError) and isinstance(info.value, hub.OfflineError)
    assert len(server.requests) == 1, "offline: no request"


def test_zeroed_weights_in_the_cache_never_reach_the_model(server, bundle, home, zoo_entry, monkeypatch):
    """The reported case: a cache whose tensors were zeroed gave a model scoring every pair 0.0."""
    model, _, body, _ = bundle
    server.files[PATH] = Served(body)
    name = zoo_entry("hub-test-zeroed", [table(server.url(PATH), body)])
    path = hub.download_entry(name, progress=False)
    rewrite(path, zero_the_tensors(body))
    hub._DIGESTS.clear()
    monkeypatch.setenv("XMATCH_OFFLINE", "1")
    with pytest.raises(hub.CorruptCacheError, match=f"(?s)'{name}'.*corrupted"):
        xmatch.build(name, pretrained=True)
    monkeypatch.delenv("XMATCH_OFFLINE")
    again = xmatch.build(name, pretrained=True).eval()
    assert_same_weights(again, model)
    assert scores(again).abs().sum() > 0


def test_a_truncated_cached_file_says_truncated_offline(server, bundle, home, monkeypatch):
    _, _, body, _ = bundle
    source, path = downloaded(server, body)
    rewrite(path, body[:1000])
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(hub.CorruptCacheError, match=rf"is truncated \(1000 of {len(body)} bytes\)") as info:
        hub.fetch(source, progress=False)
    assert "not in the cache" not in str(info.value) and str(path) in str(info.value)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    assert hub.fetch(source, progress=False).read_bytes() == body  # online: downloaded again


def test_a_cached_file_is_hashed_once_per_process(server, bundle, home, monkeypatch):
    _, _, body, _ = bundle
    hashed: list[Path] = []
    real = hub.sha256_file
    monkeypatch.setattr(hub, "sha256_file", lambda p: hashed.append(p) or real(p))
    source, path = downloaded(server, body)
    assert len(hashed) == 1, "the download is hashed once, before it is renamed into place"
    for _ in range(3):
        hub.fetch(source, progress=False)
    assert len(hashed) == 1, "the verified file is remembered"
    hub._DIGESTS.clear()  # a new process
    for _ in range(3):
        hub.fetch(source, progress=False)
    assert len(hashed) == 2
    shutil.copy(path, path.with_name("copy.tmp"))  # a fresh copy over it: another file
    os.replace(path.with_name("copy.tmp"), path)
    hub.fetch(source, progress=False)
    assert len(hashed) == 3


def test_a_cache_copied_to_another_machine_is_verified(server, bundle, home, tmp_path, monkeypatch):
    """The air-gapped workflow: copy the cache directory, then load offline."""
    _, _, body, sha = bundle
    source, _ = downloaded(server, body)
    copy = tmp_path / "usb" / "xmatch"
    shutil.copytree(home, copy)
    monkeypatch.setenv("XMATCH_HOME", str(copy))
    monkeypatch.setenv("XMATCH_OFFLINE", "1")
    assert hub.fetch(source, progress=False) == copy / "weights" / sha / "model.safetensors"
    (copy / "weights" / sha / "model.safetensors").write_bytes(flip_one_byte(body))
    os.utime(copy / "weights" / sha / "model.safetensors", ns=(1, 1))  # a copy with other times
    with pytest.raises(hub.CorruptCacheError, match="corrupted"):
        hub.fetch(source, progress=False)


# -- Hugging Face files in the same cache ----------------------------------------------------


def test_a_damaged_hf_hub_file_offline_and_online(bundle, home, monkeypatch):
    _, directory, body, sha = bundle
    snapshot = hf_cache_repo(home, "org/tiny", {"model.safetensors": flip_one_byte(body)})
    monkeypatch.setenv("XMATCH_OFFLINE", "1")
    with pytest.raises(hub.CorruptCacheError, match=r"is corrupted \(sha256 mismatch"):
        hub.fetch({"source": "hf-hub:org/tiny/model.safetensors", "sha256": sha})
    monkeypatch.delenv("XMATCH_OFFLINE")
    import huggingface_hub

    forced = []

    def fake_download(repo_id, filename, force_download=False, **options):
        forced.append(force_download)
        if force_download:
            (snapshot / filename).write_bytes(body)
        return str(snapshot / filename)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    path = hub.fetch({"source": "hf-hub:org/tiny/model.safetensors", "sha256": sha}, progress=False)
    assert forced == [False, True] and path.read_bytes() == body


def test_an_hf_hub_blob_is_checked_against_its_own_name(bundle, home, monkeypatch):
    """Without a sha256 in the source, a cached blob named by its sha256 is still verified."""
    _, _, body, sha = bundle
    repo = home / "huggingface" / "models--org--blob"
    blob = repo / "blobs" / sha
    blob.parent.mkdir(parents=True)
    blob.write_bytes(zero_the_tensors(body))
    (repo / "snapshots" / COMMIT).mkdir(parents=True)
    (repo / "snapshots" / COMMIT / "model.safetensors").symlink_to(blob)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    monkeypatch.setenv("XMATCH_OFFLINE", "1")
    with pytest.raises(hub.CorruptCacheError, match="corrupted"):
        hub.fetch("hf-hub:org/blob")
    blob.write_bytes(body)
    assert hub.fetch("hf-hub:org/blob") == repo / "snapshots" / COMMIT


# -- a stalled server -------------------------------------------------------------------------


def fetch_in_thread(source: dict, **options) -> tuple[threading.Thread, list]:
    """Run fetch where a hang cannot hang the test: the thread is given up after a deadline."""
    outcome: list = []

    def run() -> None:
        try:
            outcome.append(hub.fetch(source, **options))
        except Exception as exc:  # handed to the test
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_a_trickling_server_is_given_up_and_the_partial_resumes(server, bundle, home, monkeypatch, capsys, how):
    _, _, body, sha = bundle
    server.files[PATH] = Served(body, trickle=0.5)  # one byte every half second
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # progress bars are drawn on a terminal only
    monkeypatch.setenv("XMATCH_DOWNLOAD_RETRIES", "1")
    if how == "environment":
        monkeypatch.setenv("XMATCH_DOWNLOAD_MIN_RATE", "100")
    source = table(server.url(PATH), body)
    thread, outcome = fetch_in_thread(source, timeout=0.6, **({"min_rate": 100} if how == "argument" else {}))
    thread.join(timeout=20)
    assert not thread.is_alive(), "the download hangs on a server that sends one byte every 0.5 s"
    error = outcome[0]
    assert isinstance(error, hub.DownloadTimeoutError), error
    assert re.search(r"after 2 attempts without progress: stalled: \d+ bytes in [\d.]+ s, below the minimum "
                     r"of 100 bytes/s \(lower it with min_rate= or XMATCH_DOWNLOAD_MIN_RATE", str(error)), error
    part = home / "weights" / sha / "model.safetensors.part"
    assert cached_files(home) == [part], "only the resumable partial is left"
    kept = part.stat().st_size
    assert 0 < kept < 10 and f"{kept} of {len(body)} bytes are kept" in str(error)
    assert server.gets(PATH)[1] is not None and server.gets(PATH)[1].startswith("bytes="), "the retry resumed"
    err = capsys.readouterr().err
    # tqdm skips redraws closer than its refresh interval, so the last count drawn may lag the file
    drawn = [int(n) for n in re.findall(r"\| (\d+)\.00/\d+k \[", err)]
    assert "model.safetensors" in err and drawn and 0 < max(drawn) <= kept, "the progress bar moved"

    server.files[PATH].trickle = 0.0  # the server recovers: the next call resumes from the partial
    assert hub.fetch(source, progress=False).read_bytes() == body
    assert server.gets(PATH)[-1] == f"bytes={kept}-"
    assert cached_files(home) == [home / "weights" / sha / "model.safetensors"]


def test_a_slow_but_steady_download_is_not_stalled(server, bundle, home, monkeypatch):
    _, _, body, _ = bundle
    server.files[PATH] = Served(body, chunk_delay=0.02)  # about 0.3 s in all, well above the rate
    path = hub.fetch(table(server.url(PATH), body), timeout=0.1, min_rate=1024, progress=False)
    assert path.read_bytes() == body and server.gets(PATH) == [None]


@pytest.mark.parametrize("value", ["fast", "-1", "nan"])
def test_a_bad_minimum_rate_names_the_setting(bundle, home, monkeypatch, value):
    _, _, body, _ = bundle
    monkeypatch.setenv("XMATCH_DOWNLOAD_MIN_RATE", value)
    with pytest.raises(ValueError, match="XMATCH_DOWNLOAD_MIN_RATE|min_rate must be"):
        hub.fetch(table("http://127.0.0.1:9/m.safetensors", body), progress=False)
