"""Pictures for ``xmatch demo``: the region-word alignment of one pair and a retrieval grid.

The alignment picture follows Figure 7 of TERAN (Messina et al., "Fine-grained Visual Textual
Alignment for Cross-Modal Retrieval using Transformer Encoders", ACM TOMM 2021): the image with
region boxes, each word of the caption linked to the region it aligns with best, with the
cosine of the pair. Drawn with Pillow only (no plotting library is needed).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw, ImageFont

# Distinct, readable on white and on the scenes' grey background (Okabe-Ito, then Tableau).
PALETTE = (
    (230, 159, 0), (86, 180, 233), (0, 158, 115), (213, 94, 0), (0, 114, 178), (204, 121, 167),
    (240, 228, 66), (148, 103, 189), (140, 86, 75), (127, 127, 127), (188, 189, 34), (23, 190, 207),
)
RIGHT, WRONG = (0, 150, 60), (200, 30, 30)
WHITE, BLACK, GREY = (255, 255, 255), (0, 0, 0), (110, 110, 110)


@dataclass
class GridRow:
    """One query of the retrieval grid: the caption and its top-k images, best first.

    Attributes:
        caption: the query text.
        images: the retrieved images (PIL), best first.
        labels: one line under each image (e.g. its id and score).
        correct: whether each retrieved image is the caption's own image.
    """

    caption: str
    images: list[Image.Image]
    labels: list[str]
    correct: list[bool]


def _font(size: int) -> ImageFont.ImageFont:
    """Pillow's scalable default font (Pillow >= 10.1), else its bitmap font."""
    try:
        return ImageFont.load_default(size=size)
    except TypeError:
        return ImageFont.load_default()


def _text_width(draw: ImageDraw.ImageDraw, text: str, font: ImageFont.ImageFont) -> int:
    left, _, right, _ = draw.textbbox((0, 0), text, font=font)
    return int(right - left)


def _wrap(draw: ImageDraw.ImageDraw, text: str, font: ImageFont.ImageFont, width: int) -> list[str]:
    """Split ``text`` at spaces into lines no wider than ``width`` pixels (a longer word keeps
    its own line)."""
    lines: list[str] = []
    for word in text.split():
        if lines and _text_width(draw, f"{lines[-1]} {word}", font) <= width:
            lines[-1] = f"{lines[-1]} {word}"
        else:
            lines.append(word)
    return lines or [""]


