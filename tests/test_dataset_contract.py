"""Registry-driven dataset contract: every registered dataset layout, opened by name on a small
set written to a temporary folder, hands out the same kinds of items, batches and errors.

A layout added to the ``datasets`` registry (by xmatch or a plugin) needs a case in ``CASES``:
a function that writes a small set and says how to open it and which file to remove.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from xmatch.data import ImageTextDataset, Pair, RegionImage, open_dataset
from xmatch.core.registry import get_registry

from learnable import write_learnable_precomp

FAST_SCENES = {"size": "tiny", "backbone": "test_efficientnet", "weights": "random", "progress": False}


@dataclass
class Case:
    root: Path
    split: str
    options: dict[str, Any] = field(default_factory=dict)
    # files the layout reads or checks when it opens (a missing one is named then, not mid-epoch)
    read_at_open: tuple[Path, ...] = ()


@pytest.fixture(scope="module")
def scenes_root(tmp_path_factory) -> Path:
    """The tiny scenes set, the source of the scenes, teran and image-captions cases."""
    pytest.importorskip("sklearn", reason="the scenes generator draws digit glyphs from scikit-learn")
    from xmatch.scenes.dataset import open_scenes

    root = tmp_path_factory.mktemp("scenes")
    open_scenes(root, "test", **FAST_SCENES)
    return root


def scenes_folder(scenes_root: Path) -> Path:
    return next(p for p in scenes_root.iterdir() if p.is_dir())


def teran_case(tmp: Path, scenes_root: Path) -> Case:
    from xmatch.scenes.dataset import KARPATHY_FILE, features_folder_name

    src = scenes_folder(scenes_root)
    folder = tmp / "teran"
    shutil.copytree(src, folder)
    features = folder / features_folder_name(36, "test_efficientnet", "random")
    ds = open_dataset("teran", folder, split="test", captions=folder / KARPATHY_FILE, sizes=folder / "sizes.json",
                      features=features)
    return Case(folder, "test", {"captions": folder / KARPATHY_FILE, "sizes": folder / "sizes.json", "features": features},
                read_at_open=(folder / KARPATHY_FILE, features / "bu_att" / f"{ds.image_names[0]}.npz"))


def precomp_case(tmp: Path, scenes_root: Path | None) -> Case:
    root = write_learnable_precomp(tmp / "precomp", "test", 4, seed=0)
    return Case(root, "test", {"boxes_normalized": True}, read_at_open=(root / "test_caps.txt", root / "test_ims.npy"))


def image_captions_case(tmp: Path, scenes_root: Path) -> Case:
    folder = tmp / "photos"
    shutil.copytree(scenes_folder(scenes_root), folder, ignore=shutil.ignore_patterns("features_*"))
    ds = open_dataset("image-captions", folder, split="test")
    return Case(folder, "test", read_at_open=(folder / "test.csv", folder / ds.image_names[0]))


def webdataset_case(tmp: Path, scenes_root: Path | None) -> Case:
    from test_webdataset_layout import png, sample, write_shard

    shards = [write_shard(tmp / "shards" / f"{s:05d}.tar", [m for k in range(2) for m in sample(
        f"{s}{k}", png((90 * k, 60 * s, 30)), f"picture {k} of shard {s}".encode())]) for s in range(2)]
    return Case(tmp / "shards" / "{00000..00001}.tar", "test", read_at_open=(shards[1],))


def scenes_case(tmp: Path, scenes_root: Path) -> Case:
    return Case(scenes_root, "test", dict(FAST_SCENES, generate=False))


def tabletop_case(tmp: Path, scenes_root: Path | None) -> Case:
    from xmatch.tabletop.dataset import KARPATHY_FILE, open_tabletop

    folder = open_tabletop(tmp / "tabletop", "test", **FAST_SCENES, generate=True).root
    return Case(tmp / "tabletop", "test", dict(FAST_SCENES, generate=False), read_at_open=(folder / KARPATHY_FILE,))


def signs_case(tmp: Path, scenes_root: Path | None) -> Case:
    pytest.importorskip("matplotlib")
    pytest.importorskip("skimage")
    from xmatch.signs.dataset import open_signs

    options = {"size": "tiny", "progress": False}
    folder = open_signs(tmp / "signs", "test", **options, generate=True).root
    return Case(tmp / "signs", "test", dict(options, layout="images", generate=False), read_at_open=(folder / "test.csv",))


CASES: dict[str, Callable[[Path, Path | None], Case]] = {
    "teran": teran_case,
    "scan-precomp": precomp_case,
    "image-captions": image_captions_case,
    "scenes": scenes_case,
    "tabletop": tabletop_case,
    "signs": signs_case,
    "webdataset": webdataset_case,
}


def test_every_registered_dataset_has_a_contract_case():
    assert set(get_registry("datasets").names()) == set(CASES)


@pytest.fixture(params=sorted(CASES))
def case(request, tmp_path) -> tuple[str, Case]:
    scenes = None if request.param in ("scan-precomp", "tabletop", "signs", "webdataset") else request.getfixturevalue("scenes_root")
    return request.param, CASES[request.param](tmp_path, scenes)


def open_case(name: str, case: Case) -> ImageTextDataset:
    return open_dataset(name, case.root, split=case.split, **case.options)


def same_image(a: Any, b: Any) -> bool:
    if isinstance(a, RegionImage):
        return np.array_equal(a.regions, b.regions) and np.array_equal(a.boxes, b.boxes)
    return np.array_equal(np.asarray(a), np.asarray(b))


def test_dataset_contract(case):
    name, c = case
    ds = open_case(name, c)
    assert isinstance(ds, ImageTextDataset)
    n = len(ds)
    assert n == len(ds.captions) == len(ds.caption_image) > 0
    assert ds.num_images == len(ds.image_names) > 0
    assert ds.caption_image.dtype == np.int64 and (np.diff(ds.caption_image) >= 0).all()
    assert set(ds.caption_image.tolist()) == set(range(ds.num_images)), "an image without captions"
    if ds.captions_per_image is not None:
        assert n == ds.num_images * ds.captions_per_image
    assert all(isinstance(t, str) and t.strip() for t in ds.captions), "empty or non-string captions"

    for k in (0, n - 1):
        pair = ds[k]
        assert isinstance(pair, Pair) and pair.index == k and pair.text == ds.captions[k]
        assert pair.image_index == ds.caption_image[k]
        assert same_image(pair.image, ds[k].image), "indexing is not deterministic"
        assert same_image(pair.image, ds.image(pair.image_index))
    with pytest.raises(IndexError):
        ds[n]

    image = ds.image(0)
    if isinstance(image, RegionImage):
        assert image.regions.dtype == image.boxes.dtype == np.float32
        assert image.regions.ndim == 2 and image.boxes.shape == (image.regions.shape[0], 4)
        assert (image.boxes >= 0).all() and (image.boxes <= 1).all(), "boxes not normalised to [0, 1]"
    else:
        assert isinstance(image, Image.Image)

    batch = next(iter(ds.loader(3, shuffle=False)))
    assert batch.texts == ds.captions[:3]
    assert batch.indices.tolist() == [0, 1, 2] and batch.image_ids.tolist() == ds.caption_image[:3].tolist()
    images = next(iter(ds.image_loader(2)))
    assert images.image_ids.tolist() == list(range(min(2, ds.num_images)))
    for b, size in ((batch, 3), (images, min(2, ds.num_images))):
        if isinstance(image, RegionImage):
            regions, boxes, mask = b.images.regions, b.images.boxes, b.images.mask
            assert regions.dtype == boxes.dtype == torch.float32 and mask.dtype == torch.bool
            assert regions.shape[:2] == boxes.shape[:2] == mask.shape and mask.shape[0] == size  # batch first
            assert not regions[~mask].any() and not boxes[~mask].any(), "padding is not zero"
        else:
            assert len(b.images.images) == size and all(isinstance(im, Image.Image) for im in b.images.images)
    first = ds.image(int(ds.caption_image[0]))
    if isinstance(first, RegionImage):
        r = first.num_regions
        assert batch.images.mask[0].sum() == r
        np.testing.assert_array_equal(batch.images.regions[0, :r].numpy(), first.regions)


def test_dataset_names_the_missing_file(case):
    name, c = case
    if not c.read_at_open:  # scenes: a folder that does not hold the set, with generation off
        with pytest.raises(FileNotFoundError, match="no scenes data"):
            open_dataset(name, c.root / "elsewhere", split=c.split, **c.options)
        return
    for path in c.read_at_open:
        content = path.read_bytes()
        path.unlink()
        with pytest.raises(FileNotFoundError, match=path.name):
            open_case(name, c)
        path.write_bytes(content)
