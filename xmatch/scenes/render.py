"""Scenes of the built-in ``scenes`` benchmark: objects, layouts, hard-negative twins, drawing.

A scene holds two related objects (``objects[0]`` is ``relation`` of ``objects[1]``: left of,
right of, above or below) and up to two distractors. Objects are handwritten digits from
scikit-learn's bundled digits set (``load_digits``, UCI optical recognition of handwritten
digits, 8x8 images upscaled) or shapes drawn with Pillow, each with a colour and a size.

Scenes come in groups of two that differ in one thing only: the positions of the related pair
swapped (the relation flips), their colours swapped, or their sizes swapped. Both scenes of a
group have the same objects, so their descriptions have the same bag of words ("a small red 7
to the left of a large blue circle" / "a large blue circle to the left of a small red 7"):
only a model that binds attributes to objects and reads their layout tells them apart, which
is what fine-grained alignment (TERAN, SCAN) claims to do better than global matching.

Two object sets fix how big objects are drawn (:data:`OBJECT_SIZES`): ``standard`` (the
benchmark as shipped, objects 34-85 px on a 224-px canvas) and ``small`` (16-40 px), for
measuring region features that must keep small objects.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import numpy as np

#: RGB of each colour word; the background is grey, so colour is carried by objects only.
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 175, 70),
    "blue": (45, 95, 230),
    "yellow": (240, 215, 40),
    "purple": (150, 65, 205),
    "orange": (245, 140, 25),
    "white": (245, 245, 245),
}
DIGITS: tuple[str, ...] = tuple("0123456789")
SHAPES: tuple[str, ...] = ("circle", "square", "triangle", "diamond", "star", "cross")
KINDS: tuple[str, ...] = DIGITS + SHAPES
#: per object set, the side of the square a ``small`` and a ``large`` object is drawn in, as a
#: fraction of the canvas side: ``standard`` is the set as shipped (34-85 px on 224 px);
#: ``small`` draws every object 16-40 px on 224 px (rounded to whole pixels), the range of
#: small objects in photos that region features lose
OBJECT_SIZES: dict[str, dict[str, tuple[float, float]]] = {
    "standard": {"small": (0.15, 0.19), "large": (0.30, 0.38)},
    "small": {"small": (0.07, 0.11), "large": (0.14, 0.18)},
}
RELATIONS: tuple[str, ...] = ("left", "right", "above", "below")
INVERSE: dict[str, str] = {"left": "right", "right": "left", "above": "below", "below": "above"}
#: what the second scene of a group changed ("base" = the first scene)
VARIANTS: tuple[str, ...] = ("base", "relation", "colour", "size")
#: gap between objects and the largest perpendicular offset of a related pair (fraction of
#: the offset along the relation's axis), so every relation is unambiguous
GAP = 0.04
MAX_SKEW = 0.3
SUPERSAMPLE = 4
#: coverage above which a pixel counts as part of an object for its box
BOX_ALPHA = 0.1
TRIES = 100


@dataclass(frozen=True)
class SceneObject:
    """One object: what it is and where it is drawn.

    Attributes:
        kind: a digit ``"0"``..``"9"`` or a shape (``circle``, ``square``, ...).
        colour: a key of :data:`COLOURS`.
        size: ``"small"`` or ``"large"``.
        centre: ``(x, y)`` pixel centre of its square.
        side: pixel side of the square it is drawn in.
        glyph: for digits, the index of the handwritten sample in ``load_digits()``; else -1.
    """

    kind: str
    colour: str
    size: str
    centre: tuple[float, float]
    side: float
    glyph: int = -1


@dataclass(frozen=True)
class Scene:
    """One image's content.

    Attributes:
        objects: ``objects[0]`` is ``relation`` of ``objects[1]``; the rest are distractors.
        relation: ``"left"``, ``"right"``, ``"above"`` or ``"below"``.
        variant: ``"base"``, or what this twin changed w.r.t. its group's base scene.
        background: ``(grey at one end, grey at the other, angle in radians)`` of the gradient.
    """

    objects: tuple[SceneObject, ...]
    relation: str
    variant: str
    background: tuple[int, int, float]


@functools.lru_cache(maxsize=1)
def digit_glyphs() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's bundled handwritten digits: ``(images [1797, 8, 8] in 0..16, labels)``."""
    from xmatch.core.optional import require

    datasets = require("sklearn.datasets", "scikit-learn", "the scenes dataset's digit glyphs")
    digits = datasets.load_digits()
    return digits.images.astype(np.float32), digits.target.astype(np.int64)


