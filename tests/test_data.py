"""Datasets: the TERAN / TERN bottom-up layout, SCAN precomp, image files + a captions file,
the collate functions and open_dataset. Every layout is written to tmp_path the way it is
distributed (npz / npy per image, COCO annotation JSONs and VSE++ id files, Karpathy split
files, TERAN's sizes.pkl, SCAN's memory-mappable arrays and caption text files)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import xmatch
from xmatch.data import (
    DataError,
    DataFileNotFoundError,
    ImageCaptionsDataset,
    Pair,
    PrecompDataset,
    RegionImage,
    TeranDataset,
    collate,
    collate_images,
    open_dataset,
)
from xmatch.model.inputs import ImageBatch, PairBatch, PixelInputs, RegionInputs
from xmatch.core.registry import RegistryError, get_registry
from xmatch.core.spec import SpecError

from conftest import tiny_spec

F = 12  # feature width of the test sets (the tiny model's)

# --- TERAN layout -------------------------------------------------------------------------

# COCO image id -> (split file, width, height, regions); annotation ids are 100 * id + k
COCO_IMAGES = {
    1: ("train2014", 640, 480, 3),
    2: ("train2014", 500, 375, 4),
    10: ("val2014", 640, 427, 4),  # test; has a 6th caption
    11: ("val2014", 427, 640, 4),  # test
    12: ("val2014", 300, 200, 4),  # restval
    13: ("val2014", 640, 480, 4),  # val (dev)
}
N_CAPTIONS = {10: 6}
SPLIT_IDS = {"train": [1, 2], "test": [10, 11], "restval": [12], "dev": [13]}
IMAGE1_BOXES = np.array([[64, 48, 320, 240], [0, 0, 639, 479], [320, 240, 640, 480]], dtype=np.float32)


def features_of(key: int, regions: int) -> np.ndarray:
    return np.random.default_rng(key).random((regions, F), dtype=np.float32)


def pixel_boxes(width: int, height: int, regions: int) -> np.ndarray:
    frac = np.linspace(0.1, 0.9, regions)
    return np.stack([frac * width / 2, frac * height / 2, frac * width, frac * height], axis=1).astype(np.float32)


def write_bottom_up(folder: Path, key: int | str, feat: np.ndarray, boxes: np.ndarray) -> None:
    """As the bottom-up conversion scripts write them: savez_compressed(feat=...) and np.save."""
    (folder / "bu_att").mkdir(parents=True, exist_ok=True)
    (folder / "bu_box").mkdir(parents=True, exist_ok=True)
    np.savez_compressed(folder / "bu_att" / str(key), feat=feat)
    np.save(folder / "bu_box" / str(key), boxes)


def caption_ids(image_id: int) -> list[int]:
    return [100 * image_id + k for k in range(N_CAPTIONS.get(image_id, 5))]


@pytest.fixture
def coco_root(tmp_path: Path) -> Path:
    """data/coco as TERAN's data.tar + features_36_coco.tar unpack it."""
    root = tmp_path / "coco"
    ann = root / "annotations"
    ann.mkdir(parents=True)
    for part in ("train2014", "val2014"):
        ids = [i for i, v in COCO_IMAGES.items() if v[0] == part]
        doc = {
            "info": {}, "licenses": [],
            "images": [{"id": i, "width": COCO_IMAGES[i][1], "height": COCO_IMAGES[i][2],
                        "file_name": f"COCO_{part}_{i:012d}.jpg"} for i in ids],
            "annotations": [{"id": a, "image_id": i, "caption": f"caption {a}"} for i in ids for a in caption_ids(i)],
        }
        (ann / f"captions_{part}.json").write_text(json.dumps(doc))
    for split, ids in SPLIT_IDS.items():
        np.save(ann / f"coco_{split}_ids.npy", np.array([a for i in ids for a in caption_ids(i)], dtype=np.int64))
    for i, (_, w, h, r) in COCO_IMAGES.items():
        write_bottom_up(root / "features_36", i, features_of(i, r), IMAGE1_BOXES if i == 1 else pixel_boxes(w, h, r))
    return root


def expected_boxes(boxes: np.ndarray, width: float, height: float) -> np.ndarray:
    """The original: boxes / np.tile([W, H], 2) in float64, then torch.Tensor (float32)."""
    return (boxes.astype(np.float64) / np.tile(np.array([width, height], dtype=np.float64), 2)).astype(np.float32)


