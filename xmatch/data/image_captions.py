"""Raw images with a captions file, for models whose image encoder takes pixels.

The captions file is a CSV with a header ``image,caption`` or JSON lines
``{"image": ..., "caption": ...}``; image paths are relative to the file's folder and must
resolve (symbolic links followed) inside it, unless ``allow_outside_root=True``. An image with
several captions appears on several rows. Images are opened with Pillow only when an item is
loaded, and a picture larger than ``max_pixels`` (read from its header) is refused undecoded.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import numpy as np

from xmatch.data._io import check_text_name, first_few, inside_root
from xmatch.data.base import ImageTextDataset, check_index
from xmatch.data.errors import DataError, DataFileNotFoundError
from xmatch.io.pictures import MAX_PIXELS, ImageTooLargeError, check_pixels

FORMATS = {".csv": "csv", ".jsonl": "jsonl"}
COLUMNS = ("image", "caption")

if TYPE_CHECKING:
    from PIL.Image import Image

PathArg = str | os.PathLike


class ImageCaptionsDataset(ImageTextDataset):
    """Image files and their captions from one CSV / JSONL file; items are PIL images.

    Args:
        root: the captions file (``.csv`` or ``.jsonl``), or a folder holding
            ``<split>.csv`` or ``<split>.jsonl``.
        split: which file of a folder to read; with a file as ``root`` it is only a label.
        allow_outside_root: accept image paths that resolve outside the captions file's folder
            (absolute paths, ``..``, symbolic links out of it), for a file you trust.
        max_pixels: the largest picture :meth:`image` decodes (width x height, checked from
            the header first; default :data:`xmatch.io.pictures.MAX_PIXELS`, 50 megapixels).
        captions_per_image: keep the first N captions of every image, in file order (None:
            all). The papers' Recall@K protocol needs the same number for every image; a folder
            of one's own photos often has more for some (``--data-option captions_per_image=N``).

    Captions are grouped image by image in the order images first appear in the file (rows
    of one image need not be adjacent); ``caption_image`` maps each caption to its image.

    Raises:
        DataFileNotFoundError: the file or an image it names is missing.
        DataError: a missing ``image`` / ``caption`` column, a malformed JSON line, an empty
            caption or image path, a path with a control character or outside the folder, a
            file without rows, an image with fewer than ``captions_per_image`` captions; at
            load time an unreadable image.
        xmatch.io.pictures.ImageTooLargeError: at load time, a picture over ``max_pixels``.

    Example:
        >>> from PIL import Image
        >>> Image.new("RGB", (64, 48)).save("dog.jpg")
        >>> _ = Path("captions.csv").write_text("image,caption\\ndog.jpg,a dog on a bench\\ndog.jpg,a brown dog resting\\n")
        >>> ds = ImageCaptionsDataset("captions.csv")
        >>> ds.image(0).size, ds.captions[:2]
        ((64, 48), ['a dog on a bench', 'a brown dog resting'])
    """

    def __init__(
        self, root: PathArg, split: str | None = None, *, allow_outside_root: bool = False, max_pixels: int = MAX_PIXELS,
        captions_per_image: int | None = None,
    ) -> None:
        root = Path(root)
        self.root, self.split, self.max_pixels = root, split, max_pixels
        self.captions_file = self._captions_file(root, split)
        rows = self._read_rows(self.captions_file)
        folder = self.captions_file.parent
        order: dict[str, list[str]] = {}
        for image, caption, where in rows:
            if image not in order:
                inside_root(folder / image, folder, where, allow_outside=allow_outside_root)
            order.setdefault(image, []).append(caption)
        if captions_per_image is not None:
            order = self._first_captions(order, captions_per_image)
        self.image_paths = [folder / name for name in order]
        missing = [str(p) for p in self.image_paths if not p.is_file()]
        if missing:
            raise DataFileNotFoundError(
                f"{self.captions_file} names {len(missing)} image files that do not exist: {first_few(missing)}."
            )
        texts = [c for caps in order.values() for c in caps]
        owner = np.repeat(np.arange(len(order)), [len(caps) for caps in order.values()])
        self._set_index(texts, owner, list(order))

    def _first_captions(self, order: dict[str, list[str]], n: int) -> dict[str, list[str]]:
        """The first ``n`` captions of every image; an image with fewer is an error naming it."""
        if n < 1:
            raise DataError(f"image-captions: captions_per_image must be at least 1, got {n}.")
        short = [f"{image} ({len(caps)})" for image, caps in order.items() if len(caps) < n]
        if short:
            fewest = min(len(caps) for caps in order.values())
            raise DataError(
                f"{self.captions_file}: captions_per_image={n}, but {len(short)} images have fewer captions: "
                f"{first_few(short)}; pass captions_per_image={fewest} (the fewest any image has) or add captions."
            )
        return {image: caps[:n] for image, caps in order.items()}

    @staticmethod
    def _captions_file(root: Path, split: str | None) -> Path:
        if root.is_file():
            if root.suffix not in FORMATS:
                raise DataError(f"{root}: a captions file must end in {' or '.join(FORMATS)}.")
            return root
        if not root.is_dir():
            raise DataFileNotFoundError(
                f"image-captions: {root} does not exist (expected a .csv / .jsonl file or a folder)."
            )
        if split is None:
            raise DataError(
                f"image-captions: {root} is a folder; pass split= to read <split>.csv or <split>.jsonl from it."
            )
        candidates = [root / f"{split}{suffix}" for suffix in FORMATS]
        found = [c for c in candidates if c.is_file()]
        if not found:
            raise DataFileNotFoundError(
                f"image-captions: split {split!r}: neither {' nor '.join(map(str, candidates))} exists."
            )
        if len(found) > 1:
            raise DataError(f"both {' and '.join(map(str, found))} exist; keep one.")
        return found[0]

    @staticmethod
    def _read_rows(path: Path) -> list[tuple[str, str, str]]:
        """``(image, caption, "file:line")`` of each row, stripped and checked."""
        rows = read_caption_rows(path)
        if not rows:
            raise DataError(f"{path} has no rows (image, caption).")
        for image, caption, _, where in rows:
            if not image.strip():
                raise DataError(f"{where}: empty image path.")
            check_text_name(image.strip(), where, "image path")
            if not caption.strip():
                raise DataError(f"{where}: empty caption for image {image!r}.")
        return [(image.strip(), caption.strip(), where) for image, caption, _, where in rows]

    def image(self, index: int) -> Image:
        """Image ``index`` as an RGB ``PIL.Image.Image`` (read from disk now)."""
        from PIL import Image as PILImage

        path = self.image_paths[check_index(index, self.num_images, "image")]
        try:
            with PILImage.open(path) as im:
                check_pixels(im.size, f"image-captions: {path}", self.max_pixels,
                             f"pass max_pixels={im.size[0] * im.size[1]} (--data-option max_pixels=...)")
                return im.convert("RGB")
        except FileNotFoundError:
            raise DataFileNotFoundError(f"image-captions: image file {path} does not exist.") from None
        except ImageTooLargeError:
            raise
        except (OSError, ValueError, SyntaxError, EOFError, PILImage.DecompressionBombError) as exc:  # a corrupt file
            raise DataError(f"{path} is not a readable image: {exc!r}") from None


def read_caption_rows(path: Path, error: type[Exception] = DataError) -> list[tuple[str, str, str | None, str]]:
    """``(image, caption, split or None, "file:line")`` of each row of a captions file: a CSV
    whose header names ``image`` and ``caption`` (and optionally ``split``), or JSON lines
    ``{"image": ..., "caption": ...}`` (an optional ``"split"``; blank lines are skipped).
    Values are as written; problems raise ``error`` naming the file and the line.

    The one reader of captions files: the ``image-captions`` dataset and ``xmatch extract``
    both use it.

    Example:
        >>> _ = Path("captions.jsonl").write_text('{"image": "a.jpg", "caption": "a dog"}\\n', encoding="utf-8")
        >>> read_caption_rows(Path("captions.jsonl"))
        [('a.jpg', 'a dog', None, 'captions.jsonl:1')]
    """
    try:
        with path.open("r", encoding="utf-8-sig", newline="") as f:
            return _csv_rows(f, path, error) if path.suffix == ".csv" else _jsonl_rows(f, path, error)
    except UnicodeDecodeError as exc:
        raise error(f"{path} is not UTF-8 text: {exc}") from None
    except csv.Error as exc:
        raise error(f"{path} is not a valid CSV file: {exc}") from None
    except OSError as exc:
        raise error(f"{path} cannot be read: {exc}") from None


def _csv_rows(f: TextIO, path: Path, error: type[Exception]) -> list[tuple[str, str, str | None, str]]:
    reader = csv.DictReader(f)
    if not reader.fieldnames or not set(COLUMNS) <= set(reader.fieldnames):
        raise error(
            f"{path}: the first line must be a header with columns 'image' and 'caption' (and optionally "
            f"'split'), got {reader.fieldnames}."
        )
    return [(row["image"] or "", row["caption"] or "", row.get("split") or None, f"{path}:{reader.line_num}")
            for row in reader]


def _jsonl_rows(f: TextIO, path: Path, error: type[Exception]) -> list[tuple[str, str, str | None, str]]:
    rows = []
    for n, line in enumerate(f, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError) as exc:  # JSONDecodeError, a huge integer, deep nesting
            raise error(f"{path}:{n}: not a JSON object: {exc}") from None
        if not isinstance(record, dict) or not all(isinstance(record.get(k), str) for k in COLUMNS):
            raise error(f'{path}:{n}: expected {{"image": str, "caption": str}}, got {line.strip()[:80]}')
        split = record.get("split")
        if split is not None and not isinstance(split, str):
            raise error(f'{path}:{n}: "split" must be a string, got {split!r}.')
        rows.append((record["image"], record["caption"], split, f"{path}:{n}"))
    return rows