def sample_group(
    rng: np.random.Generator, canvas: int, variant: str | None = None, objects: str = "standard"
) -> tuple[Scene, Scene]:
    """A base scene and its hard-negative twin (same objects; relation, colours or sizes swapped).

    Args:
        rng: the group's random stream.
        canvas: image side in pixels.
        variant: what the twin changes (``relation``, ``colour`` or ``size``: the pair is then
            drawn with sizes that differ); None draws it among those the base scene allows (a
            size swap needs sizes that differ), as the train / val / test splits do.
        objects: the object set, a key of :data:`OBJECT_SIZES` (how big objects are drawn);
            the random draws are the same for every set, only the sides scale.

    Example:
        >>> base, twin = sample_group(np.random.default_rng(0), 224)
        >>> sorted(o.kind for o in base.objects) == sorted(o.kind for o in twin.objects)
        True
        >>> sample_group(np.random.default_rng(0), 224, "size")[1].variant
        'size'
        >>> max(o.side for o in sample_group(np.random.default_rng(0), 224, objects="small")[0].objects) <= 40.32
        True
    """
    if variant is not None and variant not in VARIANTS[1:]:
        raise ValueError(f"unknown twin variant {variant!r}; one of {', '.join(VARIANTS[1:])}.")
    sides = object_sizes(objects)
    _, labels = digit_glyphs()
    kinds = rng.choice(len(KINDS), size=2, replace=False)
    colours = rng.choice(len(COLOURS), size=2, replace=False)
    if variant == "size":
        sizes = rng.permutation(np.array(["small", "large"]))
    else:
        sizes = rng.choice(("small", "large"), size=2)
    centres, relation = _related_slots(rng, canvas, sides)
    pair = tuple(
        _make_object(rng, KINDS[k], list(COLOURS)[c], str(s), centre, canvas, labels, sides)
        for k, c, s, centre in zip(kinds, colours, sizes, centres)
    )
    distractors = _distractors(rng, canvas, centres, {KINDS[k] for k in kinds}, labels, sides)
    g1, g2 = (int(v) for v in rng.integers(30, 111, size=2))
    background = (g1, g2, float(rng.uniform(0, 2 * np.pi)))
    base = Scene(pair + distractors, relation, "base", background)
    if variant is not None:
        return base, twin_of(base, variant)
    options = ["relation", "colour"] + (["size"] if pair[0].size != pair[1].size else [])
    return base, twin_of(base, str(rng.choice(options)))


def object_sizes(objects: str) -> dict[str, tuple[float, float]]:
    """The sides (fractions of the canvas) of the object set ``objects``, refusing unknown sets.

    Example:
        >>> object_sizes("small")["large"]
        (0.14, 0.18)
    """
    if objects not in OBJECT_SIZES:
        raise ValueError(f"unknown scenes object set {objects!r}; object sets: {', '.join(OBJECT_SIZES)}.")
    return OBJECT_SIZES[objects]


def twin_of(scene: Scene, variant: str) -> Scene:
    """``scene`` with its related pair's positions, colours or sizes swapped.

    Example:
        >>> a = SceneObject("7", "red", "small", (50.0, 100.0), 30.0)
        >>> b = SceneObject("circle", "blue", "large", (150.0, 100.0), 70.0)
        >>> twin_of(Scene((a, b), "left", "base", (40, 90, 0.0)), "relation").relation
        'right'
    """
    a, b = scene.objects[:2]
    if variant == "relation":
        a, b, relation = replace(a, centre=b.centre), replace(b, centre=a.centre), INVERSE[scene.relation]
    elif variant == "colour":
        a, b, relation = replace(a, colour=b.colour), replace(b, colour=a.colour), scene.relation
    elif variant == "size":
        a, b = replace(a, size=b.size, side=b.side), replace(b, size=a.size, side=a.side)
        relation = scene.relation
    else:
        raise ValueError(f"unknown twin variant {variant!r}; one of {', '.join(VARIANTS[1:])}.")
    return Scene((a, b) + scene.objects[2:], relation, variant, scene.background)