def test_teran_coco_annotations_read_like_the_original(coco_root):
    ds = open_dataset("teran", coco_root, split="test")
    assert isinstance(ds, TeranDataset) and ds.feature_dim == F
    assert ds.image_names == ["10", "11"]
    # image 10 has 6 captions: the first 5 are kept (the original's ids are Karpathy's sentids[:5])
    assert ds.captions == [f"caption {a}" for a in (*caption_ids(10)[:5], *caption_ids(11))]
    assert ds.caption_image.tolist() == [0] * 5 + [1] * 5
    assert ds.captions_per_image == 5 and len(ds) == 10 and ds.num_images == 2
    assert ds.size_source == f"COCO annotations {coco_root / 'annotations' / 'captions_val2014.json'}"
    assert ds.image_size(1) == (427.0, 640.0)
    img = ds.image(1)
    np.testing.assert_array_equal(img.regions, features_of(11, 4))
    np.testing.assert_array_equal(img.boxes, expected_boxes(pixel_boxes(427, 640, 4), 427, 640))
    assert img.regions.dtype == np.float32 and img.boxes.dtype == np.float32
    pair = ds[7]
    assert (pair.text, pair.image_index, pair.index) == ("caption 1102", 1, 7)
    np.testing.assert_array_equal(pair.image.regions, img.regions)
    assert ds[-1].index == 9


def test_teran_box_normalisation_numbers(coco_root):
    ds = TeranDataset(coco_root, "train")
    boxes = ds.image(0).boxes  # image 1: 640 x 480
    np.testing.assert_array_equal(boxes, expected_boxes(IMAGE1_BOXES, 640, 480))
    np.testing.assert_allclose(
        boxes, [[0.1, 0.1, 0.5, 0.5], [0, 0, 639 / 640, 479 / 480], [0.5, 0.5, 1, 1]], rtol=0, atol=1e-7
    )


def test_teran_restval_appends_restval_images_to_train(coco_root):
    plain = TeranDataset(coco_root, "train")
    assert plain.image_names == ["1", "2"] and len(plain) == 10
    ds = TeranDataset(coco_root, "train", restval=True)
    assert ds.image_names == ["1", "2", "12"]
    assert ds.captions[10:] == [f"caption {a}" for a in caption_ids(12)]
    assert ds.image_size(2) == (300.0, 200.0)  # restval sizes come from captions_val2014.json
    assert "captions_train2014.json" in ds.size_source and "captions_val2014.json" in ds.size_source
    assert TeranDataset(coco_root, "val", restval=True).image_names == ["13"]
    assert TeranDataset(coco_root, "train", restval=True, max_images=2).image_names == ["1", "2"]


FLICKR_SIZES = [(500, 333), (375, 500), (500, 400), (640, 480)]
FLICKR_SPLITS = ["train", "train", "val", "test"]


@pytest.fixture
def flickr_root(tmp_path: Path) -> Path:
    """data/f30k: Karpathy's dataset_flickr30k.json, features keyed by imgid, images/sizes.pkl."""
    root = tmp_path / "f30k"
    (root / "annotations").mkdir(parents=True)
    (root / "images").mkdir()
    images = []
    for pos, (split, (w, h)) in enumerate(zip(FLICKR_SPLITS, FLICKR_SIZES, strict=True)):
        name = f"{1000 + pos}.jpg"
        sentences = [{"raw": f"Flickr image {pos} says {k}.", "imgid": pos, "sentid": 5 * pos + k} for k in range(5)]
        images.append({"sentids": list(range(5 * pos, 5 * pos + 5)), "imgid": pos, "sentences": sentences,
                       "split": split, "filename": name})
        Image.new("RGB", (w, h), (pos * 40, 0, 0)).save(root / "images" / name)
        write_bottom_up(root / "features_36", pos, features_of(pos, 4), pixel_boxes(w, h, 4))
    (root / "annotations" / "dataset_flickr30k.json").write_text(json.dumps({"images": images, "dataset": "flickr30k"}))
    with open(root / "images" / "sizes.pkl", "wb") as f:  # what TERAN's FlickrDataset caches
        pickle.dump([Image.open(root / "images" / im["filename"]).size for im in images], f)
    return root


