"""Writing extracted regions in the layouts the field distributes, one image at a time.

- ``teran``: TERAN / TERN's bottom-up layout, ``bu_att/<id>.npz`` (array ``feat``,
  ``[R, F]``) and ``bu_box/<id>.npy`` (``[R, 4]`` float32 pixel boxes x1, y1, x2, y2), plus a
  Karpathy split file ``dataset_xmatch.json`` whose images carry ``width`` / ``height`` (what the
  ``teran`` dataset divides the boxes by);
- ``precomp``: SCAN / VSE++'s ``<split>_ims.npy`` (``[images, R, F]``), ``<split>_caps.txt``
  (``c`` lines per image), ``<split>_boxes.npy`` and ``<split>_img_sizes.npy`` (read by the
  ``scan-precomp`` dataset), plus ``<split>_images.txt`` (the image of each row). Regions are
  first written per image (as the teran layout, in a staging folder), then assembled.

Every file is written to a temporary name and renamed into place, so a killed run never leaves
a half-written file under a final name, and ``.npz`` archives carry a fixed timestamp, so the
same regions give byte-identical files in every run.
"""

from __future__ import annotations

import io
import json
import os
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from xmatch.extract.captions import ImageRecord

DATASET_FILE = "dataset_xmatch.json"
#: split names of the precomp layout's file prefixes (SCAN calls the validation split "dev")
PRECOMP_PREFIX = {"val": "dev"}
LAYOUTS = ("teran", "precomp")


def _tmp(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """``data`` into ``path`` through a temporary file and a rename."""
    tmp = _tmp(path)
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, np.ascontiguousarray(array), allow_pickle=False)
    return buffer.getvalue()


#: zlib level of the region files
NPZ_LEVEL = 1