def draw_alignment(
    image: Image.Image,
    boxes: np.ndarray,
    words: Sequence[str],
    alignment: np.ndarray,
    *,
    title: str = "",
    scale: int = 2,
) -> Image.Image:
    """The region-word alignment of one image-caption pair (TERAN's Figure 7).

    Every word is drawn in its own colour in a column right of the image, joined by a line to
    the box of the region it matches best (the argmax of its column of ``alignment``), with the
    cosine. Each matched box is drawn once, in the colour of the word that matches it best.

    Args:
        image: the picture.
        boxes: ``[R, 4]`` region boxes ``x1, y1, x2, y2`` normalised to [0, 1].
        words: the caption's ``W`` tokens, in order.
        alignment: ``[R, W]`` region-word cosines (``model.alignment(img[k], txt[k])``).
        title: a line drawn above everything (e.g. the caption).
        scale: the image is enlarged by this factor so boxes and labels stay readable.

    Returns:
        An RGB picture.

    Example:
        >>> A = model.alignment(img[0], txt[0]).cpu().numpy()  # doctest: +SKIP
        >>> draw_alignment(pil_image, boxes, ["a", "red", "7"], A).save("alignment.png")  # doctest: +SKIP
    """
    boxes = np.asarray(boxes, dtype=np.float64)
    alignment = np.asarray(alignment, dtype=np.float64)
    if boxes.ndim != 2 or boxes.shape[1] != 4:
        raise ValueError(f"boxes must be [regions, 4] (x1, y1, x2, y2 in [0, 1]), got shape {boxes.shape}.")
    if alignment.shape != (len(boxes), len(words)):
        raise ValueError(
            f"alignment must be [regions, words] = {(len(boxes), len(words))}, got {alignment.shape}; "
            "pass model.alignment(img[k], txt[k]) with the boxes and words of the same pair."
        )
    best = alignment.argmax(axis=0)
    cosine = alignment[best, np.arange(len(words))]

    font, small = _font(15), _font(13)
    picture = image.convert("RGB")
    picture = picture.resize((picture.width * scale, picture.height * scale), Image.Resampling.LANCZOS)
    w, h = picture.size
    line_h, gap, margin = 22, 120, 12
    probe = ImageDraw.Draw(picture)
    column = max((_text_width(probe, f"{word}  {c:.2f}", font) for word, c in zip(words, cosine)), default=0)
    width = margin + w + gap + column + margin
    title_lines = _wrap(probe, title, font, width - 2 * margin) if title else []
    title_h = len(title_lines) * line_h + (8 if title else 0)
    height = max(h, len(words) * line_h) + title_h + 2 * margin
    canvas = Image.new("RGB", (width, height), WHITE)
    canvas.paste(picture, (margin, margin + title_h))
    draw = ImageDraw.Draw(canvas)
    for k, text in enumerate(title_lines):
        draw.text((margin, margin + k * line_h), text, fill=BLACK, font=font)

    origin = np.array([margin, margin + title_h, margin, margin + title_h], dtype=np.float64)
    pixel = boxes * np.array([w, h, w, h]) + origin
    # Boxes first, so every line and label is drawn on top of them; a box takes the colour of
    # the word with the highest cosine among those it is the best region of.
    for region in np.unique(best):
        words_here = np.flatnonzero(best == region)
        k = int(words_here[cosine[words_here].argmax()])
        draw.rectangle(tuple(pixel[region]), outline=PALETTE[k % len(PALETTE)], width=3)
    x_text = margin + w + gap
    top = margin + title_h + max(0, (h - len(words) * line_h) // 2)
    for k, (word, region, c) in enumerate(zip(words, best, cosine)):
        colour = PALETTE[k % len(PALETTE)]
        y = top + k * line_h + line_h // 2
        _, y1, x2, y2 = pixel[region]
        anchor = (x2, min(max(y, y1), y2))  # the nearest point of the box's right edge
        draw.line((x_text - 6, y, *anchor), fill=colour, width=1)
        draw.ellipse((anchor[0] - 3, anchor[1] - 3, anchor[0] + 3, anchor[1] + 3), fill=colour)
        draw.text((x_text, y - 9), word, fill=colour, font=font)
        draw.text((x_text + _text_width(draw, word + "  ", font), y - 8), f"{c:.2f}", fill=GREY, font=small)
    return canvas


def draw_retrieval_grid(rows: Sequence[GridRow], *, thumb: int = 160) -> Image.Image:
    """Text-to-image retrieval results: per query, the caption above its top-k images.

    Each image has a green frame when it is the caption's own image and a red one otherwise,
    and its label (id, score) below.

    Args:
        rows: one :class:`GridRow` per query.
        thumb: side of the image thumbnails in pixels.

    Returns:
        An RGB picture.

    Example:
        >>> row = GridRow("a red 7 above a blue circle", [im1, im2], ["#3 0.81", "#4 0.62"], [True, False])  # doctest: +SKIP
        >>> draw_retrieval_grid([row]).save("retrieval.png")  # doctest: +SKIP
    """
    if not rows:
        raise ValueError("the retrieval grid needs at least one query row.")
    font, small = _font(15), _font(13)
    pad, caption_h, label_h, frame = 10, 26, 20, 4
    columns = max(len(r.images) for r in rows)
    cell = thumb + 2 * frame
    width = pad + columns * (cell + pad)
    line_h = 20
    probe = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    captions = [_wrap(probe, f"query: {row.caption}", font, width - 2 * pad) for row in rows]
    heights = [(len(lines) - 1) * line_h + caption_h + cell + label_h + pad for lines in captions]
    tops = np.cumsum([pad, *heights]).tolist()
    canvas = Image.new("RGB", (width, int(tops[-1])), WHITE)
    draw = ImageDraw.Draw(canvas)
    for r, row in enumerate(rows):
        if not len(row.images) == len(row.labels) == len(row.correct):
            raise ValueError(f"grid row {r}: images, labels and correct must have the same length.")
        y = tops[r]
        for k, text in enumerate(captions[r]):
            draw.text((pad, y + 4 + k * line_h), text, fill=BLACK, font=font)
        y += (len(captions[r]) - 1) * line_h
        for c, (im, label, ok) in enumerate(zip(row.images, row.labels, row.correct)):
            x = pad + c * (cell + pad)
            top = y + caption_h
            draw.rectangle((x, top, x + cell - 1, top + cell - 1), fill=RIGHT if ok else WRONG)
            canvas.paste(im.convert("RGB").resize((thumb, thumb), Image.Resampling.LANCZOS), (x + frame, top + frame))
            draw.text((x, top + cell + 3), f"{c + 1}. {label}", fill=RIGHT if ok else BLACK, font=small)
    return canvas