def test_teran_karpathy_flickr_with_sizes_pkl(flickr_root):
    ds = open_dataset("teran", flickr_root, split="train", sizes=flickr_root / "images" / "sizes.pkl")
    assert ds.image_names == ["0", "1"]  # features are keyed by the Karpathy imgid
    assert ds.captions[:2] == ["Flickr image 0 says 0.", "Flickr image 0 says 1."] and len(ds) == 10
    assert ds.size_source.startswith("sizes file") and ds.image_size(1) == (375.0, 500.0)
    np.testing.assert_array_equal(ds.image(1).boxes, expected_boxes(pixel_boxes(375, 500, 4), 375, 500))
    test = TeranDataset(flickr_root, "test", sizes=flickr_root / "images" / "sizes.pkl")
    assert test.image_names == ["3"] and test.captions_per_image == 5


def test_teran_sizes_from_image_headers(flickr_root):
    ds = TeranDataset(flickr_root, "val", images=flickr_root / "images")
    assert ds.size_source == f"image headers in {flickr_root / 'images'}"
    assert ds.image_size(0) == (500.0, 400.0)
    np.testing.assert_array_equal(ds.image(0).boxes, expected_boxes(pixel_boxes(500, 400, 4), 500, 400))


def test_teran_karpathy_needs_an_explicit_size_source(flickr_root):
    with pytest.raises(DataError, match=r"sizes=.*images=.*images/sizes.pkl exists"):
        TeranDataset(flickr_root, "train")
    with pytest.raises(DataError, match=r"no images of split 'restval'") as err:
        TeranDataset(flickr_root, "train", restval=True, images=flickr_root / "images")
    assert str(flickr_root / "annotations" / "dataset_flickr30k.json") in str(err.value)
    (flickr_root / "images" / "1001.jpg").unlink()
    with pytest.raises(DataFileNotFoundError, match="1001.jpg"):
        TeranDataset(flickr_root, "train", images=flickr_root / "images")
    with open(flickr_root / "images" / "sizes.pkl", "wb") as f:
        pickle.dump(FLICKR_SIZES[:1], f)
    with pytest.raises(DataError, match=r"no image size .* image 1 \(position 1") as err:
        TeranDataset(flickr_root, "train", sizes=flickr_root / "images" / "sizes.pkl")
    assert "sizes.pkl" in str(err.value)


def test_teran_sizes_pkl_is_never_unpickled_with_code(flickr_root):
    with open(flickr_root / "images" / "sizes.pkl", "wb") as f:
        pickle.dump([Path("a")], f)  # needs a class import to load
    with pytest.raises(DataError, match="plain lists"):
        TeranDataset(flickr_root, "train", sizes=flickr_root / "images" / "sizes.pkl")


def test_teran_karpathy_coco_keeps_the_first_five_captions(coco_root):
    ann = coco_root / "annotations"
    images = [
        {"filepath": "val2014", "filename": f"COCO_val2014_{i:012d}.jpg", "imgid": n, "split": "test", "cocoid": i,
         "sentids": [], "sentences": [{"raw": f"coco {i} sentence {k}", "tokens": []} for k in range(n_sentences)]}
        for n, (i, n_sentences) in enumerate(((10, 7), (11, 5)))
    ]
    (ann / "dataset_coco.json").write_text(json.dumps({"images": images, "dataset": "coco"}))
    sizes = [ann / "captions_train2014.json", ann / "captions_val2014.json"]
    kwargs = {"captions": ann / "dataset_coco.json", "sizes": sizes}
    ds = TeranDataset(coco_root, "test", **kwargs)
    assert ds.image_names == ["10", "11"] and ds.captions_per_image == 5
    assert ds.captions[:5] == [f"coco 10 sentence {k}" for k in range(5)]
    assert ds.image_size(0) == (640.0, 427.0)
    every = TeranDataset(coco_root, "test", captions_per_image=None, **kwargs)
    assert len(every) == 12 and every.captions_per_image is None
    assert every.caption_image.tolist() == [0] * 7 + [1] * 5


