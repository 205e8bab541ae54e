"""The built-in ``signs`` world: a third procedural image-caption dataset, for region features
on pictures unlike the scenes and the tabletop.

Letters, words and icons of 12-60 px in eleven fonts on scikit-image's photographs, with
clutter (:mod:`xmatch.signs.world`), five captions each (:mod:`xmatch.signs.captions`), in
hard-negative twin pairs listed in a groups file beside each split (``groups_<split>.json``, the
format ``xmatch eval --groups`` reads). It comes as pictures only (``layout="images"``): it
exists to test what ``xmatch extract`` makes of pixels (docs/extract.md, docs/signs.md).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from xmatch.data.generated import SPLITS, build_once, check_may_generate, read_records, stream_rng, world_cache, write_twin_pairs
from xmatch.data.image_captions import ImageCaptionsDataset
from xmatch.signs.captions import captions as draw_captions
from xmatch.signs.world import Board, check_backdrop, plain_grey, render, sample_group

#: images per split (train, val, test); each even (boards come in twin pairs)
PRESETS: dict[str, tuple[int, int, int]] = {
    "tiny": (8, 2, 2),
    "small": (1000, 200, 200),
    "medium": (10000, 1000, 1000),
}
CAPTIONS_PER_IMAGE = 5
#: bump when the boards, captions or files change, so old caches are not reused
GENERATOR_VERSION = 1
METADATA_FILE = "signs.json"
KARPATHY_FILE = "dataset_signs.json"
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
    backdrop: str = "photos",
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
        backdrop: ``"photos"`` (scikit-image's photographs with clutter) or ``"plain"`` (the
            same boards on a flat grey canvas, no clutter, no caption naming a photograph).
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
    check_backdrop(backdrop)
    base = Path(root).expanduser() if root is not None else world_cache("signs")
    folder = signs_folder(base, size, seed, canvas, backdrop)
    if not folder.is_dir():
        check_may_generate("signs", base, folder, generate, explicit=root is not None, what="signs sets")
    build_once(folder, lambda tmp: write_signs(tmp, size, seed, canvas, progress, backdrop))
    return ImageCaptionsDataset(folder, split)


def _looks_like(root: Path) -> bool:
    """A folder that holds signs sets (for commands run without ``--dataset``)."""
    return any(p.is_dir() for p in Path(root).glob("signs-*"))


open_signs.looks_like = _looks_like  # type: ignore[attr-defined]


def signs_folder(root: Path, size: str, seed: int, canvas: int, backdrop: str = "photos") -> Path:
    """The cache subfolder of one signs set, named by every parameter that changes it.

    Example:
        >>> signs_folder(Path("cache"), "small", 0, 256).name, signs_folder(Path("cache"), "small", 0, 256, "plain").name
        ('signs-small-256px-seed0-v1', 'signs-small-256px-seed0-plain-v1')
    """
    kind = "" if backdrop == "photos" else f"-{backdrop}"
    return root / f"signs-{size}-{canvas}px-seed{seed}{kind}-v{GENERATOR_VERSION}"


def sample_boards(seed: int, group: int, canvas: int = 256) -> tuple[Board, Board]:
    """The twin pair ``group`` of every signs set made with ``seed`` and ``canvas`` (pairs are
    numbered through train, val and test in turn).

    Example:
        >>> sample_boards(0, 0)[1].variant in ("colour", "roles", "glyph")
        True
    """
    return sample_group(stream_rng(seed, group, BOARD_STREAM), canvas)


def write_signs(folder: Path, size: str, seed: int, canvas: int, progress: bool = True, backdrop: str = "photos") -> None:
    """Render a signs set into ``folder``: ``images/<id>.png``, the Karpathy split file, the
    sizes file, ``<split>.csv`` captions, ``groups_<split>.json`` (the twins) and ``signs.json``
    (every sign, box, backdrop and twin)."""

    def draw_pair(group: int) -> list[tuple[np.ndarray, list[str], dict[str, Any], str]]:
        caption_rng = stream_rng(seed, group, CAPTION_STREAM)
        photo = backdrop == "photos"
        return [(render(board, canvas, backdrop), draw_captions(board, caption_rng, CAPTIONS_PER_IMAGE, photo),
                 _record(board, backdrop), board.variant)
                for board in sample_boards(seed, group, canvas)]

    params = {"size": size, "seed": seed, "canvas": canvas, "backdrop": backdrop, "version": GENERATOR_VERSION}
    write_twin_pairs(folder, "signs", PRESETS[size], draw_pair, (METADATA_FILE, "boards", params), progress)


def _record(board: Board, backdrop: str = "photos") -> dict[str, Any]:
    b = board.backdrop
    shown = {"photo": b.photo, "x": b.x, "y": b.y, "side": b.side} if backdrop == "photos" else {"plain": plain_grey(board)}
    return {
        "variant": board.variant, "relation": board.relation,
        "backdrop": shown, "clutter": board.clutter if backdrop == "photos" else None,
        "items": [
            {"kind": s.kind, "name": s.name, "colour": s.colour, "style": s.style, "box": [int(v) for v in s.box]}
            for s in board.signs
        ],
    }


def read_signs(folder: PathArg) -> list[dict[str, Any]]:
    """The per-image records of a generated signs set (``ds.root`` of an opened split): ``id``,
    ``split``, ``group`` (twins share it), ``variant``, ``relation``, ``backdrop`` (the photograph's
    crop, or ``{"plain": grey}``), ``clutter`` (its seed; None on a plain canvas) and ``items`` (``kind``, ``name``, ``colour``, ``style``, pixel ``box``; the core pair
    first), in image-id order.

    Example:
        >>> read_signs(open_signs(split="test", size="tiny").root)[0]["relation"]  # generates the tiny preset  # doctest: +SKIP
        'left'
    """
    return read_records(folder, METADATA_FILE, "boards", "open_signs")
