"""Fill an image index from a folder of pictures, no captions needed (``xmatch index MODEL
--images DIR``), for models whose image encoder reads pixels (``timm-grid``,
``pixel-regions``, CLIP-family towers).

Each picture's id is its path relative to the folder (POSIX-style), so a hit names the file;
WebDataset shards (``shards/{00000..00099}.tar``) are read in place, each picture's id its
sample's ``shard/key`` (:mod:`xmatch.data.webdataset`).
Pictures that cannot be indexed (broken, not an image, over the pixel budget, a name that is not
plain names joined by ``/`` as every index id must be, a link out of the folder) are skipped and
listed; every ``shard_size`` pictures are one committed append, so a killed run keeps what it
finished and ``resume=True`` (``--append``) encodes only the pictures not indexed yet.

The index records the folder its pictures are in (:meth:`SearchIndex.record_pictures`), for
``xmatch serve`` to show them: the folder of ``index_images``, the folder of a dataset's
pictures (:func:`dataset_pictures`), once it holds the picture of every stored item
(:func:`holds_pictures`).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

from xmatch.core.progress import progress_bar
from xmatch.data._io import first_few, plain_path
from xmatch.data.errors import DataError
from xmatch.data.webdataset import expand_shards, names_shards, scan_shards
from xmatch.index.errors import SearchIndexError
from xmatch.index.search import SearchIndex, check_compute_dtype
from xmatch.io.archive import ArchiveMember
from xmatch.io.pictures import MAX_PIXELS, check_pixels
from xmatch.model.inputs import PixelInputs, input_type_of

#: suffixes tried after an id itself, for datasets whose ids are file stems (the scenes' ``948``)
PICTURE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp")
#: where a dataset folder keeps its pictures (the scenes' and ``xmatch extract``'s ``images/``)
PICTURE_SUBFOLDER = "images"


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
    """Encode every picture under ``folder`` (recursively) into the image index ``index``, and
    record ``folder`` as the index's picture folder (:meth:`SearchIndex.record_pictures`) where
    the index records none and the folder holds the picture of every stored item.

    Args:
        index: an image index of a model that reads pixels.
        folder: the picture folder, or WebDataset shards (a pattern such as
            ``shards/{00000..00099}.tar``, a ``.tar`` file, a folder of ``.tar`` files and no
            pictures): their pictures are read from the tars in place, named ``shard/key``, in
            shard then member order, and never recorded as the index's picture folder.
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
        a ``\\``...), and a link that leads out of the folder are skipped, each with the reason;
        from shards, also what their scan leaves out (``shard/key`` or the shard, and why).

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
    shards = names_shards(folder)
    candidates, skipped = pictures_to_index(folder, max_pixels)
    present = set(index.ids) if resume else set()
    unindexed = [(n, source) for n, source in candidates if n not in present]
    bar = progress_bar(total=len(unindexed), desc="index pictures", unit="picture", show=progress)
    added = 0
    for start in range(0, len(unindexed), shard_size):
        pictures, ids = [], []
        for name, source in unindexed[start : start + shard_size]:
            picture, why = _load(source, max_pixels)
            if picture is None:
                skipped.append((name, why))
            else:
                pictures.append(picture)
                ids.append(name)
        if pictures:
            added += index.add(PixelInputs(pictures), ids=ids, batch_size=batch_size, compute_dtype=compute_dtype)
        bar.update(len(unindexed[start : start + shard_size]))
    bar.close()
    if not shards and index.pictures is None and holds_pictures(root, index.ids):
        index.record_pictures(root)
    return added, skipped


def _shard_pictures(shards: str | os.PathLike, max_pixels: int) -> tuple[list[tuple[str, ArchiveMember]], list[tuple[str, str]]]:
    """``([(shard/key, picture member)], [(what, why skipped)])`` of WebDataset shards: the
    scan's refusals and the pictures it cannot read are skipped (captions are not needed)."""
    scan = scan_shards(expand_shards(shards), max_pixels=max_pixels)
    skipped = list(scan.left_out) + [(s.id, s.bad_picture) for s in scan.samples if s.bad_picture]
    found = [(s.id, s.picture) for s in scan.samples if not s.bad_picture and s.picture is not None]
    if not found:
        raise FileNotFoundError(f"no readable picture in the shards {os.fspath(shards)}"
                                + (f"; skipped: {first_few([f'{w}: {y}' for w, y in skipped])}." if skipped else "."))
    return found, skipped


