"""Captions of the ``tabletop`` world: a grammar with paraphrases, articles and sentence forms.

A caption states the table's core (:mod:`xmatch.tabletop.world`), optionally the distractors::

    caption  := [lead] core | core extra
    object   := ("a" | "an" | "the") [size] [pattern] colour noun ["with stripes" | "with dots" ...]
    size     := small | little | tiny / large | big        pattern := striped | dotted | spotted | plain ...
    pair     := object rel object | object "is" rel object | "there is" object rel object
              | object ("sits" | "stands") rel object | object "with" object rel-it   ("a book with a cup on top")
              | object ("contains" | "holds") object
    rel      := left: "to the left of" | "left of" | "on the left of";  right: likewise;
                on top: "on top of" | "on" | "resting on";  under: "under" | "beneath" | "underneath" | "below";
                inside: "inside" | "in";  in front: "in front of";  behind: "behind";
                next to: "next to" | "beside" | "alongside";  near: "near" | "close to";  far: "far from" | "far away from"
    between  := object "is between" object "and" object | object "and" object "with" object "between them" | ...
    count    := ("two" | "a pair of" | "three") [size] [pattern] colour nouns "and" object | ...
    extra    := ", and there is also " objects | "; " objects " is also on the table" | ", with " objects " elsewhere"

An asymmetric pair is stated from either object, with the converse relation when reversed (``a
cup on top of a book`` = ``a book under a cup`` = ``a book with a cup on top``); a symmetric one
in either order with the same words. Colour is always stated; a pattern always unless plain
(``plain`` is said sometimes); size sometimes. The article agrees with the next word (``an olive
cup``, ``an egg``).
"""

from __future__ import annotations

import numpy as np

from xmatch.tabletop.world import SYMMETRIC, Table, Thing

SIZE_WORDS: dict[str, tuple[str, ...]] = {"small": ("small", "little", "tiny"), "large": ("large", "big")}
#: pattern words before the noun, and phrases after it
PATTERN_WORDS: dict[str, tuple[str, ...]] = {"striped": ("striped", "stripy"), "dotted": ("dotted", "spotted", "polka-dot"),
                                             "plain": ("plain",)}
PATTERN_PHRASES: dict[str, tuple[str, ...]] = {"striped": ("with stripes",), "dotted": ("with dots", "with polka dots")}
PLURALS: dict[str, str] = {"box": "boxes"}
NUMBER_WORDS: dict[int, tuple[str, ...]] = {2: ("two", "a pair of"), 3: ("three",)}
#: ``x REL y`` phrases of each relation and of each converse
RELATION_WORDS: dict[str, tuple[str, ...]] = {
    "left": ("to the left of", "left of", "on the left of"),
    "right": ("to the right of", "right of", "on the right of"),
    "on_top": ("on top of", "on", "resting on"),
    "under": ("under", "beneath", "underneath", "below"),
    "inside": ("inside", "in"),
    "front": ("in front of",),
    "behind": ("behind",),
    "next_to": ("next to", "beside", "alongside"),
    "near": ("near", "close to"),
    "far": ("far from", "far away from"),
}
#: the converse of each asymmetric relation; ``contains`` is said only with a verb
CONVERSE: dict[str, str] = {"left": "right", "on_top": "under", "inside": "contains", "front": "behind"}
#: ``y with x ...``: where x is, seen from y (x *relation* y)
WITH_PHRASES: dict[str, tuple[str, ...]] = {
    "left": ("to its left", "on its left"), "right": ("to its right", "on its right"),
    "on_top": ("on top", "on it"), "under": ("under it", "beneath it"), "inside": ("inside", "in it"),
    "front": ("in front of it",), "behind": ("behind it",), "next_to": ("next to it", "beside it"),
    "near": ("near it", "close by"),
}
PAIR_FORMS: tuple[str, ...] = ("{x} {rel} {y}", "{x} is {rel} {y}", "there is {x} {rel} {y}", "{X} is {rel} {Y}",
                               "{x} {verb} {rel} {y}", "{y} with {x} {with}")
CONTAIN_FORMS: tuple[str, ...] = ("{y} contains {x}", "{y} holds {x}", "{Y} contains {X}", "{y} with {x} {with}")
BETWEEN_FORMS: tuple[str, ...] = ("{a} between {b} and {c}", "{a} is between {b} and {c}",
                                  "there is {a} between {b} and {c}", "{a} {verb} in between {b} and {c}",
                                  "{b} and {c} with {a} between them", "{A} is between {B} and {C}")
