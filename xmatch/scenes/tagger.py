"""The scenes grammar's word classes, for the perturbation probes of :mod:`xmatch.eval.probes`."""

from __future__ import annotations

from xmatch.eval.probes import WordListTagger
from xmatch.scenes.captions import NUMBER_WORDS, RELATION_WORDS, SIZE_WORDS
from xmatch.scenes.render import COLOURS, DIGITS, SHAPES


def scenes_tagger() -> WordListTagger:
    """The scenes grammar's own word classes (:mod:`xmatch.scenes.captions`): ``noun``
    (the object nouns: digits, ``digit 7``, ``number seven``, shapes), ``colour``, ``size``,
    ``adjective`` (colours and sizes) and ``relation`` (the spatial phrases).

    Example:
        >>> scenes_tagger().classes
        ('noun', 'colour', 'size', 'adjective', 'relation')
    """
    # one synonym list per object kind, size and relation: "7", "digit 7" and "number seven" are one noun
    nouns = [*([d, f"digit {d}", f"number {NUMBER_WORDS[int(d)]}"] for d in DIGITS), *SHAPES]
    sizes = [list(words) for words in SIZE_WORDS.values()]
    relations = [list(phrases) for phrases in RELATION_WORDS.values()]
    return WordListTagger(
        {"noun": nouns, "colour": list(COLOURS), "size": sizes, "adjective": [*COLOURS, *sizes], "relation": relations},
        attributes=("colour", "size"),
    )
