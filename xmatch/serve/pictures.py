"""Which files ``xmatch serve`` may send: the pictures of the items an index names, inside the
picture folder it was started with, never a path outside it (``..``, an absolute id, a
symbolic link that leads out are all refused)."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

from xmatch.index.photos import PICTURE_SUBFOLDER, PICTURE_SUFFIXES, picture_candidates
from xmatch.serve.limits import RequestError


class PictureFolder:
    """The folder an index's pictures are read from, and the rule that maps an id to a file.

    The picture of id ``ID`` is the first regular file of ``DIR/ID``, ``DIR/ID.png`` (and
    ``.jpg``, ``.jpeg``, ``.webp``), ``DIR/images/ID`` and ``DIR/images/ID.png`` (...): the
    folder given to ``xmatch index --images DIR`` names its pictures by their path in it, a
    dataset (the scenes) by the stem of ``images/ID.png``
    (:func:`xmatch.index.photos.picture_candidates`). A candidate whose real path is not
    inside ``DIR`` (a link out of it) is refused, never read.

    Args:
        root: the folder (``xmatch serve --images DIR``, else the one the index records), or
            None (the server has no pictures: thumbnails are a 404 that says how to start it
            with them).

    Example:
        >>> from PIL import Image
        >>> Path("photos/trip").mkdir(parents=True)
        >>> Image.new("RGB", (40, 30)).save("photos/trip/beach.png")
        >>> PictureFolder(Path("photos")).path_of("trip/beach.png").name
        'beach.png'
        >>> PictureFolder(Path("photos")).path_of("../etc/passwd")
        Traceback (most recent call last):
        ...
        xmatch.serve.limits.RequestError: no picture for the item '../etc/passwd' in photos (looked for photos/../etc/passwd, photos/images/../etc/passwd with .png, .jpg, .jpeg, .webp or none).
    """

    def __init__(self, root: Path | None) -> None:
        self.root = root
        self._real = os.path.realpath(root) if root is not None else None

    def path_of(self, item: str) -> Path:
        """The picture file of the item ``item`` (an id the index holds).

        Raises:
            RequestError: 404 when the server has no picture folder or no file matches;
                403 when the file found leads out of the folder.
        """
        if self.root is None or self._real is None:
            raise RequestError(404, "this server has no pictures: start it with the folder they were indexed from "
                               "(xmatch serve INDEX --images DIR).")
        outside = None
        for candidate in picture_candidates(self.root, item):
            real = os.path.realpath(candidate)
            if not os.path.isfile(real):
                continue
            if not real.startswith(self._real + os.sep):
                outside = candidate
                continue
            return Path(real)
        if outside is not None:
            raise RequestError(403, f"the picture of the item {item!r} leads out of the picture folder {self.root} "
                               "(a symbolic link); only files inside it are served.")
        raise RequestError(404, f"no picture for the item {item!r} in {self.root} (looked for {self.root}/{item}, "
                           f"{self.root}/{PICTURE_SUBFOLDER}/{item} with {', '.join(PICTURE_SUFFIXES)} or none).")


def thumbnail(path: Path, side: int, max_pixels: int) -> bytes:
    """The picture at ``path`` shrunk to fit ``side`` x ``side`` pixels, as JPEG bytes (its
    header's size checked against ``max_pixels`` before it is decoded).

    Example:
        >>> from PIL import Image
        >>> Image.new("RGB", (640, 320), "red").save("wide.png")
        >>> Image.open(io.BytesIO(thumbnail(Path("wide.png"), 128, 10**6))).size
        (128, 64)
    """
    picture = read_picture(path, max_pixels)
    picture.thumbnail((side, side))
    out = io.BytesIO()
    picture.save(out, format="JPEG", quality=85)
    return out.getvalue()


def read_picture(path: Path, max_pixels: int) -> Any:
    """The picture at ``path``, upright and RGB, within ``max_pixels`` (a 422 otherwise)."""
    from xmatch.core.errors import XmatchError
    from xmatch.index.photos import load_picture

    try:
        return load_picture(path, max_pixels, option="xmatch serve --max-pixels {}")
    except (XmatchError, OSError, ValueError) as exc:
        raise RequestError(422, f"the picture of this item cannot be read: {exc}") from None