def pictures_to_index(folder: str | os.PathLike, max_pixels: int = MAX_PIXELS) -> tuple[list[tuple[str, Any]], list[tuple[str, str]]]:
    """The pictures :func:`index_images` indexes, in its order: ``([(name, file or tar member),
    ...], [(name, why skipped), ...])``; a folder's pictures by relative path (those leading out
    of it skipped), WebDataset shards' by ``shard/key`` (damaged samples skipped).

    Raises:
        FileNotFoundError: no such folder, or no pictures in it.

    Example:
        >>> pictures_to_index("/no/such/folder")
        Traceback (most recent call last):
        ...
        FileNotFoundError: picture folder /no/such/folder does not exist or is not a folder.
    """
    from xmatch.regions.images import find_images

    if names_shards(folder):
        return _shard_pictures(folder, max_pixels)
    root = Path(folder).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"picture folder {root} does not exist or is not a folder.")
    found = find_images(root)
    if not found:
        raise FileNotFoundError(f"no pictures in {root} (looked recursively); is it the right folder?")
    refused = [(n, _refusal(root, n)) for n in found]
    return [(n, root / n) for n, why in refused if not why], [(n, why) for n, why in refused if why]


def picture_candidates(folder: Path, item: str) -> list[Path]:
    """The files the picture of the stored item ``item`` may be in the picture folder
    ``folder``, in order: ``folder/ID``, ``folder/ID.png`` (and the other
    :data:`PICTURE_SUFFIXES`), then the same under ``folder/images/``: ``index_images`` names
    pictures by their path in the folder, a dataset (the scenes) by the stem of
    ``images/ID.png``. None at all for an absolute id or one holding a NUL.

    Example:
        >>> [p.as_posix() for p in picture_candidates(Path("scenes"), "948")][:3]
        ['scenes/948', 'scenes/948.png', 'scenes/948.jpg']
        >>> picture_candidates(Path("scenes"), "/etc/passwd")
        []
    """
    if "\x00" in item or os.path.isabs(item):
        return []
    return [place / (item + suffix) for place in (folder, folder / PICTURE_SUBFOLDER) for suffix in ("", *PICTURE_SUFFIXES)]


def holds_pictures(folder: str | os.PathLike, ids: list[str]) -> bool:
    """Whether ``folder`` holds a picture file (:func:`picture_candidates`) for every id of ``ids``.

    Example:
        >>> from PIL import Image
        >>> Path("scene/images").mkdir(parents=True)
        >>> Image.new("RGB", (8, 8)).save("scene/images/3.png")
        >>> holds_pictures("scene", ["3"]), holds_pictures("scene", ["3", "4"])
        (True, False)
    """
    folder = Path(folder)
    return folder.is_dir() and all(any(c.is_file() for c in picture_candidates(folder, i)) for i in ids)


def dataset_pictures(dataset: Any, ids: list[str] | None = None) -> Path | None:
    """The folder (absolute) that holds the picture of each image of ``dataset``, or of each id
    of ``ids`` (default the dataset's image ids), where one is known: the folder of an
    image-captions file (its ids are paths in it), the dataset's root (the scenes keep
    ``images/ID.png``), the folder ``xmatch extract`` read the pictures from (its
    ``extract.json`` records it). None when no such folder holds them all: region features
    whose pictures are elsewhere.

    Example:
        >>> dataset_pictures(xmatch.scenes.dataset.open_scenes(split="test"))  # the scenes cache  # doctest: +SKIP
        PosixPath('/home/me/.cache/xmatch/datasets/scenes/scenes-small-224px-seed0-v1')
    """
    from xmatch.regions.manifest import ManifestError, read_manifest

    ids = list(dataset.image_names) if ids is None else ids
    places = []
    captions = getattr(dataset, "captions_file", None)
    if captions is not None:
        places.append(Path(captions).parent)
    root = getattr(dataset, "root", None)
    if root is not None:
        places.append(Path(root))
        try:
            places.append(Path(read_manifest(root)["images_folder"]))
        except (ManifestError, KeyError):  # not made by xmatch extract, or by one that did not record it
            pass
    return next((place.resolve() for place in places if holds_pictures(place, ids)), None)


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


def _load(path: Path | ArchiveMember, max_pixels: int) -> tuple[object | None, str]:
    """The picture, or None and why it cannot be read."""
    from xmatch.core.errors import XmatchError

    try:
        return load_picture(path, max_pixels, option="xmatch index --max-pixels {0}, or index_images(..., max_pixels={0})"), ""
    except (XmatchError, OSError, ValueError) as exc:
        return None, str(exc)


def load_picture(path: str | os.PathLike | ArchiveMember, max_pixels: int = MAX_PIXELS, *, option: str = "max_pixels={}") -> Any:
    """An image file read as :func:`xmatch.regions.images.load_image` reads it (RGB, upright),
    its size checked against ``max_pixels`` from its header before any pixel is decoded.

    Args:
        path: the image file, or a WebDataset shard's picture member.
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
