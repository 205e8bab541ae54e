"""Tables of the built-in ``tabletop`` world: household objects, layouts, hard-negative twins, drawing.

A table holds a *core* and up to two distractors. The core is what its captions state:

- a pair, ``things[0]`` *relation* ``things[1]``: asymmetric ``left`` (to the left of),
  ``on_top`` (touching, stacked), ``inside`` (box within the container's box, drawn over it),
  ``front`` (overlapping, drawn over it and standing lower), or symmetric ``next_to`` (side by
  side, a few pixels apart), ``near`` (a few pixels apart in any direction), ``far`` (most of the
  canvas apart);
- ``between``: ``things[0]`` between ``things[1]`` and ``things[2]`` in one row;
- ``count``: ``things[:count]`` are copies (same kind, colour, pattern, size), ``things[count]``
  another object.

Every relation holds by construction of the boxes, and :func:`holds` reads it back from them.
Objects are drawn with Pillow (polygons and ellipses) in a colour and a pattern (``plain``,
``striped``, ``dotted``), 20-70 px on a 224-px canvas, on a lightly grained table top.

Tables come in groups of two that differ in one declared detail (the twin's ``variant``):
``roles`` (the pair trade places: ``A on top of B`` / ``B on top of A``; the middle and an end of
``between``), ``colour`` (the pair swap colours), ``pattern`` (the pair swap patterns),
``relation`` (another relation between the same pair, one that makes the first false) or
``count`` (one copy more or fewer).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

#: RGB of each colour word; none of them is a colour of the scenes world
COLOURS: dict[str, tuple[int, int, int]] = {
    "teal": (0, 128, 128),
    "navy": (25, 35, 115),
    "maroon": (125, 15, 40),
    "olive": (120, 120, 10),
    "beige": (225, 200, 150),
    "violet": (150, 90, 225),
    "gold": (235, 180, 20),
    "pink": (245, 130, 175),
}
PATTERNS: tuple[str, ...] = ("plain", "striped", "dotted")
#: object kinds and their width / height ratio
ASPECT: dict[str, float] = {
    "cup": 1.15, "bowl": 1.7, "bottle": 0.45, "book": 1.45, "key": 2.0, "ball": 1.0,
    "box": 1.1, "lamp": 0.7, "plant": 0.75, "spoon": 2.2, "egg": 0.78,
}
KINDS: tuple[str, ...] = tuple(ASPECT)
CONTAINERS: tuple[str, ...] = ("cup", "bowl", "box")
#: what fits inside a container
ITEMS: tuple[str, ...] = ("key", "ball", "spoon", "egg")
#: the longer side of a ``small`` and a ``large`` object, in pixels on a 224-px canvas
SIDES: dict[str, tuple[float, float]] = {"small": (20.0, 34.0), "large": (46.0, 70.0)}
PAIR_RELATIONS: tuple[str, ...] = ("left", "on_top", "inside", "front", "next_to", "near", "far")
SYMMETRIC: tuple[str, ...] = ("next_to", "near", "far")
RELATIONS: tuple[str, ...] = (*PAIR_RELATIONS, "between", "count")
#: the twin's relation for a ``relation`` twin: one that is false wherever the first holds
RELATION_TWIN: dict[str, str] = {
    "left": "on_top", "on_top": "front", "inside": "front", "front": "left",
    "next_to": "on_top", "near": "far", "far": "near",
}
#: the kinds of twin each core allows (``roles`` needs an asymmetric relation)
TWIN_KINDS: dict[str, tuple[str, ...]] = {
    **{r: ("roles", "colour", "pattern", "relation") for r in ("left", "on_top", "front")},
    "inside": ("colour", "pattern", "relation"),
    **{r: ("colour", "pattern", "relation") for r in SYMMETRIC},
    "between": ("roles", "colour", "pattern"),
    "count": ("count", "colour"),
}
VARIANTS: tuple[str, ...] = ("base", "roles", "colour", "pattern", "relation", "count")
#: geometry of the relations, in pixels on a 224-px canvas (scaled with the canvas)
NEXT_GAP = (2, 8)
NEAR_GAP = 14
FAR_GAP = 90
OVERLAP = 6
#: gap kept between distractors and every other object
CLEARANCE = 8
SUPERSAMPLE = 4
TRIES = 200


@dataclass(frozen=True)
class Thing:
    """One object on the table.

    Attributes:
        kind: a key of :data:`ASPECT` (``cup``, ``bowl``, ...).
        colour: a key of :data:`COLOURS`.
        pattern: ``plain``, ``striped`` or ``dotted``.
        size: ``small`` or ``large``.
        box: ``(x1, y1, x2, y2)`` integer pixel box the object fills edge to edge.
        depth: drawing order (higher is drawn later, over lower ones).
    """

    kind: str
    colour: str
    pattern: str
    size: str
    box: tuple[int, int, int, int]
    depth: int = 0


@dataclass(frozen=True)
class Table:
    """One picture's content.

    Attributes:
        things: the core first (see the module docstring), then distractors.
        relation: a key of :data:`RELATIONS`.
        variant: ``base``, or what this twin changed w.r.t. its group's base table.
        background: ``(tone, warmth, grain period, grain phase, noise seed)`` of the table top.
        count: copies in a ``count`` core (else 0).
    """

    things: tuple[Thing, ...]
    relation: str
    variant: str
    background: tuple[int, int, float, float, int]
    count: int = 0

    @property
    def core(self) -> int:
        """How many leading things the captions' statement is about."""
        if self.relation == "count":
            return self.count + 1
        return 3 if self.relation == "between" else 2


