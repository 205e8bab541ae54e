"""What the generated worlds (``scenes``, ``tabletop``, ``signs``) share: where a world is cached,
whether a set may be generated into a folder the user named, and the files of a world of twin
pairs."""

from __future__ import annotations

import csv
import json
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np


def world_cache(world: str) -> Path:
    """The default cache folder of a generated world: ``<XMATCH_HOME>/datasets/<world>``.

    Example:
        >>> world_cache("signs").parts[-2:]
        ('datasets', 'signs')
    """
    from xmatch.io.hub import cache_dir

    return cache_dir() / "datasets" / world


def check_may_generate(
    world: str, base: Path, folder: Path, generate: bool | None, explicit: bool, what: str = "sets", hint: str = ""
) -> None:
    """Refuse to generate ``folder`` inside ``base`` unless allowed: ``generate=True``; or
    ``None`` with the cache (no ``root`` given), an empty folder, or one that already holds sets
    of this world (``<world>-*``). Anything else would fill a folder of the user's with pictures.

    Raises:
        FileNotFoundError: naming the folder, what it holds, and the ways out.

    Example:
        >>> check_may_generate("signs", Path("nowhere"), Path("nowhere/signs-tiny"), None, explicit=False)
    """
    if generate is True or (generate is None and not explicit):
        return
    if generate is None:
        entries = [p.name for p in base.iterdir()] if base.is_dir() else None
        if entries is not None and (not entries or any(n.startswith(f"{world}-") for n in entries)):
            return
        found = "does not exist" if entries is None else f"holds no {what}"
    else:
        found = "does not hold this set and generate=false"
    raise FileNotFoundError(
        f"no {world} data at {base}: the folder {found} (looked for {folder.name}). Check the path; leave --data "
        f"out to use the cache ({world_cache(world)}{hint}); or generate the set there with --data-option "
        "generate=true (generate=True)."
    )


#: the splits of a generated world, in the order their pictures are numbered
SPLITS = ("train", "val", "test")


def write_twin_pairs(
    folder: Path,
    dataset: str,
    counts: tuple[int, int, int],
    draw_pair: Callable[[int], Sequence[tuple[np.ndarray, list[str], dict[str, Any], str]]],
    metadata: tuple[str, str, dict[str, Any]],
    progress: bool = True,
) -> None:
    """Write a generated world made of twin pairs into ``folder``, in the files every xmatch
    layout reads: ``images/<id>.png``, ``dataset_<dataset>.json`` (Karpathy splits), ``sizes.json``,
    ``<split>.csv`` (``image,caption``), ``groups_<split>.json`` (each pair a group, its kind the
    second picture's variant) and the world's metadata file.

    Args:
        folder: an empty folder.
        dataset: the world's name (``tabletop``, ``signs``).
        counts: pictures per split (train, val, test), each even.
        draw_pair: ``group -> two (picture [H, W, 3] uint8, captions, record, variant)``; a record
            is the picture's metadata, to which ``id``, ``split`` and ``group`` are prepended.
        metadata: (file name, key of the records' list, parameters): ``{"params": ..., key: records}``.
        progress: show a progress bar.
    """
    from PIL import Image

    from xmatch.core.progress import progress_bar

    split_of = [s for s, n in zip(SPLITS, counts) for _ in range(n)]
    (folder / "images").mkdir()
    records: list[dict[str, Any]] = []
    entries: list[dict[str, Any]] = []
    sizes: dict[str, list[int]] = {}
    rows: dict[str, list[tuple[str, str]]] = {s: [] for s in SPLITS}
    groups: dict[str, list[dict[str, Any]]] = {s: [] for s in SPLITS}
    bar = progress_bar(total=len(split_of), desc=f"{dataset}: rendering", unit="img", show=progress)
    for group in range(len(split_of) // 2):
        ids, variant = [], ""
        for picture, texts, record, variant in draw_pair(group):
            image_id = len(records)
            ids.append(str(image_id))
            filename = f"{image_id}.png"
            Image.fromarray(picture).save(folder / "images" / filename)
            split = split_of[image_id]
            records.append({"id": image_id, "split": split, "group": group, **record})
            sizes[str(image_id)] = [picture.shape[1], picture.shape[0]]
            sentids = [image_id * len(texts) + k for k in range(len(texts))]
            entries.append({
                "split": split, "imgid": image_id, "filepath": "images", "filename": filename, "sentids": sentids,
                "sentences": [
                    {"raw": t, "tokens": t.replace(",", " ,").replace(";", " ;").split(), "imgid": image_id, "sentid": i}
                    for t, i in zip(texts, sentids)
                ],
            })
            rows[split] += [(f"images/{filename}", t) for t in texts]
            bar.update()
        groups[split_of[int(ids[0])]].append({"images": ids, "kind": variant})
    bar.close()
    write_json(folder / f"dataset_{dataset}.json", {"dataset": dataset, "images": entries})
    write_json(folder / "sizes.json", sizes)
    for split in SPLITS:
        with (folder / f"{split}.csv").open("w", encoding="utf-8", newline="") as f:
            writer = csv.writer(f, lineterminator="\n")
            writer.writerow(["image", "caption"])
            writer.writerows(rows[split])
        write_json(folder / f"groups_{split}.json", {"groups": groups[split]})
    name, key, params = metadata
    write_json(folder / name, {"params": params, key: records})


def read_records(folder: str | Path, metadata: str, key: str, opener: str) -> list[dict[str, Any]]:
    """The per-picture records of a generated world's metadata file (``folder/metadata``'s ``key``).

    Raises:
        FileNotFoundError: no such file; the message names the function that makes the folder.
    """
    path = Path(folder) / metadata
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; is {folder} a folder made by {opener}?")
    return json.loads(path.read_text(encoding="utf-8"))[key]


def write_json(path: Path, doc: Any) -> None:
    """``doc`` as indented UTF-8 JSON (the generated worlds' files)."""
    with path.open("w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)


def build_once(folder: Path, build: Callable[[Path], None]) -> None:
    """Build ``folder`` unless it exists: into a temporary sibling, renamed into place when
    complete, under a file lock, so an interrupted or concurrent run never leaves (or reads)
    a half-written folder.

    Example:
        >>> import tempfile
        >>> root = Path(tempfile.mkdtemp())
        >>> build_once(root / "set", lambda tmp: (tmp / "done").touch())
        >>> sorted(p.name for p in (root / "set").iterdir())
        ['done']
    """
    if folder.is_dir():
        return
    from filelock import FileLock

    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder) + ".lock"):
        if folder.is_dir():
            return
        tmp = folder.with_name(folder.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            build(tmp)
            os.replace(tmp, folder)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def stream_rng(seed: int, index: int, stream: int) -> np.random.Generator:
    """An independent random stream per (seed, group of twins or image, purpose): what a
    generated world draws does not depend on the order its groups are made in.

    Example:
        >>> float(stream_rng(0, 3, 1).random()) == float(stream_rng(0, 3, 1).random())
        True
    """
    return np.random.default_rng([seed, index, stream])
