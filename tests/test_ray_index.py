"""``xmatch index --ray`` on a real local Ray cluster (``ray.init(num_cpus=2)``): the shards and
the search results of one process, every shard committed at once (nothing visible before), a
worker killed mid-chunk, a driver killed and resumed with ``--append``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import xmatch
import xmatch.index
from xmatch.data import open_dataset
from xmatch.index.build import index_dataset
from xmatch.index.photos import index_images
from xmatch.index.ray_build import STAGING, index_dataset_on_ray, index_images_on_ray
from xmatch.index.store import read_manifest
from xmatch.testing import one_torch_thread  # noqa: F401  (a fixture: one torch thread, as each Ray worker of the 2-CPU cluster gets, so the bytes compare)

from conftest import tiny_spec
from test_extract import make_photos
from test_index_photos import SMALL, photo_folder

pytest.importorskip("faiss")
Image = pytest.importorskip("PIL.Image")

QUERIES = ["a dog on a beach", "a red circle", "picture b.jpg caption 0", "two cats"]


@pytest.fixture(scope="module")
def pixel_model(fixture_bert) -> xmatch.MatchingModel:
    torch.manual_seed(0)
    return xmatch.build(tiny_spec(fixture_bert, image_encoder=SMALL)).eval()


def shard_bytes(index: xmatch.index.SearchIndex) -> list[tuple[dict, dict[str, bytes]]]:
    """Each shard's metadata and the bytes of each of its tensors (the header's key order is not
    fixed: safetensors writes a hash map's, which differs between processes)."""
    from safetensors import safe_open

    shards = []
    for record in read_manifest(index.root)["shards"]:
        with safe_open(index.root / record["file"], "pt") as f:
            shards.append((f.metadata(), {k: f.get_tensor(k).numpy().tobytes() for k in f.keys()}))
    return shards


def same_results(a: xmatch.index.SearchIndex, b: xmatch.index.SearchIndex, **options) -> None:
    for got, want in zip(a.search_texts(QUERIES, k=4, **options), b.search_texts(QUERIES, k=4, **options), strict=True):
        assert got.ids == want.ids
        assert [h.score for h in got.hits] == [h.score for h in want.hits]


@pytest.mark.slow
def test_ray_index_of_pictures_equals_one_process(tmp_path, pixel_model, ray_cluster):
    photo_folder(tmp_path / "photos")
    one = xmatch.index.create(tmp_path / "one", pixel_model, dtype="float32")
    added, skipped = index_images(one, tmp_path / "photos", shard_size=2, batch_size=2, progress=False)
    spread = xmatch.index.create(tmp_path / "ray", pixel_model, dtype="float32")
    got = index_images_on_ray(spread, tmp_path / "photos", shard_size=2, batch_size=2, progress=False, ray_workers=2)
    assert got == (added, skipped) and [name for name, _ in skipped] == ["broken.jpg"]
    assert spread.ids == one.ids and shard_bytes(spread) == shard_bytes(one)
    assert not (tmp_path / "ray" / STAGING).exists()
    assert spread.pictures == one.pictures
    same_results(spread, one)
    same_results(spread, one, exact=True)


@pytest.mark.slow
@pytest.mark.parametrize("side", ["images", "texts"])
def test_ray_index_of_a_dataset_equals_one_process(side, tmp_path, pixel_model, ray_cluster):
    photos = make_photos(tmp_path / "photos")
    dataset = open_dataset("image-captions", photos / "captions.csv", split="all")
    one = xmatch.index.create(tmp_path / "one", pixel_model, side=side)
    index_dataset(one, dataset, batch_size=2, shard_size=3, progress=False)
    spread = xmatch.index.create(tmp_path / "ray", pixel_model, side=side)
    assert index_dataset_on_ray(spread, dataset, batch_size=2, shard_size=3, progress=False) == len(one)
    assert spread.ids == one.ids and shard_bytes(spread) == shard_bytes(one)
    if side == "images":
        same_results(spread, one)
    else:
        pictures = xmatch.PixelInputs([Image.open(photos / "a.png").convert("RGB"), Image.open(photos / "d.png").convert("RGB")])
        for got, want in zip(spread.search_images(pictures, k=5), one.search_images(pictures, k=5), strict=True):
            assert got.ids == want.ids and [h.score for h in got.hits] == [h.score for h in want.hits]


