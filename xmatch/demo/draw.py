"""Pictures for ``xmatch demo``: the region-word alignment of one pair and a retrieval grid.

The alignment picture shows what a TERAN pooler reads (after Figure 7 of TERAN: Messina et
al., "Fine-grained Visual Textual Alignment for Cross-Modal Retrieval using Transformer
Encoders", ACM TOMM 2021): the image with the regions the score uses, numbered, beside a
region x word heat map of their cosines in which a dot marks each cosine the pooler takes
(MrSw: every word's best region). A heat map stays legible for captions of any length: a
word is one column. Drawn with Pillow only (no plotting library is needed).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from PIL import Image, ImageDraw, ImageFont

# Distinct, readable on white and on the scenes' grey background (Okabe-Ito, then Tableau).
PALETTE = (
    (230, 159, 0), (86, 180, 233), (0, 158, 115), (213, 94, 0), (0, 114, 178), (204, 121, 167),
    (240, 228, 66), (148, 103, 189), (140, 86, 75), (127, 127, 127), (188, 189, 34), (23, 190, 207),
)
RIGHT, WRONG, TWIN = (0, 150, 60), (200, 30, 30), (230, 140, 0)
WHITE, BLACK, GREY = (255, 255, 255), (0, 0, 0), (110, 110, 110)
NEGATIVE, POSITIVE = (33, 102, 172), (178, 24, 43)  # the heat map's ends (blue -, red +)
#: which cosines a pooler sums: each word's best region, each region's best word, or both
MARKS = ("words", "regions", "both")


@dataclass
class GridRow:
    """One query of the retrieval grid: the caption and its top-k images, best first.

    Attributes:
        caption: the query text.
        images: the retrieved images (PIL), best first.
        labels: one line under each image (e.g. its rank, id and score).
        correct: whether each retrieved image is the caption's own image.
        twin: whether each retrieved image is the hard-negative twin of the right one.
        headline: a line above the caption (e.g. "SUCCESS" / "FAILURE: ...").
        truth: the right image and its label, shown after the top-k when it ranked lower.
    """

    caption: str
    images: list[Image.Image]
    labels: list[str]
    correct: list[bool]
    twin: list[bool] = field(default_factory=list)
    headline: str = ""
    truth: tuple[Image.Image, str] | None = None


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


def heat_colour(value: float, scale: float) -> tuple[int, int, int]:
    """White at 0, red for positive, blue for negative values, saturated at ``|value| = scale``.

    Example:
        >>> heat_colour(0.0, 1.0), heat_colour(1.0, 1.0)
        ((255, 255, 255), (178, 24, 43))
    """
    t = float(np.clip(value / scale, -1.0, 1.0)) if scale > 0 else 0.0
    end = POSITIVE if t >= 0 else NEGATIVE
    return tuple(int(round(255 + (e - 255) * abs(t))) for e in end)  # type: ignore[return-value]


def used_cells(alignment: np.ndarray, marks: str) -> np.ndarray:
    """Boolean ``[R, W]``: the cosines a pooler takes. ``words``: each word's best region
    (MrSw, MrAvgw); ``regions``: each region's best word (MwSr); ``both`` (Symm).

    Example:
        >>> used_cells(np.array([[0.9, 0.1], [0.2, 0.3]]), "words").tolist()
        [[True, False], [False, True]]
    """
    if marks not in MARKS:
        raise ValueError(f"marks must be one of {MARKS}, got {marks!r}.")
    used = np.zeros(alignment.shape, dtype=bool)
    if marks in ("words", "both"):
        used[alignment.argmax(axis=0), np.arange(alignment.shape[1])] = True
    if marks in ("regions", "both"):
        used[np.arange(alignment.shape[0]), alignment.argmax(axis=1)] = True
    return used


def _shown_regions(alignment: np.ndarray, used: np.ndarray, marks: str, max_rows: int) -> np.ndarray:
    if marks == "words":  # every region some word reads, in the order of the words
        order = alignment.argmax(axis=0)
        return np.array(list(dict.fromkeys(order.tolist())), dtype=np.int64)
    # every region is read (its best word): show the strongest, in region order
    strongest = np.argsort(-alignment.max(axis=1), kind="stable")[:max_rows]
    extra = alignment.argmax(axis=0) if marks == "both" else np.zeros(0, dtype=np.int64)
    return np.array(sorted(set(strongest.tolist()) | set(extra.tolist())), dtype=np.int64)


def _vertical_text(text: str, font: ImageFont.ImageFont, colour: tuple[int, int, int]) -> Image.Image:
    probe = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    left, top, right, bottom = probe.textbbox((0, 0), text, font=font)
    label = Image.new("RGBA", (right - left + 2, bottom - top + 4), (255, 255, 255, 0))
    ImageDraw.Draw(label).text((1 - left, 2 - top), text, fill=colour, font=font)
    return label.rotate(90, expand=True)


def draw_alignment(
    image: Image.Image,
    boxes: np.ndarray,
    words: Sequence[str],
    alignment: np.ndarray,
    *,
    marks: str = "words",
    title: str = "",
    notes: Sequence[str] = (),
    scale: int = 2,
    max_rows: int = 12,
) -> Image.Image:
    """The region-word alignment of one image-caption pair, as the pooler reads it.

    Left, the image (enlarged ``scale`` times) with the boxes of the regions shown, numbered;
    right, the region x word heat map of their cosines (red positive, blue negative), one
    column per word, with a dot on every cosine the pooler takes (``marks``) and its value.

    Args:
        image: the picture.
        boxes: ``[R, 4]`` region boxes ``x1, y1, x2, y2`` normalised to [0, 1].
        words: the caption's ``W`` tokens, in order.
        alignment: ``[R, W]`` region-word cosines (``model.alignment(img[k], txt[k])``).
        marks: ``words`` (MrSw, MrAvgw: rows = the regions some word reads), ``regions``
            (MwSr) or ``both`` (Symm); with ``regions`` / ``both`` the ``max_rows`` regions
            with the strongest best-word cosine are shown.
        title: lines drawn above everything (e.g. the caption), wrapped.
        notes: lines drawn under everything (e.g. how to read it).
        scale: the image is enlarged by this factor so boxes and labels stay readable.
        max_rows: see ``marks``.

    Returns:
        An RGB picture.

    Example:
        >>> boxes = np.array([[0.1, 0.1, 0.5, 0.5], [0.4, 0.3, 0.9, 0.8]])
        >>> A = np.array([[0.2, 0.7, -0.1], [0.5, 0.1, 0.8]])  # model.alignment(img[0], txt[0]).cpu().numpy()
        >>> picture = draw_alignment(Image.new("RGB", (64, 64), "white"), boxes, ["a", "red", "7"], A)
        >>> picture.mode
        'RGB'
    """
    boxes = np.asarray(boxes, dtype=np.float64)
    alignment = np.asarray(alignment, dtype=np.float64)
    if boxes.ndim != 2 or boxes.shape[1] != 4:
        raise ValueError(f"boxes must be [regions, 4] (x1, y1, x2, y2 in [0, 1]), got shape {boxes.shape}.")
    if alignment.shape != (len(boxes), len(words)) or not len(words):
        raise ValueError(
            f"alignment must be [regions, words] = {(len(boxes), len(words))}, got {alignment.shape}; "
            "pass model.alignment(img[k], txt[k]) with the boxes and words of the same pair."
        )
    used = used_cells(alignment, marks)
    rows = _shown_regions(alignment, used, marks, max_rows)
    font, small, tiny = _font(15), _font(13), _font(10)
    cell_w, cell_h, margin, gap = 34, 24, 12, 28

    picture = image.convert("RGB")
    picture = picture.resize((picture.width * scale, picture.height * scale), Image.Resampling.LANCZOS)
    w, h = picture.size
    labels = [_vertical_text(word, small, BLACK) for word in words]
    label_h = max(lab.height for lab in labels) + 6
    row_label_w = 34
    heat_w = row_label_w + cell_w * len(words)
    heat_h = label_h + cell_h * len(rows) + 46  # + the colour bar
    width = margin + w + gap + max(heat_w, 260) + margin
    probe = ImageDraw.Draw(picture)
    title_lines = [ln for text in ([title] if title else []) for ln in _wrap(probe, text, font, width - 2 * margin)]
    note_lines = [ln for text in notes for ln in _wrap(probe, text, small, width - 2 * margin)]
    top = margin + len(title_lines) * 21 + (6 if title_lines else 0)
    body_h = max(h, heat_h)
    height = top + body_h + 10 + len(note_lines) * 19 + margin
    canvas = Image.new("RGB", (width, height), WHITE)
    draw = ImageDraw.Draw(canvas)
    for k, text in enumerate(title_lines):
        draw.text((margin, margin + k * 21), text, fill=BLACK, font=font)

    # the image and the shown regions, numbered as the heat map's rows
    canvas.paste(picture, (margin, top))
    pixel = boxes * np.array([w, h, w, h]) + np.array([margin, top, margin, top])
    for k, region in enumerate(rows):
        colour = PALETTE[k % len(PALETTE)]
        x1, y1, x2, y2 = pixel[region]
        draw.rectangle((x1, y1, x2, y2), outline=colour, width=3)
        tag = str(k + 1)
        tw = _text_width(draw, tag, small)
        draw.rectangle((x1, y1, x1 + tw + 6, y1 + 17), fill=colour)
        draw.text((x1 + 3, y1 + 1), tag, fill=WHITE if k % len(PALETTE) not in (6,) else BLACK, font=small)

    # the heat map: columns = words, rows = shown regions
    x0, y0 = margin + w + gap, top
    for j, lab in enumerate(labels):
        canvas.paste(lab, (x0 + row_label_w + j * cell_w + (cell_w - lab.width) // 2, y0 + label_h - lab.height - 4), lab)
    grid_top = y0 + label_h
    shown = alignment[rows]
    scale_value = float(np.abs(shown).max()) or 1.0
    for i, region in enumerate(rows):
        colour = PALETTE[i % len(PALETTE)]
        y = grid_top + i * cell_h
        draw.rectangle((x0, y + 3, x0 + 8, y + cell_h - 3), fill=colour)
        draw.text((x0 + 11, y + 4), str(i + 1), fill=BLACK, font=small)
        for j in range(len(words)):
            x = x0 + row_label_w + j * cell_w
            value = alignment[region, j]
            draw.rectangle((x, y, x + cell_w - 1, y + cell_h - 1), fill=heat_colour(value, scale_value), outline=WHITE)
            if used[region, j]:
                draw.ellipse((x + 2, y + cell_h // 2 - 3, x + 8, y + cell_h // 2 + 3), fill=BLACK)
                ink = WHITE if abs(value) > 0.6 * scale_value else BLACK
                draw.text((x + 9, y + 6), f"{value:.2f}".replace("0.", ".", 1), fill=ink, font=tiny)
    # colour bar
    bar_y = grid_top + len(rows) * cell_h + 14
    bar_x, bar_w = x0 + row_label_w, min(200, cell_w * len(words))
    for k in range(bar_w):
        value = (2 * k / max(bar_w - 1, 1) - 1) * scale_value
        draw.line((bar_x + k, bar_y, bar_x + k, bar_y + 10), fill=heat_colour(value, scale_value))
    draw.text((bar_x, bar_y + 12), f"{-scale_value:.2f}", fill=GREY, font=tiny)
    draw.text((bar_x + bar_w // 2 - 4, bar_y + 12), "0", fill=GREY, font=tiny)
    draw.text((bar_x + bar_w - 22, bar_y + 12), f"{scale_value:.2f}", fill=GREY, font=tiny)
    draw.text((bar_x + bar_w + 10, bar_y - 2), "cosine", fill=GREY, font=small)

    y = top + body_h + 10
    for k, text in enumerate(note_lines):
        draw.text((margin, y + k * 19), text, fill=GREY, font=small)
    return canvas


def draw_retrieval_grid(rows: Sequence[GridRow], *, thumb: int = 150) -> Image.Image:
    """Text-to-image retrieval results: per query, a headline, the caption and its top-k images.

    Frames: green = the caption's own image, orange = its hard-negative twin, red = another
    image. When the right image ranked below the top k it follows, after a gap, with its rank.

    Args:
        rows: one :class:`GridRow` per query.
        thumb: side of the image thumbnails in pixels.

    Returns:
        An RGB picture.

    Example:
        >>> im1, im2 = Image.new("RGB", (64, 64), "red"), Image.new("RGB", (64, 64), "blue")
        >>> row = GridRow("a red 7 above a blue circle", [im1, im2], ["1. #3", "2. #4"], [True, False])
        >>> draw_retrieval_grid([row]).save("retrieval.png")
    """
    if not rows:
        raise ValueError("the retrieval grid needs at least one query row.")
    font, small = _font(15), _font(13)
    pad, label_h, frame, line_h, truth_gap = 10, 20, 4, 20, 30
    columns = max(len(r.images) for r in rows)
    cell = thumb + 2 * frame
    width = pad + columns * (cell + pad) + (truth_gap + cell + pad if any(r.truth for r in rows) else 0)
    width = max(width, 520)
    probe = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    texts = [([row.headline] if row.headline else []) + _wrap(probe, f"query: {row.caption}", font, width - 2 * pad)
             for row in rows]
    legend_h = 26
    heights = [len(lines) * line_h + 6 + cell + label_h + pad for lines in texts]
    tops = np.cumsum([pad + legend_h, *heights]).tolist()
    canvas = Image.new("RGB", (width, int(tops[-1])), WHITE)
    draw = ImageDraw.Draw(canvas)
    x = pad
    for colour, name in ((RIGHT, "the caption's own image"), (TWIN, "its twin (same words, one detail changed)"),
                         (WRONG, "another image")):
        draw.rectangle((x, pad + 2, x + 14, pad + 16), fill=colour)
        draw.text((x + 20, pad + 1), name, fill=BLACK, font=small)
        x += 30 + _text_width(draw, name, small)
    for r, row in enumerate(rows):
        twin = row.twin or [False] * len(row.images)
        if not len(row.images) == len(row.labels) == len(row.correct) == len(twin):
            raise ValueError(f"grid row {r}: images, labels, correct and twin must have the same length.")
        y = tops[r]
        for k, text in enumerate(texts[r]):
            bold = k == 0 and bool(row.headline)
            draw.text((pad, y + k * line_h), text, fill=(RIGHT if text.startswith("SUCCESS") else WRONG) if bold else BLACK,
                      font=font)
        top = y + len(texts[r]) * line_h + 6
        cells = [(im, label, RIGHT if ok else TWIN if tw else WRONG, pad + c * (cell + pad))
                 for c, (im, label, ok, tw) in enumerate(zip(row.images, row.labels, row.correct, twin))]
        if row.truth is not None:
            cells.append((*row.truth, RIGHT, pad + columns * (cell + pad) + truth_gap))
            draw.text((pad + columns * (cell + pad) + 4, top + cell // 2 - 9), "…", fill=GREY, font=font)
        for im, label, colour, x in cells:
            draw.rectangle((x, top, x + cell - 1, top + cell - 1), fill=colour)
            canvas.paste(im.convert("RGB").resize((thumb, thumb), Image.Resampling.LANCZOS), (x + frame, top + frame))
            draw.text((x, top + cell + 3), label, fill=RIGHT if colour == RIGHT else BLACK, font=small)
    return canvas
