"""A decoded-pixel budget: the size of a picture is checked from its header before it is decoded.

Pillow refuses only pictures above about 179 megapixels (``Image.MAX_IMAGE_PIXELS``, twice
over), but a file of a few kilobytes can declare 12000 x 12000 pixels (a 1-bit or palette PNG
of one colour compresses to almost nothing): decoding it to RGB takes 432 MB, and a batch of
them more. ``PIL.Image.open`` reads only the header, so the size is known before any pixel is
decoded; every reader of pictures in xmatch checks it there.

:data:`MAX_PIXELS` is 50 megapixels: it takes the largest common photos (48 MP phones at
8064 x 6048, 45 MP cameras at 8192 x 5464) and holds the decoded RGB picture to 150 MB (about
three times that while it is turned upright and converted). Larger pictures gain nothing for
region features (the backbone sees a few hundred pixels a side); ``xmatch extract
--max-pixels`` raises the budget for a run.

Example:
    >>> from PIL import Image
    >>> Image.new("1", (9000, 8000)).save("large.png")
    >>> with Image.open("large.png") as im:  # the header only
    ...     try:
    ...         check_pixels(im.size, "large.png")
    ...     except ImageTooLargeError as exc:
    ...         print(exc)
    large.png is 9000x8000 = 72 megapixels, over the budget of 50 megapixels; it was not decoded. Downscale it, or raise the budget (xmatch extract --max-pixels 72000000); to encode it from Python, decode it yourself (PIL.Image.open(path).convert('RGB')) and pass the picture.
"""

from __future__ import annotations

import re

from typing import Any

from xmatch.core.errors import XmatchError

#: the default decoded-pixel budget of one picture (width x height)
MAX_PIXELS = 50_000_000
#: the default decoded pixels one batch keeps at once (``xmatch extract``, for a proposer that
#: looks at pixels): a batch of eight 12-megapixel photos runs whole; a detector then holds
#: them as float32 (12 bytes a pixel, 1.2 GB)
MAX_BATCH_PIXELS = 100_000_000


class PictureNotFoundError(XmatchError, FileNotFoundError):
    """An image file or folder that does not exist (the message names it)."""


class ImageTooLargeError(XmatchError, ValueError):
    """A picture whose header declares more pixels than the budget (it is not decoded)."""


def check_pixels(size: tuple[int, int], where: str, max_pixels: int = MAX_PIXELS, fix: str = "") -> None:
    """Refuse a picture of ``size = (width, height)`` above ``max_pixels``.

    Args:
        size: the width and height its header declares.
        where: the picture, for the message (a path, ``image 3``).
        max_pixels: the budget.
        fix: how to get past the budget where the caller has an option for it (default:
            ``xmatch extract --max-pixels N``, or decoding the picture yourself).

    Raises:
        ImageTooLargeError: the picture is over the budget (the message gives its size, the
            budget and the fix).
    """
    width, height = size
    if width * height > max_pixels:
        fix = fix or (
            f"raise the budget (xmatch extract --max-pixels {width * height}); to encode it from Python, decode "
            "it yourself (PIL.Image.open(path).convert('RGB')) and pass the picture"
        )
        raise ImageTooLargeError(
            f"{where} is {width}x{height} = {width * height / 1e6:.4g} megapixels, over the budget of "
            f"{max_pixels / 1e6:.4g} megapixels; it was not decoded. Downscale it, or {fix}."
        )


def is_undecoded(image: Any) -> bool:
    """Whether ``image`` is a PIL picture opened from a file whose pixels are not decoded yet
    (``Image.open`` without ``load()``): converting it would decode it."""
    from PIL import ImageFile

    return isinstance(image, ImageFile.ImageFile) and bool(image.tile)

def unreadable_reason(exc: BaseException) -> str:
    """Why Pillow could not read a picture, without the address of the file object it was
    given (Pillow names an in-memory file by its ``repr``, which differs on every run and
    would make two runs' records of the same damaged picture differ).

    Example:
        >>> import io
        >>> from PIL import UnidentifiedImageError
        >>> unreadable_reason(UnidentifiedImageError(f"cannot identify image file {io.BytesIO()!r}"))
        'cannot identify image file'
    """
    return re.sub(r"\s*<[^<>]* at 0x[0-9a-fA-F]+>", "", str(exc))
