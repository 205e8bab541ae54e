"""Zoo entries pinned to a Hub commit, verified against the Hub's own metadata (issue 45).

Runs against ``tests/hub_emulator.py``: a local Hub and CDN that answer what huggingface_hub
asks (``resolve`` with ``X-Repo-Commit``, ``X-Linked-Etag``, ``X-Linked-Size``, a redirect to
the CDN, ``Range``; the API of ``snapshot_download``). A new process is simulated by emptying
``hub._DIGESTS``.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from pathlib import Path

import pytest

import xmatch
from xmatch.cli.main import main
from xmatch.components.text.clip import load_tokenizer
from xmatch.core import sources
from xmatch.core.registry import models
from xmatch.core.spec import merge
from xmatch.io import hub

from clip_assets import tiny_tower_overrides, tokenizer_dirs
from hub_emulator import HubEmulator, git_blob_sha1, hub_emulator  # noqa: F401 (a fixture)
from test_hub import assert_same_weights, bundle, zoo_entry  # noqa: F401 (fixtures)
from test_hub_integrity import flip_one_byte

REPO = "org/tiny"
COMMIT = "c237dc49a33fc61debc9276459120b7eac67e7ef"  # any 40-hex id: the emulator's commit
OTHER = "b33cedfd0df4e43b8238760678fcc89e1a0d38b3"
SOURCE = f"hf-hub:{REPO}@{COMMIT}/model.safetensors"


@pytest.fixture
def emulated(hub_emulator, bundle, monkeypatch) -> HubEmulator:
    """The emulator with the tiny bundle's weights at ``COMMIT`` (``main`` points at it); a
    fresh process: nothing hashed, nothing warned about yet."""
    _, _, body, _ = bundle
    hub_emulator.add_commit(REPO, COMMIT, {"model.safetensors": body, "config.json": b'{"model": "tiny"}\n'})
    monkeypatch.setattr(hub, "_DIGESTS", {})
    monkeypatch.setattr(sources, "_WARNED_MOVABLE", set())
    return hub_emulator


def cache_files(root: Path) -> list[str]:
    """Every file and link under the cache, relative (huggingface_hub's locks left out)."""
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                  if (p.is_file() or p.is_symlink()) and ".locks" not in p.parts and p.suffix != ".lock")


def record(root: Path, repo: str = REPO, commit: str = COMMIT, path: str = "model.safetensors") -> dict:
    return json.loads((root / "verified" / f"models--{repo.replace('/', '--')}" / commit / f"{path}.json").read_text())


def test_a_pinned_entry_loads_by_name_verified_against_the_hubs_metadata(emulated, bundle, zoo_entry):
    model, _, body, sha = bundle
    name = zoo_entry("hub-pinned-tiny", [{"source": SOURCE}])  # no sha256 of its own: the Hub's
    assert_same_weights(xmatch.build(name, pretrained=True), model)
    root = hub.cache_dir()
    assert record(root) == {"source": SOURCE, "repo": REPO, "commit": COMMIT, "path": "model.safetensors",
                            "sha256": sha, "size": len(body)}
    assert [(r.method, r.path) for r in emulated.requests if r.server == "hub" and "resolve" in r.path] == [
        ("HEAD", f"/{REPO}/resolve/{COMMIT}/model.safetensors")] * 2  # ours, then huggingface_hub's
    assert len(emulated.gets("cdn")) == 1, "an LFS file comes from the CDN the Hub redirects to"
    seen = len(emulated.requests)
    hub._DIGESTS.clear()  # a new process: the cached file is checked against the record, no request
    assert_same_weights(xmatch.build(name, pretrained=True), model)
    assert len(emulated.requests) == seen


def test_a_tampered_blob_is_refused_and_nothing_is_kept(emulated, bundle, zoo_entry):
    _, _, body, sha = bundle
    emulated.tamper(REPO, COMMIT, "model.safetensors", flip_one_byte(body))
    name = zoo_entry("hub-pinned-tampered", [{"source": SOURCE}])
    with pytest.raises(hub.ChecksumError, match=rf"(?s)'{name}'.*model.safetensors at commit {COMMIT}.*sha256 mismatch"
                                               rf".*expected {sha}, as the Hub's metadata for commit {COMMIT}") as info:
        xmatch.build(name, pretrained=True)
    assert "deleted from the cache" in str(info.value)
    root = hub.cache_dir()
    assert not [f for f in cache_files(root) if "/blobs/" in f or "/snapshots/" in f or f.startswith("verified/")]
    assert len(emulated.gets("cdn")) == 1, "a fresh download that is wrong is not tried again"


def test_an_entrys_checksum_or_size_that_differs_from_the_hubs_is_refused_before_any_download(emulated, bundle, zoo_entry):
    _, _, body, sha = bundle
    wrong_sha = hashlib.sha256(b"another file").hexdigest()
    name = zoo_entry("hub-pinned-disagrees", [{"source": SOURCE, "sha256": wrong_sha}])
    with pytest.raises(hub.ChecksumError, match=rf"'{name}'.*entry's sha256 {wrong_sha} differs from the Hub's {sha}"):
        xmatch.build(name, pretrained=True)
    name = zoo_entry("hub-pinned-size", [{"source": SOURCE, "size": len(body) + 1}])
    with pytest.raises(hub.ChecksumError, match=rf"entry's size {len(body) + 1} differs from the Hub's {len(body)} bytes"):
        xmatch.build(name, pretrained=True)
    assert emulated.gets("cdn") == []


