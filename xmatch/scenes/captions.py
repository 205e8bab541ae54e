"""Captions of the ``scenes`` benchmark: a small grammar with paraphrases.

A caption states the related pair and its relation, optionally the distractors::

    caption    := core | core extra
    core       := [lead] object rel object            lead: "", "there is ", "a picture of ", ...
                | object "is" rel object
    object     := "a" size colour noun                size: small | little | tiny / large | big
    noun       := digit | "digit" digit | "number" word | shape     ("7", "digit 7", "number seven")
    rel        := left: "to the left of" | "left of" | "on the left of";  right: likewise;
                  above: "above" | "over";  below: "below" | "under" | "beneath"
    extra      := ", and there is also " objects | "; " objects " also in the picture" | ...

The pair is stated in either order, with the inverse relation when reversed ("a red 7 left
of a blue circle" = "a blue circle right of a red 7"). Every object phrase starts with a size
word, all of which begin with a consonant, so the article is always "a".
"""

from __future__ import annotations

import numpy as np

from xmatch.scenes.render import DIGITS, INVERSE, Scene, SceneObject

SIZE_WORDS: dict[str, tuple[str, ...]] = {"small": ("small", "little", "tiny"), "large": ("large", "big")}
NUMBER_WORDS: tuple[str, ...] = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
RELATION_WORDS: dict[str, tuple[str, ...]] = {
    "left": ("to the left of", "left of", "on the left of"),
    "right": ("to the right of", "right of", "on the right of"),
    "above": ("above", "over"),
    "below": ("below", "under", "beneath"),
}
CORE_TEMPLATES: tuple[str, ...] = (
    "{x} {rel} {y}",
    "{x} is {rel} {y}",
    "there is {x} {rel} {y}",
    "a picture of {x} {rel} {y}",
    "an image showing {x} {rel} {y}",
)
#: ({singular form}, {plural form}) of the sentence that mentions the distractors
EXTRA_TEMPLATES: tuple[tuple[str, str], ...] = (
    ("{core}, and there is also {d}", "{core}, and there are also {d}"),
    ("{core}; {d} is also in the picture", "{core}; {d} are also in the picture"),
    ("{core}, with {d} elsewhere", "{core}, with {d} elsewhere"),
)
#: chance that a caption mentions the distractors (when the scene has some)
MENTION_DISTRACTORS = 0.6
TRIES = 50


def object_phrase(obj: SceneObject, rng: np.random.Generator | None = None) -> str:
    """``"a <size> <colour> <noun>"``; without ``rng`` the first paraphrase of each word.

    Example:
        >>> object_phrase(SceneObject("7", "red", "small", (0.0, 0.0), 10.0))
        'a small red 7'
    """
    def pick(options: tuple[str, ...]) -> str:
        return options[0] if rng is None else options[int(rng.integers(len(options)))]

    if obj.kind in DIGITS:
        noun = pick((obj.kind, f"digit {obj.kind}", f"number {NUMBER_WORDS[int(obj.kind)]}"))
    else:
        noun = obj.kind
    return f"a {pick(SIZE_WORDS[obj.size])} {obj.colour} {noun}"


def describe(scene: Scene) -> str:
    """The canonical caption: the pair with the first paraphrase of every word, stated with
    "to the left of" or "above" (a pair that is right of / below is stated from the other
    object).

    Both scenes of a group therefore have the same words in another order, which is what
    makes them hard negatives of each other.

    Example:
        >>> a = SceneObject("7", "red", "small", (150.0, 100.0), 30.0)
        >>> b = SceneObject("circle", "blue", "large", (50.0, 100.0), 70.0)
        >>> describe(Scene((a, b), "right", "base", (40, 90, 0.0)))
        'a large blue circle to the left of a small red 7'
    """
    a, b = scene.objects[:2]
    relation = scene.relation
    if relation in ("right", "below"):
        a, b, relation = b, a, INVERSE[relation]
    return f"{object_phrase(a)} {RELATION_WORDS[relation][0]} {object_phrase(b)}"


def captions(scene: Scene, rng: np.random.Generator, count: int = 5) -> list[str]:
    """``count`` different captions of ``scene`` drawn from the grammar.

    Example:
        >>> from xmatch.scenes.render import sample_group
        >>> len(set(captions(sample_group(np.random.default_rng(0), 224)[0], np.random.default_rng(1))))
        5
    """
    out: list[str] = []
    for _ in range(TRIES * count):
        caption = _one_caption(scene, rng)
        if caption not in out:
            out.append(caption)
        if len(out) == count:
            return out
    raise ValueError(f"the grammar gave only {len(out)} different captions for a scene, fewer than {count}.")


def _one_caption(scene: Scene, rng: np.random.Generator) -> str:
    first, second = scene.objects[:2]
    relation = scene.relation
    if rng.random() < 0.5:  # the same fact stated from the other object
        first, second, relation = second, first, INVERSE[relation]
    rel = RELATION_WORDS[relation][int(rng.integers(len(RELATION_WORDS[relation])))]
    template = CORE_TEMPLATES[int(rng.integers(len(CORE_TEMPLATES)))]
    core = template.format(x=object_phrase(first, rng), rel=rel, y=object_phrase(second, rng))
    distractors = scene.objects[2:]
    if not distractors or rng.random() >= MENTION_DISTRACTORS:
        return core
    singular, plural = EXTRA_TEMPLATES[int(rng.integers(len(EXTRA_TEMPLATES)))]
    listed = " and ".join(object_phrase(d, rng) for d in distractors)
    return (plural if len(distractors) > 1 else singular).format(core=core, d=listed)