def test_teran_construction_errors_name_the_file(coco_root, tmp_path):
    ann, bu = coco_root / "annotations", coco_root / "features_36"
    with pytest.raises(DataError, match=r"unknown split 'dev'.*train, val, test \(the precomp layout's 'dev' is 'val'"):
        TeranDataset(coco_root, "dev")
    with pytest.raises(DataFileNotFoundError) as err:
        TeranDataset(tmp_path / "nowhere", "test")
    assert str(tmp_path / "nowhere") in str(err.value)
    (bu / "bu_att" / "11.npz").unlink()
    with pytest.raises(DataFileNotFoundError) as err:
        TeranDataset(coco_root, "test")
    assert str(bu / "bu_att" / "11.npz") in str(err.value) and "1 of 2" in str(err.value)
    (bu / "bu_box" / "1.npy").unlink()
    with pytest.raises(DataFileNotFoundError, match=str(bu / "bu_box" / "1.npy")):
        TeranDataset(coco_root, "train")
    np.save(ann / "coco_dev_ids.npy", np.array([1301, 999], dtype=np.int64))
    with pytest.raises(DataError, match="annotation id 999") as err:
        TeranDataset(coco_root, "val")
    assert str(ann / "coco_dev_ids.npy") in str(err.value)
    doc = json.loads((ann / "captions_train2014.json").read_text())
    doc["annotations"][3]["caption"] = "   "
    doc["images"][1].pop("height")
    (ann / "captions_train2014.json").write_text(json.dumps(doc))
    with pytest.raises(DataError, match=r"COCO image 1 .*empty caption"):
        TeranDataset(coco_root, "train", features=bu)
    doc["annotations"][3]["caption"] = "fine"
    (ann / "captions_train2014.json").write_text(json.dumps(doc))
    write_bottom_up(bu, 1, features_of(1, 3), IMAGE1_BOXES)
    with pytest.raises(DataError, match="COCO image 2 has no width / height") as err:
        TeranDataset(coco_root, "train")
    assert "captions_train2014.json" in str(err.value)
    np.save(ann / "coco_test_ids.npy", np.array(caption_ids(10)[:4], dtype=np.int64))
    with pytest.raises(DataError, match="COCO image 10 .*4 captions, fewer than captions_per_image=5"):
        TeranDataset(coco_root, "test")
    (ann / "coco_test_ids.npy").unlink()
    with pytest.raises(DataFileNotFoundError, match="coco_test_ids.npy.*dataset_coco.json"):
        TeranDataset(coco_root, "test")
    (ann / "captions_val2014.json").write_text("{not json")
    with pytest.raises(DataError, match=f"{ann / 'captions_val2014.json'} is not valid JSON"):
        TeranDataset(coco_root, "val")


@pytest.mark.parametrize(
    "corrupt, message",
    [
        (lambda bu: np.savez(bu / "bu_att" / "11", features=np.zeros((4, F), np.float32)),
         r"has no array 'feat' \(arrays: features\)"),
        (lambda bu: np.savez(bu / "bu_att" / "11", feat=np.zeros((4, 8), np.float32)),
         r"8 wide but the dataset's are 12 \(from .*10\.npz\)"),
        (lambda bu: np.savez(bu / "bu_att" / "11", feat=np.full((4, F), np.nan, np.float32)), "NaN"),
        (lambda bu: (bu / "bu_att" / "11.npz").write_bytes(b"PK\x03\x04 truncated"), "not a readable .npz"),
        (lambda bu: np.save(bu / "bu_box" / "11", np.zeros((3, 4), np.float32)), "3 boxes for 4 regions"),
        (lambda bu: np.save(bu / "bu_box" / "11", np.array([[0, 0, 428, 10]] * 4, np.float32)),
         r"outside the image.*427x640.*captions_val2014"),
    ],
    ids=["no-feat", "width", "nan", "corrupt", "box-count", "box-outside"],
)
def test_teran_corrupt_items_fail_at_load_naming_the_file(coco_root, corrupt, message):
    bu = coco_root / "features_36"
    corrupt(bu)
    ds = TeranDataset(coco_root, "test")  # cheap checks pass; the item is read on demand
    ds.image(0)
    with pytest.raises(DataError, match=message) as err:
        ds.image(1)
    assert "/11.np" in str(err.value) and str(bu) in str(err.value)
    with pytest.raises(DataError):
        ds[5]  # its captions' pairs fail the same way: never a silent skip