# -- relations read back from boxes -----------------------------------------------------------


def gap(a: tuple[int, ...], b: tuple[int, ...]) -> float:
    """Euclidean distance between two boxes (0 when they touch or overlap).

    Example:
        >>> gap((0, 0, 10, 10), (13, 14, 20, 20))
        5.0
    """
    dx = max(b[0] - a[2], a[0] - b[2], 0)
    dy = max(b[1] - a[3], a[1] - b[3], 0)
    return float(np.hypot(dx, dy))


def _overlap(a: tuple[int, ...], b: tuple[int, ...], axis: int) -> int:
    return min(a[axis + 2], b[axis + 2]) - max(a[axis], b[axis])


def holds(relation: str, a: Thing, b: Thing, c: Thing | None = None, canvas: int = 224) -> bool:
    """Whether ``a`` *relation* ``b`` (``between``: ``a`` between ``b`` and ``c``) holds of the
    boxes and drawing order, read as a person reads the picture. Converses are read from the
    other side: ``under`` = ``on_top`` reversed, ``right``, ``behind``, ``contains`` likewise.

    Example:
        >>> cup = Thing("cup", "teal", "plain", "small", (10, 10, 40, 40))
        >>> book = Thing("book", "navy", "plain", "large", (60, 12, 120, 50))
        >>> holds("left", cup, book), holds("right", cup, book), holds("next_to", cup, book)
        (True, False, False)
    """
    converse = {"right": "left", "under": "on_top", "behind": "front", "contains": "inside"}
    if relation in converse:
        return holds(converse[relation], b, a, c, canvas)
    ab, bb = a.box, b.box
    scale = canvas / 224
    if relation == "left":
        return ab[2] <= bb[0]
    if relation == "on_top":  # resting on it: touching from above, over its top
        return abs(ab[3] - bb[1]) <= 1 and _overlap(ab, bb, 0) > 0.5 * min(ab[2] - ab[0], bb[2] - bb[0])
    if relation == "inside":
        return bb[0] <= ab[0] and bb[1] <= ab[1] and ab[2] <= bb[2] and ab[3] <= bb[3] and a.depth > b.depth
    if relation == "front":  # overlapping, drawn over it, standing lower (nearer)
        overlaps = _overlap(ab, bb, 0) > 0 and _overlap(ab, bb, 1) > 0
        return overlaps and a.depth > b.depth and ab[3] > bb[3]
    if relation == "next_to":  # side by side in one row, a few pixels apart
        row = _overlap(ab, bb, 1) >= 0.5 * min(ab[3] - ab[1], bb[3] - bb[1])
        apart = max(bb[0] - ab[2], ab[0] - bb[2])
        return row and 0 < apart <= NEXT_GAP[1] * scale + 1
    if relation == "near":
        return 0 < gap(ab, bb) <= NEAR_GAP * scale + 1
    if relation == "far":
        return gap(ab, bb) >= FAR_GAP * scale - 1
    if relation == "between":
        if c is None:
            raise ValueError("between needs a third object.")
        ends = sorted((b, c), key=lambda t: t.box[0])
        return holds("left", ends[0], a, canvas=canvas) and holds("left", a, ends[1], canvas=canvas)
    raise ValueError(f"unknown relation {relation!r}; relations: {', '.join(RELATIONS)}.")


