"""The built-in ``scenes`` benchmark: procedural, seeded, compositional image-caption data.

Scenes of handwritten digits (scikit-learn's bundled digits) and drawn shapes with colours,
sizes and spatial relations, five captions each, in hard-negative pairs (see
:mod:`xmatch.scenes.render`); region features from a real ImageNet CNN pooled over
detector-like boxes (:mod:`xmatch.scenes.features`). The set is generated once per
parameter set into a cache folder, in the standard layouts xmatch reads, and then opened
through the ordinary readers, so it behaves like any other dataset:

- ``layout="regions"``: the TERAN bottom-up layout (``bu_att/<id>.npz``, ``bu_box/<id>.npy``,
  a Karpathy split file and a sizes file), read by :class:`~xmatch.data.TeranDataset`;
- ``layout="images"``: PNG files with ``<split>.csv`` captions, read by
  :class:`~xmatch.data.ImageCaptionsDataset` (for raw-image encoders such as ``timm-grid``).
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from xmatch.data.generated import build_once, check_may_generate, stream_rng, world_cache, write_json
from xmatch.data.image_captions import ImageCaptionsDataset
from xmatch.scenes.captions import captions as draw_captions
from xmatch.scenes.captions import describe
from xmatch.scenes.render import VARIANTS, Scene, SceneObject, object_sizes, render, sample_group
from xmatch.data.teran import TeranDataset

#: images per split (train, val, test); each an even number (scenes come in twin pairs)
PRESETS: dict[str, tuple[int, int, int]] = {
    "tiny": (8, 2, 2),
    "small": (800, 100, 100),
    "large": (20000, 1000, 1000),
}
SPLITS = ("train", "val", "test")
#: the evaluation split of twin pairs only, balanced over the kinds of difference (docs/scenes.md)
GROUPS_SPLIT = "groups"
#: the twins' kinds of difference, cycled group by group in the groups split
GROUP_KINDS = VARIANTS[1:]
#: groups of each kind in the groups split (the same first groups in every preset)
GROUPS_PER_KIND: dict[str, int] = {"tiny": 2, "small": 320, "large": 320}
#: the groups split's subfolder of a scene set: a scene set of its own, generated on first use
GROUPS_FOLDER = "groups"
#: random streams of the groups split (scenes, captions, proposal boxes), apart from the
#: train / val / test streams 0, 1, 2, so that no preset's other splits hold its scenes
GROUPS_STREAMS = (3, 4, 5)
LAYOUTS = ("regions", "images")
#: the object set of the benchmark as shipped: its folders carry no object-set name
STANDARD_OBJECTS = "standard"
CAPTIONS_PER_IMAGE = 5
#: bump when the scenes, captions or files change, so old caches are not reused
GENERATOR_VERSION = 1
METADATA_FILE = "scenes.json"
KARPATHY_FILE = "dataset_scenes.json"
SIZES_FILE = "sizes.json"
FEATURES_FILE = "features.json"
DEFAULT_WEIGHTS = "package:efficientnet-lite0"

PathArg = str | os.PathLike


def open_scenes(
    root: PathArg | None = None,
    split: str = "train",
    *,
    size: str = "small",
    seed: int = 0,
    layout: str = "regions",
    objects: str = STANDARD_OBJECTS,
    regions: int = 36,
    canvas: int = 224,
    backbone: str = "efficientnet_lite0",
    weights: str = DEFAULT_WEIGHTS,
    batch_size: int = 32,
    progress: bool = True,
    generate: bool | None = None,
) -> TeranDataset | ImageCaptionsDataset:
    """Open the ``scenes`` benchmark, generating it into the cache on first use.

    Args:
        root: the cache folder (default ``<XMATCH_HOME>/datasets/scenes``, see
            :func:`xmatch.io.hub.cache_dir`); each parameter set gets its own subfolder.
        split: ``"train"``, ``"val"``, ``"test"``, or ``"groups"``: an evaluation split of twin
            pairs only, :data:`GROUPS_PER_KIND` of each kind (relation, colour, size: 320 each in
            ``small`` and ``large``), generated on first use into the set's ``groups``
            subfolder (train / val / test stay as they are).
        size: a preset of :data:`PRESETS`: ``tiny`` (12 images), ``small`` (1,000, the
            default: about a minute on 2 CPU cores), ``large`` (22,000).
        seed: the same seed gives identical images, captions and features.
        layout: ``"regions"`` (TERAN bottom-up features, :class:`TeranDataset`) or
            ``"images"`` (PNG files, :class:`ImageCaptionsDataset`).
        objects: how big objects are drawn (:data:`xmatch.scenes.render.OBJECT_SIZES`):
            ``"standard"`` (the benchmark as shipped: 34-85 px on the 224-px canvas) or
            ``"small"`` (every object, related pair and distractors, 16-40 px; the sides scale
            with ``canvas``): drawn by the same rules otherwise (relations, captions, twins,
            the groups split, features), from the same random streams, into a folder of its
            own (``scenes-small-224px-seed0-objects-small-v1``).
        regions: boxes per image (the drawn objects first, then proposals), like a
            detector's top-36.
        canvas: image side in pixels; also the backbone's input side.
        backbone: timm model whose last feature map is pooled (EfficientNet-Lite0: 1280
            channels, stride 32).
        weights: backbone weights (see :class:`xmatch.components.image.backbone.TimmBackbone`);
            the default is the offline ImageNet EfficientNet-Lite0; ``"random"`` = random init
            seeded by ``seed`` (only for tests: such features carry no meaning).
        batch_size: images per backbone forward during generation.
        progress: show tqdm progress bars while generating.
        generate: generate the set when it is missing. The default (None) generates into the
            cache, and into a given ``root`` that is empty or already holds scene sets; any
            other given folder (a mistyped path, another dataset's folder) is refused rather
            than filled with a new benchmark. True generates wherever ``root`` points; False
            never generates.

    Returns:
        A :class:`TeranDataset` (``layout="regions"``) or :class:`ImageCaptionsDataset`
        (``layout="images"``) over the generated files; ``read_scenes(ds.root)`` gives each
        image's objects, boxes, relation and twin.

    Raises:
        ValueError: an unknown split, size, layout or object set, or an out-of-range number.
        FileNotFoundError: the set is missing and ``generate`` does not allow making it there.

    Example:
        >>> ds = open_scenes("~/.cache/xmatch/datasets/scenes", "train")  # generates the scenes benchmark (minutes)  # doctest: +SKIP
        >>> ds.num_images, ds.captions[1], ds.image(0).regions.shape  # doctest: +SKIP
        (800, 'a little green circle to the left of a small blue triangle', (36, 1280))
        >>> open_scenes(split="test", objects="small").root.name  # the 16-40 px variant (minutes)  # doctest: +SKIP
        'scenes-small-224px-seed0-objects-small-v1'
    """
    _check_options(split, size, seed, layout, objects, regions, canvas, batch_size)
    base = Path(root).expanduser() if root is not None else world_cache("scenes")
    folder = scenes_folder(base, size, seed, canvas, objects)
    if not folder.is_dir():
        check_may_generate("scenes", base, folder, generate, explicit=root is not None, what="scene sets",
                           hint=", where `xmatch demo` generates it")
    build_once(folder, lambda tmp: write_scenes(tmp, size, seed, canvas, progress, objects))
    box_stream = 2
    if split == GROUPS_SPLIT:
        folder = folder / GROUPS_FOLDER
        build_once(folder, lambda tmp: write_groups(tmp, size, seed, canvas, progress, objects))
        box_stream = GROUPS_STREAMS[2]
    if layout == "images":
        return _declare_for_evaluation(ImageCaptionsDataset(folder, split))
    features = folder / features_folder_name(regions, backbone, weights)
    build_once(features, lambda tmp: write_features(
        folder, tmp, regions, backbone, weights, seed, batch_size, progress, box_stream=box_stream
    ))
    # the teran layout's Karpathy file knows train / val / test: the groups set is stored as the
    # test split of its own folder, and named for what it is once read
    dataset = TeranDataset(
        folder, "test" if split == GROUPS_SPLIT else split, captions=folder / KARPATHY_FILE,
        sizes=folder / SIZES_FILE, features=features,
    )
    dataset.split = split
    return _declare_for_evaluation(dataset)


def _declare_for_evaluation(dataset: TeranDataset | ImageCaptionsDataset) -> TeranDataset | ImageCaptionsDataset:
    """Declare what the evaluation's extra protocols read (docs/evaluation.md): the twins as
    hard-negative groups (``--protocol groups``) and the grammar's word classes (``probes``);
    the groups split also declares no Recall@K protocol of its own (``recall_protocol``:
    ``--protocol groups`` then scores only the pairs within each group, not the whole
    images x captions matrix; name one, e.g. ``full,groups``, to rank the whole split too)."""
    from functools import partial

    from xmatch.scenes.tagger import scenes_tagger

    dataset.hard_negative_groups = partial(scene_groups, dataset)
    dataset.word_classes = scenes_tagger
    if dataset.split == GROUPS_SPLIT:
        dataset.recall_protocol = "none"
    return dataset


def _check_options(
    split: str, size: str, seed: int, layout: str, objects: str, regions: int, canvas: int, batch_size: int
) -> None:
    if split not in (*SPLITS, GROUPS_SPLIT):
        raise ValueError(f"unknown split {split!r} for scenes; splits: {', '.join((*SPLITS, GROUPS_SPLIT))}.")
    if size not in PRESETS:
        presets = ", ".join(f"{k} ({sum(v)} images)" for k, v in PRESETS.items())
        raise ValueError(f"unknown scenes size {size!r}; presets: {presets}.")
    if layout not in LAYOUTS:
        raise ValueError(f"unknown scenes layout {layout!r}; layouts: {', '.join(LAYOUTS)}.")
    object_sizes(objects)
    if seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed}.")
    if regions < 4:
        raise ValueError(f"regions must be at least 4 (a scene has up to 4 objects), got {regions}.")
    if canvas < 128:
        raise ValueError(f"canvas must be at least 128 pixels (objects need room), got {canvas}.")
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}.")


def scenes_folder(root: Path, size: str, seed: int, canvas: int, objects: str = STANDARD_OBJECTS) -> Path:
    """The cache subfolder of one scene set (images, captions, metadata); an object set other
    than the standard one adds its name, so the standard sets keep the names they were cached
    under.

    Example:
        >>> scenes_folder(Path("cache"), "small", 0, 224).name
        'scenes-small-224px-seed0-v1'
        >>> scenes_folder(Path("cache"), "small", 0, 224, objects="small").name
        'scenes-small-224px-seed0-objects-small-v1'
    """
    object_set = "" if objects == STANDARD_OBJECTS else f"-objects-{objects}"
    return root / f"scenes-{size}-{canvas}px-seed{seed}{object_set}-v{GENERATOR_VERSION}"


def features_folder_name(regions: int, backbone: str, weights: str) -> str:
    """``features_<regions>_<backbone>_<digest>``: one folder per extractor set-up inside a
    scene set's folder (which already fixes the seed); ``weights`` enters as written (a file's
    path, not its content)."""
    key = json.dumps([GENERATOR_VERSION, regions, backbone, weights])
    digest = hashlib.sha256(key.encode()).hexdigest()[:10]
    return f"features_{regions}_{re.sub(r'[^A-Za-z0-9]+', '-', backbone)}_{digest}"


def write_scenes(
    folder: Path, size: str, seed: int, canvas: int, progress: bool = True, objects: str = STANDARD_OBJECTS
) -> None:
    """Render a scene set into ``folder``: ``images/<id>.png``, the Karpathy split file, the
    sizes file, ``<split>.csv`` captions and ``scenes.json`` (every object, box and twin)."""
    counts = PRESETS[size]
    split_of = [s for s, n in zip(SPLITS, counts) for _ in range(n)]
    pairs = (
        (sample_group(stream_rng(seed, g, 0), canvas, objects=objects), stream_rng(seed, g, 1))
        for g in range(len(split_of) // 2)
    )
    params = {"size": size, "seed": seed, "canvas": canvas, "version": GENERATOR_VERSION, **_objects_param(objects)}
    desc = f"scenes: rendering {size}{_objects_note(objects)} (seed {seed})"
    _write_set(folder, pairs, split_of, SPLITS, params, desc, progress)


def _objects_param(objects: str) -> dict[str, str]:
    """``scenes.json``'s record of the object set: none for the standard set, whose metadata
    stays byte for byte what it was before object sets existed."""
    return {} if objects == STANDARD_OBJECTS else {"objects": objects}


def _objects_note(objects: str) -> str:
    return "" if objects == STANDARD_OBJECTS else f", {objects} objects"


def write_groups(
    folder: Path, size: str, seed: int, canvas: int, progress: bool = True, objects: str = STANDARD_OBJECTS
) -> None:
    """Render the groups split of a scene set into ``folder`` (the set's ``groups`` subfolder),
    laid out like a scene set: :data:`GROUPS_PER_KIND` twin pairs of each kind, the kinds in
    turn (relation, colour, size, relation, ...), drawn from their own random streams
    (:data:`GROUPS_STREAMS`). The Karpathy file lists them as its ``test`` split (the teran
    layout's names), ``groups.csv`` and ``scenes.json`` as ``groups``."""
    n_groups = GROUPS_PER_KIND[size] * len(GROUP_KINDS)
    scene, caption, _ = GROUPS_STREAMS
    pairs = (
        (sample_group(stream_rng(seed, g, scene), canvas, GROUP_KINDS[g % len(GROUP_KINDS)], objects),
         stream_rng(seed, g, caption))
        for g in range(n_groups)
    )
    params = {"size": size, "seed": seed, "canvas": canvas, "version": GENERATOR_VERSION, "split": GROUPS_SPLIT,
              "groups_per_kind": GROUPS_PER_KIND[size], **_objects_param(objects)}
    _write_set(folder, pairs, [GROUPS_SPLIT] * (2 * n_groups), (GROUPS_SPLIT,), params,
               f"scenes: rendering the {size} groups split{_objects_note(objects)} (seed {seed})", progress,
               {GROUPS_SPLIT: "test"})


def _write_set(
    folder: Path,
    pairs: Iterable[tuple[tuple[Scene, Scene], np.random.Generator]],
    split_of: Sequence[str],
    splits: Sequence[str],
    params: dict[str, Any],
    desc: str,
    progress: bool,
    karpathy_split: Mapping[str, str] | None = None,
) -> None:
    """Render twin pairs (with each pair's caption stream) into ``folder``, image ``k`` into
    ``split_of[k]``: the images, the Karpathy split file (split names mapped by
    ``karpathy_split``), the sizes file, a ``<split>.csv`` per split and ``scenes.json``."""
    from PIL import Image
    from xmatch.core.progress import progress_bar

    karpathy_split = karpathy_split or {}
    canvas = int(params["canvas"])
    (folder / "images").mkdir()
    records: list[dict[str, Any]] = []
    entries: list[dict[str, Any]] = []
    rows: dict[str, list[tuple[str, str]]] = {s: [] for s in splits}
    bar = progress_bar(total=len(split_of), desc=desc, unit="img", show=progress)
    for group, (pair, caption_rng) in enumerate(pairs):
        for scene in pair:
            image_id = len(records)
            image, boxes = render(scene, canvas)
            filename = f"{image_id}.png"
            Image.fromarray(image).save(folder / "images" / filename)
            texts = draw_captions(scene, caption_rng, CAPTIONS_PER_IMAGE)
            split = split_of[image_id]
            records.append(_scene_record(scene, boxes, image_id, group, split))
            entries.append({
                "split": karpathy_split.get(split, split), "imgid": image_id, "filepath": "images",
                "filename": filename,
                "sentids": [image_id * CAPTIONS_PER_IMAGE + k for k in range(len(texts))],
                "sentences": [
                    {"raw": t, "tokens": t.replace(",", " ,").replace(";", " ;").split(), "imgid": image_id,
                     "sentid": image_id * CAPTIONS_PER_IMAGE + k}
                    for k, t in enumerate(texts)
                ],
            })
            rows[split] += [(f"images/{filename}", t) for t in texts]
            bar.update()
    bar.close()
    write_json(folder / KARPATHY_FILE, {"dataset": "scenes", "images": entries})
    write_json(folder / SIZES_FILE, {str(r["id"]): [canvas, canvas] for r in records})
    for split, split_rows in rows.items():
        with (folder / f"{split}.csv").open("w", encoding="utf-8", newline="") as f:
            writer = csv.writer(f, lineterminator="\n")
            writer.writerow(["image", "caption"])
            writer.writerows(split_rows)
    write_json(folder / METADATA_FILE, {"params": params, "scenes": records})


def _scene_record(scene: Scene, boxes: np.ndarray, image_id: int, group: int, split: str) -> dict[str, Any]:
    return {
        "id": image_id,
        "split": split,
        "group": group,
        "variant": scene.variant,
        "relation": scene.relation,
        "description": describe(scene),
        "background": list(scene.background),
        "objects": [
            {"kind": o.kind, "colour": o.colour, "size": o.size, "centre": list(o.centre), "side": o.side,
             "glyph": o.glyph, "box": [float(v) for v in box]}
            for o, box in zip(scene.objects, boxes)
        ],
    }


def write_features(
    scenes: Path,
    folder: Path,
    regions: int,
    backbone: str,
    weights: str,
    seed: int,
    batch_size: int,
    progress: bool = True,
    *,
    box_stream: int = 2,
) -> None:
    """Pool the backbone's feature map over each image's proposal boxes into ``folder``:
    ``bu_att/<id>.npz`` (``feat [regions, C]`` float16, as compact as the original's stored
    features are float32) and ``bu_box/<id>.npy`` (``[regions, 4]`` float32 pixel boxes);
    the proposals are drawn from the random stream ``box_stream`` of each image."""
    from PIL import Image
    from xmatch.core.progress import progress_bar

    from xmatch.scenes.features import RegionFeatureExtractor, proposal_boxes

    meta = json.loads((scenes / METADATA_FILE).read_text(encoding="utf-8"))
    canvas = int(meta["params"]["canvas"])
    records = meta["scenes"]
    extractor = RegionFeatureExtractor(backbone, weights, canvas, seed)
    (folder / "bu_att").mkdir()
    (folder / "bu_box").mkdir()
    bar = progress_bar(total=len(records), desc=f"scenes: {backbone} region features", unit="img", show=progress)
    for start in range(0, len(records), batch_size):
        batch = records[start : start + batch_size]
        images = [np.asarray(Image.open(scenes / "images" / f"{r['id']}.png").convert("RGB")) for r in batch]
        boxes = np.stack([
            proposal_boxes(
                np.array([o["box"] for o in r["objects"]], dtype=np.float64), canvas, regions,
                stream_rng(seed, r["id"], box_stream),
            )
            for r in batch
        ])
        feats = extractor(images, boxes)
        for r, f, b in zip(batch, feats, boxes):
            np.savez_compressed(folder / "bu_att" / f"{r['id']}.npz", feat=f.astype(np.float16))
            np.save(folder / "bu_box" / f"{r['id']}.npy", b)
        bar.update(len(batch))
    bar.close()
    write_json(folder / FEATURES_FILE, {
        "regions": regions, "backbone": backbone, "weights": weights, "seed": seed,
        "feature_dim": extractor.feature_dim, "dtype": "float16", "version": GENERATOR_VERSION,
        "boxes": "the drawn objects' boxes first (as in scenes.json), then jittered copies, the whole image, "
                 "random background boxes",
    })


def read_scenes(folder: PathArg) -> list[dict[str, Any]]:
    """The per-image records of a generated scene set (``ds.root`` of an opened one): ``id``,
    ``split``, ``group`` (twins share it), ``variant``, ``relation``, ``description`` and
    ``objects`` (``kind``, ``colour``, ``size``, pixel ``box``, ...), in image-id order.

    Example:
        >>> ds = open_scenes(split="test")  # generates the scenes benchmark (minutes)  # doctest: +SKIP
        >>> [r["description"] for r in read_scenes(ds.root) if r["group"] == 450]  # doctest: +SKIP
        ['a small blue 6 above a large purple 1', 'a large blue 6 above a small purple 1']
    """
    path = Path(folder) / METADATA_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; is {folder} a folder made by open_scenes?")
    return json.loads(path.read_text(encoding="utf-8"))["scenes"]


def scene_from_record(record: dict[str, Any]) -> Scene:
    """Rebuild the :class:`Scene` of a ``read_scenes`` record (e.g. to render it again)."""
    objects = tuple(
        SceneObject(o["kind"], o["colour"], o["size"], tuple(o["centre"]), o["side"], o["glyph"])
        for o in record["objects"]
    )
    return Scene(objects, record["relation"], record["variant"], tuple(record["background"]))


def twins(dataset: Any) -> dict[int, int]:
    """Image index -> the index of its twin, for the scenes of a split opened with either
    layout whose twin is in the same split.

    Example:
        >>> twins(open_scenes(split="test"))[0]  # generates the scenes benchmark (minutes)  # doctest: +SKIP
        1
    """
    row = {int(Path(name).stem): i for i, name in enumerate(dataset.image_names)}
    members: dict[int, list[int]] = {}
    for record in read_scenes(dataset.root):
        if record["id"] in row:
            members.setdefault(record["group"], []).append(row[record["id"]])
    return {i: j for pair in members.values() if len(pair) == 2 for i, j in (pair, pair[::-1])}


def scene_groups(dataset: Any) -> Any:
    """The twins of a scenes split as hard-negative groups (:class:`xmatch.eval.groups.GroupSet`),
    each of kind ``relation``, ``colour`` or ``size``: what the second scene changed.

    ``open_scenes`` declares them on every split it opens (``dataset.hard_negative_groups()``),
    so ``xmatch eval ... --dataset scenes --protocol groups`` finds them.

    Example:
        >>> scene_groups(open_scenes(split="test")).kinds[:2]  # generates the scenes benchmark (minutes)  # doctest: +SKIP
        ['size', 'colour']
    """
    from xmatch.eval.groups import Group, GroupSet

    row = {int(Path(name).stem): i for i, name in enumerate(dataset.image_names)}
    members: dict[int, list[tuple[int, str]]] = {}
    for record in read_scenes(dataset.root):
        if record["id"] in row:
            members.setdefault(record["group"], []).append((row[record["id"]], record["variant"]))
    groups = [
        Group(tuple(i for i, _ in pair), next(v for _, v in pair if v != "base"))
        for pair in members.values() if len(pair) == 2
    ]
    if not groups:
        raise ValueError("no scene of this split has its twin in the split; twin accuracy needs whole pairs.")
    return GroupSet(groups, dataset.caption_image)


def twin_accuracy(scores: np.ndarray | Any, dataset: Any) -> tuple[float, int]:
    """How often a caption scores its own scene above that scene's twin (chance: 0.5).

    Twins share their objects and words but differ in a relation, a colour or a size
    (:func:`~xmatch.scenes.render.sample_group`), so a model that matches bags of words
    or pools global features sits near 0.5; fine-grained alignment is needed to go above it.
    Ties count as wrong. This is the ``t2i`` figure of the twins' groups
    (:func:`scene_groups`, :func:`xmatch.eval.groups.score_groups`), as a fraction.

    Args:
        scores: ``[images, captions]`` similarities over the whole split, in the dataset's
            order (``model.similarity(img, txt)`` or :func:`xmatch.eval.score_blocks`).
        dataset: a scenes split opened with either layout.

    Returns:
        (accuracy in [0, 1], number of captions whose scene has its twin in the split).

    Example:
        >>> test = open_scenes(split="test")  # generates the scenes benchmark (minutes)  # doctest: +SKIP
        >>> twin_accuracy(model.similarity(img, txt), test)  # doctest: +SKIP
        (0.71, 500)
    """
    from xmatch.eval.groups import score_groups

    scores = np.asarray(scores.detach().cpu() if hasattr(scores, "detach") else scores, dtype=np.float64)
    if scores.shape != (dataset.num_images, len(dataset.captions)):
        raise ValueError(
            f"scores must be [images, captions] = [{dataset.num_images}, {len(dataset.captions)}] over the "
            f"whole split, got {list(scores.shape)}."
        )
    overall = score_groups(scores, scene_groups(dataset), resamples=0).overall
    return overall["t2i"] / 100.0, overall["queries"]