# --- SCAN precomp -------------------------------------------------------------------------


def write_precomp(
    root: Path, split: str, n_images: int, *, regions: int = 5, per_caption_rows: bool = False
) -> np.ndarray:
    """<split>_ims.npy and <split>_caps.txt as SCAN's data; returns the feature array."""
    root.mkdir(parents=True, exist_ok=True)
    rows = 5 * n_images if per_caption_rows else n_images
    ims = np.random.default_rng(rows).random((rows, regions, F), dtype=np.float32)
    np.save(root / f"{split}_ims.npy", ims)
    lines = [f"image {i} caption {k}" for i in range(n_images) for k in range(5)]
    (root / f"{split}_caps.txt").write_text("\n".join(lines) + "\n")
    return ims


def test_precomp_memory_maps_and_orders_captions(tmp_path):
    ims = write_precomp(tmp_path, "test", 4)
    with pytest.warns(UserWarning, match=r"full-image box \[0, 0, 1, 1\]"):
        ds = open_dataset("scan-precomp", tmp_path, split="test")
    assert isinstance(ds, PrecompDataset) and isinstance(ds.features, np.memmap)
    assert ds.num_images == 4 and len(ds) == 20 and ds.captions_per_image == 5
    assert ds.captions[6] == "image 1 caption 1" and ds.caption_image[6] == 1
    assert not ds.has_boxes and ds.image_names == ["0", "1", "2", "3"]
    img = ds.image(2)
    np.testing.assert_array_equal(img.regions, ims[2])
    np.testing.assert_array_equal(img.boxes, np.tile([0, 0, 1, 1], (5, 1)).astype(np.float32))
    assert not isinstance(img.regions, np.memmap)  # a copy: the item does not pin the mapping
    pair = ds[13]  # caption k belongs to image k // 5
    assert pair.image_index == 2 and pair.text == "image 2 caption 3"
    np.testing.assert_array_equal(pair.image.regions, ims[2])


def test_precomp_one_image_row_per_caption(tmp_path):
    ims = write_precomp(tmp_path, "test", 3, per_caption_rows=True)  # the original's im_div = 1
    with pytest.warns(UserWarning):
        ds = PrecompDataset(tmp_path, "test")
    assert ds.rows_per_caption and ds.num_images == 3 and ds.image_names == ["0", "5", "10"]
    np.testing.assert_array_equal(ds.image(1).regions, ims[5])  # evaluation takes images[::5]
    np.testing.assert_array_equal(ds[7].image.regions, ims[7])  # training pairs use their own row
    assert ds[7].image_index == 1


def test_precomp_boxes_are_normalised_by_the_sizes_file(tmp_path):
    write_precomp(tmp_path, "dev", 2, regions=3)
    boxes = np.stack([IMAGE1_BOXES, pixel_boxes(500, 375, 3)])
    np.save(tmp_path / "dev_boxes.npy", boxes)
    np.save(tmp_path / "dev_img_sizes.npy", np.array([[640, 480], [500, 375]]))
    ds = PrecompDataset(tmp_path, "val")  # val reads dev
    assert ds.split == "dev" and ds.has_boxes and ds.size_source == f"sizes file {tmp_path / 'dev_img_sizes.npy'}"
    np.testing.assert_array_equal(ds.image(0).boxes, expected_boxes(IMAGE1_BOXES, 640, 480))
    np.testing.assert_allclose(ds.image(0).boxes[0], [0.1, 0.1, 0.5, 0.5], atol=1e-7)
    np.testing.assert_array_equal(ds.image(1).boxes, expected_boxes(boxes[1], 500, 375))
    np.save(tmp_path / "norm.npy", expected_boxes(boxes.reshape(-1, 4), 640, 480).reshape(2, 3, 4))
    normed = PrecompDataset(tmp_path, "dev", boxes=tmp_path / "norm.npy", boxes_normalized=True, max_images=1)
    assert len(normed) == 5 and normed.num_images == 1
    np.testing.assert_array_equal(normed.image(0).boxes, expected_boxes(IMAGE1_BOXES, 640, 480))
    (tmp_path / "dev_img_sizes.npy").unlink()
    with pytest.raises(DataError, match=f"{tmp_path / 'dev_boxes.npy'} holds pixel boxes.*dev_img_sizes.npy"):
        PrecompDataset(tmp_path, "dev")
    np.save(tmp_path / "dev_ims_size.npy", np.array([{"image_w": 640, "image_h": 480}] * 2, dtype=object))
    with pytest.raises(DataError, match=f"{tmp_path / 'dev_ims_size.npy'} holds pickled Python objects"):
        PrecompDataset(tmp_path, "dev")