def _related_slots(
    rng: np.random.Generator, canvas: int, sides: dict[str, tuple[float, float]]
) -> tuple[list[tuple[float, float]], str]:
    """Centres of the related pair and the relation of the first to the second.

    The slots leave room for a large object at either, so swapping the pair's positions or
    sizes (the twins) never makes objects overlap or leave the canvas.
    """
    largest = sides["large"][1] * canvas
    low, high = largest / 2, canvas - largest / 2
    for _ in range(TRIES):
        along = rng.uniform(low, high, size=2)
        offset = abs(along[1] - along[0])
        if offset < largest + GAP * canvas:
            continue
        across = rng.uniform(low, high)
        other = across + rng.uniform(-MAX_SKEW, MAX_SKEW) * offset
        if not low <= other <= high:
            continue
        horizontal = bool(rng.integers(2))
        if horizontal:
            centres = [(along[0], across), (along[1], other)]
            relation = "left" if along[0] < along[1] else "right"
        else:
            centres = [(across, along[0]), (other, along[1])]
            relation = "above" if along[0] < along[1] else "below"
        return [(float(x), float(y)) for x, y in centres], relation
    raise ValueError(f"canvas {canvas} is too small to place two related objects; use a canvas of at least 128.")


def _make_object(
    rng: np.random.Generator,
    kind: str,
    colour: str,
    size: str,
    centre: tuple[float, float],
    canvas: int,
    labels: np.ndarray,
    sides: dict[str, tuple[float, float]],
) -> SceneObject:
    side = float(rng.uniform(*sides[size]) * canvas)
    glyph = int(rng.choice(np.flatnonzero(labels == int(kind)))) if kind in DIGITS else -1
    return SceneObject(kind, colour, size, centre, side, glyph)


def _distractors(
    rng: np.random.Generator,
    canvas: int,
    slots: list[tuple[float, float]],
    used_kinds: set[str],
    labels: np.ndarray,
    sides: dict[str, tuple[float, float]],
) -> tuple[SceneObject, ...]:
    """Up to two more objects of other kinds, clear of the related pair's slots."""
    count = int(rng.choice(3, p=[0.3, 0.45, 0.25]))
    largest = sides["large"][1] * canvas
    taken = [(x, y, largest) for x, y in slots]
    free_kinds = [k for k in KINDS if k not in used_kinds]
    out: list[SceneObject] = []
    for kind in rng.choice(free_kinds, size=count, replace=False):
        colour = list(COLOURS)[int(rng.integers(len(COLOURS)))]
        size = str(rng.choice(("small", "large")))
        for _ in range(TRIES):
            obj = _make_object(rng, str(kind), colour, size, (0.0, 0.0), canvas, labels, sides)
            x, y = rng.uniform(obj.side / 2, canvas - obj.side / 2, size=2)
            gap = GAP * canvas
            if all(max(abs(x - tx), abs(y - ty)) >= (obj.side + side) / 2 + gap for tx, ty, side in taken):
                out.append(replace(obj, centre=(float(x), float(y))))
                taken.append((x, y, obj.side))
                break
    return tuple(out)


