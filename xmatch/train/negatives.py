"""Structural hard negatives: captions with the words of the true one and another meaning.

Contrastive matchers trained with in-batch negatives behave like bags of words: a random other
caption of the batch almost never differs from the true one in a relation or a binding only, so
nothing teaches the model to read them (Yuksekgonul et al., "When and why vision-language models
behave like bags-of-words", ICLR 2023; Thrush et al., Winoground, CVPR 2022). NegCLIP's remedy
is to add, for every training caption, negatives made from it by changing its structure. The
makers here do that on the structure a :class:`~xmatch.eval.probes.Tagger` reads in a caption
(:func:`xmatch.eval.lexicons.structure_of`: the spaCy tagger's dependency parse, or a dataset's
declared word lists, a JSON file of them), so that every negative is grammatical and false:

- ``swap-roles``: the two noun phrases a place relation joins directly change places, whole
  (the determiner and the modifiers move with their noun, "a"/"an" agree again): "a red 7 left
  of a blue circle" -> "a blue circle left of a red 7". Never across a verb ("a wine glass
  holding a man"), containment ("a cup in a ball"), "with" or "of", nor a symmetric relation
  ("next to", "near"), whose swap would still be true; never a phrase torn from a longer one, the
  scene, a body part or clothing (:data:`xmatch.eval.lexicons.NOT_OBJECTS`), nor a singular with
  a plural phrase;
- ``swap-attributes``: two attributes of one class (colour, size, material, pattern, ...:
  :data:`xmatch.eval.lexicons.ATTRIBUTE_LEXICONS`, or the word list's attribute classes) bound
  to different noun phrases change places ("a red 7 left of a blue circle" -> "a blue 7 left
  of a red circle"); a word in no class never moves, nor two shades of one colour ("white",
  "bright white"), coordinated colours ("yellow and white") or a place's attribute;
- ``replace-relation``: a relation of :data:`xmatch.eval.lexicons.RELATION_TABLE` becomes its
  converse ("left of" -> "right of", "on top of" -> "beneath"), one of proximity "far from"
  (and "far from" "next to"), another without a converse an asymmetric relation that is not its
  synonym; "in yellow" (an attribute), verbs, a plain "in", a relation to the scene, a body part
  or clothing ("in the picture", "in hand") and an "on" a verb places ("sitting on a chair")
  are left alone;
- ``change-count``: a count of 2 to 10 becomes another of 2 to 10 ("two dogs" -> "three dogs");
  "a"/"one" are left alone, so the noun's number stays right.

:func:`negative_problem` checks a negative: re-read, it keeps the original's grammatical pattern
(with a parser's tags) and no longer says the same (:meth:`xmatch.eval.lexicons.Structure.key`:
synonyms merged, a symmetric relation's sides unordered); :class:`CaptionNegatives` drops those
that fail.

A maker is a callable ``(caption, rng) -> str | None`` (None: the caption has nothing it can
change), registered in the ``negatives`` registry (entry-point group ``xmatch_negatives``) and
built with ``tagger=``. :class:`CaptionNegatives` draws a training caption's negatives from
``(seed, epoch, caption index)`` alone, so a resumed run sees exactly the negatives of an
uninterrupted one. :func:`structural_hinge` is the loss term that pushes the true caption above
its negatives and, where the dataset declares hard-negative groups, each caption's image above
the other images of its group.

Example:
    >>> from xmatch.scenes.tagger import scenes_tagger
    >>> rng = np.random.default_rng(0)
    >>> ReplaceRelation(scenes_tagger())("a red 7 to the left of a blue circle", rng)
    'a red 7 to the right of a blue circle'
    >>> SwapRoles(scenes_tagger())("a red 7 to the left of a blue circle", rng)
    'a blue circle to the left of a red 7'
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from xmatch.eval.lexicons import (
    CONTAINMENT,
    DETERMINERS,
    PEOPLE,
    SCENE_NOUNS,
    Structure,
    match_relation,
    relation_named,
    replacement,
    structure_of,
)
from xmatch.eval.probes import Tagger, join_words, respace, split_words

#: word -> its converse inside a spatial relation phrase (general English, both directions)
CONVERSE_WORDS: dict[str, str] = {
    "left": "right", "right": "left", "above": "below", "below": "above", "over": "under",
    "under": "over", "beneath": "above", "underneath": "above", "top": "bottom", "bottom": "top",
    "front": "back", "back": "front", "behind": "before", "before": "after", "after": "before",
    "inside": "outside", "outside": "inside", "into": "out of", "up": "down", "down": "up",
    "on": "under", "upon": "under", "atop": "beneath",
}
#: whole phrases whose converse is not one word away
CONVERSE_PHRASES: dict[tuple[str, ...], str] = {
    ("in", "front", "of"): "behind",
    ("behind",): "in front of",
    ("on", "top", "of"): "beneath",
}
#: relations a relation phrase without a known converse may become
RELATION_PHRASES: tuple[str, ...] = (
    "on", "under", "above", "below", "next to", "behind", "in front of", "inside", "near",
    "to the left of", "to the right of", "on top of",
)
NUMBER_WORDS: tuple[str, ...] = ("one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")


class NegativeMaker(Protocol):
    """Makes one structural negative of a caption: ``maker(caption, rng) -> str | None``."""

    name: str

    def __call__(self, text: str, rng: np.random.Generator) -> str | None: ...


def _meaning(tagger: Tagger, words: Sequence[str], word_class: str) -> Any:
    meaning = getattr(tagger, "meaning", None)
    return meaning(words, word_class) if meaning is not None else tuple(w.lower() for w in words)


def noun_phrases(words: Sequence[str], tagger: Tagger) -> list[tuple[int, int]]:
    """``(start, stop)`` word ranges of the noun phrases: a noun span with the attribute spans
    right before it (of any of the tagger's attribute classes), articles left out.

    Example:
        >>> from xmatch.scenes.tagger import scenes_tagger
        >>> noun_phrases(split_words("a small red 7 above a circle"), scenes_tagger())
        [(1, 4), (6, 7)]
    """
    starts_of_attributes: dict[int, int] = {}
    for word_class in tagger.attributes:
        for start, stop in tagger.spans(words, word_class):
            starts_of_attributes[stop] = min(start, starts_of_attributes.get(stop, start))
    phrases = []
    for start, stop in tagger.spans(words, "noun"):
        while start in starts_of_attributes:
            start = starts_of_attributes[start]
        phrases.append((start, stop))
    return phrases


@dataclass(frozen=True)
class SwapRoles:
    """The two noun phrases a place relation joins directly change places, whole: what is
    where changes. Never across a verb, containment ("in", "inside", "outside", "in the middle
    of"), "with", "of" or a symmetric relation ("next to": still true); never a phrase that
    would tear ("the shore of ..."), the scene, a body part or clothing; never a person "on" a
    thing, nor a singular with a plural phrase; None when no pair qualifies.

    Example:
        >>> from xmatch.scenes.tagger import scenes_tagger
        >>> SwapRoles(scenes_tagger())("a big red 7 above a small blue circle", np.random.default_rng(0))
        'a small blue circle above a big red 7'
    """

    tagger: Any = field(repr=False, compare=False)
    name: str = "swap-roles"

    def __call__(self, text: str, rng: np.random.Generator) -> str | None:
        words = split_words(text)
        structure = structure_of(words, self.tagger)
        options: list[tuple[int, int]] = []
        for link in structure.links:
            # a verb's sides swapped are absurd ("a wine glass holding a man"), a container's too
            # ("a cup in a ball"); "with" and "of" are no relation, a symmetric one stays true
            if link.verb or link.symmetric or (link.relation is not None and link.relation.name in CONTAINMENT):
                continue
            subject = _direct_subject(structure, link)
            if subject is None or _torn(structure, subject, link.object):
                continue
            a, b = sorted((subject, link.object))
            (s1, e1), (s2, e2) = structure.phrases[a], structure.phrases[b]
            if a == b or not (structure.is_thing(a) and structure.is_thing(b)):
                continue  # "the table is also on a lamp", "shade standing in a giraffe"
            if link.relation is not None and link.relation.name == "on":
                continue  # what bears a thing seldom rests on it: "a clock on a pole" -> "a pole on a clock"
            if structure.plural[a] != structure.plural[b] or (a, b) in options:
                continue
            if _lower(words[s1:e1]) == _lower(words[s2:e2]):
                continue  # the same phrase twice: nothing changes
            options.append((a, b))
        if not options:
            return None
        a, b = options[int(rng.integers(len(options)))]
        (s1, e1), (s2, e2) = structure.phrases[a], structure.phrases[b]
        return _rewrite(structure, [(s1, e1, _moved(structure, s2, e2)), (s2, e2, _moved(structure, s1, e1))])


@dataclass(frozen=True)
class SwapBoundAttributes:
    """Two different attributes of one class (colour, size, material, pattern, ...) bound to
    different noun phrases change places; the class, then the pair, drawn at random. Not two
    shades of one colour, not a colour coordinated with another ("yellow and white"), not a
    swap that gives a phrase one attribute twice, not a place's attribute.

    Example:
        >>> from xmatch.scenes.tagger import scenes_tagger
        >>> SwapBoundAttributes(scenes_tagger())("a small red 7 above a big blue circle", np.random.default_rng(1))
        'a small blue 7 above a big red circle'
    """

    tagger: Any = field(repr=False, compare=False)
    name: str = "swap-attributes"

    def __call__(self, text: str, rng: np.random.Generator) -> str | None:
        structure = structure_of(split_words(text), self.tagger)
        lower = [w.lower() for w in structure.words]
        # a place's colour is no thing's ("a green lush shore"); "yellow and white" is one colour
        movable = [a for a in structure.attributes if _head(structure, a.owner) not in SCENE_NOUNS and not _coordinated(structure, a)
                   and (a.stop >= len(lower) or lower[a.stop] != "-")]  # "black-haired": a compound's part
        pairs: dict[str, list[tuple[Any, Any]]] = {}
        for k, first in enumerate(movable):
            for second in movable[k + 1:]:
                if first.word_class != second.word_class or first.owner == second.owner or first.meaning == second.meaning:
                    continue
                if lower[first.stop - 1] == lower[second.stop - 1]:
                    continue  # "white" and "bright white": still white both
                if _has(structure, first.owner, second) or _has(structure, second.owner, first):
                    continue  # the phrase would say one colour twice
                if first.word_class == "size" and _contains(structure, first.owner, second.owner):
                    continue  # "a small ball in a big box" -> "a big ball in a small box" cannot be drawn
                pairs.setdefault(first.word_class, []).append((first, second))
        if not pairs:
            return None
        options = pairs[sorted(pairs)[int(rng.integers(len(pairs)))]]
        first, second = options[int(rng.integers(len(options)))]
        words = structure.words
        return _rewrite(structure, [(first.start, first.stop, list(words[second.start:second.stop])),
                                    (second.start, second.stop, list(words[first.start:first.stop]))])


@dataclass(frozen=True)
class ReplaceRelation:
    """One relation between two noun phrases becomes its converse ("left of" -> "right of",
    "on top of" -> "beneath": :data:`CONVERSE_WORDS`, :data:`CONVERSE_PHRASES`, the table
    :data:`xmatch.eval.lexicons.RELATION_TABLE`), one of proximity (``next to``) "far from",
    another without a converse an asymmetric relation of the table that is not its synonym. A
    relation word a word list declares and the table does not know becomes a relation of the
    table. Verbs, "with", "by", "between", a plain "in", a relation with the scene, a body
    part or clothing on either side, an "on" that does not link two things directly and a
    preposition before an attribute ("in yellow") are left alone.

    Example:
        >>> from xmatch.scenes.tagger import scenes_tagger
        >>> ReplaceRelation(scenes_tagger())("a red 7 under a blue circle", np.random.default_rng(0))
        'a red 7 over a blue circle'
    """

    tagger: Any = field(repr=False, compare=False)
    name: str = "replace-relation"

    def __call__(self, text: str, rng: np.random.Generator) -> str | None:
        structure = structure_of(split_words(text), self.tagger)
        options = [link for link in structure.links if _relates_things(structure, link)]
        rng.shuffle(options)
        for link in options:
            new = _replacement(list(structure.words[link.start:link.stop]), link.relation, rng)
            if new is not None:
                return _rewrite(structure, [(link.start, link.stop, new)])
        return None


#: relations that a verb before them often means otherwise ("grazing on grass", "fighting over a frisbee",
#: "standing over a plate"): replaced only between two things they link directly
VERTICAL = frozenset({"on", "above", "below"})
#: words that may stand between a relation and the phrase it says something about ("a cup is also on a book")
GAP_WORDS = frozenset({"is", "are", "was", "were", "be", "also", "still"})


def _direct_subject(structure: Structure, link: Any) -> int | None:
    """The phrase right before a relation (only a copula or an adverb between: "a cup is on a
    book"), or None: a verb places the thing ("sitting on a chair"), or the parse attaches the
    relation to another thing ("a man preparing food on an oven")."""
    k = link.start
    while k > 0 and (structure.words[k - 1].lower() in GAP_WORDS or (structure.tags is not None and structure.tags[k - 1] in ("AUX", "ADV"))):
        k -= 1
    before = next((p for p, (_, stop) in enumerate(structure.phrases) if stop == k), None)
    if before is None:
        return None
    head = structure.words[structure.heads[before][0]:structure.heads[before][1]]
    if len(head) > 1 and head[-1].lower().endswith("ing"):
        return None  # "a giraffe grazing" read as one noun: the verb places the thing
    if link.subject is not None and link.subject != before and structure.is_thing(link.subject):
        return None
    return before


def _torn(structure: Structure, subject: int, obj: int) -> bool:
    """Whether moving the two phrases would tear a longer one or move a verb's object: the
    object continues with "of" or another noun ("the shore of a body of water", "a bathroom |
    counter"); the subject ends "a thing of ...", follows a preposition, an "and" or a verb
    ("a person reaching for a pizza on a pan", "a man and his wife on a bed", "blow out a candle
    on a dessert"; but "an image showing X below Y" and "a picture of X below Y": the frame
    holds any thing), or is the end of a phrase the parse split ("a small | spotted violet spoon")."""
    words, tags = structure.words, structure.tags
    start, after = structure.phrases[subject][0], structure.phrases[obj][1]
    if after < len(words) and (words[after].lower() in ("of", "'s") or any(s == after for s, _ in structure.phrases)):
        return True
    if not all(_opens(words[structure.phrases[p][0]]) for p in (subject, obj)):
        return True  # "lady", "is place": no article, the phrase is not what the parse took it for
    if any(stop == start for _, stop in structure.phrases):
        return True
    if start == 0:
        return False
    before = words[start - 1].lower()
    frame = next((p for p, (_, stop) in enumerate(structure.phrases) if stop == start - 1), None)
    if before == "of" or (tags is not None and tags[start - 1] == "VERB"):
        return frame is None or structure.is_thing(frame)
    return before in ("and", "or", "&") or (tags is not None and tags[start - 1] in ("ADP", "CCONJ", "PART", "DET", "ADJ", "NUM"))


def _opens(word: str) -> bool:
    """Whether a word opens a whole noun phrase: a determiner, a possessive or a count."""
    lower = word.lower()
    return lower in DETERMINERS or lower == "an" or _number(lower) is not None


def _relates_things(structure: Structure, link: Any) -> bool:
    """Whether a relation may be replaced: not a verb; neither side the scene, a body part or
    clothing ("in the picture", "in one hand", "in a uniform"); not a plain "in" (a place, a
    container, clothes: too many meanings); "on", "above", "below" (and their synonyms) only
    between two things they link directly ("a cup on a book", not "sitting on a chair",
    "fighting over a frisbee", "a youngster on a skateboard")."""
    if link.verb or not structure.is_thing(link.object):
        return False
    after = structure.phrases[link.object][1]
    if after < len(structure.words) and structure.words[after].lower() == "'s":
        return False  # "out of the catcher 's glove": the glove is the object
    if link.subject is not None and not structure.is_thing(link.subject):
        return False
    subject = _direct_subject(structure, link)
    if subject is not None and not structure.is_thing(subject):
        return False
    phrase = tuple(w.lower() for w in structure.words[link.start:link.stop])
    if phrase in (("in",), ("out", "of")):
        return False  # "eating hay out of a basket", "sticking out of": a source, not a place
    if link.relation is not None and link.relation.name == "on" and link.object is not None:
        if not _opens(structure.words[structure.phrases[link.object][0]]):
            return False  # "on parade", "on display": no thing is on anything
    if link.relation is not None and link.relation.name in VERTICAL:
        return subject is not None and _head(structure, subject) not in PEOPLE
    return True


def _head(structure: Structure, phrase: int) -> str:
    """A phrase's noun, lower-cased (the last word of its head)."""
    return structure.words[structure.heads[phrase][1] - 1].lower()


def _coordinated(structure: Structure, attribute: Any) -> bool:
    """Whether an attribute is coordinated with another of its class in one phrase ("yellow and
    white", "black-and-white"): together they are one description."""
    words = [w.lower() for w in structure.words]
    for other in structure.attributes:
        if other is attribute or other.word_class != attribute.word_class:
            continue
        first, second = sorted((attribute, other), key=lambda a: a.start)
        if 0 < second.start - first.stop <= 1 and words[first.stop] in ("and", "-", ",", "or", "&"):
            return True
    return False


def _contains(structure: Structure, first: int, second: int) -> bool:
    """Whether a containment relation ("in", "inside", ...) joins phrases ``first`` and ``second``."""
    for link in structure.links:
        if link.relation is None or link.relation.name not in CONTAINMENT:
            continue
        if {link.object, _direct_subject(structure, link), link.subject} >= {first, second}:
            return True
    return False


def _has(structure: Structure, owner: int, incoming: Any) -> bool:
    """Whether phrase ``owner`` already has another attribute meaning what ``incoming`` means."""
    return any(a.owner == owner and a.word_class == incoming.word_class and a.meaning == incoming.meaning
               for a in structure.attributes if a is not incoming)


def _replacement(phrase: list[str], relation: Any, rng: np.random.Generator) -> list[str] | None:
    """What a relation phrase becomes: the word-level converse where it is the table's converse
    (it keeps the caption's wording: "left of" -> "right of"), else the table's."""
    if relation is None:  # a word list's relation the table does not know ("riding")
        others = [p for p in RELATION_PHRASES if tuple(p.split()) != tuple(w.lower() for w in phrase)]
        return others[int(rng.integers(len(others)))].split()
    new = replacement(relation, rng)
    if new is None:
        return None
    if relation.converse is not None:
        worded = converse(phrase)
        found = match_relation(worded, 0) if worded else None
        if found is not None and found[0] == len(worded) and found[1].name == relation_named(new).name:
            return worded
    return new.split()


def converse(phrase: Sequence[str]) -> list[str] | None:
    """The converse of a spatial relation phrase, or None when none is known.

    Example:
        >>> converse(["to", "the", "left", "of"]), converse(["in", "front", "of"]), converse(["with"])
        (['to', 'the', 'right', 'of'], ['behind'], None)
    """
    lower = tuple(w.lower() for w in phrase)
    if lower in CONVERSE_PHRASES:
        return CONVERSE_PHRASES[lower].split()
    for k, word in enumerate(lower):
        if word in CONVERSE_WORDS:
            return [*phrase[:k], *CONVERSE_WORDS[word].split(), *phrase[k + 1:]]
    return None


@dataclass(frozen=True)
class ChangeCount:
    """A count of 2 to 10 becomes another of 2 to 10 within two of it ("two dogs" -> "three
    dogs"), so the noun stays plural and the picture may hold the count: the tagger's ``count`` class where it has one (and the counted phrase
    is plural), else number words and numerals that the tagger does not take for a noun (the
    scenes' "digit 7" is a name, not a count). "a" and "one" are left alone.

    Example:
        >>> from xmatch.eval.probes import WordListTagger
        >>> tagger = WordListTagger({"noun": ["dogs", "cat"]})
        >>> ChangeCount(tagger)("two dogs and a cat", np.random.default_rng(0))
        'four dogs and a cat'
    """

    tagger: Any = field(repr=False, compare=False)
    name: str = "change-count"

    def __call__(self, text: str, rng: np.random.Generator) -> str | None:
        words = split_words(text)
        if "count" in self.tagger.classes:
            spans = [(s, e) for s, e in self.tagger.spans(words, "count") if e - s == 1]
            if getattr(self.tagger, "structure", None) is not None:
                structure = self.tagger.structure(words)
                plural = [p for p, (s, e) in enumerate(structure.phrases) if structure.plural[p]]
                spans = [(s, e) for s, e in spans if any(structure.phrases[p][0] <= s < structure.phrases[p][1] for p in plural)]
        else:
            in_noun = np.zeros(len(words), dtype=bool)
            for s, e in self.tagger.spans(words, "noun"):
                in_noun[s:e] = True
            spans = [(k, k + 1) for k, w in enumerate(words)
                     if not in_noun[k] and (w.lower() in NUMBER_WORDS or (w.isdigit() and 0 < int(w) <= 10))]
        numbers = [(s, _number(words[s])) for s, _ in spans]
        numbers = [(s, n) for s, n in numbers if n is not None and n >= 2]
        if not numbers:
            return None
        at, value = numbers[int(rng.integers(len(numbers)))]
        # a count a picture may hold: within two of the true one ("two people ride the motorcycle"
        # -> "ten" is rejected without the picture)
        other = int(rng.choice([n for n in range(max(2, value - 2), min(10, value + 2) + 1) if n != value]))
        new = str(other) if words[at].isdigit() else NUMBER_WORDS[other - 1]
        if words[at][:1].isupper():
            new = new.capitalize()
        return join_words(words[:at] + [new] + words[at + 1:])


def _number(word: str) -> int | None:
    lower = word.lower()
    if lower in NUMBER_WORDS:
        return NUMBER_WORDS.index(lower) + 1
    return int(word) if word.isdigit() and 0 < int(word) <= 10 else None


#: single capital letters read with a vowel first ("an F", "an X")
VOWEL_LETTERS = frozenset("AEFHILMNORSX")
#: words that start with a vowel letter and a consonant sound ("a unicorn", "a one-way sign")
CONSONANT_SOUNDS = ("uni", "use", "usu", "uti", "ute", "uk", "ur", "eu", "ewe", "one", "once")
#: words that start with a silent h ("an hour")
SILENT_H = ("hour", "honest", "honor", "honour", "heir")


def _article(word: str) -> str:
    """``a`` or ``an`` before ``word``."""
    if len(word) == 1 and word.isalpha():
        return "an" if word.upper() in VOWEL_LETTERS else "a"
    if word[:1].isdigit():
        return "an" if word.startswith("8") or word in ("11", "18") or (len(word) in (5, 6) and word[:2] in ("11", "18")) else "a"
    lower = word.lower()
    if lower.startswith(SILENT_H):
        return "an"
    return "an" if lower[:1] in "aeiou" and not lower.startswith(CONSONANT_SOUNDS) else "a"


def _lower(words: Sequence[str]) -> list[str]:
    """A phrase's words to compare: case aside, and "a"/"an" alike."""
    return [("a" if w.lower() == "an" else w.lower()) for w in words]


def _moved(structure: Structure, start: int, stop: int) -> list[str]:
    """A phrase's words to move elsewhere: the sentence's capital stays at the start ("A man"
    moved inside becomes "a man"; "K" stays a capital)."""
    words = list(structure.words[start:stop])
    tags = structure.tags
    if start == 0 and words and words[0][0].isupper() and (len(words[0]) == 1 or words[0][1:].islower()):
        if words[0].lower() in DETERMINERS | {"an"} or (len(words[0]) > 1 and (tags is None or tags[0] != "PROPN")):
            words[0] = words[0].lower()
    return words


def _rewrite(structure: Structure, replacements: Sequence[tuple[int, int, list[str]]]) -> str:
    """The caption with word ranges replaced (``(start, stop, new words)``, not overlapping),
    the first word capitalised when the original's was, and every "a"/"an" agreeing with the
    word after it."""
    words = list(structure.words)
    out: list[str] = []
    k = 0
    for start, stop, new in sorted(replacements):
        out += words[k:start] + list(new)
        k = stop
    out += words[k:]
    if words and out and words[0][:1].isupper() and out[0][:1].islower():
        out[0] = out[0][:1].upper() + out[0][1:]
    for j in range(len(out) - 1):
        # a capital "A" inside the sentence is a letter ("the letter A"), not an article
        if out[j] in ("a", "an") or (j == 0 and out[j] in ("A", "An")):
            article = _article(out[j + 1])
            out[j] = article.capitalize() if out[j][0].isupper() else article
    return re.sub(r"(\w)- (\w)", r"\1-\2", join_words(out))  # "polka-dot", as it was


def negative_problem(original: str, negative: str, tagger: Tagger, read: Structure | None = None) -> str | None:
    """What is wrong with a negative, or None: re-read by ``tagger``, it must keep the
    original's grammatical pattern (:meth:`~xmatch.eval.lexicons.Structure.pattern`: the
    coarse tags outside the noun phrases in order, the phrases' shapes; only a tagger with
    tags, the spaCy one, has one) and say something else
    (:meth:`~xmatch.eval.lexicons.Structure.key`: synonyms merged, a symmetric relation's
    sides unordered). ``read``: the negative's structure, when it was read already.

    Example:
        >>> from xmatch.scenes.tagger import scenes_tagger
        >>> negative_problem("a red 7 above a blue circle", "a blue circle above a red 7", scenes_tagger()) is None
        True
        >>> negative_problem("a red 7 above a blue circle", "a red 7 over a blue circle", scenes_tagger())
        'says what the original says (a synonym, or the sides of a symmetric relation swapped)'
    """
    before = _read(split_words(original), tagger, cache=True)
    after = read if read is not None else _read(split_words(negative), tagger, cache=False)
    if before.pattern() != after.pattern():
        return f"the grammatical pattern changed: {before.pattern()} -> {after.pattern()}"
    if before.key() == after.key():
        return "says what the original says (a synonym, or the sides of a symmetric relation swapped)"
    return None


def _read(words: list[str], tagger: Tagger, cache: bool) -> Structure:
    own = getattr(tagger, "structure", None)
    return own(words, cache=cache) if own is not None else structure_of(words, tagger)


@dataclass
class NegativeTexts:
    """A batch's structural negatives: ``texts[m]`` was made from the caption of batch row
    ``owner[m]`` (LongTensor ``[M]``)."""

    texts: list[str]
    owner: torch.Tensor

    def __len__(self) -> int:
        return len(self.texts)


class CaptionNegatives:
    """Draws up to ``per_caption`` different structural negatives per training caption.

    The makers are tried in an order drawn from ``(seed, epoch, caption index)``, and each maker
    draws from the same generator: the negatives depend on nothing else, so a resumed run (or a
    run on another number of processes) sees the same ones. A negative that fails
    :func:`negative_problem` with its maker's tagger is dropped (``check``).

    Args:
        makers: :class:`NegativeMaker` callables (see :func:`build_makers`).
        per_caption: negatives per caption (fewer when the makers cannot change a caption).
        seed: the run's seed.
        check: drop the negatives :func:`negative_problem` finds fault with (with the spaCy
            tagger each negative is parsed once more).

    Example:
        >>> from xmatch.scenes.tagger import scenes_tagger
        >>> negatives = CaptionNegatives(build_makers(["replace-relation"], scenes_tagger()), per_caption=1)
        >>> batch = negatives.draw(["a red 7 above a blue circle", "a green star"], [10, 11], epoch=0)
        >>> batch.texts, batch.owner.tolist()
        (['a red 7 below a blue circle'], [0])
    """

    def __init__(self, makers: Sequence[NegativeMaker], per_caption: int = 2, seed: int = 0, check: bool = True) -> None:
        if not makers:
            raise ValueError("structural negatives need at least one maker (e.g. 'swap-roles').")
        if per_caption < 1:
            raise ValueError(f"per_caption must be at least 1, got {per_caption}.")
        self.makers = list(makers)
        self.per_caption = per_caption
        self.seed = seed
        self.check = check

    def for_caption(self, text: str, index: int, epoch: int) -> list[str]:
        """The negatives of caption ``index`` (text ``text``) in ``epoch``."""
        return self._choose([text], [int(index)], epoch)[0]

    def draw(self, texts: Sequence[str], indices: Sequence[int] | torch.Tensor, epoch: int) -> NegativeTexts:
        """The negatives of a batch of captions (their dataset indices ``indices``)."""
        indices = indices.tolist() if isinstance(indices, torch.Tensor) else list(indices)
        if len(indices) != len(texts):
            raise ValueError(f"{len(texts)} captions but {len(indices)} caption indices.")
        out, owner = [], []
        for row, made in enumerate(self._choose(list(texts), [int(i) for i in indices], epoch)):
            out += made
            owner += [row] * len(made)
        return NegativeTexts(out, torch.tensor(owner, dtype=torch.long))

    def _candidates(self, text: str, index: int, epoch: int) -> list[tuple[NegativeMaker, str]]:
        """Every maker's negative of a caption, in the caption's order of makers. A maker's
        output depends only on the makers called before it, so calling them all gives the
        negatives of stopping at ``per_caption`` too."""
        rng = np.random.default_rng([self.seed, epoch, index])
        out: list[tuple[NegativeMaker, str]] = []
        for k in rng.permutation(len(self.makers)):
            maker = self.makers[int(k)]
            negative = maker(text, rng)
            if negative is None:
                continue
            negative = respace(text, negative)
            if negative.lower() != text.lower() and all(negative != n for _, n in out):
                out.append((maker, negative))
        return out

    def _choose(self, texts: list[str], indices: list[int], epoch: int) -> list[list[str]]:
        """Each caption's first ``per_caption`` candidates that pass the check. The check reads
        the candidates in rounds, each round's parses in one batch (a spaCy tagger parses a
        batch two to three times faster than one caption at a time), a round reading only the
        candidates the captions still short of negatives need next."""
        candidates = [self._candidates(t, i, epoch) for t, i in zip(texts, indices)]
        made: list[list[str]] = [[] for _ in texts]
        tried = [0] * len(texts)
        while True:
            wanted = [(row, tried[row] + j) for row in range(len(texts))
                      for j in range(min(self.per_caption - len(made[row]), len(candidates[row]) - tried[row]))]
            if not wanted:
                return made
            read = self._read_all([candidates[row][k] for row, k in wanted])
            for (row, k), structure in zip(wanted, read):
                maker, negative = candidates[row][k]
                tagger = getattr(maker, "tagger", None)
                tried[row] = k + 1
                if self.check and tagger is not None and negative_problem(texts[row], negative, tagger, structure) is not None:
                    continue
                made[row].append(negative)

    def _read_all(self, candidates: list[tuple[NegativeMaker, str]]) -> list[Structure | None]:
        """The structures of the candidates whose tagger reads many at once (None for the others)."""
        read: list[Structure | None] = [None] * len(candidates)
        if not self.check:
            return read
        by_tagger: dict[int, list[int]] = {}
        for k, (maker, _) in enumerate(candidates):
            if hasattr(getattr(maker, "tagger", None), "structures"):
                by_tagger.setdefault(id(maker.tagger), []).append(k)
        for ks in by_tagger.values():
            tagger = candidates[ks[0]][0].tagger
            for k, structure in zip(ks, tagger.structures([split_words(candidates[k][1]) for k in ks])):
                read[k] = structure
        return read


def build_makers(names: Sequence[str], tagger: Tagger) -> list[NegativeMaker]:
    """The registered makers ``names`` (registry ``negatives``), built with ``tagger``.

    Example:
        >>> from xmatch.scenes.tagger import scenes_tagger
        >>> [m.name for m in build_makers(["swap-roles", "change-count"], scenes_tagger())]
        ['swap-roles', 'change-count']
    """
    from xmatch.core.registry import negatives

    if not names:
        raise ValueError("no structural negatives named; registered: " + ", ".join(negatives.names()) + ".")
    return [negatives.get(name)(tagger=tagger) for name in names]


def tagger_for(source: str, dataset: Any) -> Tagger:
    """The word classes of the makers: ``"dataset"`` = the lists ``dataset`` declares
    (``dataset.word_classes()``, e.g. the scenes grammar's), ``"scenes"`` = the scenes grammar's
    lists, else any source of
    :func:`xmatch.eval.probes.make_tagger` (``"spacy"``, ``"nltk"``, a JSON file of word lists).

    Raises:
        ValueError: ``"dataset"`` and the dataset declares no word classes (names the fixes).

    Example:
        >>> tagger_for("dataset", open_dataset("scenes", None, split="train")).classes  # generates the scenes benchmark (minutes)  # doctest: +SKIP
        ('noun', 'colour', 'size', 'adjective', 'relation')
    """
    from xmatch.eval.probes import make_tagger

    if source == "scenes":
        from xmatch.scenes.tagger import scenes_tagger

        return scenes_tagger()
    if source == "dataset":
        declared = getattr(dataset, "word_classes", None)
        if declared is None:
            raise ValueError(
                f"structural negatives need word classes and the training set ({type(dataset).__name__}) declares "
                "none: set negatives.word_classes to a JSON file of word lists (xmatch train --word-classes FILE), "
                "to 'spacy' (pip install 'xmatch-zoo[spacy]') or to 'nltk'."
            )
        return declared() if callable(declared) else declared
    return make_tagger(source)


def training_groups(dataset: Any, groups_file: str | os.PathLike | None = None) -> list[tuple[int, ...]]:
    """The hard-negative groups of a training set (member image indices per group): the ones a
    JSON file lists (``groups_file``, the format of ``xmatch eval --groups``:
    :meth:`xmatch.eval.groups.GroupSet.from_json`, images by name or index), else the ones the
    set declares (``hard_negative_groups()``), else ``[]``. A file's per-image ``captions`` are
    not read here: training batches every caption of the member images.

    Raises:
        FileNotFoundError: no such file.
        GroupsFileError: the file is not in the groups layout, or a group does not fit the
            training split (the message names the file, the group and the fix).

    Example:
        >>> from pathlib import Path
        >>> from types import SimpleNamespace
        >>> split = SimpleNamespace(image_names=["a.jpg", "b.jpg", "c.jpg"], caption_image=np.array([0, 1, 2]), split="train")
        >>> _ = Path("twins.json").write_text('{"groups": [{"images": ["a", 2], "kind": "relation"}]}')
        >>> training_groups(split, "twins.json")
        [(0, 2)]
    """
    if groups_file is not None:
        from xmatch.eval.groups import GroupSet, GroupsFileError

        try:
            listed = GroupSet.from_json(groups_file, dataset)
        except GroupsFileError as exc:
            split = getattr(dataset, "split", None)
            raise GroupsFileError(
                f"{exc} A training groups file lists images of the training split"
                + (f" ('{split}'" if split else " (")
                + f", {len(dataset.image_names)} images) by name or index: correct that group, or pass the file "
                "written for the split that --split names."
            ) from None
        return [tuple(int(i) for i in group.images) for group in listed.groups]
    declared = getattr(dataset, "hard_negative_groups", None)
    if declared is None:
        return []
    return [tuple(group.images) for group in declared().groups]


def structural_hinge(
    scores: torch.Tensor,
    negative_scores: torch.Tensor | None,
    owner: torch.Tensor | None,
    margin: float = 0.2,
    group_ids: torch.Tensor | None = None,
    image_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The hinge terms of structural negatives, summed like the main hinge loss.

    - captions: ``[m - S(i, t_i) + S(i, n)]_+`` for every negative ``n`` made from ``t_i``;
    - groups: within a declared hard-negative group, ``[m - S(j, t_j) + S(i, t_j)]_+`` (the
      caption's image above the other members' images) and ``[m - S(i, t_i) + S(i, t_j)]_+``
      (the image's caption above the other members' captions).

    Args:
        scores: ``[B, B]`` batch scores (row = image, column = caption, positives on the
            diagonal).
        negative_scores: ``[M]`` the score of each negative caption with its own caption's
            image, ``S(owner[m], n_m)`` (None: no caption negatives).
        owner: ``[M]`` the batch row each negative caption was made from.
        margin: the hinge margin.
        group_ids: ``[B]`` each row's hard-negative group (-1: none); None: no group terms.
        image_ids: ``[B]`` image ids: members of one image are never each other's negatives.

    Returns:
        ``(loss, logs)`` with the terms' sums in ``logs`` (``negatives_captions``, ``negatives_groups``).

    Example:
        >>> scores = torch.tensor([[1.0, 0.9], [0.95, 1.0]])
        >>> loss, logs = structural_hinge(scores, torch.tensor([0.7]), torch.tensor([0]),
        ...                               group_ids=torch.tensor([4, 4]), image_ids=torch.tensor([0, 1]))
        >>> round(logs["negatives_captions"].item(), 2), round(logs["negatives_groups"].item(), 2)
        (0.0, 0.5)
    """
    positive = scores.diagonal()
    zero = scores.new_zeros(())
    captions = zero
    if negative_scores is not None and owner is not None and owner.numel():
        owner = owner.to(scores.device)
        if negative_scores.shape != owner.shape:
            raise ValueError(
                f"negative_scores are the [M] scores of each negative with its own caption's image "
                f"(MatchingModel.paired_scores); got {tuple(negative_scores.shape)} for {owner.numel()} negatives."
            )
        own = negative_scores.to(scores.device)
        captions = (margin - positive[owner] + own).clamp_min(0).sum()
    groups = zero
    if group_ids is not None:
        group_ids = group_ids.to(scores.device)
        same = (group_ids[:, None] == group_ids[None, :]) & (group_ids[:, None] >= 0)
        if image_ids is not None:
            image_ids = image_ids.to(scores.device)
            same &= image_ids[:, None] != image_ids[None, :]
        else:
            same &= ~torch.eye(len(scores), dtype=torch.bool, device=scores.device)
        image_side = (margin + scores - positive[None, :]).clamp_min(0)
        caption_side = (margin + scores - positive[:, None]).clamp_min(0)
        groups = (image_side + caption_side).masked_fill(~same, 0).sum()
    logs = {"negatives_captions": captions.detach(), "negatives_groups": groups.detach()}
    return captions + groups, logs


__all__ = [
    "CONVERSE_PHRASES", "CONVERSE_WORDS", "CaptionNegatives", "ChangeCount", "NegativeMaker", "NegativeTexts",
    "ReplaceRelation", "SwapBoundAttributes", "SwapRoles", "build_makers", "converse", "negative_problem", "noun_phrases",
    "structural_hinge", "tagger_for", "training_groups",
]