def npz_bytes(**arrays: np.ndarray) -> bytes:
    """A compressed ``.npz`` archive with a fixed timestamp (``np.savez_compressed`` stamps the
    current time, so the same arrays would give different files). zlib's level 1: region
    features barely compress further at its default 6 (files 9 % smaller), which took a fifth
    of the extraction's time at 224 px."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=NPZ_LEVEL) as archive:
        for name, array in arrays.items():
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, npy_bytes(array), compresslevel=NPZ_LEVEL)
    return buffer.getvalue()


def write_json_atomic(path: Path, doc: Any) -> None:
    write_bytes_atomic(path, (json.dumps(doc, indent=1, sort_keys=False) + "\n").encode("utf-8"))


def remove_temporaries(folder: Path) -> None:
    """Delete temporary files a killed run left behind."""
    if folder.is_dir():
        for leftover in folder.glob(".*.tmp-*"):
            leftover.unlink(missing_ok=True)


class RegionFiles:
    """Per-image region files in the bottom-up layout under ``folder`` (``bu_att``, ``bu_box``).

    Example:
        >>> files = RegionFiles(Path("feats"))
        >>> files.create()
        >>> files.write("7", np.zeros((36, 1280), np.float32), np.zeros((36, 4), np.float32))
        >>> sorted(str(p) for p in Path("feats").rglob("*") if p.is_file())
        ['feats/bu_att/7.npz', 'feats/bu_box/7.npy']
    """

    def __init__(self, folder: Path, dtype: str = "float32") -> None:
        self.att, self.box = folder / "bu_att", folder / "bu_box"
        self.dtype = np.dtype(dtype)

    def create(self) -> None:
        """The folders, without the temporary files a killed run left behind."""
        for d in (self.att, self.box):
            d.mkdir(parents=True, exist_ok=True)
            remove_temporaries(d)

    def done(self, key: str) -> bool:
        """Both files of image ``key`` are in place (each is renamed in when complete)."""
        return (self.att / f"{key}.npz").is_file() and (self.box / f"{key}.npy").is_file()

    def write(self, key: str, features: np.ndarray, boxes: np.ndarray) -> None:
        # the boxes first: the features file is the one whose presence counts an image as done
        write_bytes_atomic(self.box / f"{key}.npy", npy_bytes(np.asarray(boxes, dtype=np.float32)))
        write_bytes_atomic(self.att / f"{key}.npz", npz_bytes(feat=np.asarray(features, dtype=self.dtype)))

    def read(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        with np.load(self.att / f"{key}.npz") as archive:
            features = archive["feat"]
        return features, np.load(self.box / f"{key}.npy")


def karpathy_document(records: Sequence[ImageRecord], sizes: dict[str, tuple[int, int]]) -> dict[str, Any]:
    """The Karpathy split file of the extracted images: ``split``, the id (``imgid``, or the
    source's ``cocoid``), ``filepath`` / ``filename`` relative to the image folder,
    ``sentences[].raw``, and ``width`` / ``height`` (after EXIF rotation) for the box
    normalisation."""
    images, sentid = [], 0
    for r in records:
        path = Path(r.name)
        entry: dict[str, Any] = {"split": r.split}
        if r.entry is not None and "cocoid" in r.entry:
            entry["cocoid"] = r.entry["cocoid"]
        entry["imgid"] = r.entry["imgid"] if r.entry is not None and "imgid" in r.entry else _id(r.key)
        ids = list(range(sentid, sentid + len(r.captions)))
        entry.update({
            "filepath": path.parent.as_posix() if str(path.parent) != "." else "",
            "filename": path.name,
            "sentids": ids,
            "sentences": [{"raw": c, "imgid": entry["imgid"], "sentid": s} for c, s in zip(r.captions, ids)],
            "width": sizes[r.key][0],
            "height": sizes[r.key][1],
        })
        sentid += len(r.captions)
        images.append(entry)
    return {"dataset": "xmatch-extract", "images": images}


def _id(key: str) -> int | str:
    # a zero-padded key (img2dataset's 000000011) stays a string: as an integer it would name another feature file
    return int(key) if key.isdigit() and str(int(key)) == key else key


def write_teran(out: Path, records: Sequence[ImageRecord], sizes: dict[str, tuple[int, int]]) -> None:
    """The dataset file of the teran layout (the region files are already in place)."""
    write_json_atomic(out / DATASET_FILE, karpathy_document(records, sizes))


def write_precomp(
    out: Path, records: Sequence[ImageRecord], sizes: dict[str, tuple[int, int]], dtype: str, parts: RegionFiles
) -> list[Path]:
    """Assemble the per-image region files ``parts`` into the precomp layout, split by split;
    returns the files written. Every image must have the same number of regions and captions
    (checked before extraction by :func:`check_precomp`)."""
    written = []
    by_split: dict[str, list[ImageRecord]] = {}
    for r in records:
        by_split.setdefault(r.split, []).append(r)
    for split, members in by_split.items():
        prefix = PRECOMP_PREFIX.get(split, split)
        first, _ = parts.read(members[0].key)
        shape = (len(members), *first.shape)
        ims = out / f"{prefix}_ims.npy"
        tmp = _tmp(ims)
        array = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.dtype(dtype), shape=shape)
        boxes = np.zeros((len(members), first.shape[0], 4), np.float32)
        for i, r in enumerate(members):
            features, box = parts.read(r.key)
            if features.shape != first.shape:
                del array
                tmp.unlink()
                raise ValueError(
                    f"the precomp layout needs the same number of regions for every image: image {r.name} has "
                    f"{features.shape[0]}, image {members[0].name} {first.shape[0]}; use --layout teran."
                )
            array[i], boxes[i] = features, box
        array.flush()
        del array
        os.replace(tmp, ims)
        write_bytes_atomic(out / f"{prefix}_boxes.npy", npy_bytes(boxes))
        size = np.array([sizes[r.key] for r in members], dtype=np.float32)
        write_bytes_atomic(out / f"{prefix}_img_sizes.npy", npy_bytes(size))
        lines = "".join(f"{' '.join(c.split())}\n" for r in members for c in r.captions)
        write_bytes_atomic(out / f"{prefix}_caps.txt", lines.encode("utf-8"))
        write_bytes_atomic(out / f"{prefix}_images.txt", "".join(f"{r.name}\n" for r in members).encode("utf-8"))
        written += [ims, out / f"{prefix}_caps.txt"]
    return written


def check_precomp(records: Sequence[ImageRecord], fixed_regions: bool) -> None:
    """The precomp layout stores one array per split and consecutive caption lines: it needs a
    fixed region count and the same number of captions for every image."""
    if not fixed_regions:
        raise ValueError(
            "the precomp layout stores a fixed number of regions per image; set min_regions = regions "
            "(or use --layout teran, which stores any number per image)."
        )
    counts = {len(r.captions) for r in records}
    if counts == {0}:
        raise ValueError("the precomp layout stores captions with the features; give --captions (or use --layout teran).")
    if len(counts) != 1:
        odd = [f"{r.name} ({len(r.captions)})" for r in records if len(r.captions) != min(counts)][:5]
        raise ValueError(
            f"the precomp layout needs the same number of captions for every image, got {sorted(counts)} "
            f"(e.g. {', '.join(odd)}); use --layout teran."
        )
