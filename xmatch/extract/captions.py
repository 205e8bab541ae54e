"""Which images to extract, under which ids and splits, with which captions.

The captions come from ``--captions FILE`` or, without it, from the image folder itself:

1. a Karpathy split file (``dataset_*.json``: ``images`` with ``split``, ``filepath``,
   ``filename``, ``imgid`` / ``cocoid``, ``sentences[].raw``): its ids and splits are kept, so
   features of COCO, Flickr30k or the built-in scenes keep their usual ids;
2. COCO caption annotations (``images`` with ``id`` and ``file_name``, ``annotations`` with
   ``image_id`` and ``caption``): the COCO ids, every image in the split ``default_split``;
3. a CSV (header ``image,caption[,split]``) or JSON-lines file (``{"image", "caption"[,
   "split"]}``) as the ``image-captions`` layout reads, or the folder's ``<split>.csv`` /
   ``<split>.jsonl`` files; image paths are relative to the captions file's folder; ids are
   0, 1, 2... in the order images first appear; rows without a split go to ``default_split``;
4. nothing: every image found under the folder, ids in path order, no captions (the features
   can be encoded, but ``xmatch eval`` / ``train`` need captions);
5. WebDataset shards instead of a folder (``shards/{00000..00099}.tar``, a ``.tar`` file, or a
   folder holding ``.tar`` files and no pictures): each sample's caption is its ``KEY.txt``, its
   id its key, its name ``shard/key``, every sample in ``default_split``, in shard then member
   order (:mod:`xmatch.data.webdataset`); pictures are read from the tar in place.

A captions file is data from elsewhere, and its names become paths: every image it names must
resolve (symbolic links followed) inside the image folder unless ``allow_outside_root`` is
given; splits and ids must be plain names (they name output files); no name may hold a newline
or another control character (it would shift ``<split>_images.txt``). Each refusal names the
file, the entry and the value.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xmatch.core.errors import XmatchError
from xmatch.data._io import check_text_name, first_few, inside_root, plain_id, plain_name, plain_path, shown
from xmatch.data.errors import DataFileNotFoundError
from xmatch.data.image_captions import read_caption_rows
from xmatch.data.webdataset import expand_shards, names_shards, scan_shards
from xmatch.io.archive import ArchiveMember
from xmatch.regions.images import find_images

logger = logging.getLogger(__name__)

CAPTION_SUFFIXES = (".csv", ".jsonl")
#: split files recognised in an image folder, in this order
SPLIT_NAMES = ("train", "val", "test")


class CaptionsError(XmatchError, ValueError):
    """A captions file that cannot be used (the message names it and the fix)."""


@dataclass
class ImageRecord:
    """One image to extract.

    Attributes:
        key: the feature id (``bu_att/<key>.npz``), unique.
        name: the image's path relative to the image folder (POSIX), as proposers see it
            (``shard/key`` for a WebDataset sample).
        path: the image file, or its member of a WebDataset shard.
        split: ``train``, ``val``, ``test``... (as the captions say).
        captions: its captions (possibly none).
        entry: the original Karpathy entry, kept when the captions came from one.
    """

    key: str
    name: str
    path: Path | ArchiveMember
    split: str
    captions: list[str] = field(default_factory=list)
    entry: dict[str, Any] | None = None


def read_records(
    images: str | os.PathLike,
    captions: str | os.PathLike | None,
    default_split: str = "test",
    *,
    allow_outside_root: bool = False,
) -> tuple[list[ImageRecord], str]:
    """The images to extract and where their captions came from.

    Args:
        images: the image folder (paths in caption files are relative to it for Karpathy and
            COCO files, to the captions file's folder for CSV / JSONL), or WebDataset shards
            (a pattern such as ``shards/{00000..00099}.tar``, a ``.tar`` file, or a folder
            of ``.tar`` files and no pictures): their captions are their ``KEY.txt``.
        captions: a captions file, or None to look in ``images`` (see the module docstring).
        default_split: the split of images whose captions name none.
        allow_outside_root: accept image paths that resolve outside ``images`` (absolute
            paths, ``..``, symbolic links out of the folder) in a captions file you trust.

    Returns:
        ``(records, source)``: records in id order; ``source`` says where captions came from.

    Raises:
        xmatch.data.errors.DataFileNotFoundError: (a ``FileNotFoundError``) a missing folder
            or captions file, no image at all, or caption rows naming image files that do not
            exist (listed).
        CaptionsError: a malformed captions file, duplicate ids, empty captions, an image
            path outside ``images``, a split or id that is not a plain name, a name with a
            control character, an id that is not an integer or a plain name, an image of a
            folder without captions whose path is not plain names joined by ``/``
            (:func:`xmatch.data._io.plain_path`, as index ids).

    Example:
        >>> records, source = read_records("my_photos", "my_photos/captions.csv")  # needs the user's photos and captions  # doctest: +SKIP
        >>> records[0].key, records[0].split, records[0].captions[:1]  # doctest: +SKIP
        ('0', 'test', ['a dog on a beach'])
    """
    root = Path(images).expanduser()
    plain_name(default_split, "the default split (--split)", "split", CaptionsError)
    if names_shards(root):
        if captions is not None:
            raise CaptionsError(f"{images}: WebDataset shards carry their captions (KEY.txt); leave out --captions.")
        return shard_records(images, default_split)
    if not root.is_dir():
        raise DataFileNotFoundError(f"image folder {root} does not exist or is not a folder.")
    files = [Path(captions).expanduser()] if captions is not None else _discover(root)
    for f in files:
        if not f.is_file():
            raise DataFileNotFoundError(f"captions file {f} does not exist.")
    if not files:
        names = find_images(root)
        if not names:
            from xmatch.regions.images import IMAGE_SUFFIXES

            raise DataFileNotFoundError(
                f"no images in {root} (looked recursively for {', '.join(IMAGE_SUFFIXES)}); is it the right folder?"
            )
        for n in names:
            where = f"{root}: image {shown(n)}"
            # the names become the images' ids (<split>_images.txt, then index ids): the index's name rule
            inside_root(root / plain_path(n, where, "file name", CaptionsError), root, where,
                        allow_outside=allow_outside_root, error=CaptionsError)
        records = [ImageRecord(str(k), n, root / n, default_split) for k, n in enumerate(names)]
        return records, "none (every image in the folder, no captions)"
    if len(files) == 1 and files[0].suffix == ".json":
        records = _json_records(root, files[0], default_split, allow_outside_root)
    else:
        records = _table_records(root, files, default_split, allow_outside_root)
    _check(records, files)
    return records, ", ".join(map(str, files))


def shard_records(shards: str | os.PathLike, split: str) -> tuple[list[ImageRecord], str]:
    """The samples of WebDataset shards as records, in shard then member order (a resumed
    extraction cuts the same chunks): id the sample's key, name ``shard/key``, the picture its
    tar member, the caption its ``KEY.txt`` (none when it has none or one that cannot be read).

    A sample whose picture cannot be read stays a record: the extraction leaves it out and
    lists it as it does an unreadable file. What cannot be a record (a damaged tar's rest, a
    key met again, a key without a picture or that is not a plain name) and captions that
    cannot be read are logged as warnings, and named in the returned source.

    Raises:
        xmatch.data.errors.DataFileNotFoundError: a shard the pattern names is missing.
        CaptionsError: no sample with a picture.

    Example:
        >>> records, source = shard_records("shards/{00000..00003}.tar", "train")  # needs the shards  # doctest: +SKIP
        >>> records[0].key, records[0].name, records[0].captions  # doctest: +SKIP
        ('000000011', '00000/000000011', ['a dog on a beach'])
    """
    paths = expand_shards(shards)
    scan = scan_shards(paths)
    records, listed = [], list(scan.left_out)
    for s in scan.samples:
        where = f"{shards}: sample {s.id}"
        try:
            key = plain_name(s.key, where, "key (the feature id)", CaptionsError)
        except CaptionsError as exc:
            listed.append((s.id, str(exc)))
            continue
        if s.bad_caption:
            listed.append((s.id, f"{s.bad_caption}; the picture is extracted without a caption"))
        records.append(ImageRecord(key, s.id, s.picture, split, [s.caption] if s.caption else []))  # type: ignore[arg-type]
    for where, why in listed:
        logger.warning("left out of %s: %s: %s", shards, where, why)
    if not records:
        raise CaptionsError(f"{shards}: no sample with a picture in its {len(paths)} shards"
                            + (f"; left out: {first_few([f'{w}: {y}' for w, y in listed])}." if listed else "."))
    left = f", {len(listed)} members or captions left out (logged)" if listed else ""
    return records, f"WebDataset shards {os.fspath(shards)} ({len(paths)} shards{left})"


def _discover(root: Path) -> list[Path]:
    karpathy = sorted(root.glob("dataset_*.json"))
    if len(karpathy) > 1:
        raise CaptionsError(f"several Karpathy split files in {root}: {', '.join(map(str, karpathy))}; pass --captions <one of them>.")
    if karpathy:
        return karpathy
    splits = [root / f"{s}{x}" for s in SPLIT_NAMES for x in CAPTION_SUFFIXES if (root / f"{s}{x}").is_file()]
    if splits:
        return splits
    return [root / f"captions{x}" for x in CAPTION_SUFFIXES if (root / f"captions{x}").is_file()][:1]


def _json_records(root: Path, path: Path, default_split: str, outside: bool) -> list[ImageRecord]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, deep nesting
        raise CaptionsError(f"{path} is not a readable JSON file: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("images"), list):
        raise CaptionsError(f"{path}: expected a Karpathy split file or COCO caption annotations (an 'images' list).")
    if isinstance(doc.get("annotations"), list):
        return _coco_records(root, path, doc, default_split, outside)
    records = []
    for pos, im in enumerate(doc["images"]):
        where = f"{path}: image entry {pos}"
        try:
            key = im.get("cocoid", im.get("imgid"))
            folder, filename = im.get("filepath", "") or "", im["filename"]
            caps = [s["raw"] for s in im.get("sentences", [])]
        except (AttributeError, KeyError, TypeError):
            raise CaptionsError(
                f"{where} is not a Karpathy entry (filename, imgid or cocoid, sentences[].raw)."
            ) from None
        rel = Path(check_text_name(folder, where, "filepath", CaptionsError) if folder else "") / check_text_name(
            filename, where, "filename", CaptionsError)
        if key is None:
            raise CaptionsError(f"{where} ({rel}) has no 'imgid' or 'cocoid'.")
        inside_root(root / rel, root, where, allow_outside=outside, error=CaptionsError)
        split = plain_name(im.get("split", default_split), where, "split", CaptionsError)
        records.append(ImageRecord(plain_id(key, where, CaptionsError), rel.as_posix(), root / rel, split, caps, im))
    return records


def _coco_records(root: Path, path: Path, doc: dict[str, Any], default_split: str, outside: bool) -> list[ImageRecord]:
    try:
        images = {im["id"]: im["file_name"] for im in doc["images"]}
        grouped: dict[Any, list[str]] = {k: [] for k in images}
        for ann in doc["annotations"]:
            grouped[ann["image_id"]].append(ann["caption"])
    except (KeyError, TypeError) as exc:
        raise CaptionsError(
            f"{path}: COCO caption annotations need images (id, file_name) and annotations (image_id, caption) "
            f"of listed images; {exc!r} is missing."
        ) from None
    records = []
    for pos, (k, name) in enumerate(images.items()):
        where = f"{path}: images[{pos}] (id {k!r})"
        name = check_text_name(name, where, "file_name", CaptionsError)
        inside_root(root / name, root, where, allow_outside=outside, error=CaptionsError)
        records.append(ImageRecord(plain_id(k, where, CaptionsError), name, root / name, default_split, grouped[k]))
    return records


def _table_records(root: Path, files: list[Path], default_split: str, outside: bool) -> list[ImageRecord]:
    order: dict[Path, ImageRecord] = {}
    for f in files:
        split_of_file = f.stem if f.stem in SPLIT_NAMES and f.parent == root else None
        for image, caption, split, where in _rows(f):
            check_text_name(image, where, "image path", CaptionsError)
            path = inside_root(f.parent / image, root, where, allow_outside=outside, error=CaptionsError)
            split = plain_name(split, where, "split", CaptionsError) if split else split_of_file or default_split
            record = order.get(path)
            if record is None:
                name = _relative(path, root)
                record = order[path] = ImageRecord(str(len(order)), name, path, split)
            elif record.split != split:
                raise CaptionsError(f"{where}: image {image} is in split {split!r} here but {record.split!r} before.")
            record.captions.append(caption)
    return list(order.values())


def _relative(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root.resolve()).as_posix()
    except ValueError:
        return path.as_posix()


def _rows(path: Path) -> list[tuple[str, str, str | None, str]]:
    """``(image, caption, split or None, "file:line")`` of a CSV / JSONL captions file."""
    if path.suffix not in CAPTION_SUFFIXES:
        raise CaptionsError(f"{path}: a captions file is a .csv, .jsonl or a Karpathy / COCO .json file.")
    rows = read_caption_rows(path, CaptionsError)
    for image, caption, _, where in rows:
        if not image.strip() or not caption.strip():
            raise CaptionsError(f"{where}: empty image path or caption.")
    if not rows:
        raise CaptionsError(f"{path} has no rows (image, caption).")
    return [(i.strip(), c.strip(), s, w) for i, c, s, w in rows]


def _check(records: list[ImageRecord], files: list[Path]) -> None:
    where = ", ".join(map(str, files))
    if not records:
        raise CaptionsError(f"{where} lists no images.")
    seen: dict[str, str] = {}
    for r in records:
        if r.key in seen:
            raise CaptionsError(f"{where}: id {r.key} is used by both {seen[r.key]} and {r.name}; ids must be unique.")
        seen[r.key] = r.name
        if any(not isinstance(c, str) or not c.strip() for c in r.captions):
            raise CaptionsError(f"{where}: image {r.name} (id {r.key}) has an empty caption.")
    missing = [str(r.path) for r in records if not r.path.is_file()]
    if missing:
        raise DataFileNotFoundError(f"{where} names {len(missing)} image files that do not exist: {first_few(missing)}.")
