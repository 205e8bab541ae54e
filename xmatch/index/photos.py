"""Fill an image index from a folder of pictures, no captions needed (``xmatch index MODEL
--images DIR``), for models whose image encoder reads pixels (``timm-grid``,
``pixel-regions``, CLIP-family towers).

Each picture's id is its path relative to the folder (POSIX-style), so a hit names the file.
Pictures that cannot be indexed (broken, not an image, over the pixel budget, a name that is not
plain names joined by ``/`` as every index id must be, a link out of the folder) are skipped and
listed; every ``shard_size`` pictures are one committed append, so a killed run keeps what it
finished and ``resume=True`` (``--append``) encodes only the pictures not indexed yet.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

from xmatch.core.progress import progress_bar
from xmatch.data._io import plain_path
from xmatch.data.errors import DataError
from xmatch.index.errors import SearchIndexError
from xmatch.index.search import SearchIndex, check_compute_dtype
from xmatch.io.pictures import MAX_PIXELS, check_pixels
from xmatch.model.inputs import PixelInputs, input_type_of


def index_images(
    index: SearchIndex,
    folder: str | os.PathLike,
    *,
    batch_size: int = 64,
    shard_size: int = 1024,
    resume: bool = False,
    progress: bool = True,
    max_pixels: int = MAX_PIXELS,
    compute_dtype: str = "float32",
) -> tuple[int, list[tuple[str, str]]]:
    """Encode every picture under ``folder`` (recursively) into the image index ``index``.

    Args:
        index: an image index of a model that reads pixels.
        folder: the picture folder.
        batch_size: pictures encoded at once.
        shard_size: pictures per committed append.
        resume: skip pictures whose ids (relative paths) the index holds already; without it
            such ids are refused.
        progress: show a progress bar.
        max_pixels: pictures whose header declares more pixels are skipped, not decoded
            (``xmatch index --max-pixels``).
        compute_dtype: ``"bfloat16"`` encodes under bfloat16 autocast
            (:func:`xmatch.index.search.encoding`; 1.8x the pictures/s of a CLIP ViT-B/32 on a
            CPU with AVX512-BF16).

    Returns:
        ``(pictures added, [(relative path, why skipped), ...])``: a picture that cannot be
        read, one whose name is not a plain id (:func:`xmatch.data._io.plain_path`: a newline,
        a ``\\``...), and a link that leads out of the folder are skipped, each with the reason.

    Raises:
        SearchIndexError: a caption index, or a model that reads precomputed region features
            (the message gives the ``xmatch extract`` route).
        FileNotFoundError: no folder, or no picture file in it.
        ValueError: an unknown ``compute_dtype``, a batch or shard size below 1.

    Example:
        >>> index = xmatch.index.create("photos-idx", xmatch.build("clip-vit-b-32", pretrained=True))  # needs the hub  # doctest: +SKIP
        >>> index_images(index, "my_photos")  # doctest: +SKIP
        (120, [])
    """
    from xmatch.regions.images import find_images

    if index.side != "images":
        raise SearchIndexError(f"{index.root} holds captions; pictures go to an image index (--side images).")
    if input_type_of(index.model.image_encoder) is not PixelInputs:
        raise SearchIndexError(
            "this model reads precomputed region features, not pictures: extract them first "
            f"(xmatch extract {folder} --out FEATURES), then index that folder "
            "(xmatch index MODEL --data FEATURES --out INDEX); or index with a model that reads pixels (timm-grid, pixel-regions)."
        )
    if shard_size < 1 or batch_size < 1:
        raise ValueError(f"batch_size and shard_size must be positive, got {batch_size} and {shard_size}.")
    check_compute_dtype(compute_dtype)
    root = Path(folder).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"picture folder {root} does not exist or is not a folder.")
    found = find_images(root)
    if not found:
        raise FileNotFoundError(f"no pictures in {root} (looked recursively); is it the right folder?")
    refused = [(n, _refusal(root, n)) for n in found]
    skipped = [(n, why) for n, why in refused if why]
    present = set(index.ids) if resume else set()
    unindexed = [n for n, why in refused if not why and n not in present]
    bar = progress_bar(total=len(unindexed), desc="index pictures", unit="picture", show=progress)
    added = 0
    for start in range(0, len(unindexed), shard_size):
        pictures, ids = [], []
        for name in unindexed[start : start + shard_size]:
            picture, why = _load(root / name, max_pixels)
            if picture is None:
                skipped.append((name, why))
            else:
                pictures.append(picture)
                ids.append(name)
        if pictures:
            added += index.add(PixelInputs(pictures), ids=ids, batch_size=batch_size, compute_dtype=compute_dtype)
        bar.update(len(unindexed[start : start + shard_size]))
    bar.close()
    return added, skipped


def _refusal(root: Path, name: str) -> str:
    """Why the picture ``name`` found in ``root`` is not indexed before it is read ('' when it
    is read): a link out of the folder, or a name that cannot be an index id."""
    target = os.path.realpath(root / name)
    if not target.startswith(os.path.realpath(root) + os.sep):
        return (
            f"a link out of the folder (it leads to {target}); only pictures inside {root} are indexed: "
            "copy the picture into the folder to index it"
        )
    try:
        plain_path(name, str(root), "file name")
    except DataError as exc:
        return str(exc)
    return ""


def _load(path: Path, max_pixels: int) -> tuple[object | None, str]:
    """The picture, or None and why it cannot be read."""
    from xmatch.core.errors import XmatchError

    try:
        return load_picture(path, max_pixels, option="xmatch index --max-pixels {0}, or index_images(..., max_pixels={0})"), ""
    except (XmatchError, OSError, ValueError) as exc:
        return None, str(exc)


def load_picture(path: str | os.PathLike, max_pixels: int = MAX_PIXELS, *, option: str = "max_pixels={}") -> Any:
    """An image file read as :func:`xmatch.regions.images.load_image` reads it (RGB, upright),
    its size checked against ``max_pixels`` from its header before any pixel is decoded.

    Args:
        path: the image file.
        max_pixels: the budget (width x height).
        option: how the caller raises the budget, for the refusal; ``{}`` stands for the
            picture's pixel count.

    Raises:
        xmatch.io.pictures.ImageTooLargeError: over the budget (the message names the file, its
            size and ``option``).
        FileNotFoundError: no such file.
        xmatch.core.errors.XmatchError: the file is not an image Pillow can decode.

    Example:
        >>> from PIL import Image
        >>> Image.new("1", (9000, 8000)).save("large.png")
        >>> load_picture("large.png", option="xmatch search --max-pixels {}")
        Traceback (most recent call last):
        ...
        xmatch.io.pictures.ImageTooLargeError: large.png is 9000x8000 = 72 megapixels, over the budget of 50 megapixels; it was not decoded. Downscale it, or raise the budget (xmatch search --max-pixels 72000000).
    """
    from PIL import Image

    from xmatch.regions.images import load_image, picture_size

    with warnings.catch_warnings():  # Pillow's bomb warning (over 89 megapixels): the budget below decides
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        size = picture_size(path)  # the header only; None: not an image, which load_image says
    if size is not None:
        check_pixels(size, str(path), max_pixels, fix=f"raise the budget ({option.format(size[0] * size[1])})")
    return load_image(path, max_pixels=max_pixels)
