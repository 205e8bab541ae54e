"""The scenes benchmark's ``small`` object set (every object 16-40 px on a 224-px canvas), and the
standard set left as it was."""

from __future__ import annotations

import argparse
import hashlib
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from xmatch.data import ImageCaptionsDataset, TeranDataset, open_dataset
from xmatch.scenes.captions import describe
from xmatch.scenes.dataset import GROUPS_FOLDER, METADATA_FILE, open_scenes, read_scenes, scenes_folder
from xmatch.scenes.render import INVERSE, OBJECT_SIZES, GAP, Scene, render, sample_group

pytest.importorskip("sklearn")
pytest.importorskip("timm")

FAST = {"size": "tiny", "backbone": "test_efficientnet", "weights": "random", "progress": False}
CANVAS = 224
#: the small set's sides on a 224-px canvas: 0.07 x 224 = 15.7 and 0.18 x 224 = 40.3 px, drawn in
#: squares of whole pixels
SMALLEST, LARGEST = 16, 40

#: sha256 of the standard set as generated before object sets existed (commit 08f47fb, seed 0):
#: the rendered pixels and boxes of the first four groups' scenes, and the tiny preset's
#: metadata and Karpathy file (every object's kind, colour, size, centre, side and box)
STANDARD_RENDERS_SHA256 = {
    "0-base": "2b7b5851ddeca2487317f9fe02d841c40fc76185f2312b9d359038edda87979e",
    "0-relation": "e0c4d0e820c3998a86ab5a1b200f03813c6c17b4fcc00fb54aec5533f8779125",
    "1-base": "5faac6d5f3cbedf214df3274a44e8b4455114f550690482d0d34dde9ee327b96",
    "1-colour": "f19289846cc449024d668757f8d57b5ed7911376a907ed23400ddc93385dec59",
    "2-base": "03b331813bc98af8fce588ee38f9f3da0e5014f72af9cb1c315bf1bc64db9063",
    "2-colour": "5c380e7ec061519121e28cae72265a31fafabaa9154662437a8d8d89082135cf",
    "3-base": "4413a25b60cae73dbcc53673c29e68f6aa5ae12b6423ad28efae6ab503750248",
    "3-size": "1f5c8979f9516a25ec6eafbabbef16cadc39cb314af3dfe21c88417ded985e0f",
}
STANDARD_TINY_SHA256 = {
    "scenes.json": "91e5bcd36b6186ba4b3fa4c1d92f374218e0bd2af498078f9a0c3f576f5999cf",
    "dataset_scenes.json": "3b92aa4571757500338eef4d58b1e7bc9f36ff96a8b6c75aa8cad03fb5328015",
}


def _rng(seed: int, index: int, stream: int) -> np.random.Generator:
    """The scenes generator's stream for (seed, group, purpose): the same seeding rule."""
    return np.random.default_rng([seed, index, stream])


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """The tiny preset of both object sets, scenes and features, in one cache folder."""
    root = tmp_path_factory.mktemp("scenes-small-objects")
    open_scenes(root, "train", objects="small", **FAST)
    open_scenes(root, "train", layout="images", **FAST)
    return root


def squares(scene: Scene) -> np.ndarray:
    """``[n, 4]`` the squares the objects are drawn in: what placement keeps apart."""
    return np.array([(x - s / 2, y - s / 2, x + s / 2, y + s / 2) 
                     for (x, y), s in ((o.centre, o.side) for o in scene.objects)])


