"""Captions of the ``signs`` world: a grammar that states the core pair, sometimes a distractor
and the photograph behind them.

```
sign     := a [colour] letter L | a colour L | the letter L in colour | a colour capital L
          | the word W in colour | a colour word W | a colour sign reading W | a colour W sign
          | a colour icon | a colour icon shape | a colour icon symbol          (an, for a vowel)
relation := to the left of | left of | on the left of   (and right)
          | above | over | higher up than      below | under | beneath | lower down than
core     := A rel B | A is rel B | there is A rel B | B rel' A            (rel' the opposite)
caption  := core | core, with S elsewhere | core, and S nearby | on a picture of P, core | ...
```

On a plain canvas (``photo=False``) no caption names a photograph.
"""

from __future__ import annotations

import numpy as np

from xmatch.signs.world import OPPOSITE, Board, Sign

RELATION_PHRASES: dict[str, tuple[str, ...]] = {
    "left": ("to the left of", "left of", "on the left of"),
    "right": ("to the right of", "right of", "on the right of"),
    "above": ("above", "over", "higher up than"),
    "below": ("below", "under", "beneath", "lower down than"),
}
#: what each backdrop shows, as a caption names it
PHOTOS: dict[str, str] = {
    "astronaut": "an astronaut", "coffee": "a cup of coffee", "chelsea": "a cat", "rocket": "a rocket",
    "hubble_deep_field": "galaxies", "immunohistochemistry": "stained cells", "retina": "a retina",
    "brick": "a brick wall", "grass": "grass", "gravel": "gravel", "coins": "coins", "camera": "a cameraman",
    "moon": "the moon's surface", "horse": "a horse", "page": "a printed page",
}


def _a(word: str) -> str:
    return ("an " if word[0] in "aeiouAEIOU" else "a ") + word


def name_sign(sign: Sign, rng: np.random.Generator) -> str:
    """One of the ways a caption names the sign.

    Example:
        >>> name_sign(Sign("letter", "K", "red", "cmr10.ttf", (0, 0, 9, 12)), np.random.default_rng(4))
        'the letter K in red'
    """
    c, n = sign.colour, sign.name
    if sign.kind == "letter":
        forms = (f"{_a(c)} letter {n}", f"{_a(c)} {n}", f"the letter {n} in {c}", f"{_a(c)} capital {n}")
    elif sign.kind == "word":
        forms = (f"the word {n} in {c}", f"{_a(c)} word {n}", f"{_a(c)} sign reading {n}", f"{_a(c)} {n} sign")
    else:
        forms = (f"{_a(c)} {n}", f"{_a(c)} {n} shape", f"{_a(c)} {n} symbol")
    return forms[int(rng.integers(len(forms)))]


def core_phrase(board: Board, rng: np.random.Generator) -> str:
    """The core relation, in one of the grammar's orders."""
    a, b = board.signs[:2]
    order = int(rng.integers(4))
    relation = board.relation if order < 3 else OPPOSITE[board.relation]
    phrases = RELATION_PHRASES[relation]
    rel = phrases[int(rng.integers(len(phrases)))]
    first, second = (name_sign(a, rng), name_sign(b, rng))
    if order == 0:
        return f"{first} {rel} {second}"
    if order == 1:
        return f"{first} is {rel} {second}"
    if order == 2:
        return f"there is {first} {rel} {second}"
    return f"{second} {rel} {first}"


def captions(board: Board, rng: np.random.Generator, n: int, photo: bool = True) -> list[str]:
    """``n`` different captions of the board, each stating its core; ``photo=False`` (a plain
    canvas) never names the board's photograph.

    Example:
        >>> from xmatch.signs.world import sample_group
        >>> base = sample_group(np.random.default_rng(0))[0]
        >>> len(set(captions(base, np.random.default_rng(0), 5)))
        5
    """
    out: list[str] = []
    for _ in range(50 * n):
        text = core_phrase(board, rng)
        extra = int(rng.integers(4))
        if extra == 1 and len(board.signs) > 2:
            other = board.signs[2 + int(rng.integers(len(board.signs) - 2))]
            text += (", with ", ", and ")[int(rng.integers(2))] + name_sign(other, rng) + (" elsewhere", " nearby")[int(rng.integers(2))]
        elif extra == 2 and photo:
            text = f"on a picture of {PHOTOS[board.backdrop.photo]}, {text}"
        if text not in out:
            out.append(text)
        if len(out) == n:
            return out
    raise RuntimeError(f"could not write {n} different captions for a board; ask for fewer.")
