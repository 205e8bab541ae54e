"""Boards of the built-in ``signs`` world: letters, words and icons on photographs, in twins.

A board is a 256-px picture: a crop of one of scikit-image's bundled photographs and textures
(muted so that colours read), clutter that no caption names (thin strokes, dots, grey digits),
and three to six *signs*, each a capital letter, a short word or an icon, in one of eight
colours, 12-60 px on its longer side, a few pixels to a few tens of pixels apart. Letters and
words are set in one of eleven fonts that matplotlib ships (DejaVu sans, serif and mono, the
Computer Modern faces with their thin strokes, STIX), icons drawn filled or as thin outlines.

The *core* that every caption states is ``signs[0]`` *relation* ``signs[1]``: ``left``,
``right``, ``above`` or ``below``, read from the boxes (:func:`holds`: the first box wholly on
that side of the second, and the centres further apart along that axis than across it). The
other signs are distractors that look like neither core sign.

Boards come in groups of two that differ in one declared detail (the twin's ``variant``):
``colour`` (the core signs swap colours), ``roles`` (they swap places, so the relation turns
round) or ``glyph`` (the first core sign becomes another letter, word or icon of the same
colour, font and size). The twin keeps the backdrop and the clutter.

``backdrop="plain"`` renders the same boards on a flat grey canvas without clutter (the
photograph and the clutter are still drawn from the random streams, so a seed gives the same
signs, boxes and twins either way): objects on an empty canvas, what a set of drawn glyphs and
icons often is, against the photographs' textured, cluttered ground.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

#: RGB of each colour word
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (225, 25, 30),
    "orange": (255, 135, 0),
    "yellow": (250, 225, 30),
    "green": (30, 185, 55),
    "cyan": (30, 215, 225),
    "blue": (35, 75, 245),
    "pink": (250, 105, 195),
    "white": (250, 250, 250),
}
#: capital letters (I and O left out: a bar and a ring in several fonts)
LETTERS: tuple[str, ...] = tuple("ABCDEFGHJKLMNPRSTUVWXYZ")
WORDS: tuple[str, ...] = ("STOP", "OPEN", "EXIT", "SALE", "TAXI", "BUS", "BAR", "ZOO", "INN", "GYM", "HOT", "FUN")
ICONS: tuple[str, ...] = ("star", "heart", "arrow", "ring", "cross", "triangle", "moon", "bolt")
KINDS: tuple[str, ...] = ("letter", "word", "icon")
#: font files of matplotlib's ``mpl-data/fonts/ttf``
FONTS: tuple[str, ...] = (
    "DejaVuSans.ttf", "DejaVuSans-Bold.ttf", "DejaVuSans-Oblique.ttf", "DejaVuSerif.ttf", "DejaVuSerif-Italic.ttf",
    "DejaVuSansMono.ttf", "cmr10.ttf", "cmss10.ttf", "cmtt10.ttf", "STIXGeneral.ttf", "STIXGeneralItalic.ttf",
)
#: how an icon is drawn (in place of a font)
ICON_STYLES: tuple[str, ...] = ("filled", "outline")
#: scikit-image's bundled photographs and textures, the backdrops
BACKDROPS: tuple[str, ...] = (
    "astronaut", "coffee", "chelsea", "rocket", "hubble_deep_field", "immunohistochemistry", "retina",
    "brick", "grass", "gravel", "coins", "camera", "moon", "horse", "page",
)
RELATIONS: tuple[str, ...] = ("left", "right", "above", "below")
OPPOSITE: dict[str, str] = {"left": "right", "right": "left", "above": "below", "below": "above"}
VARIANTS: tuple[str, ...] = ("base", "colour", "roles", "glyph")
#: the longer side of a sign, in pixels on a 256-px canvas (scaled with the canvas)
SIDE = (12.0, 60.0)
#: a word is wider than a letter: its longer side is at least this
WORD_SIDE = 26.0
#: gap between the two core signs along their axis, and the least gap between any two signs
CORE_GAP = (3.0, 40.0)
CLEARANCE = 3.0
SIGNS = (3, 6)
CLUTTER = (6, 14)
#: what the signs are drawn on: scikit-image's photographs with clutter, or a flat grey canvas
BACKDROP_KINDS: tuple[str, ...] = ("photos", "plain")
#: the grey levels of a plain canvas (every sign colour, white included, reads on them)
PLAIN_GREYS = (60.0, 150.0)
SUPERSAMPLE = 4
TRIES = 200


@dataclass(frozen=True)
class Sign:
    """One sign: ``kind`` (``letter``, ``word``, ``icon``), ``name`` (the letter, word or icon),
    ``colour``, ``style`` (a font file of :data:`FONTS`, or an icon's ``filled`` / ``outline``)
    and its pixel ``box`` ``(x1, y1, x2, y2)``."""

    kind: str
    name: str
    colour: str
    style: str
    box: tuple[int, int, int, int]

    @property
    def look(self) -> tuple[str, str, str]:
        """What a caption can say of it: kind, name, colour."""
        return self.kind, self.name, self.colour


@dataclass(frozen=True)
class Backdrop:
    """A square crop of a scikit-image photograph: its name, the crop's corner and side."""

    photo: str
    x: int
    y: int
    side: int


@dataclass(frozen=True)
class Board:
    """A picture's content: the signs (the core pair first), the core's relation, the twin's
    variant (``base`` for the first of a group), the backdrop and the clutter's seed."""

    signs: tuple[Sign, ...]
    relation: str
    variant: str
    backdrop: Backdrop
    clutter: int


def holds(relation: str, a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    """Whether box ``a`` is ``relation`` box ``b``: wholly on that side, and the centres further
    apart along that axis than across it.

    Example:
        >>> holds("left", (0, 0, 10, 10), (20, 2, 30, 12)), holds("above", (0, 0, 10, 10), (20, 2, 30, 12))
        (True, False)
    """
    dx = (b[0] + b[2]) / 2 - (a[0] + a[2]) / 2
    dy = (b[1] + b[3]) / 2 - (a[1] + a[3]) / 2
    if relation == "left":
        return a[2] < b[0] and abs(dx) > abs(dy)
    if relation == "right":
        return b[2] < a[0] and abs(dx) > abs(dy)
    if relation == "above":
        return a[3] < b[1] and abs(dy) > abs(dx)
    if relation == "below":
        return b[3] < a[1] and abs(dy) > abs(dx)
    raise ValueError(f"unknown relation {relation!r}; relations: {', '.join(RELATIONS)}.")


def font_path(name: str) -> Path:
    """The path of one of matplotlib's bundled fonts (``pip install matplotlib``)."""
    try:
        import matplotlib
    except ImportError:
        raise ImportError(
            "the signs world sets its letters in matplotlib's bundled fonts: pip install 'xmatch-zoo[report]' "
            "(or pip install matplotlib)."
        ) from None
    path = Path(matplotlib.get_data_path()) / "fonts" / "ttf" / name
    if not path.is_file():
        raise FileNotFoundError(f"font {path} is missing from this matplotlib; reinstall matplotlib.")
    return path


@functools.lru_cache(maxsize=None)
def _font(name: str, size: int):  # noqa: ANN202 - a PIL FreeTypeFont
    from PIL import ImageFont

    return ImageFont.truetype(str(font_path(name)), size)


def _text_mask(text: str, style: str, height: int) -> np.ndarray:
    """The ink of ``text`` set in font ``style``, tightly cropped, as a float mask in [0, 1]."""
    from PIL import Image, ImageDraw

    font = _font(style, height)
    left, top, right, bottom = font.getbbox(text)
    canvas = Image.new("L", (right - left + 4, bottom - top + 4), 0)
    ImageDraw.Draw(canvas).text((2 - left, 2 - top), text, fill=255, font=font)
    ink = np.asarray(canvas, dtype=np.float32) / 255.0
    rows, cols = np.flatnonzero(ink.max(1) > 0.05), np.flatnonzero(ink.max(0) > 0.05)
    return ink[rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1]


def _icon_polygons(name: str) -> list[list[tuple[float, float]]]:
    """An icon as polygons in the unit square (y down)."""
    t = np.linspace(0, 2 * np.pi, 48, endpoint=False)
    if name == "star":
        angles = -np.pi / 2 + np.arange(10) * np.pi / 5
        radii = np.where(np.arange(10) % 2 == 0, 0.5, 0.2)
        return [list(zip(0.5 + radii * np.cos(angles), 0.53 + radii * np.sin(angles)))]
    if name == "heart":
        x = 16 * np.sin(t) ** 3
        y = 13 * np.cos(t) - 5 * np.cos(2 * t) - 2 * np.cos(3 * t) - np.cos(4 * t)
        return [list(zip(0.5 + x / 34, 0.45 - y / 34))]
    if name == "arrow":
        return [[(0, 0.38), (0.55, 0.38), (0.55, 0.12), (1, 0.5), (0.55, 0.88), (0.55, 0.62), (0, 0.62)]]
    if name == "ring":
        return [list(zip(0.5 + 0.5 * np.cos(t), 0.5 + 0.5 * np.sin(t))), list(zip(0.5 + 0.28 * np.cos(t), 0.5 + 0.28 * np.sin(t)))]
    if name == "cross":
        a, b = 0.34, 0.66
        return [[(a, 0), (b, 0), (b, a), (1, a), (1, b), (b, b), (b, 1), (a, 1), (a, b), (0, b), (0, a), (a, a)]]
    if name == "triangle":
        return [[(0.5, 0), (1, 1), (0, 1)]]
    if name == "moon":
        outer = list(zip(0.5 + 0.5 * np.cos(t[12:37]), 0.5 + 0.5 * np.sin(t[12:37])))
        inner = list(zip(0.72 + 0.38 * np.cos(t[36:11:-1]), 0.5 + 0.45 * np.sin(t[36:11:-1])))
        return [outer + inner]
    if name == "bolt":
        return [[(0.62, 0), (0.1, 0.58), (0.45, 0.58), (0.3, 1), (0.9, 0.4), (0.55, 0.4), (0.8, 0)]]
    raise ValueError(f"unknown icon {name!r}; icons: {', '.join(ICONS)}.")


def _icon_mask(name: str, style: str, width: int, height: int) -> np.ndarray:
    from PIL import Image, ImageDraw

    w, h = width * SUPERSAMPLE, height * SUPERSAMPLE
    canvas = Image.new("L", (w, h), 0)
    draw = ImageDraw.Draw(canvas)
    polygons = [[(x * (w - 1), y * (h - 1)) for x, y in poly] for poly in _icon_polygons(name)]
    if style == "outline":
        for poly in polygons:
            draw.line([*poly, poly[0]], fill=255, width=max(3 * SUPERSAMPLE // 2, round(0.08 * min(w, h))), joint="curve")
    else:
        draw.polygon(polygons[0], fill=255)
        for hole in polygons[1:]:
            draw.polygon(hole, fill=0)
    return np.asarray(canvas.resize((width, height), Image.Resampling.BOX), dtype=np.float32) / 255.0


@functools.lru_cache(maxsize=None)
def aspect(kind: str, name: str, style: str) -> float:
    """Width over height of a sign's ink (a letter's or word's in its font; an icon's own)."""
    if kind == "icon":
        return {"arrow": 1.4, "moon": 0.75, "bolt": 0.7}.get(name, 1.0)
    ink = _text_mask(name, style, 64)
    return ink.shape[1] / ink.shape[0]


def sign_mask(sign: Sign) -> np.ndarray:
    """The sign's ink over its box, a float mask in [0, 1] of the box's height x width."""
    from PIL import Image

    width, height = sign.box[2] - sign.box[0], sign.box[3] - sign.box[1]
    if sign.kind == "icon":
        return _icon_mask(sign.name, sign.style, width, height)
    ink = _text_mask(sign.name, sign.style, max(8, height * SUPERSAMPLE))
    image = Image.fromarray((ink * 255).astype(np.uint8)).resize((width, height), Image.Resampling.BOX)
    return np.asarray(image, dtype=np.float32) / 255.0


def _size(kind: str, name: str, style: str, side: float) -> tuple[int, int]:
    """(width, height) of a sign whose longer side is ``side``."""
    ratio = aspect(kind, name, style)
    width, height = (side, side / ratio) if ratio >= 1 else (side * ratio, side)
    return max(3, round(width)), max(3, round(height))


def _draw_sign(rng: np.random.Generator, scale: float, kind: str | None = None) -> tuple[str, str, str, tuple[int, int]]:
    kind = kind or KINDS[int(rng.integers(len(KINDS)))]
    if kind == "icon":
        name, style = ICONS[int(rng.integers(len(ICONS)))], ICON_STYLES[int(rng.integers(len(ICON_STYLES)))]
    else:
        name = (LETTERS if kind == "letter" else WORDS)[int(rng.integers(len(LETTERS if kind == "letter" else WORDS)))]
        style = FONTS[int(rng.integers(len(FONTS)))]
    low = max(SIDE[0], WORD_SIDE) if kind == "word" else SIDE[0]
    return kind, name, style, _size(kind, name, style, rng.uniform(low, SIDE[1]) * scale)


def _clear(box: tuple[float, ...], others: list[tuple[int, ...]], gap: float) -> bool:
    return all(box[2] + gap <= o[0] or o[2] + gap <= box[0] or box[3] + gap <= o[1] or o[3] + gap <= box[1] for o in others)


def _inside(box: tuple[float, ...], canvas: int) -> bool:
    return box[0] >= 2 and box[1] >= 2 and box[2] <= canvas - 2 and box[3] <= canvas - 2


def _at(centre: tuple[float, float], size: tuple[int, int]) -> tuple[int, int, int, int]:
    x1, y1 = round(centre[0] - size[0] / 2), round(centre[1] - size[1] / 2)
    return x1, y1, x1 + size[0], y1 + size[1]


def _centre(box: tuple[int, ...]) -> tuple[float, float]:
    return (box[0] + box[2]) / 2, (box[1] + box[3]) / 2


def _core(rng: np.random.Generator, relation: str, sizes: list[tuple[int, int]], canvas: int, scale: float):
    """Boxes of the core pair such that the first is ``relation`` the second."""
    (wa, ha), (wb, hb) = sizes
    for _ in range(TRIES):
        a = _at((rng.uniform(0, canvas), rng.uniform(0, canvas)), (wa, ha))
        gap = rng.uniform(*CORE_GAP) * scale
        along = {"left": (1, 0), "right": (-1, 0), "above": (0, 1), "below": (0, -1)}[relation]
        ca = _centre(a)
        reach = (wa + wb) / 2 + gap if along[0] else (ha + hb) / 2 + gap
        drift = rng.uniform(-0.4, 0.4) * reach
        cb = (ca[0] + along[0] * reach + along[1] * drift, ca[1] + along[1] * reach + along[0] * drift)
        b = _at(cb, (wb, hb))
        if _inside(a, canvas) and _inside(b, canvas) and holds(relation, a, b):
            return a, b
    return None


def sample_group(rng: np.random.Generator, canvas: int = 256) -> tuple[Board, Board]:
    """A base board and its twin (its ``variant`` one of ``colour``, ``roles``, ``glyph``).

    Example:
        >>> base, twin = sample_group(np.random.default_rng(0))
        >>> holds(base.relation, base.signs[0].box, base.signs[1].box), twin.variant in VARIANTS
        (True, True)
    """
    scale = canvas / 256
    for _ in range(TRIES):
        board = _sample_base(rng, canvas, scale)
        if board is None:
            continue
        twin = _sample_twin(rng, board, canvas)
        if twin is not None:
            return board, twin
    raise RuntimeError("could not lay out a signs board; the canvas is too small for its signs.")


def _sample_base(rng: np.random.Generator, canvas: int, scale: float) -> Board | None:
    relation = RELATIONS[int(rng.integers(len(RELATIONS)))]
    colours = rng.permutation(len(COLOURS))[:2]
    drawn = [_draw_sign(rng, scale) for _ in range(2)]
    if drawn[0][:2] == drawn[1][:2]:
        return None
    core = _core(rng, relation, [d[3] for d in drawn], canvas, scale)
    if core is None:
        return None
    names = list(COLOURS)
    signs = [Sign(k, n, names[c], s, box) for (k, n, s, _), c, box in zip(drawn, colours, core)]
    for _ in range(int(rng.integers(SIGNS[0], SIGNS[1] + 1)) - 2):
        kind, name, style, size = _draw_sign(rng, scale)
        colour = names[int(rng.integers(len(names)))]
        if any((kind, name) == s.look[:2] or (kind, colour) == (s.kind, s.colour) for s in signs[:2]):
            continue
        for _ in range(TRIES):
            box = _at((rng.uniform(0, canvas), rng.uniform(0, canvas)), size)
            if _inside(box, canvas) and _clear(box, [s.box for s in signs], CLEARANCE * scale):
                signs.append(Sign(kind, name, colour, style, box))
                break
    photo = BACKDROPS[int(rng.integers(len(BACKDROPS)))]
    height, width = _photo(photo).shape[:2]
    side = int(rng.uniform(0.45, 1.0) * min(height, width))
    backdrop = Backdrop(photo, int(rng.integers(0, width - side + 1)), int(rng.integers(0, height - side + 1)), side)
    return Board(tuple(signs), relation, "base", backdrop, int(rng.integers(2**31)))


def _sample_twin(rng: np.random.Generator, base: Board, canvas: int) -> Board | None:
    a, b, *rest = base.signs
    options = ["colour", "roles", "glyph"]
    variant = options[int(rng.integers(len(options)))]
    if variant == "colour":
        a, b = replace(a, colour=b.colour), replace(b, colour=a.colour)
    elif variant == "roles":
        a, b = replace(a, box=_at(_centre(b.box), _size_of(a))), replace(b, box=_at(_centre(a.box), _size_of(b)))
        if not holds(OPPOSITE[base.relation], a.box, b.box):
            return None
        base = replace(base, relation=OPPOSITE[base.relation])
    else:
        pool = {"letter": LETTERS, "word": WORDS, "icon": ICONS}[a.kind]
        name = pool[int(rng.integers(len(pool)))]
        if name == a.name or (a.kind, name) == b.look[:2]:
            return None
        width, height = _size(a.kind, name, a.style, max(_size_of(a)))
        a = replace(a, name=name, box=_at(_centre(a.box), (width, height)))
        if not holds(base.relation, a.box, b.box):
            return None
    if not all(_inside(s.box, canvas) for s in (a, b)) or not _clear(a.box, [b.box], CLEARANCE * canvas / 256):
        return None
    if not all(_clear(s.box, [r.box for r in rest], CLEARANCE * canvas / 256) for s in (a, b)):
        return None
    return replace(base, signs=(a, b, *rest), variant=variant)


def _size_of(sign: Sign) -> tuple[int, int]:
    return sign.box[2] - sign.box[0], sign.box[3] - sign.box[1]


@functools.lru_cache(maxsize=None)
def _photo(name: str) -> np.ndarray:
    """One of scikit-image's bundled pictures as RGB uint8."""
    try:
        from skimage import data
    except ImportError:
        raise ImportError(
            "the signs world's backdrops are scikit-image's bundled photographs: pip install 'xmatch-zoo[regions]' "
            "(or pip install scikit-image)."
        ) from None
    image = np.asarray(getattr(data, name)())
    if image.ndim == 2:
        image = np.repeat(image[..., None], 3, axis=2)
    return np.ascontiguousarray(image[..., :3]).astype(np.uint8)


def _backdrop(backdrop: Backdrop, canvas: int) -> np.ndarray:
    """The crop, resized, half desaturated and pressed to the middle tones, so colours read on it."""
    from PIL import Image

    photo = _photo(backdrop.photo)[backdrop.y : backdrop.y + backdrop.side, backdrop.x : backdrop.x + backdrop.side]
    image = np.asarray(Image.fromarray(photo).resize((canvas, canvas), Image.Resampling.BILINEAR), dtype=np.float32)
    grey = image @ np.array([0.299, 0.587, 0.114], dtype=np.float32)
    image = 0.5 * image + 0.5 * grey[..., None]
    return (image - image.mean()) * 0.6 + 105.0


def _clutter(image: np.ndarray, seed: int, canvas: int) -> None:
    """Marks no caption names: thin strokes, dots and grey digits, under the signs."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    layer = Image.new("L", (canvas, canvas), 0)
    shade = Image.new("L", (canvas, canvas), 0)
    ink, tone = ImageDraw.Draw(layer), ImageDraw.Draw(shade)
    for _ in range(int(rng.integers(CLUTTER[0], CLUTTER[1] + 1))):
        grey = int(rng.choice([20, 60, 160, 220]))
        x, y = rng.uniform(0, canvas, 2)
        what = int(rng.integers(3))
        if what == 0:
            length, angle = rng.uniform(8, 40) * canvas / 256, rng.uniform(0, np.pi)
            end = (x + length * np.cos(angle), y + length * np.sin(angle))
            for draw, fill in ((ink, 255), (tone, grey)):
                draw.line([(x, y), end], fill=fill, width=1)
        elif what == 1:
            r = rng.uniform(1, 3)
            for draw, fill in ((ink, 255), (tone, grey)):
                draw.ellipse([x - r, y - r, x + r, y + r], fill=fill)
        else:
            font = _font(FONTS[int(rng.integers(len(FONTS)))], int(rng.uniform(8, 15) * canvas / 256))
            digit = str(int(rng.integers(10)))
            for draw, fill in ((ink, 255), (tone, grey)):
                draw.text((x, y), digit, fill=fill, font=font)
    alpha = np.asarray(layer, dtype=np.float32)[..., None] / 255.0
    image *= 1 - alpha
    image += alpha * np.asarray(shade, dtype=np.float32)[..., None]


def check_backdrop(backdrop: str) -> None:
    """Refuse a backdrop kind other than :data:`BACKDROP_KINDS`."""
    if backdrop not in BACKDROP_KINDS:
        raise ValueError(f"unknown signs backdrop {backdrop!r}; use one of {', '.join(map(repr, BACKDROP_KINDS))}.")


def plain_grey(board: Board) -> float:
    """The grey level of the board's plain canvas (twins share it: it comes from the clutter's seed).

    Example:
        >>> base, twin = sample_group(np.random.default_rng(0))
        >>> plain_grey(base) == plain_grey(twin), PLAIN_GREYS[0] <= plain_grey(base) <= PLAIN_GREYS[1]
        (True, True)
    """
    return float(np.random.default_rng([board.clutter, 1]).uniform(*PLAIN_GREYS))


def render(board: Board, canvas: int = 256, backdrop: str = "photos") -> np.ndarray:
    """The board's picture, ``[canvas, canvas, 3]`` uint8: on its photograph with clutter, or
    with ``backdrop="plain"`` on a flat grey canvas (:func:`plain_grey`) without clutter.

    Example:
        >>> board = sample_group(np.random.default_rng(0))[0]
        >>> render(board).shape, len(np.unique(render(board, backdrop="plain")[:4, :4]))
        ((256, 256, 3), 1)
    """
    check_backdrop(backdrop)
    if backdrop == "plain":
        image = np.full((canvas, canvas, 3), plain_grey(board), dtype=np.float32)
    else:
        image = _backdrop(board.backdrop, canvas)
        _clutter(image, board.clutter, canvas)
    for sign in board.signs:
        x1, y1, x2, y2 = sign.box
        alpha = sign_mask(sign)[..., None]
        patch = image[y1:y2, x1:x2]
        patch *= 1 - alpha
        patch += alpha * np.asarray(COLOURS[sign.colour], dtype=np.float32)
    return np.clip(np.rint(image), 0, 255).astype(np.uint8)
