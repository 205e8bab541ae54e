"""The SCAN / VSE++ "precomp" layout (Lee et al., "Stacked Cross Attention for Image-Text
Matching", ECCV 2018; kuanghuei/SCAN ``data.py:PrecompDataset``).

``<root>/<split>_ims.npy`` holds ``[rows, 36, 2048]`` bottom-up features and
``<root>/<split>_caps.txt`` one caption a line, ``captions_per_image`` consecutive lines per
image. ``rows`` is either one per image (caption k belongs to row k // 5) or one per caption
(the original's ``im_div = 1`` case, e.g. ``10crop_precomp``: caption k uses row k, and the
image of captions 5i..5i+4 is row 5i, as the original evaluation takes ``images[::5]``).
The features are memory-mapped, never read whole.

The SCAN files carry no boxes. Later works distribute ``<split>_boxes.npy`` (``[rows, R, 4]``
pixel x1, y1, x2, y2) with ``<split>_img_sizes.npy`` (``[rows, 2]`` width, height), or
``<split>_ims_bbx.npy`` with ``<split>_ims_size.npy``; these are read when present. Without
boxes every region gets the full-image box ``[0, 0, 1, 1]`` (with a warning): a region model
that conditions on boxes then sees no geometry, one that ignores them (SCAN) is unaffected.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from xmatch.data._io import (
    check_boxes,
    check_normalized,
    check_regions,
    is_real,
    load_npy,
    normalize_pixel_boxes,
    read_lines,
    require_dir,
    require_file,
)
from xmatch.data.base import ImageTextDataset, check_index
from xmatch.data.errors import DataError, DataFileNotFoundError
from xmatch.data.items import RegionImage

BOX_FILES = ("{split}_boxes.npy", "{split}_ims_bbx.npy")
SIZE_FILES = ("{split}_img_sizes.npy", "{split}_ims_size.npy")

PathArg = str | os.PathLike


class PrecompDataset(ImageTextDataset):
    """SCAN precomp features (memory-mapped ``<split>_ims.npy``) and ``<split>_caps.txt``.

    Args:
        root: the folder, e.g. ``data/coco_precomp``.
        split: a file prefix present in ``root`` (``train``, ``dev``, ``test``, ``testall``;
            ``val`` reads ``dev``). On COCO, ``test`` is 1K images and ``testall`` the 5K
            Karpathy test split.
        captions_per_image: consecutive caption lines per image (5).
        boxes: a ``[rows, R, 4]`` box file (default: ``<split>_boxes.npy`` or
            ``<split>_ims_bbx.npy`` when present).
        sizes: a ``[rows, 2]`` (width, height) file the pixel boxes are divided by (default:
            ``<split>_img_sizes.npy`` or ``<split>_ims_size.npy`` when present).
        boxes_normalized: the box file already holds boxes in [0, 1]; no sizes are needed.
        max_images: keep the first N images (SCAN validates on the first 1,000 dev images).

    Raises:
        DataFileNotFoundError: the folder, the split's features / captions, or a given box /
            size file is missing.
        DataError: an unknown split, a caption count that is not ``captions_per_image`` per
            image row (nor one per row), an empty caption line, arrays of the wrong shape, box
            without sizes; at load time NaN features or boxes outside the image.

    Example:
        >>> np.save("test_ims.npy", np.ones((2, 36, 8), np.float32))  # data/f30k_precomp: 1000 images
        >>> _ = Path("test_caps.txt").write_text("".join(f"caption {k}\\n" for k in range(10)))
        >>> np.save("test_boxes.npy", np.tile(np.float32([0.1, 0.1, 0.5, 0.5]), (2, 36, 1)))
        >>> ds = PrecompDataset(".", "test", boxes_normalized=True)
        >>> ds.num_images, len(ds), type(ds.features).__name__
        (2, 10, 'memmap')
    """

    def __init__(
        self,
        root: PathArg,
        split: str,
        *,
        captions_per_image: int = 5,
        boxes: PathArg | None = None,
        sizes: PathArg | None = None,
        boxes_normalized: bool = False,
        max_images: int | None = None,
    ) -> None:
        self.root = require_dir(Path(root), "scan-precomp dataset root")
        if captions_per_image < 1:
            raise ValueError(f"captions_per_image must be at least 1, got {captions_per_image}.")
        if max_images is not None and max_images < 1:
            raise ValueError(f"max_images must be at least 1 or None, got {max_images}.")
        self.split = self._resolve_split(split)
        self.features_file = self.root / f"{self.split}_ims.npy"
        self.captions_file = self.root / f"{self.split}_caps.txt"
        self._map_features()
        if self.features.ndim != 3 or not np.issubdtype(self.features.dtype, np.floating):
            raise DataError(
                f"{self.features_file} must be a float array [images, regions, features], "
                f"got {self.features.dtype} {self.features.shape}."
            )
        rows, c = len(self.features), captions_per_image
        texts = read_lines(self.captions_file, "scan-precomp captions")
        if not texts:
            raise DataError(f"{self.captions_file} has no captions.")
        if rows * c == len(texts):
            self.rows_per_caption = False
        elif rows == len(texts) and rows % c == 0:
            self.rows_per_caption = True  # the original's im_div = 1
        else:
            hint = f"; pass captions_per_image={len(texts) // rows}" if rows and len(texts) % rows == 0 else ""
            raise DataError(
                f"{self.captions_file} has {len(texts)} lines, which is neither {c} per image row of "
                f"{self.features_file} ({rows} rows -> {rows * c} lines) nor one per row{hint}."
            )
        n_images = len(texts) // c if max_images is None else min(len(texts) // c, max_images)
        texts = texts[: n_images * c]
        self.boxes_file, self.sizes_file = self._box_files(boxes, sizes, boxes_normalized)
        self._map_boxes()
        self.has_boxes = self.boxes_file is not None
        self._sizes = None
        if self.sizes_file is not None:
            self._sizes = load_npy(self.sizes_file, "scan-precomp image sizes", mmap=False)
            if self._sizes.shape != (rows, 2) or not is_real(self._sizes.dtype):
                raise DataError(
                    f"{self.sizes_file} must be a real numeric array [{rows}, 2] (width, height per row of "
                    f"{self.features_file.name}), got {self._sizes.dtype} {self._sizes.shape}."
                )
            self.size_source = f"sizes file {self.sizes_file}"
        elif self.has_boxes:
            self.size_source = f"none: {self.boxes_file} holds normalised boxes"
        else:
            self.size_source = "none: no box file, full-image boxes"
            box_names = " or ".join(f.format(split=self.split) for f in BOX_FILES)
            warnings.warn(
                f"{self.root} has no box file for split {self.split!r} ({box_names}): "
                "every region gets the full-image box [0, 0, 1, 1], so a box-conditioned image encoder "
                "(TERAN, TERN) sees no region geometry.",
                stacklevel=2,
            )
        self._c = c
        self._set_index(texts, np.arange(len(texts)) // c, [str(self._image_row(i)) for i in range(n_images)])

    def _resolve_split(self, split: str) -> str:
        present = sorted(p.name[: -len("_ims.npy")] for p in self.root.glob("*_ims.npy"))
        if split in present:
            return split
        if split == "val" and "dev" in present:
            return "dev"
        expected = self.root / f"{split}_ims.npy"
        if not present:
            raise DataFileNotFoundError(
                f"scan-precomp: {self.root} has no <split>_ims.npy files (expected e.g. {expected})."
            )
        raise DataError(f"unknown split {split!r}: {expected} does not exist; splits present: {', '.join(present)}.")

    def _box_files(
        self, boxes: PathArg | None, sizes: PathArg | None, boxes_normalized: bool
    ) -> tuple[Path | None, Path | None]:
        def pick(given: PathArg | None, patterns: tuple[str, ...], what: str) -> Path | None:
            if given is not None:
                return require_file(Path(given), what)
            found = [self.root / p.format(split=self.split) for p in patterns]
            return next((f for f in found if f.is_file()), None)

        box_file = pick(boxes, BOX_FILES, "scan-precomp boxes")
        if box_file is None:
            if boxes_normalized or sizes is not None:
                raise DataFileNotFoundError(
                    f"scan-precomp boxes: boxes_normalized / sizes= given but there is no box file "
                    f"({', '.join(str(self.root / p.format(split=self.split)) for p in BOX_FILES)})."
                )
            return None, None
        if boxes_normalized:
            if sizes is not None:
                raise DataError("sizes= has no use with boxes_normalized=True; remove one of them.")
            return box_file, None
        size_file = pick(sizes, SIZE_FILES, "scan-precomp image sizes")
        if size_file is None:
            raise DataError(
                f"{box_file} holds pixel boxes but there is no image size file "
                f"({', '.join(str(self.root / p.format(split=self.split)) for p in SIZE_FILES)}) to divide them by; "
                "pass sizes=<[rows, 2] width, height .npy>, or boxes_normalized=True if they are already in [0, 1]."
            )
        return box_file, size_file

    def _map_features(self) -> None:
        self.features = load_npy(self.features_file, "scan-precomp features", mmap=True)

    def _map_boxes(self) -> None:
        self._boxes: np.ndarray | None = None
        if self.boxes_file is None:
            return
        self._boxes = load_npy(self.boxes_file, "scan-precomp boxes", mmap=True)
        expected = (len(self.features), self.features.shape[1], 4)
        if self._boxes.shape != expected or not is_real(self._boxes.dtype):
            raise DataError(
                f"{self.boxes_file} must be [rows, regions, 4] = {expected} numbers to match {self.features_file.name}, "
                f"got {self._boxes.dtype} {self._boxes.shape}."
            )

    def __getstate__(self) -> dict[str, Any]:
        # A pickled memmap would carry the whole array (DataLoader workers under "spawn"):
        # send the paths and map the files again on the other side.
        state = self.__dict__.copy()
        state["features"] = state["_boxes"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._map_features()
        self._map_boxes()

    def _row(self, row: int) -> RegionImage:
        where = f"{self.features_file} row {row}"
        regions = check_regions(np.array(self.features[row]), where, self.features.shape[2], str(self.features_file))
        if self._boxes is None:
            return RegionImage(regions, np.tile(np.array([0, 0, 1, 1], np.float32), (len(regions), 1)))
        box_where = f"{self.boxes_file} row {row}"
        boxes = check_boxes(np.array(self._boxes[row]), box_where, len(regions))
        if self._sizes is None:
            return RegionImage(regions, check_normalized(boxes, box_where, "boxes_normalized=True"))
        width, height = (float(v) for v in self._sizes[row])
        size_where = f"{self.sizes_file} row {row}"
        return RegionImage(regions, normalize_pixel_boxes(boxes, (width, height), box_where, size_where))

    def image(self, index: int) -> RegionImage:
        """Regions ``[R, F]`` and boxes ``[R, 4]`` (in [0, 1]) of image ``index``."""
        return self._row(self._image_row(check_index(index, self.num_images, "image")))

    def _image_row(self, index: int) -> int:
        return index * self._c if self.rows_per_caption else index

    def _pair_image(self, caption_index: int) -> RegionImage:
        return self._row(caption_index if self.rows_per_caption else caption_index // self._c)