def test_a_hub_that_states_the_wrong_size_is_refused(emulated, bundle, zoo_entry):
    _, _, body, _ = bundle
    emulated.lie_about_size(REPO, COMMIT, "model.safetensors", len(body) + 100)
    name = zoo_entry("hub-pinned-lying", [{"source": SOURCE}])
    with pytest.raises(hub.ChecksumError, match=rf"(?s)'{name}'.*model.safetensors at commit {COMMIT}.*size"):
        xmatch.build(name, pretrained=True)
    assert not [f for f in cache_files(hub.cache_dir()) if "/blobs/" in f or "/snapshots/" in f]


def test_a_file_missing_at_the_pinned_commit_names_the_entry_the_commit_and_the_file(emulated, zoo_entry):
    name = zoo_entry("hub-pinned-404", [{"source": f"hf-hub:{REPO}@{COMMIT}/other.safetensors"}])
    with pytest.raises(hub.DownloadError, match=rf"'{name}'.*other.safetensors at commit {COMMIT} of {REPO}: "
                                               r"the file is not at that commit \(the Hub answers 404 EntryNotFound\)"):
        xmatch.build(name, pretrained=True)
    name = zoo_entry("hub-pinned-no-commit", [{"source": f"hf-hub:{REPO}@{OTHER}/model.safetensors"}])
    with pytest.raises(hub.DownloadError, match=rf"'{name}'.*the Hub has no revision '{OTHER}' in {REPO}"):
        xmatch.build(name, pretrained=True)
    assert emulated.gets("cdn") == []


@pytest.mark.parametrize("where", ["weights", "tokenizer"])
@pytest.mark.parametrize("revision", ["@main", "@v1.0", "@refs/pr/66", ""])
def test_a_zoo_entry_must_pin_every_hub_reference_to_a_commit(fixture_bert, where, revision):
    from conftest import tiny_spec

    spec, weights = tiny_spec(fixture_bert), []
    if where == "weights":
        weights = [{"source": f"hf-hub:{REPO}{revision}/model.safetensors"}]
        field = "weights -> source"
    else:
        spec["text_encoder"]["tokenizer"] = f"hf-hub:{REPO}{revision}"
        field = "spec -> text_encoder -> tokenizer"
    with pytest.raises(ValueError, match=rf"zoo entry 'unpinned': {field} 'hf-hub:{REPO}.*' names .*"
                                         r"pin a full 40-hex commit") as info:
        xmatch.ZooEntry(name="unpinned", spec=spec, weights=weights)
    assert ("can move (branches, tags and refs/pr/N do)" if revision else "the default branch, which moves") in str(info.value)
    with pytest.raises(ValueError, match="zoo entry 'unpinned-base'"):
        xmatch.core.zoo.as_entry("unpinned-base", {"spec": spec, "weights": weights})


def test_every_zoo_entry_pins_its_hub_references():
    for name in xmatch.list_models():
        for where, source in xmatch.core.zoo._hub_references(xmatch.info(name)):
            assert sources.unpinned_problem(source) is None, (name, where, source)