# -- sampling ---------------------------------------------------------------------------------


def sample_group(rng: np.random.Generator, canvas: int = 224, relation: str | None = None,
                 variant: str | None = None) -> tuple[Table, Table]:
    """A base table and its hard-negative twin, which differs in one declared detail.

    Args:
        rng: the group's random stream.
        canvas: image side in pixels (object sizes scale with it).
        relation: the core (a key of :data:`RELATIONS`); None draws one.
        variant: what the twin changes (one of :data:`TWIN_KINDS` of the core); None draws one.

    Example:
        >>> base, twin = sample_group(np.random.default_rng(0), relation="left", variant="roles")
        >>> a, b = twin.things[1], twin.things[0]  # the base's pair, after trading places
        >>> holds("left", *base.things[:2]), holds("right", a, b), twin.variant
        (True, True, 'roles')
    """
    if relation is not None and relation not in RELATIONS:
        raise ValueError(f"unknown relation {relation!r}; relations: {', '.join(RELATIONS)}.")
    if canvas < 160:
        raise ValueError(f"canvas must be at least 160 pixels (objects need room), got {canvas}.")
    rel = relation or RELATIONS[int(rng.integers(len(RELATIONS)))]
    kinds = TWIN_KINDS[rel]
    if variant is not None and variant not in kinds:
        raise ValueError(f"a {rel} table has no {variant!r} twin; its twins: {', '.join(kinds)}.")
    kind = variant or kinds[int(rng.integers(len(kinds)))]
    for _ in range(TRIES):  # the relation and the twin's kind stay drawn: every core is as frequent
        pair = _try_group(rng, canvas, rel, kind)
        if pair is not None:
            return pair
    raise ValueError(f"could not lay out a {rel} table with a {kind} twin on a {canvas}-px canvas in {TRIES} tries.")


def _try_group(rng: np.random.Generator, canvas: int, relation: str, variant: str) -> tuple[Table, Table] | None:
    scale = canvas / 224
    if relation == "count":
        count = int(rng.integers(2, 4))
        twin_count = count + 1 if count == 2 else count - 1
        kinds = rng.choice(len(KINDS), size=2, replace=False)
        colours = rng.choice(len(COLOURS), size=2, replace=False)
        patterns = rng.choice(len(PATTERNS), size=2)
        sizes = [str(rng.choice(("small", "large"))) for _ in range(2)]
        looks = [(KINDS[k], list(COLOURS)[c], PATTERNS[p], s) for k, c, p, s in zip(kinds, colours, patterns, sizes)]
        most = max(count, twin_count)
        things = _scatter(rng, canvas, [looks[0]] * most + [looks[1]], [])
        if things is None:
            return None
        base_things = things[:count] + things[most:]
        if variant == "count":
            twin_things = things[:twin_count] + things[most:]
        else:  # the copies and the other object swap colours
            twin_things = tuple(replace(t, colour=looks[1][1] if i < count else looks[0][1])
                                for i, t in enumerate(base_things))
        base = (base_things, count)
        twin = (twin_things, twin_count if variant == "count" else count)
    else:
        looks = _draw_looks(rng, relation, variant)
        base_core = _lay_out(rng, canvas, relation, looks, scale)
        if base_core is None:
            return None
        twin_core = _twin_core(rng, canvas, relation, variant, looks, base_core, scale)
        if twin_core is None or not _on_canvas(base_core + twin_core, canvas):
            return None
        base = (base_core, 0)
        twin = (twin_core, 0)
    taken = [t.box for t in base[0] + twin[0]]
    distractors = _distractors(rng, canvas, {t.kind for t in base[0] + twin[0]}, taken, scale)
    background = (int(rng.integers(165, 211)), int(rng.integers(-12, 13)), float(rng.uniform(5, 12)),
                  float(rng.uniform(0, 2 * np.pi)), int(rng.integers(2**31)))
    base_table = Table(base[0] + distractors, relation, "base", background, base[1])
    twin_table = Table(twin[0] + distractors, _twin_relation(relation, variant), variant, background, twin[1])
    return base_table, twin_table


