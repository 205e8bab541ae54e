"""File reading shared by the dataset layouts: each failure names the path and what was expected."""

from __future__ import annotations

import io
import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import torch

from xmatch.model.inputs import normalize_boxes
from xmatch.data.errors import DataError, DataFileNotFoundError


def require_dir(path: Path, what: str) -> Path:
    if not path.is_dir():
        raise DataFileNotFoundError(f"{what}: folder {path} does not exist.")
    return path


def require_file(path: Path, what: str) -> Path:
    if not path.is_file():
        raise DataFileNotFoundError(f"{what}: file {path} does not exist.")
    return path


def load_json(path: Path, what: str) -> Any:
    require_file(path, what)
    try:
        with path.open("r", encoding="utf-8") as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataError(f"{what}: {path} is not valid JSON: {exc}") from None


def load_npy(path: Path, what: str, *, mmap: bool) -> np.ndarray:
    """``np.load`` of a plain (non-pickled) .npy array, memory-mapped when ``mmap``."""
    require_file(path, what)
    try:
        return np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except ValueError as exc:
        if "pickle" in str(exc).lower():
            raise DataError(
                f"{what}: {path} holds pickled Python objects, which xmatch does not unpickle "
                "(a pickle can run code). Convert it once into a plain numeric array, e.g. "
                "np.save(path, np.asarray(np.load(path, allow_pickle=True).tolist(), dtype=np.float64)) "
                "for a file you trust."
            ) from None
        raise DataError(f"{what}: {path} is not a readable .npy array: {exc}") from None
    except (OSError, EOFError) as exc:
        raise DataError(f"{what}: {path} is not a readable .npy array: {exc}") from None


def load_ids(path: Path, what: str) -> np.ndarray:
    """Integer ids from a ``.npy`` array or a text file with one id a line."""
    if path.suffix == ".npy":
        ids = load_npy(path, what, mmap=False)
        if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
            raise DataError(f"{what}: {path} must be a 1-D integer array, got {ids.dtype} {ids.shape}.")
        return ids.astype(np.int64)
    lines = read_lines(path, what)
    try:
        return np.array([int(line) for line in lines], dtype=np.int64)
    except ValueError as exc:
        raise DataError(f"{what}: {path} must hold one integer id a line: {exc}") from None


def read_lines(path: Path, what: str) -> list[str]:
    """The stripped lines of a UTF-8 text file; an empty line is an error naming it."""
    require_file(path, what)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise DataError(f"{what}: {path} is not UTF-8 text: {exc}") from None
    out = [line.strip() for line in lines]
    empty = [i + 1 for i, line in enumerate(out) if not line]
    if empty:
        raise DataError(f"{what}: {path} has empty lines {first_few(empty)}; every line must hold one caption.")
    return out


class _NoGlobalsUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing to load the global {module}.{name}")


def load_plain_pickle(path: Path, what: str) -> Any:
    """Unpickle a file made only of builtin containers and numbers (no class is ever
    imported, so no code can run), e.g. TERAN's ``sizes.pkl`` list of (width, height)."""
    require_file(path, what)
    try:
        return _NoGlobalsUnpickler(io.BytesIO(path.read_bytes())).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as exc:
        raise DataError(
            f"{what}: {path} is not a pickle of plain lists / tuples / numbers ({exc})."
        ) from None


def check_regions(regions: np.ndarray, where: str, feature_dim: int, reference: str) -> np.ndarray:
    """``[R, F]`` finite features of the dataset's width, as float32."""
    if regions.ndim != 2:
        raise DataError(f"{where}: region features must be [regions, features], got shape {regions.shape}.")
    if regions.shape[0] == 0:
        raise DataError(f"{where}: the image has no regions.")
    if regions.shape[1] != feature_dim:
        raise DataError(
            f"{where}: features are {regions.shape[1]} wide but the dataset's are {feature_dim} "
            f"(from {reference}); all items must come from the same extractor."
        )
    if not np.issubdtype(regions.dtype, np.floating):
        raise DataError(f"{where}: region features must be floating point, got {regions.dtype}.")
    regions = np.asarray(regions, dtype=np.float32)
    if not np.isfinite(regions).all():
        raise DataError(f"{where}: region features contain NaN or inf.")
    return regions


def check_boxes(boxes: np.ndarray, where: str, num_regions: int) -> np.ndarray:
    """``[R, 4]`` finite boxes, one per region."""
    if boxes.ndim != 2 or boxes.shape[1] != 4:
        raise DataError(f"{where}: boxes must be [regions, 4] (x1, y1, x2, y2), got shape {boxes.shape}.")
    if boxes.shape[0] != num_regions:
        raise DataError(f"{where}: {boxes.shape[0]} boxes for {num_regions} regions; there must be one box per region.")
    if not np.isfinite(boxes).all():
        raise DataError(f"{where}: boxes contain NaN or inf.")
    return boxes


def normalize_pixel_boxes(boxes: np.ndarray, size_wh: tuple[float, float], where: str, size_source: str) -> np.ndarray:
    """Pixel boxes divided by ``[W, H, W, H]`` (float64, then float32, as the original
    loader), checked to lie in [0, 1] with x2 >= x1 and y2 >= y1."""
    width, height = size_wh
    if not (width > 0 and height > 0):
        raise DataError(f"{where}: image size {width}x{height} (from {size_source}) is not positive.")
    out = normalize_boxes(torch.from_numpy(np.asarray(boxes, dtype=np.float64)), torch.tensor([width, height])).numpy()
    return check_normalized(out, where, f"the image is {width:g}x{height:g} pixels (size from {size_source})")


def check_normalized(boxes: np.ndarray, where: str, context: str) -> np.ndarray:
    if (boxes < 0).any() or (boxes > 1).any():
        raise DataError(
            f"{where}: boxes fall outside the image after normalisation (values {boxes.min():.4g}.."
            f"{boxes.max():.4g}, expected [0, 1]); {context}. Are the sizes those of the right images?"
        )
    if (boxes[:, 2] < boxes[:, 0]).any() or (boxes[:, 3] < boxes[:, 1]).any():
        raise DataError(f"{where}: boxes must be (x1, y1, x2, y2) with x2 >= x1 and y2 >= y1; some are not.")
    return boxes.astype(np.float32, copy=False)


def first_few(values: list[Any], n: int = 5) -> str:
    shown = ", ".join(str(v) for v in values[:n])
    return shown + (f" (and {len(values) - n} more)" if len(values) > n else "")

