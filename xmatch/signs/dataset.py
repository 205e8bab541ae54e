"""The built-in ``signs`` world: a third procedural image-caption dataset, for region features
on pictures unlike the scenes and the tabletop.

Letters, words and icons of 12-60 px in eleven fonts on scikit-image's photographs, with
clutter (:mod:`xmatch.signs.world`), five captions each (:mod:`xmatch.signs.captions`), in
hard-negative twin pairs listed in a groups file beside each split (``groups_<split>.json``, the
format ``xmatch eval --groups`` reads). It comes as pictures only (``layout="images"``): it
exists to test what ``xmatch extract`` makes of pixels (docs/extract.md, docs/signs.md).
"""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any

from xmatch.data.generated import check_may_generate, world_cache
from xmatch.data.image_captions import ImageCaptionsDataset
from xmatch.scenes.dataset import _build_once, _rng, _write_json
from xmatch.signs.captions import captions as draw_captions
from xmatch.signs.world import Board, render, sample_group

#: images per split (train, val, test); each even (boards come in twin pairs)
PRESETS: dict[str, tuple[int, int, int]] = {
    "tiny": (8, 2, 2),
    "small": (1000, 200, 200),
    "medium": (10000, 1000, 1000),
}
SPLITS = ("train", "val", "test")
CAPTIONS_PER_IMAGE = 5
#: bump when the boards, captions or files change, so old caches are not reused
GENERATOR_VERSION = 1
METADATA_FILE = "signs.json"
KARPATHY_FILE = "dataset_signs.json"
SIZES_FILE = "sizes.json"
#: random streams of a group: boards, captions
BOARD_STREAM, CAPTION_STREAM = 0, 1

PathArg = str | os.PathLike


