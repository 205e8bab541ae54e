"""The built-in ``tabletop`` world: a second procedural image-caption dataset, unlike ``scenes``.

Household objects (cups, bowls, bottles, books, keys, ...) in eight colours and three patterns,
with relations (on top of, inside, in front of, to the left of, next to, near, far from,
between) and counts (:mod:`xmatch.tabletop.world`), five captions each from a grammar of its
own (:mod:`xmatch.tabletop.captions`), in hard-negative twin pairs. It plays a *new user's*
dataset: it declares no word classes and no ``hard_negative_groups()``; its twins come as a
groups file beside each split (``groups_<split>.json``, the format ``xmatch eval --groups``
reads, :meth:`xmatch.eval.groups.GroupSet.from_json`).

It is made by the machinery of the scenes benchmark (:mod:`xmatch.scenes`): generated once per
parameter set into a fingerprinted cache folder, in the TERAN regions layout (region features of
:class:`xmatch.scenes.features.RegionFeatureExtractor` over
:func:`xmatch.scenes.features.proposal_boxes`) or the images layout.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from xmatch.data.generated import SPLITS, build_once, check_may_generate, read_records, stream_rng, world_cache, write_json, write_twin_pairs
from xmatch.data.image_captions import ImageCaptionsDataset
from xmatch.data.teran import TeranDataset
from xmatch.scenes.dataset import features_folder_name
from xmatch.tabletop.captions import captions as draw_captions
from xmatch.tabletop.captions import describe
from xmatch.tabletop.world import Table, Thing, render, sample_group

#: images per split (train, val, test); each even (tables come in twin pairs)
PRESETS: dict[str, tuple[int, int, int]] = {
    "tiny": (8, 2, 2),
    "small": (800, 100, 100),
    "medium": (8000, 1000, 1000),
}
LAYOUTS = ("regions", "images")
CAPTIONS_PER_IMAGE = 5
#: bump when the tables, captions or files change, so old caches are not reused
GENERATOR_VERSION = 1
METADATA_FILE = "tabletop.json"
KARPATHY_FILE = "dataset_tabletop.json"
SIZES_FILE = "sizes.json"
FEATURES_FILE = "features.json"
DEFAULT_WEIGHTS = "package:efficientnet-lite0"
#: random streams of a group: tables, captions; of an image: proposal boxes
TABLE_STREAM, CAPTION_STREAM, BOX_STREAM = 0, 1, 2
MAX_THINGS = 6

PathArg = str | os.PathLike


def open_tabletop(
    root: PathArg | None = None,
    split: str = "train",
    *,
    size: str = "small",
    seed: int = 0,
    layout: str = "regions",
    regions: int = 36,
    canvas: int = 224,
    backbone: str = "efficientnet_lite0",
    weights: str = DEFAULT_WEIGHTS,
    batch_size: int = 32,
    progress: bool = True,
    generate: bool | None = None,
) -> TeranDataset | ImageCaptionsDataset:
    """Open the ``tabletop`` world, generating it into the cache on first use.

    Args:
        root: the cache folder (default ``<XMATCH_HOME>/datasets/tabletop``); each parameter set
            gets its own subfolder (:func:`tabletop_folder`).
        split: ``"train"``, ``"val"`` or ``"test"``; its twins are listed in
            ``groups_<split>.json`` in the dataset's folder (:func:`groups_file`).
        size: a preset of :data:`PRESETS`: ``tiny`` (12 images, for tests), ``small`` (1,000
            images, 5,000 captions), ``medium`` (10,000 images).
        seed: the same seed gives identical images, captions and features.
        layout: ``"regions"`` (TERAN bottom-up features, :class:`TeranDataset`) or ``"images"``
            (PNG files, :class:`ImageCaptionsDataset`).
        regions: boxes per image (the objects first, then proposals), at least 8.
        canvas: image side in pixels (at least 160); also the backbone's input side.
        backbone: timm model whose last feature map is pooled.
        weights: backbone weights, as for the scenes; ``"random"`` = seeded random init (tests only).
        batch_size: images per backbone forward during generation.
        progress: show progress bars while generating.
        generate: generate the set when it is missing: None generates into the cache, and into a
            given ``root`` that is empty or already holds tabletop sets; True anywhere; False never.

    Returns:
        The split over the generated files; it declares nothing beyond its layout.

    Raises:
        ValueError: an unknown split, size or layout, or an out-of-range number.
        FileNotFoundError: the set is missing and ``generate`` does not allow making it there.

    Example:
        >>> test = open_tabletop(split="test", size="tiny", progress=False)  # generates the tiny preset (seconds)  # doctest: +SKIP
        >>> test.num_images, len(test.captions)  # doctest: +SKIP
        (2, 10)
    """
    _check_options(split, size, seed, layout, regions, canvas, batch_size)
    base = Path(root).expanduser() if root is not None else world_cache("tabletop")
    folder = tabletop_folder(base, size, seed, canvas)
    if not folder.is_dir():
        check_may_generate("tabletop", base, folder, generate, explicit=root is not None, what="tabletop sets")
    build_once(folder, lambda tmp: write_tables(tmp, size, seed, canvas, progress))
    if layout == "images":
        return ImageCaptionsDataset(folder, split)
    features = folder / features_folder_name(regions, backbone, weights)
    build_once(features, lambda tmp: write_features(folder, tmp, regions, backbone, weights, seed, batch_size, progress))
    return TeranDataset(folder, split, captions=folder / KARPATHY_FILE, sizes=folder / SIZES_FILE, features=features)


def _looks_like(root: Path) -> bool:
    """A folder that holds tabletop sets (for commands run without ``--dataset``)."""
    return any(p.is_dir() for p in Path(root).glob("tabletop-*"))


open_tabletop.looks_like = _looks_like  # type: ignore[attr-defined]


def _check_options(split: str, size: str, seed: int, layout: str, regions: int, canvas: int, batch_size: int) -> None:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r} for tabletop; splits: {', '.join(SPLITS)}.")
    if size not in PRESETS:
        presets = ", ".join(f"{k} ({sum(v)} images)" for k, v in PRESETS.items())
        raise ValueError(f"unknown tabletop size {size!r}; presets: {presets}.")
    if layout not in LAYOUTS:
        raise ValueError(f"unknown tabletop layout {layout!r}; layouts: {', '.join(LAYOUTS)}.")
    if seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed}.")
    if regions < MAX_THINGS + 2:
        raise ValueError(f"regions must be at least {MAX_THINGS + 2} (a table has up to {MAX_THINGS} objects), got {regions}.")
    if canvas < 160:
        raise ValueError(f"canvas must be at least 160 pixels (objects need room), got {canvas}.")
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}.")


def tabletop_folder(root: Path, size: str, seed: int, canvas: int) -> Path:
    """The cache subfolder of one tabletop set, named by every parameter that changes it.

    Example:
        >>> tabletop_folder(Path("cache"), "small", 0, 224).name
        'tabletop-small-224px-seed0-v1'
    """
    return root / f"tabletop-{size}-{canvas}px-seed{seed}-v{GENERATOR_VERSION}"


def groups_file(dataset: Any) -> Path:
    """The groups file of an opened split: ``<its folder>/groups_<split>.json``, to pass to
    ``xmatch eval --groups`` (or :meth:`xmatch.eval.groups.GroupSet.from_json`).

    Example:
        >>> from types import SimpleNamespace
        >>> groups_file(SimpleNamespace(root=Path("tabletop-small-224px-seed0-v1"), split="test")).name
        'groups_test.json'
    """
    return Path(dataset.root) / f"groups_{dataset.split}.json"


def sample_tables(seed: int, group: int, canvas: int = 224) -> tuple[Table, Table]:
    """The twin pair ``group`` of every tabletop set made with ``seed`` and ``canvas`` (pairs
    are numbered through train, val and test in turn).

    Example:
        >>> sample_tables(0, 0)[1].variant in ("roles", "colour", "pattern", "relation", "count")
        True
    """
    return sample_group(stream_rng(seed, group, TABLE_STREAM), canvas)


def tabletop_captions(n: int, seed: int = 0, canvas: int = 224) -> list[str]:
    """The first ``n`` captions of the tabletop world for ``seed``, without drawing a picture:
    the captions of the train split of every preset, in its order (five per picture).

    Example:
        >>> len(tabletop_captions(12)), tabletop_captions(3) == tabletop_captions(12)[:3]
        (12, True)
    """
    if n < 0:
        raise ValueError(f"n must be a non-negative number of captions, got {n}.")
    out: list[str] = []
    group = 0
    while len(out) < n:
        caption_rng = stream_rng(seed, group, CAPTION_STREAM)
        for table in sample_tables(seed, group, canvas):
            out += draw_captions(table, caption_rng, CAPTIONS_PER_IMAGE)
        group += 1
    return out[:n]


def write_tables(folder: Path, size: str, seed: int, canvas: int, progress: bool = True) -> None:
    """Render a tabletop set into ``folder``: ``images/<id>.png``, the Karpathy split file, the
    sizes file, ``<split>.csv`` captions, ``groups_<split>.json`` (the twins) and
    ``tabletop.json`` (every object, box, relation and twin)."""

    def draw_pair(group: int) -> list[tuple[np.ndarray, list[str], dict[str, Any], str]]:
        caption_rng = stream_rng(seed, group, CAPTION_STREAM)
        out = []
        for table in sample_tables(seed, group, canvas):
            image, boxes = render(table, canvas)
            out.append((image, draw_captions(table, caption_rng, CAPTIONS_PER_IMAGE), _record(table, boxes), table.variant))
        return out

    params = {"size": size, "seed": seed, "canvas": canvas, "version": GENERATOR_VERSION}
    write_twin_pairs(folder, "tabletop", PRESETS[size], draw_pair, (METADATA_FILE, "tables", params), progress)


def _record(table: Table, boxes: np.ndarray) -> dict[str, Any]:
    return {
        "variant": table.variant, "relation": table.relation,
        "count": table.count, "description": describe(table), "background": list(table.background),
        "things": [
            {"kind": t.kind, "colour": t.colour, "pattern": t.pattern, "size": t.size, "box": [int(v) for v in t.box],
             "depth": t.depth}
            for t in table.things
        ],
    }


def write_features(
    tables: Path, folder: Path, regions: int, backbone: str, weights: str, seed: int, batch_size: int,
    progress: bool = True,
) -> None:
    """Pool the backbone's feature map over each image's proposal boxes into ``folder``, as the
    scenes' features are made: ``bu_att/<id>.npz`` (``feat [regions, C]`` float16) and
    ``bu_box/<id>.npy`` (``[regions, 4]`` float32 pixel boxes: the objects' boxes first)."""
    from PIL import Image

    from xmatch.core.progress import progress_bar
    from xmatch.scenes.features import RegionFeatureExtractor, proposal_boxes

    records = read_tables(tables)
    canvas = int(json.loads((tables / METADATA_FILE).read_text(encoding="utf-8"))["params"]["canvas"])
    extractor = RegionFeatureExtractor(backbone, weights, canvas, seed)
    (folder / "bu_att").mkdir()
    (folder / "bu_box").mkdir()
    bar = progress_bar(total=len(records), desc=f"tabletop: {backbone} region features", unit="img", show=progress)
    for start in range(0, len(records), batch_size):
        batch = records[start : start + batch_size]
        images = [np.asarray(Image.open(tables / "images" / f"{r['id']}.png").convert("RGB")) for r in batch]
        boxes = np.stack([
            proposal_boxes(np.array([t["box"] for t in r["things"]], dtype=np.float64), canvas, regions,
                           stream_rng(seed, r["id"], BOX_STREAM))
            for r in batch
        ])
        for r, f, b in zip(batch, extractor(images, boxes), boxes):
            np.savez_compressed(folder / "bu_att" / f"{r['id']}.npz", feat=f.astype(np.float16))
            np.save(folder / "bu_box" / f"{r['id']}.npy", b)
        bar.update(len(batch))
    bar.close()
    write_json(folder / FEATURES_FILE, {
        "regions": regions, "backbone": backbone, "weights": weights, "seed": seed,
        "feature_dim": extractor.feature_dim, "dtype": "float16", "version": GENERATOR_VERSION,
        "boxes": "the objects' boxes first (as in tabletop.json), then jittered copies, the whole image, "
                 "random background boxes",
    })


def read_tables(folder: PathArg) -> list[dict[str, Any]]:
    """The per-image records of a generated tabletop set (``ds.root`` of an opened split): ``id``,
    ``split``, ``group`` (twins share it), ``variant``, ``relation``, ``count``, ``description``
    and ``things`` (``kind``, ``colour``, ``pattern``, ``size``, pixel ``box``, ``depth``), in
    image-id order.

    Example:
        >>> read_tables(open_tabletop(split="test", size="tiny").root)[0]["relation"]  # generates the tiny preset  # doctest: +SKIP
        'far'
    """
    return read_records(folder, METADATA_FILE, "tables", "open_tabletop")


def table_from_record(record: dict[str, Any]) -> Table:
    """Rebuild the :class:`~xmatch.tabletop.world.Table` of a ``read_tables`` record.

    Example:
        >>> base = sample_tables(0, 0)[0]
        >>> table_from_record(_record(base, render(base)[1])) == base
        True
    """
    things = tuple(
        Thing(t["kind"], t["colour"], t["pattern"], t["size"], tuple(t["box"]), t["depth"]) for t in record["things"]
    )
    background = record["background"]
    return Table(things, record["relation"], record["variant"],
                 (int(background[0]), int(background[1]), float(background[2]), float(background[3]), int(background[4])),
                 record["count"])