COUNT_FORMS: tuple[str, ...] = ("{n} and {o}", "there are {n} and {o}", "{o} and {n}", "a table with {n} and {o}")
LEADS: tuple[str, ...] = ("on the table, ", "on a table, ")
#: the forms a lead may open (a clause, not "the" forms or "there is")
LED_FORMS: tuple[str, ...] = ("{x} is {rel} {y}", "{x} {verb} {rel} {y}", "{a} is between {b} and {c}")
VERBS: tuple[str, ...] = ("sits", "stands")
#: ({singular}, {plural}) forms of the sentence that mentions the distractors
EXTRA_TEMPLATES: tuple[tuple[str, str], ...] = (
    ("{core}, and there is also {d}", "{core}, and there are also {d}"),
    ("{core}; {d} is also on the table", "{core}; {d} are also on the table"),
    ("{core}, with {d} elsewhere", "{core}, with {d} elsewhere"),
)
MENTION_DISTRACTORS = 0.5
MENTION_SIZE = 0.4
MENTION_PLAIN = 0.15
PATTERN_AFTER = 0.3
LEAD = 0.2
TRIES = 50


def article(word: str) -> str:
    """``a`` or ``an`` before ``word``.

    Example:
        >>> article("olive"), article("teal")
        ('an', 'a')
    """
    return "an" if word[0] in "aeiou" else "a"


def _pick(options: tuple[str, ...], rng: np.random.Generator | None) -> str:
    return options[0] if rng is None else options[int(rng.integers(len(options)))]


def _words(thing: Thing, rng: np.random.Generator | None, plural: bool = False, after: bool = True) -> str:
    """``[size] [pattern] colour noun [pattern phrase]`` without the article; without ``rng`` the
    canonical form (size stated, pattern before the noun, plain unsaid); ``after=False`` keeps
    the pattern before the noun."""
    size = _pick(SIZE_WORDS[thing.size], rng) if rng is None or rng.random() < MENTION_SIZE else ""
    before = behind = ""
    if thing.pattern != "plain":
        if rng is not None and after and rng.random() < PATTERN_AFTER:
            behind = _pick(PATTERN_PHRASES[thing.pattern], rng)
        else:
            before = _pick(PATTERN_WORDS[thing.pattern], rng)
    elif rng is not None and rng.random() < MENTION_PLAIN:
        before = "plain"
    noun = PLURALS.get(thing.kind, thing.kind + "s") if plural else thing.kind
    return " ".join(w for w in (size, before, thing.colour, noun, behind) if w)


def object_phrase(thing: Thing, rng: np.random.Generator | None = None, definite: bool = False,
                  after: bool = True) -> str:
    """``"a small striped teal cup"``, ``"an olive bowl with dots"``, ``"the navy book"``;
    without ``rng`` the canonical form; ``after=False`` never says the pattern after the noun
    (in a sentence that has a "with" of its own).

    Example:
        >>> object_phrase(Thing("cup", "olive", "striped", "small", (0, 0, 20, 20)))
        'a small striped olive cup'
    """
    words = _words(thing, rng, after=after)
    return f"{'the' if definite else article(words)} {words}"


def describe(table: Table) -> str:
    """The canonical caption: the first paraphrase of every word, asymmetric pairs stated in
    their own direction.

    Example:
        >>> cup = Thing("cup", "teal", "plain", "small", (10, 10, 40, 40))
        >>> book = Thing("book", "navy", "dotted", "large", (60, 12, 120, 50))
        >>> describe(Table((cup, book), "left", "base", (180, 0, 8.0, 0.0, 0)))
        'a small teal cup to the left of a large dotted navy book'
    """
    things = table.things
    if table.relation == "count":
        n = table.count
        return f"{NUMBER_WORDS[n][0]} {_words(things[0], None, plural=True)} and {object_phrase(things[n])}"
    if table.relation == "between":
        return f"{object_phrase(things[0])} between {object_phrase(things[1])} and {object_phrase(things[2])}"
    return f"{object_phrase(things[0])} {RELATION_WORDS[table.relation][0]} {object_phrase(things[1])}"