def _twin_relation(relation: str, variant: str) -> str:
    return RELATION_TWIN[relation] if variant == "relation" else relation


def _draw_looks(rng: np.random.Generator, relation: str, variant: str) -> list[tuple[str, str, str, str]]:
    """``(kind, colour, pattern, size)`` of the core's objects, all kinds and colours different."""
    n = 3 if relation == "between" else 2
    if relation == "inside":
        kinds = [ITEMS[int(rng.integers(len(ITEMS)))], CONTAINERS[int(rng.integers(len(CONTAINERS)))]]
        sizes = ["small", "large"]
    else:
        kinds = [KINDS[k] for k in rng.choice(len(KINDS), size=n, replace=False)]
        # three in a row must fit the canvas; a pair stacked or overlapping reads best mixed
        sizes = ["small"] * n if relation == "between" else [str(rng.choice(("small", "large"))) for _ in range(n)]
    colours = [list(COLOURS)[c] for c in rng.choice(len(COLOURS), size=n, replace=False)]
    if variant == "pattern":  # swapping needs two different patterns
        patterns = [PATTERNS[p] for p in rng.choice(len(PATTERNS), size=2, replace=False)]
        patterns += [PATTERNS[int(rng.integers(len(PATTERNS)))] for _ in range(n - 2)]
    else:
        patterns = [PATTERNS[int(rng.integers(len(PATTERNS)))] for _ in range(n)]
    return list(zip(kinds, colours, patterns, sizes))


def _dims(rng: np.random.Generator, kind: str, size: str, scale: float) -> tuple[int, int]:
    """Width and height of an object: its longer side drawn from :data:`SIDES`, the other from
    the kind's aspect ratio."""
    long = rng.uniform(*SIDES[size]) * scale
    aspect = ASPECT[kind]
    w, h = (long, long / aspect) if aspect >= 1 else (long * aspect, long)
    return max(int(round(w)), 6), max(int(round(h)), 6)


def _thing(look: tuple[str, str, str, str], x: float, y: float, w: int, h: int, depth: int = 0) -> Thing:
    """A thing of ``look`` whose box has its top-left corner at ``(x, y)``."""
    x0, y0 = int(round(x)), int(round(y))
    return Thing(*look, box=(x0, y0, x0 + w, y0 + h), depth=depth)


def _on_canvas(things: tuple[Thing, ...], canvas: int) -> bool:
    return all(0 <= t.box[0] < t.box[2] <= canvas and 0 <= t.box[1] < t.box[3] <= canvas for t in things)