def assert_well_placed(scene: Scene, canvas: int) -> None:
    """The related pair unambiguous (wholly on the stated side with room to spare, more along
    the relation's axis than across it), every object inside the canvas and clear of the others."""
    box = squares(scene)
    assert (box >= -0.5).all() and (box <= canvas + 0.5).all()
    gap = GAP * canvas
    for i in range(len(box)):
        for j in range(i + 1, len(box)):
            apart = max(box[j, 0] - box[i, 2], box[i, 0] - box[j, 2], box[j, 1] - box[i, 3], box[i, 1] - box[j, 3])
            assert apart >= gap - 1e-6, f"objects {i} and {j} are {apart:.1f} px apart"
    (ax1, ay1, ax2, ay2), (bx1, by1, bx2, by2) = box[:2]
    (ax, ay), (bx, by) = scene.objects[0].centre, scene.objects[1].centre
    dx, dy = bx - ax, by - ay
    assert {
        "left": ax2 + gap <= bx1 and abs(dx) > abs(dy),
        "right": bx2 + gap <= ax1 and abs(dx) > abs(dy),
        "above": ay2 + gap <= by1 and abs(dy) > abs(dx),
        "below": by2 + gap <= ay1 and abs(dy) > abs(dx),
    }[scene.relation], scene


def assert_twins(base: Scene, twin: Scene) -> None:
    """Same objects and the same bag of words, another meaning."""
    assert base.objects[2:] == twin.objects[2:] and base.background == twin.background
    assert describe(base) != describe(twin) and sorted(describe(base).split()) == sorted(describe(twin).split())
    (a, b), (ta, tb) = base.objects[:2], twin.objects[:2]
    if twin.variant == "relation":
        assert (ta.centre, tb.centre) == (b.centre, a.centre) and twin.relation == INVERSE[base.relation]
    elif twin.variant == "colour":
        assert (ta.colour, tb.colour) == (b.colour, a.colour) and (ta.side, tb.side) == (a.side, b.side)
    else:
        assert twin.variant == "size" and a.size != b.size
        assert (ta.size, ta.side, tb.size, tb.side) == (b.size, b.side, a.size, a.side)


def test_the_standard_set_is_unchanged(cache):
    for g in range(4):
        for scene in sample_group(_rng(0, g, 0), CANVAS):
            image, boxes = render(scene, CANVAS)
            digest = hashlib.sha256(image.tobytes() + boxes.tobytes()).hexdigest()
            assert digest == STANDARD_RENDERS_SHA256[f"{g}-{scene.variant}"], (g, scene.variant)
        assert sample_group(_rng(0, g, 0), CANVAS) == sample_group(_rng(0, g, 0), CANVAS, objects="standard")
    folder = scenes_folder(cache, "tiny", 0, CANVAS)
    assert folder.name == "scenes-tiny-224px-seed0-v1"
    assert folder == scenes_folder(cache, "tiny", 0, CANVAS, "standard")
    assert {name: hashlib.sha256((folder / name).read_bytes()).hexdigest() for name in STANDARD_TINY_SHA256} == (
        STANDARD_TINY_SHA256)
    assert "objects" not in json.loads((folder / METADATA_FILE).read_text())["params"]


def test_small_objects_are_16_to_40_px_and_their_boxes_hold_them(cache):
    folder = scenes_folder(cache, "tiny", 0, CANVAS, "small")
    assert folder.name == "scenes-tiny-224px-seed0-objects-small-v1"
    assert json.loads((folder / METADATA_FILE).read_text())["params"]["objects"] == "small"
    records = read_scenes(folder)
    for record in records:
        for obj in record["objects"]:
            x1, y1, x2, y2 = obj["box"]
            (x, y), side = obj["centre"], obj["side"]
            assert SMALLEST <= round(side) <= LARGEST and 0 < x2 - x1 <= LARGEST and 0 < y2 - y1 <= LARGEST
            # the tight box of the drawn pixels lies in the object's square
            half = round(side) / 2 + 1
            assert x - half <= x1 and x2 <= x + half and y - half <= y1 and y2 <= y + half
    # the same random streams: each base scene's related pair is the standard set's, drawn smaller
    # (where objects fit, and what is drawn after it, may differ: slots are tried until they fit)
    standard = read_scenes(scenes_folder(cache, "tiny", 0, CANVAS))
    pair = [[(o["kind"], o["colour"], o["size"]) for o in r["objects"][:2]] for r in records[::2]]
    assert pair == [[(o["kind"], o["colour"], o["size"]) for o in r["objects"][:2]] for r in standard[::2]]
    # over many draws the sides span the range, "small" and "large" apart; they scale with the canvas
    sides: dict[str, list[float]] = {"small": [], "large": []}
    for g in range(200):
        for obj in sample_group(_rng(0, g, 0), CANVAS, objects="small")[0].objects:
            sides[obj.size].append(obj.side)
    assert SMALLEST <= round(min(sides["small"])) <= 17 and round(max(sides["small"])) <= 25
    assert 31 <= round(min(sides["large"])) and 39 <= round(max(sides["large"])) <= LARGEST
    wide = [o.side for g in range(50) for o in sample_group(_rng(0, g, 0), 448, objects="small")[0].objects]
    assert 0.07 * 448 <= min(wide) and max(wide) <= 0.18 * 448