def open_signs(
    root: PathArg | None = None,
    split: str = "train",
    *,
    size: str = "small",
    seed: int = 0,
    canvas: int = 256,
    layout: str = "images",
    progress: bool = True,
    generate: bool | None = None,
) -> ImageCaptionsDataset:
    """Open the ``signs`` world's pictures and captions, generating them into the cache on first use.

    Args:
        root: the cache folder (default ``<XMATCH_HOME>/datasets/signs``); each parameter set
            gets its own subfolder (:func:`signs_folder`).
        split: ``"train"``, ``"val"`` or ``"test"``; its twins are listed in
            ``groups_<split>.json`` in the dataset's folder.
        size: a preset of :data:`PRESETS`: ``tiny`` (12 images, for tests), ``small`` (1,400
            images, 7,000 captions), ``medium`` (12,000 images).
        seed: the same seed gives identical pictures and captions.
        canvas: picture side in pixels (at least 192).
        layout: ``"images"`` only: make region features with ``xmatch extract``.
        progress: show a progress bar while generating.
        generate: generate the set when it is missing: None generates into the cache, and into a
            given ``root`` that is empty or already holds signs sets; True anywhere; False never.

    Raises:
        ValueError: an unknown split, size or layout, or an out-of-range number.
        FileNotFoundError: the set is missing and ``generate`` does not allow making it there.
        ImportError: matplotlib (its fonts) or scikit-image (its photographs) is missing.

    Example:
        >>> test = open_signs(split="test", size="tiny", progress=False)  # generates the tiny preset (seconds)  # doctest: +SKIP
        >>> test.num_images, len(test.captions)  # doctest: +SKIP
        (2, 10)
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r} for signs; splits: {', '.join(SPLITS)}.")
    if size not in PRESETS:
        presets = ", ".join(f"{k} ({sum(v)} images)" for k, v in PRESETS.items())
        raise ValueError(f"unknown signs size {size!r}; presets: {presets}.")
    if layout != "images":
        raise ValueError(
            f"the signs world comes as pictures only (layout='images'), got {layout!r}; make region features "
            "from them with xmatch extract (docs/extract.md)."
        )
    if seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed}.")
    if canvas < 192:
        raise ValueError(f"canvas must be at least 192 pixels (signs need room), got {canvas}.")
    base = Path(root).expanduser() if root is not None else world_cache("signs")
    folder = signs_folder(base, size, seed, canvas)
    if not folder.is_dir():
        check_may_generate("signs", base, folder, generate, explicit=root is not None, what="signs sets")
    _build_once(folder, lambda tmp: write_signs(tmp, size, seed, canvas, progress))
    return ImageCaptionsDataset(folder, split)


def _looks_like(root: Path) -> bool:
    """A folder that holds signs sets (for commands run without ``--dataset``)."""
    return any(p.is_dir() for p in Path(root).glob("signs-*"))


open_signs.looks_like = _looks_like  # type: ignore[attr-defined]


def signs_folder(root: Path, size: str, seed: int, canvas: int) -> Path:
    """The cache subfolder of one signs set, named by every parameter that changes it.

    Example:
        >>> signs_folder(Path("cache"), "small", 0, 256).name
        'signs-small-256px-seed0-v1'
    """
    return root / f"signs-{size}-{canvas}px-seed{seed}-v{GENERATOR_VERSION}"


def sample_boards(seed: int, group: int, canvas: int = 256) -> tuple[Board, Board]:
    """The twin pair ``group`` of every signs set made with ``seed`` and ``canvas`` (pairs are
    numbered through train, val and test in turn).

    Example:
        >>> sample_boards(0, 0)[1].variant in ("colour", "roles", "glyph")
        True
    """
    return sample_group(_rng(seed, group, BOARD_STREAM), canvas)


def write_signs(folder: Path, size: str, seed: int, canvas: int, progress: bool = True) -> None:
    """Render a signs set into ``folder``: ``images/<id>.png``, the Karpathy split file, the
    sizes file, ``<split>.csv`` captions, ``groups_<split>.json`` (the twins) and ``signs.json``
    (every sign, box, backdrop and twin)."""
    from PIL import Image

    from xmatch.core.progress import progress_bar

    counts = PRESETS[size]
    split_of = [s for s, n in zip(SPLITS, counts) for _ in range(n)]
    (folder / "images").mkdir()
    records: list[dict[str, Any]] = []
    entries: list[dict[str, Any]] = []
    rows: dict[str, list[tuple[str, str]]] = {s: [] for s in SPLITS}
    groups: dict[str, list[dict[str, Any]]] = {s: [] for s in SPLITS}
    bar = progress_bar(total=len(split_of), desc=f"signs: rendering {size} (seed {seed})", unit="img", show=progress)
    for group in range(len(split_of) // 2):
        caption_rng = _rng(seed, group, CAPTION_STREAM)
        pair = sample_boards(seed, group, canvas)
        ids = []
        for board in pair:
            image_id = len(records)
            ids.append(str(image_id))
            filename = f"{image_id}.png"
            Image.fromarray(render(board, canvas)).save(folder / "images" / filename)
            texts = draw_captions(board, caption_rng, CAPTIONS_PER_IMAGE)
            split = split_of[image_id]
            records.append(_record(board, image_id, group, split))
            entries.append({
                "split": split, "imgid": image_id, "filepath": "images", "filename": filename,
                "sentids": [image_id * CAPTIONS_PER_IMAGE + k for k in range(len(texts))],
                "sentences": [
                    {"raw": t, "tokens": t.replace(",", " ,").split(), "imgid": image_id,
                     "sentid": image_id * CAPTIONS_PER_IMAGE + k}
                    for k, t in enumerate(texts)
                ],
            })
            rows[split] += [(f"images/{filename}", t) for t in texts]
            bar.update()
        groups[split_of[int(ids[0])]].append({"images": ids, "kind": pair[1].variant})
    bar.close()
    _write_json(folder / KARPATHY_FILE, {"dataset": "signs", "images": entries})
    _write_json(folder / SIZES_FILE, {str(r["id"]): [canvas, canvas] for r in records})
    for split in SPLITS:
        with (folder / f"{split}.csv").open("w", encoding="utf-8", newline="") as f:
            writer = csv.writer(f, lineterminator="\n")
            writer.writerow(["image", "caption"])
            writer.writerows(rows[split])
        _write_json(folder / f"groups_{split}.json", {"groups": groups[split]})
    params = {"size": size, "seed": seed, "canvas": canvas, "version": GENERATOR_VERSION}
    _write_json(folder / METADATA_FILE, {"params": params, "boards": records})


def _record(board: Board, image_id: int, group: int, split: str) -> dict[str, Any]:
    b = board.backdrop
    return {
        "id": image_id, "split": split, "group": group, "variant": board.variant, "relation": board.relation,
        "backdrop": {"photo": b.photo, "x": b.x, "y": b.y, "side": b.side}, "clutter": board.clutter,
        "items": [
            {"kind": s.kind, "name": s.name, "colour": s.colour, "style": s.style, "box": [int(v) for v in s.box]}
            for s in board.signs
        ],
    }


def read_signs(folder: PathArg) -> list[dict[str, Any]]:
    """The per-image records of a generated signs set (``ds.root`` of an opened split): ``id``,
    ``split``, ``group`` (twins share it), ``variant``, ``relation``, ``backdrop``, ``clutter``
    and ``items`` (``kind``, ``name``, ``colour``, ``style``, pixel ``box``; the core pair
    first), in image-id order.

    Example:
        >>> read_signs(open_signs(split="test", size="tiny").root)[0]["relation"]  # generates the tiny preset  # doctest: +SKIP
        'left'
    """
    import json

    path = Path(folder) / METADATA_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; is {folder} a folder made by open_signs?")
    return json.loads(path.read_text(encoding="utf-8"))["boards"]