def _lay_out(rng: np.random.Generator, canvas: int, relation: str, looks: list, scale: float,
             dims: list[tuple[int, int]] | None = None) -> tuple[Thing, ...] | None:
    """The core's things placed so that ``relation`` holds, or None if they do not fit; ``dims``
    (widths and heights) are drawn unless given."""
    dims = dims or [_dims(rng, look[0], look[3], scale) for look in looks]
    (wa, ha), (wb, hb) = dims[:2]
    margin = 4 * scale
    if relation in ("left", "next_to"):
        lo, hi = NEXT_GAP if relation == "next_to" else (12, 100)
        space = float(rng.uniform(lo, hi)) * scale
        if wa + wb + space > canvas - 2 * margin:
            return None
        xa = rng.uniform(margin, canvas - margin - (wa + wb + space))
        base_line = rng.uniform(margin + max(ha, hb), canvas - margin)  # a common floor: bottoms aligned
        return (_thing(looks[0], xa, base_line - ha, wa, ha),
                _thing(looks[1], xa + wa + space, base_line - hb, wb, hb))
    if relation == "on_top":
        return _stack(rng, canvas, looks, dims, margin)
    if relation == "inside":
        xb = rng.uniform(margin, canvas - margin - wb)
        yb = rng.uniform(margin, canvas - margin - hb)
        if wa > wb - 4 or ha > hb - 4:
            return None
        # the container's box minus its handle / rim margin, so the item sits within its body
        xa = xb + rng.uniform(2, (wb - wa) * (0.75 if looks[1][0] == "cup" else 1.0) - 2 + 1e-6)
        ya = yb + rng.uniform(2, hb - ha - 2 + 1e-6)
        return (_thing(looks[0], xa, ya, wa, ha, depth=1), _thing(looks[1], xb, yb, wb, hb))
    if relation == "front":
        return _front(rng, canvas, looks, dims, margin)
    if relation in ("near", "far"):
        for _ in range(TRIES):
            xb, yb = rng.uniform(margin, canvas - margin - wb), rng.uniform(margin, canvas - margin - hb)
            xa, ya = rng.uniform(margin, canvas - margin - wa), rng.uniform(margin, canvas - margin - ha)
            a, b = _thing(looks[0], xa, ya, wa, ha), _thing(looks[1], xb, yb, wb, hb)
            d = gap(a.box, b.box)
            if (relation == "near" and 3 * scale <= d <= NEAR_GAP * scale) or (relation == "far" and d >= FAR_GAP * scale + 4):
                return a, b
        return None
    if relation == "between":
        wc, hc = dims[2]
        spaces = rng.uniform(10, 30, size=2) * scale
        widest = max(wa, wb, wc)
        # slots as wide as the widest object, so the middle and an end can trade places
        step = widest + spaces
        if 3 * widest + spaces.sum() > canvas - 2 * margin:
            return None
        x0 = rng.uniform(margin, canvas - margin - 3 * widest - spaces.sum())
        floor = rng.uniform(margin + max(ha, hb, hc), canvas - margin)
        slots = [x0, x0 + step[0], x0 + step[0] + step[1]]
        order = [1, 0, 2] if rng.random() < 0.5 else [2, 0, 1]  # things[0] in the middle slot
        return tuple(
            _thing(looks[i], slots[order.index(i)] + (widest - w) / 2, floor - h, w, h)
            for i, (w, h) in enumerate(dims)
        )
    raise ValueError(f"unknown relation {relation!r}")


def _stack(rng: np.random.Generator, canvas: int, looks: list, dims: list, margin: float) -> tuple[Thing, Thing] | None:
    """``looks[0]`` resting on ``looks[1]``: the top one's bottom edge on the lower one's top edge."""
    (wa, ha), (wb, hb) = dims[:2]
    if ha + hb > canvas - 2 * margin:
        return None
    width = max(wa, wb)
    cx = rng.uniform(margin + width / 2, canvas - margin - width / 2)
    floor = int(round(rng.uniform(margin + ha + hb, canvas - margin)))
    shift = rng.uniform(-0.2, 0.2) * min(wa, wb)
    top = int(floor - hb)
    b = _thing(looks[1], cx - wb / 2, top, wb, hb)
    a = _thing(looks[0], cx + shift - wa / 2, top - ha, wa, ha)
    return a, b


