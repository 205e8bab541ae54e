"""Finding and reading the pictures of an image folder."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from xmatch.core.errors import XmatchError
from xmatch.io.archive import ArchiveMember, ArchiveMemberError
from xmatch.io.pictures import MAX_PIXELS, ImageTooLargeError, PictureNotFoundError, check_pixels, unreadable_reason

#: file suffixes taken for images when a folder is scanned (case-insensitive)
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm")


class UnreadableImageError(XmatchError, ValueError):
    """A file that Pillow cannot decode (the message names it)."""


def find_images(folder: str | os.PathLike) -> list[str]:
    """Paths of the images under ``folder`` (recursively, hidden folders skipped), relative to
    it, POSIX-style, sorted.

    Raises:
        FileNotFoundError: ``folder`` does not exist or is not a folder.

    Example:
        >>> from PIL import Image
        >>> Path("my_photos/dogs").mkdir(parents=True)
        >>> Image.new("RGB", (64, 48)).save("my_photos/beach.jpg"); Image.new("RGB", (8, 8)).save("my_photos/dogs/rex.png")
        >>> _ = Path("my_photos/notes.txt").write_text("not an image")
        >>> find_images("my_photos")
        ['beach.jpg', 'dogs/rex.png']
    """
    root = Path(folder).expanduser()
    if not root.is_dir():
        raise PictureNotFoundError(f"image folder {root} does not exist or is not a folder.")
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in filenames:
            if name.lower().endswith(IMAGE_SUFFIXES) and not name.startswith("."):
                found.append((Path(dirpath) / name).relative_to(root).as_posix())
    return sorted(found)


def picture_size(path: str | os.PathLike | ArchiveMember) -> tuple[int, int] | None:
    """``(width, height)`` from an image file's header (nothing is decoded), or None for a
    file Pillow cannot identify; ``path`` may be a tar member (a WebDataset shard's picture).

    Example:
        >>> from PIL import Image
        >>> Image.new("RGB", (64, 48)).save("beach.jpg")
        >>> _ = Path("notes.txt").write_text("not an image")
        >>> picture_size("beach.jpg"), picture_size("notes.txt")
        ((64, 48), None)
    """
    from PIL import Image

    try:
        with Image.open(path.open() if isinstance(path, ArchiveMember) else path) as im:
            return im.size
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError):  # ArchiveMemberError is a ValueError
        return None


def load_image(path: str | os.PathLike | ArchiveMember, max_pixels: int = MAX_PIXELS) -> Any:
    """An image file (or a tar member: a WebDataset shard's picture, read in place) as an RGB
    PIL image, turned upright by its EXIF orientation (as photo viewers show it; the boxes of
    ``xmatch extract`` are in this frame). The size its header declares is checked against
    ``max_pixels`` before any pixel is decoded.

    Raises:
        FileNotFoundError: no such file.
        UnreadableImageError: the file is not an image Pillow can decode.
        xmatch.io.pictures.ImageTooLargeError: the picture is larger than ``max_pixels``
            (:data:`xmatch.io.pictures.MAX_PIXELS`, 50 megapixels, by default).

    Example:
        >>> from PIL import Image
        >>> Image.new("RGB", (64, 48)).save("beach.jpg")
        >>> load_image("beach.jpg").size
        (64, 48)
    """
    from PIL import Image, ImageOps, UnidentifiedImageError

    if isinstance(path, ArchiveMember):
        if not path.archive.is_file():
            raise PictureNotFoundError(f"{path}: the archive {path.archive} does not exist.")
        try:
            source: Any = path.open()
        except ArchiveMemberError as exc:
            raise UnreadableImageError(str(exc)) from None
    else:
        path = source = Path(path)
        if not path.is_file():
            raise PictureNotFoundError(f"image file {path} does not exist.")
    try:
        with Image.open(source) as im:
            check_pixels(im.size, str(path), max_pixels)
            im.load()
            upright = ImageOps.exif_transpose(im)
            picture = upright.convert("RGB")
    except ImageTooLargeError:
        raise
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise UnreadableImageError(f"{path} is not a readable image: {unreadable_reason(exc)}") from None
    if picture.width < 1 or picture.height < 1:
        raise UnreadableImageError(f"{path} is an empty image ({picture.width}x{picture.height}).")
    return picture