def render(scene: Scene, canvas: int) -> tuple[np.ndarray, np.ndarray]:
    """Draw a scene: ``(image [canvas, canvas, 3] uint8, boxes [n_objects, 4] float32)``.

    Boxes are the tight pixel boxes ``(x1, y1, x2, y2)`` of the pixels each object covers by
    more than :data:`BOX_ALPHA`, pixel edges included, so ``image[y1:y2, x1:x2]`` holds the
    object with its anti-aliased rim.

    Example:
        >>> image, boxes = render(sample_group(np.random.default_rng(0), 224)[0], 224)
        >>> image.shape, image.dtype, boxes.shape[1]
        ((224, 224, 3), dtype('uint8'), 4)
    """
    image = _background(scene.background, canvas)
    boxes = np.zeros((len(scene.objects), 4), dtype=np.float32)
    for i, obj in enumerate(scene.objects):
        alpha = _object_alpha(obj)
        n = alpha.shape[0]
        x0, y0 = round(obj.centre[0] - n / 2), round(obj.centre[1] - n / 2)
        patch = image[y0 : y0 + n, x0 : x0 + n]
        a = alpha[: patch.shape[0], : patch.shape[1], None]
        colour = np.asarray(COLOURS[obj.colour], dtype=np.float32)
        image[y0 : y0 + n, x0 : x0 + n] = patch * (1 - a) + colour * a
        rows, cols = np.nonzero(alpha > BOX_ALPHA)
        boxes[i] = (x0 + cols.min(), y0 + rows.min(), x0 + cols.max() + 1, y0 + rows.max() + 1)
    return np.rint(image).clip(0, 255).astype(np.uint8), boxes.clip(0, canvas)


def _background(background: tuple[int, int, float], canvas: int) -> np.ndarray:
    """A grey linear gradient from one tone to the other along the given angle (float32 HWC)."""
    start, end, angle = background
    y, x = np.mgrid[0:canvas, 0:canvas].astype(np.float32) / max(canvas - 1, 1)
    t = x * np.cos(angle) + y * np.sin(angle)
    t = (t - t.min()) / max(float(t.max() - t.min()), 1e-6)
    grey = start + (end - start) * t
    return np.repeat(grey[:, :, None], 3, axis=2)


def _object_alpha(obj: SceneObject) -> np.ndarray:
    """Coverage ``[n, n]`` in [0, 1] of the object drawn in its ``n x n`` square."""
    from PIL import Image, ImageDraw

    n = max(int(round(obj.side)), 4)
    if obj.kind in DIGITS:
        glyph = digit_glyphs()[0][obj.glyph] / 16.0
        big = Image.fromarray(np.uint8(glyph * 255)).resize((n, n), Image.Resampling.BICUBIC)
        # the 8x8 glyph upscaled is a soft blob; a contrast ramp gives strokes with clean edges
        return np.clip((np.asarray(big, dtype=np.float32) / 255 - 0.25) * 2.5, 0, 1)
    big_n = n * SUPERSAMPLE
    mask = Image.new("L", (big_n, big_n), 0)
    draw = ImageDraw.Draw(mask)
    points = [(x * (big_n - 1), y * (big_n - 1)) for x, y in _shape_outline(obj.kind)]
    if obj.kind == "circle":
        draw.ellipse([points[0], points[1]], fill=255)
    else:
        draw.polygon(points, fill=255)
    small = mask.resize((n, n), Image.Resampling.BOX)  # area average = anti-aliased edges
    return np.asarray(small, dtype=np.float32) / 255


def _shape_outline(kind: str) -> list[tuple[float, float]]:
    """The shape's outline in the unit square (the circle: its bounding box corners)."""
    if kind == "circle":
        return [(0.0, 0.0), (1.0, 1.0)]
    if kind == "square":
        return [(0.08, 0.08), (0.92, 0.08), (0.92, 0.92), (0.08, 0.92)]
    if kind == "triangle":
        return [(0.5, 0.04), (0.97, 0.93), (0.03, 0.93)]
    if kind == "diamond":
        return [(0.5, 0.0), (1.0, 0.5), (0.5, 1.0), (0.0, 0.5)]
    if kind == "star":
        k = np.arange(10)
        radius = np.where(k % 2 == 0, 0.5, 0.2)
        angle = -np.pi / 2 + k * np.pi / 5
        return [(0.5 + r * np.cos(a), 0.53 + r * np.sin(a)) for r, a in zip(radius, angle)]
    if kind == "cross":
        a, b = 0.33, 0.67
        return [(a, 0), (b, 0), (b, a), (1, a), (1, b), (b, b), (b, 1), (a, 1), (a, b), (0, b), (0, a), (a, a)]
    raise ValueError(f"unknown shape {kind!r}; shapes: {', '.join(SHAPES)}.")