@pytest.mark.parametrize("canvas", [CANVAS, 128])
def test_small_objects_relations_are_unambiguous_and_twins_valid(canvas):
    seen = Counter()
    for g in range(300):
        base, twin = sample_group(_rng(0, g, 0), canvas, objects="small")
        seen[twin.variant] += 1
        for scene in (base, twin):
            assert_well_placed(scene, canvas)
        assert_twins(base, twin)
    assert set(seen) == {"relation", "colour", "size"}
    for variant in ("relation", "colour", "size"):  # as the groups split draws them
        for g in range(20):
            base, twin = sample_group(_rng(0, g, 3), canvas, variant, objects="small")
            assert twin.variant == variant
            assert_well_placed(base, canvas)
            assert_well_placed(twin, canvas)
            assert_twins(base, twin)


def test_both_layouts_and_the_groups_split_open_with_small_objects(cache):
    regions = open_scenes(cache, "test", objects="small", **FAST)
    images = open_scenes(cache, "test", objects="small", layout="images", **FAST)
    folder = scenes_folder(cache, "tiny", 0, CANVAS, "small")
    assert isinstance(regions, TeranDataset) and isinstance(images, ImageCaptionsDataset)
    assert regions.root == folder and images.root == folder and regions.captions == images.captions
    assert regions.image(0).regions.shape == (36, 256) and images.image(0).size == (CANVAS, CANVAS)
    assert regions.hard_negative_groups().kinds  # the twins, declared for the evaluation
    groups = open_scenes(cache, "groups", objects="small", **FAST)
    assert groups.root == folder / GROUPS_FOLDER and groups.num_images == 12
    records = read_scenes(groups.root)
    assert all(SMALLEST <= round(o["side"]) <= LARGEST for r in records for o in r["objects"])
    assert Counter(r["variant"] for r in records) == {"base": 6, "relation": 2, "colour": 2, "size": 2}


def test_the_option_reaches_the_scenes_from_open_dataset_and_the_command_line(cache):
    from xmatch.cli.options import open_data

    by_name = open_dataset("scenes", cache, split="val", objects="small", **FAST)
    assert by_name.root == scenes_folder(cache, "tiny", 0, CANVAS, "small")
    # --data-option KEY=VALUE strings, as train / eval / index pass them
    args = argparse.Namespace(dataset="scenes", data=str(cache))
    options = ["objects=small", "size=tiny", "backbone=test_efficientnet", "weights=random", "progress=false"]
    from_cli = open_data(args, "val", options)
    assert from_cli.root == by_name.root and from_cli.captions == by_name.captions


@pytest.mark.parametrize("objects", ["tiny", "Small", ""])
def test_an_unknown_object_set_is_refused_before_anything_is_written(tmp_path, objects):
    with pytest.raises(ValueError, match=rf"unknown scenes object set '{objects}'; object sets: standard, small\."):
        open_scenes(tmp_path, "train", objects=objects, **FAST)
    assert not any(tmp_path.iterdir())
    assert list(OBJECT_SIZES) == ["standard", "small"]
    with pytest.raises(ValueError, match="object sets: standard, small"):
        sample_group(np.random.default_rng(0), CANVAS, objects=objects)