@pytest.mark.slow
def test_a_worker_killed_mid_chunk_is_replaced_and_nothing_is_lost(tmp_path, pixel_model, ray_cluster, monkeypatch):
    photo_folder(tmp_path / "photos", n=7)
    one = xmatch.index.create(tmp_path / "one", pixel_model, dtype="float32")
    index_images(one, tmp_path / "photos", shard_size=2, progress=False)
    marker = tmp_path / "died"
    # the image encoder's worker exits on the first batch it encodes (once: the marker file says
    # it happened), as a worker killed mid-task would; the hook travels with the pickled model
    spread = xmatch.index.create(tmp_path / "ray", pixel_model, dtype="float32")
    encoder = pixel_model.image_encoder
    real = type(encoder).forward

    def dies_once(self, *args, **kwargs):
        if not os.path.exists(marker):
            Path(marker).write_text(str(os.getpid()))
            os._exit(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(encoder, "forward", dies_once.__get__(encoder))
    try:
        added, _ = index_images_on_ray(spread, tmp_path / "photos", shard_size=2, progress=False, ray_workers=2)
    finally:
        monkeypatch.undo()
    assert marker.is_file(), "a worker exited mid-chunk"
    assert added == len(one) and spread.ids == one.ids and shard_bytes(spread) == shard_bytes(one)
    same_results(spread, one)


@pytest.mark.slow
def test_a_killed_driver_resumes_with_append_and_nothing_is_lost(tmp_path, pixel_model, ray_cluster):
    folder = tmp_path / "many"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for k in range(16):
        Image.fromarray(rng.integers(0, 256, (60, 80, 3), dtype=np.uint8)).save(folder / f"{k:02d}.png")
    bundle = xmatch.save_pretrained(pixel_model, tmp_path / "bundle")
    args = [sys.executable, "-m", "xmatch", "index", f"local-dir:{bundle}", "--images", str(folder), "--shard-size", "2",
            "--batch-size", "2", "--dtype", "float32", "--no-progress"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    address = ray_cluster.get_runtime_context().gcs_address
    subprocess.run([*args, "--out", str(tmp_path / "one")], check=True, env=env, capture_output=True)
    driver = subprocess.Popen([*args, "--out", str(tmp_path / "killed"), "--ray", address],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    staging = tmp_path / "killed" / STAGING
    deadline = time.time() + 180
    while time.time() < deadline and driver.poll() is None and not (staging.is_dir() and any(staging.glob("chunk-*.json"))):
        time.sleep(0.05)
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    staged = len(list(staging.glob("chunk-*.json")))
    assert 1 <= staged < 8, "killed mid-run"
    assert read_manifest(tmp_path / "killed")["shards"] == [], "nothing is visible before every shard is in"
    resumed = subprocess.run([*args, "--out", str(tmp_path / "killed"), "--ray", address, "--append"],
                             env=env, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    killed, one = xmatch.index.open(tmp_path / "killed"), xmatch.index.open(tmp_path / "one")
    assert killed.ids == one.ids and shard_bytes(killed) == shard_bytes(one)
    same_results(killed, one)


def test_ray_options_are_checked_before_anything_is_made(tmp_path, capsys):
    from xmatch.cli.main import main

    assert main(["index", "teran-mrsw-scenes", "--out", str(tmp_path / "a"), "--ray-workers", "2"]) == 2
    assert "--ray-workers is the number of workers of --ray" in capsys.readouterr().err
    assert main(["index", "teran-mrsw-scenes", "--out", str(tmp_path / "b"), "--ray", "--engine", "qdrant"]) == 2
    assert "--ray encodes into an embedded index" in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_without_ray_the_error_names_the_extra(tmp_path, pixel_model, monkeypatch):
    from xmatch.core.optional import MissingDependencyError

    photo_folder(tmp_path / "photos")
    index = xmatch.index.create(tmp_path / "idx", pixel_model)
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(MissingDependencyError, match=r"pip install \"xmatch-zoo\[ray\]\""):
        index_images_on_ray(index, tmp_path / "photos", progress=False)
    assert len(xmatch.index.open(tmp_path / "idx", pixel_model)) == 0


@pytest.mark.slow
def test_ray_index_of_webdataset_shards_equals_one_process(tmp_path, pixel_model, ray_cluster):
    from test_webdataset_extract import picture
    from test_webdataset_layout import sample, write_shard

    good = picture(0, (40, 30))
    write_shard(tmp_path / "s" / "00000.tar", [*sample("a", good, b"a"), *sample("bad", b"\x89PNG garbage", b"bad"),
                                             *sample("b", picture(2, (50, 30)), b"b")])
    write_shard(tmp_path / "s" / "00001.tar", [*sample("a", picture(1, (40, 30)), b"a again"), *sample("c", good, b"c")])
    pattern = str(tmp_path / "s" / "{00000..00001}.tar")
    one = xmatch.index.create(tmp_path / "one", pixel_model, dtype="float32")
    added, skipped = index_images(one, pattern, shard_size=2, progress=False)
    spread = xmatch.index.create(tmp_path / "ray", pixel_model, dtype="float32")
    assert index_images_on_ray(spread, pattern, shard_size=2, progress=False) == (added, skipped)
    assert "00000/bad" in [name for name, _ in skipped]
    assert spread.ids == one.ids and shard_bytes(spread) == shard_bytes(one)
    same_results(spread, one)