def _front(rng: np.random.Generator, canvas: int, looks: list, dims: list, margin: float) -> tuple[Thing, Thing] | None:
    """``looks[0]`` in front of ``looks[1]``: overlapping, drawn over it, its bottom lower by more
    than the height difference (so neither box holds the other, whichever stands in front)."""
    (wa, ha), (wb, hb) = dims[:2]
    dy = abs(ha - hb) / 2 + rng.uniform(OVERLAP, OVERLAP + 12)
    if dy >= (ha + hb) / 2 - OVERLAP:
        return None
    dx = rng.uniform(-1, 1) * ((wa + wb) / 2 - OVERLAP)
    cbx = rng.uniform(margin + 1.5 * max(wa, wb), canvas - margin - 1.5 * max(wa, wb))
    cby = rng.uniform(margin + max(ha, hb), canvas - margin - max(ha, hb) - dy)
    b = _thing(looks[1], cbx - wb / 2, cby - hb / 2, wb, hb)
    a = _thing(looks[0], cbx + dx - wa / 2, cby + dy - ha / 2, wa, ha, depth=1)
    return a, b


def _twin_core(rng: np.random.Generator, canvas: int, relation: str, variant: str, looks: list,
               core: tuple[Thing, ...], scale: float) -> tuple[Thing, ...] | None:
    """The twin's core: the base core with one detail changed."""
    a, b = core[:2]
    if variant == "colour":
        return (replace(a, colour=b.colour), replace(b, colour=a.colour), *core[2:])
    if variant == "pattern":
        return (replace(a, pattern=b.pattern), replace(b, pattern=a.pattern), *core[2:])
    if variant == "roles":
        if relation == "on_top":  # restacked the other way up, on the same floor
            floor = b.box[3]
            hb, ha = b.box[3] - b.box[1], a.box[3] - a.box[1]
            a2 = replace(a, box=(a.box[0], floor - ha, a.box[2], floor))
            b2 = replace(b, box=(b.box[0], floor - ha - hb, b.box[2], floor - ha))
            return b2, a2
        # the one that now stands in the relation comes first, as in every table
        if relation == "front":  # trade centres and which is drawn over the other
            return _trade(b, a, depth=True)
        return (*_trade(b, a), *core[2:])  # left, between: trade places
    if variant == "relation":  # the same objects, the same size: only where they stand changes
        dims = [(t.box[2] - t.box[0], t.box[3] - t.box[1]) for t in core]
        return _lay_out(rng, canvas, RELATION_TWIN[relation], looks, scale, dims)
    raise ValueError(f"unknown twin variant {variant!r}; one of {', '.join(VARIANTS[1:])}.")


