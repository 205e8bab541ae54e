"""File reading shared by the dataset layouts: each failure names the path and what was expected."""

from __future__ import annotations

import io
import json
import math
import os
import pickle
import tokenize
import unicodedata
from pathlib import Path, PurePosixPath, PureWindowsPath
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
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, a huge integer, deep nesting
        raise DataError(f"{what}: {path} is not valid JSON: {exc}") from None
    except OSError as exc:
        raise DataError(f"{what}: {path} cannot be read: {exc}") from None


#: deflate expands data at most about 1032 times: an archive member claiming more is corrupt
MAX_DEFLATE_RATIO = 1100


def npy_header(stream: Any) -> tuple[tuple[int, ...], np.dtype, int]:
    """``(shape, dtype, data offset)`` from the header of a ``.npy`` stream (nothing else read).

    Raises:
        ValueError: not a ``.npy`` header of version 1.0 or 2.0 (what numpy writes for
            numeric arrays).
    """
    version = np.lib.format.read_magic(stream)
    readers = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
    if version not in readers:
        raise ValueError(f".npy format version {version[0]}.{version[1]} is not read here (1.0 or 2.0)")
    try:
        shape, _, dtype = readers[version](stream)
    except (SyntaxError, tokenize.TokenError) as exc:  # numpy parses the header as a Python literal
        raise ValueError(f"the .npy header is not a valid dictionary: {exc}") from None
    return shape, dtype, stream.tell()


def check_declared_size(shape: tuple[int, ...], dtype: np.dtype, available: int, where: str) -> None:
    """Refuse an array whose header declares more bytes than the file holds: numpy allocates
    the declared size before it reads (a 100-byte file can declare terabytes)."""
    declared = math.prod(shape) * dtype.itemsize
    if declared > available:
        raise DataError(
            f"{where}: the header declares a {dtype} array of shape {shape} ({declared:,} bytes) but the file holds "
            f"{max(available, 0):,} bytes of data; the file is truncated or corrupt."
        )


def check_npz_member(archive: Any, key: str, where: str) -> None:
    """:func:`check_declared_size` for the member ``key`` of an open ``np.load`` archive, against
    the size the archive records for it (itself bounded by the compressed size)."""
    info = archive.zip.getinfo(f"{key}.npy")
    if info.file_size > MAX_DEFLATE_RATIO * info.compress_size + 4096:
        raise DataError(
            f"{where}: the member {key}.npy claims {info.file_size:,} bytes from {info.compress_size:,} compressed, "
            "more than any compression gives; the file is corrupt."
        )
    with archive.zip.open(info) as stream:
        shape, dtype, offset = npy_header(stream)
    check_declared_size(shape, dtype, info.file_size - offset, where)