def captions(table: Table, rng: np.random.Generator, count: int = 5) -> list[str]:
    """``count`` different captions of ``table`` drawn from the grammar, each true of it.

    Example:
        >>> from xmatch.tabletop.world import sample_group
        >>> len(set(captions(sample_group(np.random.default_rng(0))[0], np.random.default_rng(1))))
        5
    """
    out: list[str] = []
    for _ in range(TRIES * count):
        caption = _one_caption(table, rng)
        if caption not in out:
            out.append(caption)
        if len(out) == count:
            return out
    raise ValueError(f"the grammar gave only {len(out)} different captions for a table, fewer than {count}.")


def _one_caption(table: Table, rng: np.random.Generator) -> str:
    things = table.things
    distractors = things[table.core:]
    extra = None
    if distractors and rng.random() < MENTION_DISTRACTORS:
        extra = EXTRA_TEMPLATES[int(rng.integers(len(EXTRA_TEMPLATES)))]
    # one "with" per sentence: "a cup with stripes, with a book elsewhere" reads as the cup's
    after = extra is None or " with " not in extra[0]
    if table.relation == "count":
        core = _count_statement(table, rng, after)
    elif table.relation == "between":
        core = _between_statement(things[:3], rng, after)
    else:
        core = _pair_statement(things[0], table.relation, things[1], rng, after)
    if extra is None:
        return core
    listed = " and ".join(object_phrase(d, rng, after=after) for d in distractors)
    return extra[len(distractors) > 1].format(core=core, d=listed)


def _pair_statement(x: Thing, relation: str, y: Thing, rng: np.random.Generator, after: bool) -> str:
    """``x relation y`` in one of the sentence forms, from either object."""
    if relation in SYMMETRIC:
        if rng.random() < 0.5:
            x, y = y, x
    elif rng.random() < 0.5:  # the same fact stated from the other object
        x, y, relation = y, x, CONVERSE[relation]
    if relation == "contains":  # y contains x: said with a verb or "with", never "is contains"
        form = _pick(CONTAIN_FORMS, rng)
        after = after and " with " not in form
        return form.format(x=object_phrase(y, rng, after=after), y=object_phrase(x, rng, after=after),
                           X=object_phrase(y, rng, True, after), Y=object_phrase(x, rng, True, after),
                           **{"with": _pick(WITH_PHRASES["inside"], rng)})
    forms = PAIR_FORMS if relation in WITH_PHRASES else PAIR_FORMS[:-1]
    form = _pick(forms, rng)
    after = after and " with " not in form
    # "sits resting on" says it twice: a verb takes the relation's other phrases
    rels = tuple(r for r in RELATION_WORDS[relation] if "{verb}" not in form or not r.startswith("resting"))
    text = form.format(
        x=object_phrase(x, rng, after=after), y=object_phrase(y, rng, after=after),
        X=object_phrase(x, rng, True, after), Y=object_phrase(y, rng, True, after), rel=_pick(rels, rng), verb=_pick(VERBS, rng),
        **{"with": _pick(WITH_PHRASES.get(relation, ("",)), rng)},
    )
    return _lead(form, text, rng)


def _between_statement(things: tuple[Thing, ...], rng: np.random.Generator, after: bool) -> str:
    a, b, c = things
    if rng.random() < 0.5:
        b, c = c, b
    form = _pick(BETWEEN_FORMS, rng)
    after = after and " with " not in form
    text = form.format(a=object_phrase(a, rng, after=after), b=object_phrase(b, rng, after=after),
                       c=object_phrase(c, rng, after=after), A=object_phrase(a, rng, True, after),
                       B=object_phrase(b, rng, True, after), C=object_phrase(c, rng, True, after), verb=_pick(VERBS, rng))
    return _lead(form, text, rng)


def _count_statement(table: Table, rng: np.random.Generator, after: bool) -> str:
    n = table.count
    form = _pick(COUNT_FORMS, rng)
    after = after and " with " not in form
    copies = f"{_pick(NUMBER_WORDS[n], rng)} {_words(table.things[0], rng, plural=True, after=after)}"
    return form.format(n=copies, o=object_phrase(table.things[n], rng, after=after))


def _lead(form: str, text: str, rng: np.random.Generator) -> str:
    if form in LED_FORMS and rng.random() < LEAD:
        return _pick(LEADS, rng) + text
    return text