def test_precomp_errors_name_the_file(tmp_path):
    write_precomp(tmp_path, "train", 2)
    with pytest.raises(DataError, match=r"unknown split 'test'.*test_ims.npy.*splits present: train"):
        PrecompDataset(tmp_path, "test")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataFileNotFoundError, match=f"{tmp_path / 'empty'} has no <split>_ims.npy"):
        PrecompDataset(tmp_path / "empty", "train")
    caps = tmp_path / "train_caps.txt"
    caps.write_text("\n".join(f"c{i}" for i in range(12)) + "\n")
    with pytest.raises(DataError, match=f"{caps} has 12 lines.*5 per image row.*pass captions_per_image=6"):
        PrecompDataset(tmp_path, "train")
    caps.write_text("\n".join(f"c{i}" for i in range(11)) + "\n")
    with pytest.raises(DataError, match=r"has 11 lines, which is neither 5 per image row .*one per row\.$"):
        PrecompDataset(tmp_path, "train")
    caps.write_text("a\nb\n\nd\ne\nf\ng\nh\ni\nj\n")
    with pytest.raises(DataError, match=f"{caps} has empty lines 3"):
        PrecompDataset(tmp_path, "train")
    caps.write_text("".join(f"c{i}\n" for i in range(10)))
    ims = np.load(tmp_path / "train_ims.npy")
    ims[1, 2, 3] = np.nan
    np.save(tmp_path / "train_ims.npy", ims)
    with pytest.warns(UserWarning):
        ds = PrecompDataset(tmp_path, "train")
    ds.image(0)
    with pytest.raises(DataError, match=f"{tmp_path / 'train_ims.npy'} row 1: region features contain NaN"):
        ds[7]
    np.save(tmp_path / "train_boxes.npy", np.zeros((2, 4, 4), np.float32))
    with pytest.raises(DataError, match=r"train_boxes.npy must be \[rows, regions, 4\] = \(2, 5, 4\)"):
        PrecompDataset(tmp_path, "train", boxes_normalized=True)


def test_precomp_pickles_paths_not_the_mapped_array(tmp_path):
    ims = write_precomp(tmp_path, "test", 50, regions=36)
    with pytest.warns(UserWarning):
        ds = PrecompDataset(tmp_path, "test")
    blob = pickle.dumps(ds)  # what DataLoader workers receive under the "spawn" start method
    assert len(blob) < ims.nbytes / 10
    again = pickle.loads(blob)
    assert isinstance(again.features, np.memmap)
    np.testing.assert_array_equal(again.image(49).regions, ims[49])


# --- image files + captions file ----------------------------------------------------------


@pytest.fixture
def photos(tmp_path: Path) -> Path:
    (tmp_path / "sub").mkdir()
    Image.new("RGB", (32, 24), (255, 0, 0)).save(tmp_path / "a.jpg")
    Image.new("L", (8, 16), 128).save(tmp_path / "sub" / "b.png")
    (tmp_path / "captions.csv").write_text(
        'image,caption\na.jpg,a red square\nsub/b.png,"a grey, tall rectangle"\na.jpg, red again \n'
    )
    return tmp_path


def test_image_captions_csv_groups_captions_by_image(photos):
    ds = open_dataset("image-captions", photos / "captions.csv")
    assert isinstance(ds, ImageCaptionsDataset)
    assert ds.image_names == ["a.jpg", "sub/b.png"] and ds.image_paths[1] == photos / "sub" / "b.png"
    assert ds.captions == ["a red square", "red again", "a grey, tall rectangle"]
    assert ds.caption_image.tolist() == [0, 0, 1] and ds.captions_per_image is None
    img = ds.image(1)
    assert isinstance(img, Image.Image) and img.size == (8, 16) and img.mode == "RGB"
    batch = collate([ds[0], ds[2]])
    assert isinstance(batch, PairBatch) and isinstance(batch.images, PixelInputs)
    assert [im.size for im in batch.images.images] == [(32, 24), (8, 16)]
    assert batch.texts == ["a red square", "a grey, tall rectangle"]
    assert batch.image_ids.tolist() == [0, 1] and batch.indices.tolist() == [0, 2]
    [images] = list(ds.image_batches(8))
    assert len(images.images.images) == 2 and images.image_ids.tolist() == [0, 1]