def load_npy(path: Path, what: str, *, mmap: bool) -> np.ndarray:
    """``np.load`` of a plain (non-pickled) .npy array, memory-mapped when ``mmap``; a header
    declaring more data than the file holds is refused before anything is allocated."""
    require_file(path, what)
    try:
        with path.open("rb") as stream:
            shape, dtype, offset = npy_header(stream)
        check_declared_size(shape, dtype, path.stat().st_size - offset, f"{what}: {path}")
        return np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except DataError:
        raise
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
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, OverflowError, MemoryError, RecursionError) as exc:
        # a hostile header (a frame or length claiming more bytes than exist) is a bad file, not a crash
        raise DataError(
            f"{what}: {path} is not a pickle of plain lists / tuples / numbers ({type(exc).__name__}: {exc})."
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


def is_real(dtype: np.dtype) -> bool:
    """Integer or floating point (not bool, complex, text or objects)."""
    return np.issubdtype(dtype, np.integer) or np.issubdtype(dtype, np.floating)


def check_boxes(boxes: np.ndarray, where: str, num_regions: int) -> np.ndarray:
    """``[R, 4]`` finite boxes, one per region."""
    if boxes.ndim != 2 or boxes.shape[1] != 4:
        raise DataError(f"{where}: boxes must be [regions, 4] (x1, y1, x2, y2), got shape {boxes.shape}.")
    if boxes.shape[0] != num_regions:
        raise DataError(f"{where}: {boxes.shape[0]} boxes for {num_regions} regions; there must be one box per region.")
    if not is_real(boxes.dtype):
        raise DataError(f"{where}: boxes must be integer or floating point numbers, got {boxes.dtype}.")
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


#: a file name's limit on common file systems (bytes of UTF-8)
MAX_NAME_BYTES = 255
#: a path's limit on Linux (``PATH_MAX``, bytes of UTF-8): the longest id an index takes
MAX_PATH_BYTES = 4096
#: what allows paths outside the declared folder, for the messages
OUTSIDE_OPTION = "allow_outside_root=True (xmatch extract --allow-outside-root)"


def unsafe_characters(text: str) -> list[str]:
    """The control and line-separator characters of ``text`` (``\\n``, ``\\x00``, U+2028...):
    a name holding one would break a one-name-a-line file or a terminal."""
    return [c for c in text if unicodedata.category(c) in ("Cc", "Zl", "Zp")]


def check_text_name(value: Any, where: str, what: str, error: type[Exception] = DataError) -> str:
    """``value`` as a name from a data file that is written or shown as text (an image's
    relative path, a caption file's split): a non-empty string without control characters.

    Example:
        >>> check_text_name("park/bench.png", "captions.csv:3", "image path")
        'park/bench.png'
        >>> check_text_name("a\\nb.png", "captions.csv:3", "image path")
        Traceback (most recent call last):
        ...
        xmatch.data.errors.DataError: captions.csv:3: the image path 'a\\nb.png' holds the control character '\\n'; ...
    """
    if not isinstance(value, str) or not value:
        raise error(f"{where}: the {what} must be a non-empty string, got {shown(value)}.")
    bad = unsafe_characters(value)
    if bad:
        raise error(
            f"{where}: the {what} {shown(value)} holds the control character {bad[0]!r}; a name with a newline or "
            "another control character would shift or break the files it is written to. Rename it."
        )
    return value


def plain_name(value: Any, where: str, what: str, error: type[Exception] = DataError) -> str:
    """``value`` as one plain path component (a split name, a feature id): no separator, not
    ``.`` / ``..``, not absolute, no control character, at most 255 bytes. Whatever a data
    file says, a plain name joined to a folder stays in that folder.

    Raises:
        error: naming ``where``, the value and the fix.

    Example:
        >>> plain_name("test", "captions.csv:2", "split")
        'test'
        >>> plain_name("../../x", "captions.csv:2", "split")
        Traceback (most recent call last):
        ...
        xmatch.data.errors.DataError: captions.csv:2: the split '../../x' is not a plain name ...
    """
    check_text_name(value, where, what, error)
    if "/" in value or _not_plain(value):
        raise error(
            f"{where}: the {what} {shown(value)} is not a plain name (it would become a path outside its folder: "
            "no '/', '\\', '..' or drive); use a plain name such as 'train'."
        )
    if len(value.encode("utf-8")) > MAX_NAME_BYTES:
        raise error(f"{where}: the {what} {shown(value)} is longer than a file name can be ({MAX_NAME_BYTES} bytes).")
    return value


def _not_plain(part: str) -> bool:
    """Whether one ``/``-free part of a name could leave its folder: ``.``, ``..``, a ``\\``
    (a separator on Windows) or a drive (``C:``)."""
    return "\\" in part or part in (".", "..") or bool(PurePosixPath(part).anchor or PureWindowsPath(part).anchor)


def plain_path(value: Any, where: str, what: str, error: type[Exception] = DataError) -> str:
    """``value`` as a relative path of plain names joined by ``/`` (a picture's path in its
    folder, an index id): every part a :func:`plain_name` (none empty, ``.`` or ``..``, no
    ``\\`` or drive, at most 255 bytes), no control character, at most 4096 bytes in all. It
    is the one rule for every id xmatch stores or prints: whatever a folder or a caller holds,
    such a name stays one line of a file, one line of a terminal, and a path inside its folder.

    Raises:
        error: naming ``where``, the value (cut short when long), the part at fault and the rule.

    Example:
        >>> plain_path("trip/beach.jpg", "photos", "id")
        'trip/beach.jpg'
        >>> plain_path("trip/../secret.jpg", "photos", "id")
        Traceback (most recent call last):
        ...
        xmatch.data.errors.DataError: photos: the id 'trip/../secret.jpg' is not a plain relative name: its part '..' ...
    """
    check_text_name(value, where, what, error)
    rule = (
        f"a {what} is plain names joined by '/', such as 'trip/beach.jpg': no empty part, '.', '..', '\\', drive or "
        f"control character, each part at most {MAX_NAME_BYTES} bytes and all at most {MAX_PATH_BYTES} bytes. Rename it."
    )
    if len(value.encode("utf-8")) > MAX_PATH_BYTES:
        raise error(f"{where}: the {what} {shown(value)} is longer than a path can be ({MAX_PATH_BYTES} bytes); {rule}")
    for part in value.split("/"):
        if not part:
            why = "it starts with '/' (an absolute path)" if value.startswith("/") else "it has an empty part ('//' or a final '/')"
        elif _not_plain(part):
            why = f"its part {shown(part)} would lead out of the folder"
        elif len(part.encode("utf-8")) > MAX_NAME_BYTES:
            why = f"its part {shown(part)} is longer than a file name can be"
        else:
            continue
        raise error(f"{where}: the {what} {shown(value)} is not a plain relative name: {why}; {rule}")
    return value


def shown(value: Any, limit: int = 100) -> str:
    """``repr(value)``, a string cut to its first ``limit`` characters: a 10,000-character name
    keeps a message one readable line.

    Example:
        >>> shown("x" * 1000, limit=8)
        "'xxxxxxxx'..."
    """
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]!r}..."
    text = repr(value)
    return text if len(text) <= 2 * limit else f"{text[: 2 * limit]}..."


