"""Lexicons of attribute classes, a table of spatial relations, and the structure of a caption
(its noun phrases, what relates them, what describes them), for structural negatives.

A parser tags "big", "yellow" and "outlined" alike as adjectives, so swapping two adjectives
makes "a yellow outlined heart in big". The structural negatives of
:mod:`xmatch.train.negatives` therefore swap attributes only within one class of
:data:`ATTRIBUTE_LEXICONS` (colour, size, material, pattern, shape, age, ...): a word in no
lexicon is never swapped. :data:`RELATIONS` lists spatial relations as units (``on top of``,
``to the right of``, ``in front of``), grouped into synonyms, each with its converse where it
has one; a symmetric relation (``next to``, ``near``, ``touching``) has none, and the two sides
of it never swap: that "negative" would still be true. A :class:`Structure` is what a tagger
read in one caption (:meth:`xmatch.eval.spacy_tagger.SpacyTagger.structure` from the parse);
its :meth:`Structure.key` is the caption's meaning up to synonyms and the order of a symmetric
relation's sides, its :meth:`Structure.pattern` the grammatical pattern a negative keeps.

Example:
    >>> attribute_spans(["a", "light", "blue", "wooden", "chair"])
    [(1, 3, 'colour'), (3, 4, 'material')]
    >>> match_relation(["sits", "on", "top", "of", "a", "box"], 1)
    (4, Relation(name='on', converse='under', symmetric=False))
    >>> relation_named("next to").symmetric
    True
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

#: attribute class -> its words: a negative swaps two words of one class only
ATTRIBUTE_LEXICONS: dict[str, frozenset[str]] = {
    "colour": frozenset({
        "black", "white", "red", "green", "yellow", "blue", "brown", "purple", "pink", "orange", "grey", "gray",
        "teal", "navy", "maroon", "turquoise", "violet", "beige", "olive", "cyan", "magenta", "gold", "golden",
        "silver", "tan", "indigo", "lavender", "lilac", "crimson", "scarlet", "burgundy", "khaki", "cream",
        "ivory", "aqua", "lime", "mint", "peach", "coral", "salmon", "amber", "bronze", "copper", "charcoal",
        "mauve", "fuchsia", "ochre", "rust", "emerald", "azure", "blond", "blonde",
    }),
    # size, length, height and width apart: "a large truck with long logs" -> "a long truck with
    # large logs" says the same of the picture (read on held-out COCO captions)
    "size": frozenset({
        "small", "little", "tiny", "big", "large", "huge", "giant", "enormous", "massive", "medium", "miniature",
        "oversized", "petite",
    }),
    "length": frozenset({"long", "short"}),
    "height": frozenset({"tall", "low"}),
    "width": frozenset({"wide", "narrow", "thin", "thick"}),
    "material": frozenset({
        "wooden", "wood", "metal", "metallic", "steel", "iron", "plastic", "glass", "stone", "brick", "leather",
        "paper", "cardboard", "ceramic", "concrete", "marble", "rubber", "woolen", "wool", "cotton", "silk",
        "denim", "velvet", "wicker", "straw", "porcelain", "clay", "tin", "aluminum", "aluminium", "fur",
    }),
    "pattern": frozenset({
        "striped", "stripy", "dotted", "checkered", "chequered", "checked", "plaid", "spotted", "polka", "floral", "solid", "plain",
        "outlined", "patterned", "dashed", "hatched", "speckled", "camouflage", "zebra", "tartan", "filled",
        "hollow", "shaded", "transparent", "shiny", "matte", "glossy",
    }),
    "shape": frozenset({
        "round", "square", "rectangular", "triangular", "circular", "oval", "curved", "straight", "pointed",
        "flat", "spherical", "cubic", "hexagonal", "diamond",
    }),
    "age": frozenset({"old", "young", "new", "elderly", "ancient", "modern", "antique", "vintage", "baby", "adult"}),
    "state": frozenset({
        "open", "closed", "empty", "full", "wet", "dry", "clean", "dirty", "broken", "lit", "dark", "bright",
        "sliced", "whole", "cooked", "raw", "frozen", "melted", "folded", "parked", "standing", "sitting",
    }),
}
#: nouns of a pattern after "with" ("a cup with stripes", "a ball with polka dots"): one attribute
PATTERN_NOUNS = frozenset({"dots", "stripes", "spots", "checks", "stars", "squares", "flowers"})
#: words that make one colour with the colour after them ("light blue", "dark green")
COLOUR_SHADES = frozenset({"light", "dark", "pale", "bright", "deep", "navy", "lime", "sky", "olive", "hot"})
#: synonyms within an attribute class: the first word of a group stands for it
ATTRIBUTE_SYNONYMS: tuple[tuple[str, ...], ...] = (
    ("small", "little", "tiny"), ("big", "large", "huge", "giant", "enormous", "massive"), ("grey", "gray"),
    ("gold", "golden"), ("wooden", "wood"), ("metal", "metallic"), ("woolen", "wool"), ("blond", "blonde"),
    ("striped", "stripy"), ("checkered", "chequered", "checked", "plaid", "tartan"), ("spotted", "dotted", "polka", "speckled"), ("round", "circular"),
    ("aluminum", "aluminium"), ("new", "modern"), ("old", "ancient", "antique", "vintage"),
)
_ATTRIBUTE_CANONICAL = {w: g[0] for g in ATTRIBUTE_SYNONYMS for w in g}


@dataclass(frozen=True)
class Relation:
    """A spatial relation: its ``name`` (the first phrase of its synonyms), the name of its
    ``converse`` (``A r B`` means ``B converse A``; None when it has none) and whether it is
    ``symmetric`` (``A r B`` means ``B r A``)."""

    name: str
    converse: str | None
    symmetric: bool = False


#: relation name -> (its phrases, synonyms first; the converse's name or None; symmetric)
RELATION_TABLE: dict[str, tuple[tuple[str, ...], str | None, bool]] = {
    "to the left of": (("to the left of", "left of", "on the left of", "on the left side of", "to the left side of"), "to the right of", False),
    "to the right of": (("to the right of", "right of", "on the right of", "on the right side of", "to the right side of"), "to the left of", False),
    "above": (("above", "over"), "below", False),
    "below": (("below", "under", "beneath", "underneath", "underneath of"), "above", False),
    "on": (("on", "on top of", "atop", "upon", "onto", "on the top of"), "under", False),
    "in the middle of": (("in the middle of", "in the center of", "in the centre of", "at the center of"), None, False),
    "in front of": (("in front of", "in the front of", "ahead of"), "behind", False),
    "behind": (("behind", "in back of", "at the back of", "in the back of"), "in front of", False),
    "inside": (("inside", "inside of", "in", "within", "into"), "outside", False),
    "outside": (("outside", "outside of", "out of"), "inside", False),
    "next to": (("next to", "beside", "alongside", "adjacent to", "by the side of"), None, True),
    "near": (("near", "close to", "nearby", "near to", "closer to"), None, True),
    "far from": (("far from", "away from", "far away from"), None, True),
    "touching": (("touching",), None, True),
    "opposite": (("opposite", "across from", "opposite to"), None, True),
    "by": (("by",), None, True),
    "between": (("between", "among", "amongst", "in between"), None, True),
    "with": (("with", "and", "together with"), None, True),
}
#: asymmetric relations a symmetric one may become (not its synonyms: "near" never becomes "close to")
ASYMMETRIC_RELATIONS: tuple[str, ...] = tuple(n for n, (_, _, symmetric) in RELATION_TABLE.items() if not symmetric)
#: relations that are no place and so are never replaced ("with" and "and" join things, "between" needs two
#: sides, "by" names the agent of "covered by" as often as a place, "across from" holds beside most others)
NOT_REPLACED = frozenset({"with", "between", "by", "opposite"})
_PHRASES: dict[tuple[str, ...], str] = {tuple(p.split()): name for name, (ps, _, _) in RELATION_TABLE.items() for p in ps}
_LONGEST = max(len(p) for p in _PHRASES)


def attribute_class(word: str) -> str | None:
    """The lexicon class of an attribute word, or None (a word in no lexicon).

    Example:
        >>> attribute_class("Teal"), attribute_class("striped"), attribute_class("happy")
        ('colour', 'pattern', None)
    """
    lower = word.lower()
    return next((name for name, words in ATTRIBUTE_LEXICONS.items() if lower in words), None)


def attribute_meaning(words: Sequence[str]) -> str:
    """What an attribute means: synonyms (``small`` / ``little``) mean the same.

    Example:
        >>> attribute_meaning(["little"]) == attribute_meaning(["small"]), attribute_meaning(["light", "blue"])
        (True, 'light blue')
    """
    phrase = " ".join(w.lower() for w in words)
    return _ATTRIBUTE_CANONICAL.get(phrase, phrase)


def attribute_spans(words: Sequence[str]) -> list[tuple[int, int, str]]:
    """``(start, stop, class)`` of every lexicon word; a shade word before a colour
    (``light blue``, ``dark green``) joins it; ``with`` and a pattern noun (``with stripes``,
    ``with polka dots``) make one attribute of class ``pattern-with`` (it swaps only with its
    like: "a with stripes cup" is no English).

    Example:
        >>> attribute_spans(["a", "dark", "green", "striped", "sofa"])
        [(1, 3, 'colour'), (3, 4, 'pattern')]
    """
    out: list[tuple[int, int, str]] = []
    k = 0
    while k < len(words):
        lower = words[k].lower()
        after = [w.lower() for w in words[k + 1:k + 3]]
        if lower == "with" and after and (after[0] in PATTERN_NOUNS or (after[0] == "polka" and after[1:] == ["dots"])):
            stop = k + 2 if after[0] in PATTERN_NOUNS else k + 3
            out.append((k, stop, "pattern-with"))
            k = stop
            continue
        if lower in COLOUR_SHADES and k + 1 < len(words) and words[k + 1].lower() in ATTRIBUTE_LEXICONS["colour"]:
            out.append((k, k + 2, "colour"))
            k += 2
            continue
        found = attribute_class(lower)
        if found is not None:
            out.append((k, k + 1, found))
        k += 1
    return out


def match_relation(words: Sequence[str], start: int) -> tuple[int, Relation] | None:
    """The longest relation phrase of :data:`RELATION_TABLE` that starts at ``start``: where
    it stops and the relation, or None.

    Example:
        >>> match_relation(["a", "dog", "to", "the", "left", "of", "a", "cat"], 2)
        (6, Relation(name='to the left of', converse='to the right of', symmetric=False))
    """
    lower = [w.lower() for w in words[start:start + _LONGEST]]
    for length in range(len(lower), 0, -1):
        name = _PHRASES.get(tuple(lower[:length]))
        if name is not None:
            return start + length, relation_named(name)
    return None


def relation_named(name: str) -> Relation:
    """The relation of one of the table's phrases (any synonym).

    Raises:
        KeyError: a phrase the table does not know.

    Example:
        >>> relation_named("beneath")
        Relation(name='below', converse='above', symmetric=False)
    """
    key = _PHRASES[tuple(name.lower().split())]
    _, converse_name, symmetric = RELATION_TABLE[key]
    return Relation(key, converse_name, symmetric)


def relation_meaning(phrase: Sequence[str]) -> str:
    """A relation phrase's name (synonyms merged), or the phrase itself when the table does
    not know it.

    Example:
        >>> relation_meaning(["under"]) == relation_meaning(["below"]), relation_meaning(["riding"])
        (True, 'riding')
    """
    lower = tuple(w.lower() for w in phrase)
    return _PHRASES.get(lower, " ".join(lower))


def replacement(relation: Relation, rng: np.random.Generator) -> str | None:
    """What a relation becomes in a negative: its converse; for one of proximity "far from"
    (and "next to" for "far from": :data:`PROXIMITY`), since a specific relation ("behind")
    may hold beside "near"; for another without a converse (``opposite``) an asymmetric
    relation drawn at random (never a synonym, never ``in the middle of`` or ``inside``:
    neither fits most pairs of things); None for relations that are no place
    (:data:`NOT_REPLACED`) and for ``in the middle of`` (no converse, no fitting other).

    Example:
        >>> replacement(relation_named("on top of"), np.random.default_rng(0))
        'under'
        >>> replacement(relation_named("beside"), np.random.default_rng(0)), replacement(relation_named("far away from"), None)
        ('far from', 'next to')
    """
    if relation.name in NOT_REPLACED:
        return None
    if relation.converse is not None:
        return relation.converse
    if relation.name in PROXIMITY:
        return PROXIMITY[relation.name]
    if relation.name in CONTAINMENT:
        return None  # "in the middle of a pen" has no converse, and "on a pen" or "below" fits few pairs
    others = [name for name in ASYMMETRIC_RELATIONS if name != relation.name and name not in CONTAINMENT]
    return others[int(rng.integers(len(others)))]


#: nouns of the scene, the place or the frame, not of a thing in it ("in the picture", "on the ground", "over a body
#: of water", "on the table" of a tabletop): a negative never moves them, relates them otherwise or swaps their attributes
SCENE_NOUNS = frozenset({
    "picture", "pictures", "image", "images", "photo", "photos", "photograph", "scene", "view", "shot", "frame",
    "table", "ground", "floor", "field", "fields", "sky", "water", "waters", "street", "streets", "road", "roads",
    "beach", "snow", "grass", "dirt", "sand", "shore", "bank", "runway", "surface", "air", "room", "kitchen",
    "bathroom", "bedroom", "park", "city", "town", "area", "background", "foreground", "stadium",
    "crowd", "ocean", "sea", "lake", "river", "shade", "pool", "court", "lawn", "yard", "sidewalk", "pavement",
    "distance", "outdoors", "indoors", "hill", "hillside", "mountain", "mountains", "forest",
    "woods", "track", "tracks", "slope", "wave", "waves", "sun", "night", "day", "middle", "body", "display",
    "tarmac", "window", "balcony", "environment", "wilderness", "meadow", "enclosure", "station", "tunnel",
})
#: parts of a body (or a thing's): what a person holds "in hand" is no place to be outside of
BODY_PARTS = frozenset({
    "hand", "hands", "head", "heads", "face", "faces", "arm", "arms", "leg", "legs", "foot", "feet", "mouth",
    "nose", "ear", "ears", "eye", "eyes", "back", "shoulder", "shoulders", "lap", "neck", "finger", "fingers",
    "hair", "knee", "knees", "wing", "wings", "tail", "paw", "paws", "lip", "lips", "teeth", "chest",
})
#: clothing: "in a baseball uniform" is worn, never a container or a thing to swap with its wearer
CLOTHING = frozenset({
    "shirt", "shirts", "uniform", "uniforms", "suit", "suits", "wetsuit", "dress", "dresses", "jacket", "jackets",
    "hat", "hats", "cap", "caps", "helmet", "helmets", "mask", "masks", "glove", "gloves", "coat", "coats",
    "pants", "jeans", "shorts", "skirt", "sweater", "hoodie", "tie", "vest", "outfit", "costume", "clothes",
    "clothing", "shoes", "boots", "sunglasses", "glasses", "scarf", "apron", "gear", "top",
})
#: nouns that name no object to move or relate: the scene's, body parts and clothing
NOT_OBJECTS = SCENE_NOUNS | BODY_PARTS | CLOTHING
#: people: "a youngster on a skateboard" rides it, so "under a skateboard" is no negative a picture can show
PEOPLE = frozenset({
    "man", "men", "woman", "women", "person", "people", "boy", "boys", "girl", "girls", "child", "children", "kid",
    "kids", "youngster", "player", "players", "skier", "skiers", "surfer", "surfers", "skateboarder", "snowboarder",
    "rider", "riders", "guy", "guys", "lady", "ladies", "baby", "toddler", "teenager", "someone", "he", "she",
    "police", "policeman", "policemen", "officer", "officers", "guide", "male", "female", "driver", "drivers",
    "biker", "bikers", "cyclist", "cyclists", "pilot", "chef", "cook", "worker", "workers", "student", "students",
    "tourist", "tourists", "athlete", "soldier", "soldiers", "cowboy", "jockey", "passenger", "passengers",
})
#: relations of containment: their two sides never swap ("a cup in a ball" is absurd by size)
CONTAINMENT = frozenset({"inside", "outside", "in the middle of"})
#: relations of proximity, and what a negative makes of them: a specific relation ("behind") may hold
#: beside "near", so only "far from" denies it
PROXIMITY = {"next to": "far from", "near": "far from", "touching": "far from", "far from": "next to"}

#: verbs whose two sides may change places without changing what is said
SYMMETRIC_VERBS = frozenset({
    "touching", "touches", "touch", "meeting", "meets", "hugging", "hugs", "kissing", "kisses", "overlapping",
    "overlaps", "intersecting", "intersects", "bordering", "borders", "adjoining", "marrying", "joining",
})
#: nouns that name a part or a group of what follows their "of": the argument is the thing after it
PARTITIVES = frozenset({
    "part", "parts", "side", "sides", "group", "groups", "pair", "pairs", "couple", "bunch", "lot", "lots",
    "piece", "pieces", "herd", "flock", "row", "rows", "stack", "pile", "set", "number", "half", "top", "bottom",
    "edge", "end", "front", "back", "corner", "middle", "crowd", "team", "line", "collection", "variety", "slice",
})
DETERMINERS = frozenset({"a", "an", "the", "this", "that", "these", "those", "some", "his", "her", "its", "their"})
NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")
#: coarse groups of universal part-of-speech tags: what a negative's re-parse must keep
COARSE_TAGS: dict[str, str] = {
    "NOUN": "N", "PROPN": "N", "NUM": "N", "PRON": "N", "ADJ": "A", "VERB": "V", "AUX": "V", "ADP": "P",
    "SCONJ": "P", "ADV": "R", "PART": "R", "DET": "D", "CCONJ": "C", "PUNCT": ".", "SYM": ".",
}


@dataclass(frozen=True)
class Link:
    """A relation or a verb between two noun phrases: words ``start:stop``, the phrase before
    it (``subject``, None when none is found) and after it (``object``); ``relation`` is the
    table's relation (None for a verb or a relation word the table does not know),
    ``meaning`` its name (synonyms merged) or its lower-cased words, and ``verb`` whether it
    is a verb (verbs are never replaced; their two sides swap)."""

    start: int
    stop: int
    subject: int | None
    object: int
    relation: Relation | None
    meaning: str
    verb: bool = False

    @property
    def symmetric(self) -> bool:
        """Whether the two sides may swap without changing what is said."""
        return self.relation.symmetric if self.relation is not None else self.meaning in SYMMETRIC_VERBS


@dataclass(frozen=True)
class Attribute:
    """An attribute word (or ``light blue``) ``start:stop`` of class ``word_class``, bound to
    the noun phrase ``owner``; ``meaning`` merges synonyms."""

    start: int
    stop: int
    word_class: str
    owner: int
    meaning: Any


@dataclass(frozen=True)
class Structure:
    """What a tagger read in a caption's words.

    Attributes:
        words: the caption's words (:func:`xmatch.eval.probes.split_words`).
        phrases: ``(start, stop)`` of every noun phrase, determiner and modifiers included.
        heads: the noun span of each phrase.
        plural: whether each phrase names more than one thing.
        links: relations and verbs between phrases.
        attributes: attribute words bound to a phrase (in it, or a predicate: "is red", "in yellow").
        tags: universal part-of-speech tag per word (None: the tagger has none, a word list).
    """

    words: tuple[str, ...]
    phrases: tuple[tuple[int, int], ...]
    heads: tuple[tuple[int, int], ...]
    plural: tuple[bool, ...]
    links: tuple[Link, ...]
    attributes: tuple[Attribute, ...]
    tags: tuple[str, ...] | None = None

    def argument(self, phrase: int) -> int:
        """The phrase a relation really relates: through partitives ("part of a heart", "a
        group of people") to the phrase after their ``of``."""
        seen = 0
        while seen < len(self.phrases):
            start, stop = self.heads[phrase]
            after = self.phrases[phrase][1]
            if self.words[stop - 1].lower() not in PARTITIVES or after >= len(self.words) or self.words[after].lower() != "of":
                return phrase
            nxt = next((p for p, (s, _) in enumerate(self.phrases) if s == after + 1), None)
            if nxt is None:
                return phrase
            phrase, seen = nxt, seen + 1
        return phrase

    def is_thing(self, phrase: int) -> bool:
        """Whether a phrase names a thing a negative may move or relate otherwise: its noun
        (the last word of its head) is none of :data:`NOT_OBJECTS` (the scene, the ground, a
        hand, a shirt).

        Example:
            >>> from xmatch.eval.probes import WordListTagger
            >>> s = structure_of(["a", "cup", "on", "the", "table"], WordListTagger({"noun": ["cup", "table"]}))
            >>> s.is_thing(0), s.is_thing(1)
            (True, False)
        """
        return self.words[self.heads[phrase][1] - 1].lower() not in NOT_OBJECTS

    def phrase_key(self, phrase: int) -> tuple[Any, ...]:
        """A phrase's meaning: its words but determiners and attribute words (numbers as
        digits), and its attributes' classes and meanings, sorted."""
        start, stop = self.phrases[phrase]
        own = [a for a in self.attributes if a.owner == phrase]
        inside = {k for a in own for k in range(a.start, a.stop)}
        words = tuple(_number_key(w.lower()) for k, w in enumerate(self.words[start:stop], start)
                      if k not in inside and w.lower() not in DETERMINERS and w.lower() not in ("an",))
        return words, tuple(sorted((a.word_class, str(a.meaning)) for a in own))

    def key(self) -> tuple[Any, ...]:
        """The caption's meaning: its phrases (unordered) and its relations as ``(subject,
        relation, object)``, the two sides of a symmetric one unordered. Two captions with one
        key say the same (``a dog next to a cat`` / ``a cat next to a dog``).

        Example:
            >>> from xmatch.eval.probes import WordListTagger
            >>> t = WordListTagger({"noun": ["dog", "cat"], "relation": ["next to", "under", "below"]})
            >>> structure_of(["a", "dog", "next", "to", "a", "cat"], t).key() == structure_of(["a", "cat", "next", "to", "a", "dog"], t).key()
            True
        """
        phrases = Counter(self.phrase_key(p) for p in range(len(self.phrases)))
        triples = []
        for link in self.links:
            obj = self.phrase_key(self.argument(link.object))
            subj = self.phrase_key(self.argument(link.subject)) if link.subject is not None else ()
            sides = tuple(sorted((subj, obj), key=repr)) if link.symmetric else (subj, obj)
            triples.append((link.meaning, sides))
        return tuple(sorted(phrases.items(), key=repr)), tuple(sorted(triples, key=repr))

    def pattern(self) -> tuple[Any, ...] | None:
        """The grammatical pattern a negative keeps: the coarse tags of the words outside the
        noun phrases (a relation of the table as one unit ``REL``), in order, and the phrases'
        shapes (length, determiner or not), unordered; None without tags."""
        if self.tags is None:
            return None
        phrase_at = dict(self.phrases)
        relation_at = {link.start: link.stop for link in self.links if link.relation is not None}
        units: list[str] = []
        shapes = []
        k = 0
        while k < len(self.words):
            if k in phrase_at:
                units.append("NP")
                shapes.append((phrase_at[k] - k, self.words[k].lower() in DETERMINERS | {"an"}))
                k = phrase_at[k]
            elif k in relation_at:
                units.append("REL")
                k = relation_at[k]
            else:
                units.append(COARSE_TAGS.get(self.tags[k], "X"))
                k += 1
        return tuple(units), tuple(sorted(shapes))


def structure_of(words: Sequence[str], tagger: Any) -> Structure:
    """A caption's :class:`Structure` from a tagger: its own (``tagger.structure``, the
    spaCy tagger's parse) or, for word lists, read from the word classes: a noun phrase is
    a noun with the attributes and the determiner before it, a link a relation phrase
    between two phrases, an attribute a member of one of ``tagger.attributes`` in a phrase.

    Example:
        >>> from xmatch.scenes.tagger import scenes_tagger
        >>> s = structure_of(["a", "red", "7", "above", "a", "blue", "circle"], scenes_tagger())
        >>> s.phrases, [(l.subject, l.meaning, l.object) for l in s.links]
        (((0, 3), (4, 7)), [(0, 'above', 1)])
    """
    own = getattr(tagger, "structure", None)
    if own is not None:
        return own(words)
    words = tuple(words)
    lower = [w.lower() for w in words]
    meaning = getattr(tagger, "meaning", lambda ws, _: tuple(w.lower() for w in ws))
    attribute_at: dict[int, tuple[int, str]] = {}
    for word_class in tagger.attributes:
        for start, stop in tagger.spans(words, word_class):
            attribute_at.setdefault(start, (stop, word_class))
    counts = {k for k, w in enumerate(lower) if _number_key(w).isdigit()}
    phrases, heads = [], []
    taken = 0
    for start, stop in tagger.spans(words, "noun"):
        first = start
        while True:
            before = next((s for s, (e, _) in attribute_at.items() if e == first and s >= taken), None)
            if before is not None:
                first = before
            elif first - 1 >= taken and (first - 1) in counts:
                first -= 1
            else:
                break
        if first - 1 >= taken and lower[first - 1] in DETERMINERS | {"an"}:
            first -= 1
        phrases.append((first, stop))
        heads.append((start, stop))
        taken = stop
    attributes = []
    for p, (start, stop) in enumerate(phrases):
        for s, (e, word_class) in sorted(attribute_at.items()):
            if start <= s and e <= heads[p][0]:
                attributes.append(Attribute(s, e, word_class, p, meaning(words[s:e], word_class)))
    links = []
    if "relation" in tagger.classes:
        starts = {s: p for p, (s, _) in enumerate(phrases)}
        for start, stop in tagger.spans(words, "relation"):
            obj = starts.get(stop)
            if obj is None:
                continue
            subj = next((p for p in range(len(phrases) - 1, -1, -1) if phrases[p][1] <= start), None)
            if subj is not None and any(phrases[subj][1] <= s < start for s, _ in phrases):
                subj = None
            found = match_relation(words, start)
            relation = found[1] if found is not None and found[0] == stop else None
            links.append(Link(start, stop, subj, obj, relation, relation.name if relation else str(meaning(words[start:stop], "relation"))))
    plural = tuple(False for _ in phrases)
    return Structure(words, tuple(phrases), tuple(heads), plural, tuple(links), tuple(attributes))


def _number_key(word: str) -> str:
    return str(NUMBER_WORDS.index(word)) if word in NUMBER_WORDS else word


__all__ = [
    "BODY_PARTS", "CLOTHING", "CONTAINMENT", "NOT_OBJECTS", "PEOPLE", "PROXIMITY", "SCENE_NOUNS",
    "COARSE_TAGS", "PARTITIVES", "PATTERN_NOUNS", "SYMMETRIC_VERBS", "Attribute", "Link", "Structure", "structure_of", "ASYMMETRIC_RELATIONS", "ATTRIBUTE_LEXICONS", "ATTRIBUTE_SYNONYMS", "COLOUR_SHADES", "NOT_REPLACED", "RELATION_TABLE",
    "Relation", "attribute_class", "attribute_meaning", "attribute_spans", "match_relation", "relation_meaning",
    "relation_named", "replacement",
]
