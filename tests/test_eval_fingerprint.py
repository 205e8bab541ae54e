"""The dataset fingerprint of a report's provenance covers the features, not only the captions:
two feature sets of the same captions are two datasets, a moved copy is the same one, and the
cost stays a few reads per file whatever the files' size."""

from __future__ import annotations

import builtins
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from xmatch.data import ImageCaptionsDataset, PrecompDataset, TeranDataset
import xmatch.eval.suite as suite
from xmatch.eval.suite import (
    FEATURE_BLOCK_BYTES,
    FEATURE_BLOCKS,
    FEATURE_EDGE_BYTES,
    dataset_fingerprint,
    feature_files,
    files_digest,
)

CAPTIONS = [[f"a {colour} square number {k}" for colour in ("red", "blue")] for k in range(3)]


def teran_folder(root: Path, seed: int) -> Path:
    """A teran layout: a Karpathy file (sizes in its entries) and bottom-up features of ``seed``."""
    rng = np.random.default_rng(seed)
    (root / "bu_att").mkdir(parents=True)
    (root / "bu_box").mkdir()
    images = []
    for k, caps in enumerate(CAPTIONS):
        images.append({"imgid": k, "split": "test", "width": 100, "height": 80, "sentences": [{"raw": c} for c in caps]})
        np.savez_compressed(root / "bu_att" / f"{k}.npz", feat=rng.normal(size=(4, 8)).astype(np.float32))
        np.save(root / "bu_box" / f"{k}.npy", np.tile(np.float32([10, 10, 50, 40]), (4, 1)))
    (root / "dataset_xmatch.json").write_text(json.dumps({"images": images}))
    return root


def precomp_folder(root: Path, seed: int) -> Path:
    root.mkdir(parents=True)
    np.save(root / "test_ims.npy", np.random.default_rng(seed).normal(size=(3, 4, 8)).astype(np.float32))
    (root / "test_caps.txt").write_text("".join(f"{c}\n" for caps in CAPTIONS for c in caps))
    return root


def image_captions_folder(root: Path, seed: int) -> Path:
    root.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    rows = ["image,caption"]
    for k, caps in enumerate(CAPTIONS):
        Image.fromarray(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(root / f"{k}.png")
        rows += [f"{k}.png,{c}" for c in caps]
    (root / "test.csv").write_text("\n".join(rows) + "\n")
    return root


LAYOUTS = {
    "teran": (teran_folder, lambda root: TeranDataset(root, "test", captions_per_image=2)),
    "scan-precomp": (precomp_folder, lambda root: PrecompDataset(root, "test", captions_per_image=2)),
    "image-captions": (image_captions_folder, lambda root: ImageCaptionsDataset(root, "test")),
}


@pytest.mark.filterwarnings("ignore:.*has no box file")
@pytest.mark.parametrize("layout", LAYOUTS)
def test_two_feature_sets_of_the_same_captions_are_two_datasets(layout, tmp_path):
    make, open_split = LAYOUTS[layout]
    first, other = open_split(make(tmp_path / "a", seed=0)), open_split(make(tmp_path / "b", seed=1))
    assert first.captions == other.captions and first.image_names == other.image_names
    assert dataset_fingerprint(first) != dataset_fingerprint(other)
    # the same files elsewhere: the same dataset
    shutil.copytree(tmp_path / "a", tmp_path / "moved" / "copy")
    assert dataset_fingerprint(open_split(tmp_path / "moved" / "copy")) == dataset_fingerprint(first)
    assert dataset_fingerprint(open_split(tmp_path / "a")) == dataset_fingerprint(first)


def test_teran_features_elsewhere_and_every_file_counts(tmp_path):
    """features= another folder of the same captions; one box file changed is another dataset."""
    root = teran_folder(tmp_path / "data", seed=0)
    teran_folder(tmp_path / "other-features", seed=1)
    here = TeranDataset(root, "test", captions_per_image=2)
    there = TeranDataset(root, "test", captions_per_image=2, features=tmp_path / "other-features")
    assert [p.name for p in feature_files(here)] == ["0.npz", "0.npy", "1.npz", "1.npy", "2.npz", "2.npy"]
    assert dataset_fingerprint(here) != dataset_fingerprint(there)
    before = dataset_fingerprint(here)
    np.save(root / "bu_box" / "2.npy", np.tile(np.float32([10, 10, 50, 41]), (4, 1)))
    assert dataset_fingerprint(here) != before


class _CountingFile:
    """A file whose reads add their length to a counter."""

    def __init__(self, file, counter: list[int]) -> None:
        self._file, self._counter = file, counter

    def read(self, size: int = -1) -> bytes:
        data = self._file.read(size)
        self._counter[0] += len(data)
        return data

    def __getattr__(self, name: str):
        return getattr(self._file, name)

    def __enter__(self) -> _CountingFile:
        return self

    def __exit__(self, *exc) -> None:
        self._file.close()


def count_bytes_read(monkeypatch) -> list[int]:
    """The number of bytes the fingerprint reads from here on (a one-element list, updated)."""
    counter = [0]
    monkeypatch.setattr(suite, "open", lambda *args, **kw: _CountingFile(builtins.open(*args, **kw), counter),
                        raising=False)
    return counter


def test_the_sample_is_bounded_for_any_file_size(tmp_path, monkeypatch):
    """A 64 GiB sparse file costs a few reads: both ends and a few blocks, not the file."""
    big = tmp_path / "train_ims.npy"
    with open(big, "wb") as f:
        f.truncate(64 << 30)
    read = count_bytes_read(monkeypatch)
    digest = files_digest([big])
    assert read == [2 * FEATURE_EDGE_BYTES + FEATURE_BLOCKS * FEATURE_BLOCK_BYTES]
    with open(big, "r+b") as f:  # a byte within the last FEATURE_EDGE_BYTES: sampled
        f.seek((64 << 30) - FEATURE_EDGE_BYTES // 2)
        f.write(b"x")
    assert files_digest([big]) != digest
    with open(big, "r+b") as f:  # another length: another digest, whatever the bytes
        f.truncate((64 << 30) + 1)
    assert len({digest, files_digest([big])}) == 2


def test_an_unreadable_feature_file_is_named(tmp_path):
    from xmatch.data import DataError

    with pytest.raises(DataError, match=r"missing\.npz: cannot be read for the dataset fingerprint"):
        files_digest([tmp_path / "missing.npz"])