def test_image_captions_jsonl_split_in_a_folder(photos):
    pictures = (("a.jpg", "red"), ("sub/b.png", "grey"))
    lines = [{"image": name, "caption": f"{word} {k}"} for name, word in pictures for k in range(2)]
    (photos / "test.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    ds = open_dataset("image-captions", photos, split="test")
    assert ds.captions == ["red 0", "red 1", "grey 0", "grey 1"] and ds.captions_per_image == 2
    assert ds.split == "test" and ds.captions_file == photos / "test.jsonl"


def test_image_captions_errors_name_the_file(photos):
    csv_file = photos / "captions.csv"
    csv_file.write_text("path,text\na.jpg,x\n")
    with pytest.raises(DataError, match=f"{csv_file}: the first line must be a header with columns 'image' and 'capt"):
        ImageCaptionsDataset(csv_file)
    csv_file.write_text("image,caption\na.jpg,x\na.jpg,  \n")
    with pytest.raises(DataError, match=f"{csv_file}:3: empty caption for image 'a.jpg'"):
        ImageCaptionsDataset(csv_file)
    csv_file.write_text("image,caption\nmissing.jpg,x\n")
    with pytest.raises(DataFileNotFoundError, match=str(photos / "missing.jpg")):
        ImageCaptionsDataset(csv_file)
    (photos / "bad.jsonl").write_text('{"image": "a.jpg", "caption": "x"}\n{"image": "a.jpg"\n')
    with pytest.raises(DataError, match=f"{photos / 'bad.jsonl'}:2: not a JSON object"):
        ImageCaptionsDataset(photos / "bad.jsonl")
    with pytest.raises(DataFileNotFoundError, match="neither .*val.csv nor .*val.jsonl"):
        ImageCaptionsDataset(photos, "val")
    (photos / "a.jpg").write_bytes(b"not an image")
    csv_file.write_text("image,caption\na.jpg,x\n")
    ds = ImageCaptionsDataset(csv_file)
    with pytest.raises(DataError, match=f"{photos / 'a.jpg'} is not a readable image"):
        ds.image(0)


# --- collation, loaders, the model ----------------------------------------------------------


def test_collate_pads_regions_and_masks(coco_root):
    ds = TeranDataset(coco_root, "train")  # image 1 has 3 regions, image 2 has 4
    batch = collate([ds[0], ds[5], ds[6]])
    assert isinstance(batch, PairBatch) and isinstance(batch.images, RegionInputs)
    assert batch.images.regions.shape == (3, 4, F) and batch.images.regions.dtype == torch.float32
    assert batch.images.boxes.shape == (3, 4, 4) and batch.images.mask.dtype == torch.bool
    assert batch.images.mask.tolist() == [[True, True, True, False]] + [[True] * 4] * 2
    assert batch.images.regions[0, 3].abs().sum() == 0 and batch.images.boxes[0, 3].abs().sum() == 0
    torch.testing.assert_close(batch.images.regions[0, :3], torch.from_numpy(features_of(1, 3)))
    torch.testing.assert_close(batch.images.boxes[0, :3], torch.from_numpy(expected_boxes(IMAGE1_BOXES, 640, 480)))
    assert batch.texts == ["caption 100", "caption 200", "caption 201"]
    assert batch.image_ids.tolist() == [0, 1, 1] and batch.indices.tolist() == [0, 5, 6]
    assert batch.image_ids.dtype == torch.long
    loaded = next(iter(ds.loader(4, shuffle=False)))
    assert loaded.indices.tolist() == [0, 1, 2, 3] and loaded.images.regions.shape == (4, 3, F)


def test_collate_rejects_mixed_items():
    a = Pair(RegionImage(np.zeros((2, 4), np.float32), np.zeros((2, 4), np.float32)), "a", 0, 0)
    b = Pair(RegionImage(np.zeros((2, 6), np.float32), np.zeros((2, 4), np.float32)), "b", 1, 1)
    with pytest.raises(DataError, match=r"caption 1 \(image 1\) has 6-wide region features but caption 0 \(image 0\)"):
        collate([a, b])
    with pytest.raises(DataError, match="mixes precomputed regions and raw images"):
        collate([a, Pair(Image.new("RGB", (2, 2)), "c", 2, 2)])


def test_image_loader_reads_each_image_once(coco_root):
    ds = TeranDataset(coco_root, "train", restval=True)
    batches = list(ds.image_batches(2))
    assert [b.image_ids.tolist() for b in batches] == [[0, 1], [2]]
    assert batches[0].images.mask.sum(dim=1).tolist() == [3, 4]
    assert isinstance(batches[0], ImageBatch) and isinstance(batches[0].images, RegionInputs)
    single = collate_images([ds.images[2]])
    torch.testing.assert_close(single.images.regions[0], torch.from_numpy(features_of(12, 4)))
    assert len(ds.images) == 3 and ds.images[-1].image_index == 2


def test_batches_feed_the_model_and_evaluation(coco_root, fixture_bert):
    model = xmatch.build(tiny_spec(fixture_bert))
    ds = TeranDataset(coco_root, "train", restval=True)
    out = model(next(iter(ds.loader(6, shuffle=True, generator=torch.Generator().manual_seed(0)))))
    assert torch.isfinite(out.loss)
    from xmatch.eval import encode_dataset

    encoded = encode_dataset(model, TeranDataset(coco_root, "test"), image_batch_size=1, progress=False)
    assert len(encoded.images) == 2 and len(encoded.captions) == 10


# --- open_dataset and the registry ----------------------------------------------------------


def test_open_dataset_converts_command_line_strings_and_checks_options(coco_root):
    assert open_dataset("TERAN", coco_root, split="train", restval="true").image_names == ["1", "2", "12"]
    assert open_dataset("teran", coco_root, split="train", restval="0", max_images="1").image_names == ["1"]
    assert open_dataset("teran", coco_root, split="test", captions_per_image="none").captions_per_image is None
    with pytest.raises(SpecError, match=r"dataset 'teran' -> restvl: .*Did you mean 'restval'"):
        open_dataset("teran", coco_root, split="train", restvl=True)
    with pytest.raises(SpecError, match=r"dataset 'teran' -> max_images: expected"):
        open_dataset("teran", coco_root, split="train", max_images="many")
    with pytest.raises(SpecError, match=r"dataset 'scan-precomp' -> split: required"):
        open_dataset("scan-precomp", coco_root)
    with pytest.raises(RegistryError, match="Did you mean: 'teran'"):
        open_dataset("teren", coco_root, split="test")


def test_builtin_datasets_are_registered():
    reg = get_registry("datasets")
    assert {n: reg.get(n) for n in ("teran", "scan-precomp", "image-captions")} == {
        "teran": TeranDataset, "scan-precomp": PrecompDataset, "image-captions": ImageCaptionsDataset,
    }
    assert all(reg.origin(n) == "xmatch" for n in ("teran", "scan-precomp", "image-captions"))


def test_a_custom_layout_gets_the_pair_view_and_loaders():
    class Tiny(xmatch.data.ImageTextDataset):
        def __init__(self, owners: list[int]) -> None:
            self.root, self.split = Path("."), None
            self._set_index([f"c{k}" for k in range(len(owners))], np.array(owners), ["a", "b"])

        def image(self, index: int) -> RegionImage:
            return RegionImage(np.full((index + 1, 3), index, np.float32), np.zeros((index + 1, 4), np.float32))

    ds = Tiny([0, 0, 1])
    assert ds.captions_per_image is None and [p.image_index for p in ds] == [0, 0, 1]
    batch = next(iter(ds.loader(3, shuffle=False)))
    assert batch.images.mask.tolist() == [[True, False]] * 2 + [[True, True]]
    with pytest.raises(ValueError, match="ordered image by image"):
        Tiny([1, 0, 1])
    with pytest.raises(ValueError, match="every image needs at least one caption"):
        Tiny([0, 0, 0])