def _trade(a: Thing, b: Thing, depth: bool = False) -> tuple[Thing, Thing]:
    """``a`` and ``b`` trade centres (bottoms kept on the same floor line when in one row, or
    with ``depth`` the drawing order too)."""
    def moved(t: Thing, to: Thing) -> Thing:
        w, h = t.box[2] - t.box[0], t.box[3] - t.box[1]
        cx = (to.box[0] + to.box[2]) // 2
        if depth:
            cy = (to.box[1] + to.box[3]) // 2
            box = (cx - w // 2, cy - h // 2, cx - w // 2 + w, cy - h // 2 + h)
        else:
            box = (cx - w // 2, to.box[3] - h, cx - w // 2 + w, to.box[3])
        return replace(t, box=box, depth=to.depth if depth else t.depth)

    return moved(a, b), moved(b, a)


def _scatter(rng: np.random.Generator, canvas: int, looks: list, taken: list) -> tuple[Thing, ...] | None:
    """Objects placed anywhere, clear of each other and of ``taken`` boxes; copies of one look
    get the same dimensions."""
    scale = canvas / 224
    dims: dict[tuple, tuple[int, int]] = {}
    out: list[Thing] = []
    boxes = list(taken)
    for look in looks:
        w, h = dims.setdefault(look, _dims(rng, look[0], look[3], scale))
        thing = _place_clear(rng, canvas, look, w, h, boxes, scale)
        if thing is None:
            return None
        out.append(thing)
        boxes.append(thing.box)
    return tuple(out)


def _place_clear(rng: np.random.Generator, canvas: int, look: tuple, w: int, h: int, boxes: list,
                 scale: float) -> Thing | None:
    for _ in range(TRIES):
        x, y = rng.uniform(2, canvas - 2 - w), rng.uniform(2, canvas - 2 - h)
        thing = _thing(look, x, y, w, h)
        if all(gap(thing.box, b) >= CLEARANCE * scale for b in boxes):
            return thing
    return None


def _distractors(rng: np.random.Generator, canvas: int, used: set[str], taken: list, scale: float) -> tuple[Thing, ...]:
    """Up to two more objects of kinds the core does not use, clear of both twins' objects."""
    count = int(rng.choice(3, p=[0.35, 0.45, 0.2]))
    free = [k for k in KINDS if k not in used]
    out: list[Thing] = []
    boxes = list(taken)
    for kind in rng.choice(free, size=count, replace=False):
        look = (str(kind), list(COLOURS)[int(rng.integers(len(COLOURS)))],
                PATTERNS[int(rng.integers(len(PATTERNS)))], str(rng.choice(("small", "large"))))
        w, h = _dims(rng, look[0], look[3], scale)
        thing = _place_clear(rng, canvas, look, w, h, boxes, scale)
        if thing is not None:
            out.append(thing)
            boxes.append(thing.box)
    return tuple(out)


# -- drawing ----------------------------------------------------------------------------------


def render(table: Table, canvas: int = 224) -> tuple[np.ndarray, np.ndarray]:
    """Draw a table: ``(image [canvas, canvas, 3] uint8, boxes [n_things, 4] float32)``, the
    boxes being the things' own (each object fills its box edge to edge).

    Example:
        >>> image, boxes = render(sample_group(np.random.default_rng(0))[0])
        >>> image.shape, image.dtype, boxes.shape[1]
        ((224, 224, 3), dtype('uint8'), 4)
    """
    image = _table_top(table.background, canvas)
    order = sorted(range(len(table.things)), key=lambda i: table.things[i].depth)
    for i in order:
        thing = table.things[i]
        x0, y0, x1, y1 = thing.box
        alpha = _alpha(thing.kind, x1 - x0, y1 - y0)
        fill = _fill(thing, x1 - x0, y1 - y0)
        edge = _edge(alpha)
        patch = image[y0:y1, x0:x1]
        a = alpha[: patch.shape[0], : patch.shape[1], None]
        e = edge[: patch.shape[0], : patch.shape[1], None]
        colour = fill[: patch.shape[0], : patch.shape[1]] * (1 - e) + fill[: patch.shape[0], : patch.shape[1]] * 0.45 * e
        image[y0:y1, x0:x1] = patch * (1 - a) + colour * a
    boxes = np.array([t.box for t in table.things], dtype=np.float32).reshape(-1, 4)
    return np.rint(image).clip(0, 255).astype(np.uint8), boxes.clip(0, canvas)


def _table_top(background: tuple[int, int, float, float, int], canvas: int) -> np.ndarray:
    """A light table top: a grey tone, slightly warm or cool, with a faint wood grain (noise that
    varies along the grain's rows only, so the pictures stay small as PNG files)."""
    tone, warmth, period, phase, seed = background
    y, x = np.mgrid[0:canvas, 0:canvas].astype(np.float32)
    grain = 5 * np.sin(2 * np.pi * y / period + phase + 0.8 * np.sin(x / 23.0))
    noise = np.random.default_rng(seed).normal(0, 2.5, size=(canvas, 1)).astype(np.float32)
    grey = tone + grain + noise
    tint = np.array([warmth, warmth / 3, -warmth], dtype=np.float32) / 2
    return grey[:, :, None] + tint


def _fill(thing: Thing, w: int, h: int) -> np.ndarray:
    """The object's colour with its pattern, ``[h, w, 3]`` float32."""
    colour = np.asarray(COLOURS[thing.colour], dtype=np.float32)
    fill = np.broadcast_to(colour, (h, w, 3)).copy()
    y, x = np.mgrid[0:h, 0:w]
    # patterns in the lighter or darker tone of the colour, whichever contrasts more
    other = colour * 0.45 if colour.mean() > 150 else colour + (255 - colour) * 0.6
    if thing.pattern == "striped":
        fill[((x + y) // 4) % 2 == 1] = other
    elif thing.pattern == "dotted":
        fill[((x % 7 - 3) ** 2 + (y % 7 - 3) ** 2) <= 3] = other
    if thing.kind == "book":  # the spine, a shade darker
        fill[:, : max(w // 8, 1)] *= 0.7
    return fill


def _edge(alpha: np.ndarray) -> np.ndarray:
    """A thin dark rim where the shape meets its outside, so touching objects stay apart."""
    from PIL import Image, ImageFilter

    inner = Image.fromarray(np.uint8(alpha * 255)).filter(ImageFilter.MinFilter(3))
    return np.clip(alpha - np.asarray(inner, dtype=np.float32) / 255, 0, 1)


def _alpha(kind: str, w: int, h: int) -> np.ndarray:
    """Coverage ``[h, w]`` in [0, 1] of the object drawn to fill a ``w x h`` box edge to edge."""
    from PIL import Image, ImageDraw

    s = SUPERSAMPLE
    W, H = w * s, h * s
    mask = Image.new("L", (W, H), 0)
    draw = ImageDraw.Draw(mask)

    def poly(points: list[tuple[float, float]]) -> None:
        draw.polygon([(px * (W - 1), py * (H - 1)) for px, py in points], fill=255)

    def ellipse(x0: float, y0: float, x1: float, y1: float, fill: int = 255) -> None:
        draw.ellipse([x0 * (W - 1), y0 * (H - 1), x1 * (W - 1), y1 * (H - 1)], fill=fill)

    if kind == "cup":
        poly([(0, 0), (0.78, 0), (0.68, 1), (0.1, 1)])
        ellipse(0.58, 0.15, 1.0, 0.7)
        ellipse(0.7, 0.3, 0.88, 0.55, fill=0)
        poly([(0, 0), (0.78, 0), (0.68, 1), (0.1, 1)])
    elif kind == "bowl":
        draw.chord([0, -(H - 1), W - 1, H - 1], 0, 180, fill=255)
    elif kind == "bottle":
        poly([(0.35, 0), (0.65, 0), (0.65, 0.3), (1, 0.45), (1, 1), (0, 1), (0, 0.45), (0.35, 0.3)])
    elif kind == "book":
        poly([(0, 0), (1, 0), (1, 1), (0, 1)])
    elif kind == "key":
        ellipse(0, 0, 0.42, 1)
        ellipse(0.1, 0.3, 0.28, 0.7, fill=0)
        poly([(0.38, 0.35), (1, 0.35), (1, 0.85), (0.9, 0.85), (0.9, 0.65), (0.78, 0.65), (0.78, 0.85),
              (0.68, 0.85), (0.68, 0.65), (0.38, 0.65)])
    elif kind == "ball":
        ellipse(0, 0, 1, 1)
    elif kind == "box":
        poly([(0, 0.12), (1, 0.12), (1, 1), (0, 1)])
        poly([(0.08, 0), (0.92, 0), (1, 0.12), (0, 0.12)])
    elif kind == "lamp":
        poly([(0.2, 0), (0.8, 0), (1, 0.45), (0, 0.45)])
        poly([(0.45, 0.45), (0.55, 0.45), (0.55, 0.9), (0.45, 0.9)])
        poly([(0.15, 0.9), (0.85, 0.9), (0.85, 1), (0.15, 1)])
    elif kind == "plant":
        poly([(0.15, 0.55), (0.85, 0.55), (0.72, 1), (0.28, 1)])
        ellipse(0, 0.1, 0.5, 0.6)
        ellipse(0.5, 0.1, 1, 0.6)
        ellipse(0.3, 0, 0.7, 0.55)
    elif kind == "spoon":
        ellipse(0, 0, 0.42, 1)
        poly([(0.38, 0.4), (1, 0.35), (1, 0.65), (0.38, 0.6)])
    elif kind == "egg":
        ellipse(0, 0, 1, 1)
    else:
        raise ValueError(f"unknown kind {kind!r}; kinds: {', '.join(KINDS)}.")
    small = mask.resize((w, h), Image.Resampling.BOX)  # area average = anti-aliased edges
    return np.asarray(small, dtype=np.float32) / 255