def integer_id(value: Any, where: str, error: type[Exception] = DataError) -> int:
    """An image id that must be an integer: an int, or a float with an integral finite value
    (``7.0``, as some tools write JSON numbers); not NaN, inf, ``7.5``, a bool or a string."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    raise error(f"{where}: the id {value!r} is not an integer; ids name feature files and must be whole numbers.")


def plain_id(value: Any, where: str, error: type[Exception] = DataError) -> str:
    """The feature-file name of an image id from a data file (Karpathy ``imgid`` / ``cocoid``,
    a COCO ``id``): an integer (as :func:`integer_id`) or a string that is a plain name.

    Example:
        >>> plain_id(7.0, "dataset.json: image entry 0"), plain_id("im_7", "dataset.json: image entry 1")
        ('7', 'im_7')
    """
    return plain_name(value if isinstance(value, str) else str(integer_id(value, where, error)), where, "id", error)


def inside_root(
    path: Path, root: Path, where: str, *, allow_outside: bool = False, error: type[Exception] = DataError
) -> Path:
    """``path`` (named by a data file) resolved, symbolic links followed, and refused unless it
    lies inside ``root`` -- an absolute path, ``../`` or a link out of the folder would read a
    file the folder's owner did not put there.

    Args:
        path: the path as the data file gives it, joined to its base folder.
        root: the declared folder (the image folder, the captions file's folder).
        where: the entry, for the message (``captions.csv:4``, ``dataset.json: image entry 3``).
        allow_outside: accept any path (the caller trusts the data file).
        error: the exception to raise.

    Returns:
        The resolved path.

    Example:
        >>> Path("photos").mkdir(); Path("photos/a.png").touch()
        >>> inside_root(Path("photos/a.png"), Path("photos"), "captions.csv:2").name
        'a.png'
        >>> inside_root(Path("photos/../secret.png"), Path("photos"), "captions.csv:3")
        Traceback (most recent call last):
        ...
        xmatch.data.errors.DataError: captions.csv:3: photos/../secret.png resolves to ...secret.png, outside the folder ...
    """
    resolved = Path(os.path.realpath(path))
    if allow_outside or resolved.is_relative_to(os.path.realpath(root)):
        return resolved
    raise error(
        f"{where}: {path} resolves to {resolved}, outside the folder {root} (an absolute path, '..' or a "
        f"symbolic link): xmatch reads only files inside it. Move the file into {root}, or pass "
        f"{OUTSIDE_OPTION} if you trust the file that names it."
    )


def first_few(values: list[Any], n: int = 5) -> str:
    shown = ", ".join(str(v) for v in values[:n])
    return shown + (f" (and {len(values) - n} more)" if len(values) > n else "")