def test_a_users_branch_is_warned_about_once_and_still_verified(emulated, bundle):
    _, _, body, sha = bundle
    source = f"hf-hub:{REPO}@main/model.safetensors"
    with pytest.warns(sources.MovableRevisionWarning, match=rf"'{source}' names the revision 'main', which can move.*"
                                                            r"integrity rests on the Hub's answer at download time"):
        path = hub.fetch(source, progress=False)
    assert path.read_bytes() == body and record(hub.cache_dir())["sha256"] == sha  # resolved to COMMIT, verified
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert hub.fetch(source, progress=False) == path, "warned once per source"
    with pytest.warns(sources.MovableRevisionWarning, match="names no revision"):
        hub.fetch(f"hf-hub:{REPO}/model.safetensors", progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hub.fetch(SOURCE, progress=False)  # a commit: nothing to warn about


def test_an_interrupted_download_resumes_with_a_range_request(emulated, bundle, monkeypatch):
    from huggingface_hub import constants

    _, _, body, _ = bundle
    # huggingface_hub counts bytes per chunk it writes: small chunks, so the cut is mid-file
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 16384)
    emulated.drop_after(REPO, COMMIT, "model.safetensors", len(body) // 2)
    assert hub.fetch(SOURCE, progress=False).read_bytes() == body
    ranges = [r.range for r in emulated.gets("cdn")]
    assert len(ranges) == 2 and ranges[0] is None and ranges[1] is not None and ranges[1].startswith("bytes=")
    assert 0 < int(ranges[1].removeprefix("bytes=").rstrip("-")) <= len(body) // 2


def test_the_record_is_rechecked_on_every_later_load(emulated, bundle, zoo_entry, monkeypatch):
    model, _, body, _ = bundle
    name = zoo_entry("hub-pinned-recheck", [{"source": SOURCE}])
    path = hub.download_entry(name, progress=False)
    blob = Path(os.path.realpath(path))
    blob.write_bytes(flip_one_byte(body))  # the cached copy changes (a bad disk, a bad copy)
    hub._DIGESTS.clear()  # a later process
    monkeypatch.setenv("XMATCH_OFFLINE", "1")
    with pytest.raises(hub.CorruptCacheError, match=rf"(?s)'{name}'.*corrupted \(sha256 mismatch.*xmatch's record"):
        xmatch.build(name, pretrained=True)
    monkeypatch.delenv("XMATCH_OFFLINE")
    assert_same_weights(xmatch.build(name, pretrained=True), model)  # online: downloaded again, verified
    assert blob.read_bytes() == body and len(emulated.gets("cdn")) == 2


def test_an_offline_cache_without_a_record_is_checked_against_its_blob_name(emulated, bundle, zoo_entry, monkeypatch):
    _, _, body, _ = bundle
    name = zoo_entry("hub-pinned-no-record", [{"source": SOURCE}])
    path = hub.download_entry(name, progress=False)
    for item in (hub.cache_dir() / "verified").rglob("*.json"):
        item.unlink()  # a cache written before records existed
    Path(os.path.realpath(path)).write_bytes(flip_one_byte(body))
    hub._DIGESTS.clear()
    monkeypatch.setenv("XMATCH_OFFLINE", "1")
    with pytest.raises(hub.CorruptCacheError, match="its blob name"):
        hub.download_entry(name, progress=False)


def tokenizer_files() -> dict[str, bytes]:
    folder = Path(tokenizer_dirs()["clip"])
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def test_tokenizer_files_are_verified_against_the_names_the_hub_gave_them(emulated, monkeypatch):
    files = tokenizer_files()
    emulated.add_commit("org/clip", OTHER, files)
    source = f"hf-hub:org/clip@{OTHER}"
    assert len(load_tokenizer(source, "clip-text")) == 514
    folder = hub.cache_dir() / "huggingface" / "models--org--clip" / "snapshots" / OTHER
    blob = Path(os.path.realpath(folder / "tokenizer.json"))
    assert blob.name == git_blob_sha1(files["tokenizer.json"]), "a small file is named by its git blob sha1"
    blob.write_bytes(files["tokenizer.json"].replace(b"<|endoftext|>", b"<|endoftexx|>"))
    monkeypatch.setenv("XMATCH_OFFLINE", "1")
    with pytest.raises(hub.CorruptCacheError, match=r"tokenizer.json.*git blob sha1 mismatch"):
        load_tokenizer(source, "clip-text")
    monkeypatch.delenv("XMATCH_OFFLINE")
    assert len(load_tokenizer(source, "clip-text")) == 514  # online: fetched again
    emulated.tamper("org/clip", OTHER, "tokenizer.json", files["tokenizer.json"].replace(b"<|endoftext|>", b"<|endoftexx|>"))
    Path(os.path.realpath(folder / "tokenizer.json")).unlink()
    (folder / "tokenizer.json").unlink()
    with pytest.raises(hub.ChecksumError, match=r"tokenizer.json is corrupted \(git blob sha1 mismatch"):
        load_tokenizer(source, "clip-text")
    assert not (folder / "tokenizer.json").exists()


def test_download_command_prefetches_the_weights_and_the_tokenizer(emulated, bundle, tmp_path, capsys, monkeypatch):
    _, _, body, _ = bundle
    emulated.add_commit("org/clip", OTHER, {**tokenizer_files(), "model.safetensors": body})
    spec = merge(xmatch.info("clip-vit-b-32").spec, tiny_tower_overrides("clip"))
    spec["text_encoder"]["tokenizer"] = f"hf-hub:org/clip@{OTHER}"
    with models.restored():
        models.register("hub-pinned-clip", xmatch.ZooEntry(
            name="hub-pinned-clip", spec=spec, description="tiny CLIP", origin="the hub emulator",
            weights=[{"source": f"hf-hub:org/clip@{OTHER}/model.safetensors"}]))
        cache = tmp_path / "usb"
        assert main(["download", "hub-pinned-clip", "--cache-dir", str(cache)]) == 0
        lines = capsys.readouterr().out.split()
        snapshot = cache / "huggingface" / "models--org--clip" / "snapshots" / OTHER
        assert lines == [str(snapshot / "model.safetensors"), str(snapshot)]
        assert (snapshot / "tokenizer.json").is_file() and record(cache, "org/clip", OTHER)["size"] == len(body)
        # the air-gapped machine: that cache alone, offline
        monkeypatch.setenv("XMATCH_HOME", str(cache))
        monkeypatch.setenv("XMATCH_OFFLINE", "1")
        seen = len(emulated.requests)
        assert len(load_tokenizer(f"hf-hub:org/clip@{OTHER}", "clip-text")) == 514
        assert hub.download_entry("hub-pinned-clip", progress=False) == snapshot / "model.safetensors"
        assert len(emulated.requests) == seen
