"""Structural hard negatives: captions with the words of the true one and another meaning.

Contrastive matchers trained with in-batch negatives behave like bags of words: a random other
caption of the batch almost never differs from the true one in a relation or a binding only, so
nothing teaches the model to read them (Yuksekgonul et al., "When and why vision-language models
behave like bags-of-words", ICLR 2023; Thrush et al., Winoground, CVPR 2022). NegCLIP's remedy
is to add, for every training caption, negatives made from it by changing its structure. The
makers here do that on word classes from a :class:`~xmatch.eval.probes.Tagger` (a dataset's
declared word lists, a JSON file, or a part-of-speech tagger):

- ``swap-roles``: two noun phrases (a noun with the attributes before it) change places
  ("a red 7 left of a blue circle" -> "a blue circle left of a red 7");
- ``swap-attributes``: two attributes of one class bound to different nouns change places
  ("a red 7 left of a blue circle" -> "a blue 7 left of a red circle");
- ``replace-relation``: a relation phrase becomes its converse ("left of" -> "right of") or,
  without a known converse, another relation;
- ``change-count``: a count becomes another number ("two dogs" -> "three dogs").

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

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from xmatch.eval.probes import SwapAttributes, Tagger, join_words, split_words

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
    """Two noun phrases with their attributes change places: who does what to whom changes.

    Pairs joined by a relation phrase ("A left of B", "a dog chasing a cat" with a relation
    class of verbs) are preferred; otherwise any two different noun phrases.

    Example:
        >>> from xmatch.scenes.tagger import scenes_tagger
        >>> SwapRoles(scenes_tagger())("a big red 7 above a small blue circle", np.random.default_rng(0))
        'a small blue circle above a big red 7'
    """

    tagger: Any = field(repr=False, compare=False)
    name: str = "swap-roles"

    def __call__(self, text: str, rng: np.random.Generator) -> str | None:
        words = split_words(text)
        phrases = noun_phrases(words, self.tagger)
        relations = self.tagger.spans(words, "relation") if "relation" in self.tagger.classes else []
        pairs, linked = [], []
        for a, (s1, e1) in enumerate(phrases):
            for s2, e2 in phrases[a + 1:]:
                if [w.lower() for w in words[s1:e1]] == [w.lower() for w in words[s2:e2]]:
                    continue
                pairs.append((s1, e1, s2, e2))
                if any(e1 <= rs and re <= s2 for rs, re in relations) and not any(
                    e1 <= ps and pe <= s2 for ps, pe in phrases
                ):
                    linked.append((s1, e1, s2, e2))
        options = linked or pairs
        if not options:
            return None
        s1, e1, s2, e2 = options[int(rng.integers(len(options)))]
        return join_words(words[:s1] + words[s2:e2] + words[e1:s2] + words[s1:e1] + words[e2:])


@dataclass(frozen=True)
class SwapBoundAttributes:
    """Two attributes of one class (colour, size, ...) bound to different nouns change places:
    :class:`xmatch.eval.probes.SwapAttributes` on one of the tagger's attribute classes, drawn
    at random among those that change the caption.

    Example:
        >>> from xmatch.scenes.tagger import scenes_tagger
        >>> SwapBoundAttributes(scenes_tagger())("a small red 7 above a big blue circle", np.random.default_rng(1))
        'a small blue 7 above a big red circle'
    """

    tagger: Any = field(repr=False, compare=False)
    name: str = "swap-attributes"

    def __call__(self, text: str, rng: np.random.Generator) -> str | None:
        classes = list(self.tagger.attributes)
        for k in rng.permutation(len(classes)):
            swapped = SwapAttributes(classes[int(k)], self.tagger)(text, rng)
            if swapped != text:
                return swapped
        return None


@dataclass(frozen=True)
class ReplaceRelation:
    """One relation phrase becomes its converse ("left of" -> "right of", "on top of" ->
    "beneath": :data:`CONVERSE_WORDS`, :data:`CONVERSE_PHRASES`) or, when it has none,
    another relation of :data:`RELATION_PHRASES`.

    Example:
        >>> from xmatch.scenes.tagger import scenes_tagger
        >>> ReplaceRelation(scenes_tagger())("a red 7 under a blue circle", np.random.default_rng(0))
        'a red 7 over a blue circle'
    """

    tagger: Any = field(repr=False, compare=False)
    name: str = "replace-relation"

    def __call__(self, text: str, rng: np.random.Generator) -> str | None:
        if "relation" not in self.tagger.classes:
            return None
        words = split_words(text)
        spans = self.tagger.spans(words, "relation")
        if not spans:
            return None
        start, stop = spans[int(rng.integers(len(spans)))]
        phrase = words[start:stop]
        replacement = converse(phrase)
        if replacement is None:
            current = tuple(w.lower() for w in phrase)
            others = [p for p in RELATION_PHRASES if tuple(p.split()) != current]
            replacement = others[int(rng.integers(len(others)))].split()
        return join_words(words[:start] + replacement + words[stop:])


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
    """A count becomes another number ("two dogs" -> "three dogs"): the tagger's ``count``
    class where it has one, else number words and numerals that the tagger does not take for
    a noun (the scenes' "digit 7" is a name, not a count).

    Example:
        >>> from xmatch.eval.probes import WordListTagger
        >>> tagger = WordListTagger({"noun": ["dogs", "cat"]})
        >>> ChangeCount(tagger)("two dogs and a cat", np.random.default_rng(0))
        'nine dogs and a cat'
    """

    tagger: Any = field(repr=False, compare=False)
    name: str = "change-count"

    def __call__(self, text: str, rng: np.random.Generator) -> str | None:
        words = split_words(text)
        if "count" in self.tagger.classes:
            spans = [(s, e) for s, e in self.tagger.spans(words, "count") if e - s == 1]
        else:
            in_noun = np.zeros(len(words), dtype=bool)
            for s, e in self.tagger.spans(words, "noun"):
                in_noun[s:e] = True
            spans = [(k, k + 1) for k, w in enumerate(words)
                     if not in_noun[k] and (w.lower() in NUMBER_WORDS or (w.isdigit() and 0 < int(w) <= 10))]
        numbers = [(s, _number(words[s])) for s, _ in spans]
        numbers = [(s, n) for s, n in numbers if n is not None]
        if not numbers:
            return None
        at, value = numbers[int(rng.integers(len(numbers)))]
        other = int(rng.choice([n for n in range(1, 11) if n != value]))
        new = str(other) if words[at].isdigit() else NUMBER_WORDS[other - 1]
        return join_words(words[:at] + [new] + words[at + 1:])


def _number(word: str) -> int | None:
    lower = word.lower()
    if lower in NUMBER_WORDS:
        return NUMBER_WORDS.index(lower) + 1
    return int(word) if word.isdigit() and 0 < int(word) <= 10 else None


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
    run on another number of processes) sees the same ones.

    Args:
        makers: :class:`NegativeMaker` callables (see :func:`build_makers`).
        per_caption: negatives per caption (fewer when the makers cannot change a caption).
        seed: the run's seed.

    Example:
        >>> from xmatch.scenes.tagger import scenes_tagger
        >>> negatives = CaptionNegatives(build_makers(["replace-relation"], scenes_tagger()), per_caption=1)
        >>> batch = negatives.draw(["a red 7 above a blue circle", "a green star"], [10, 11], epoch=0)
        >>> batch.texts, batch.owner.tolist()
        (['a red 7 below a blue circle'], [0])
    """

    def __init__(self, makers: Sequence[NegativeMaker], per_caption: int = 2, seed: int = 0) -> None:
        if not makers:
            raise ValueError("structural negatives need at least one maker (e.g. 'swap-roles').")
        if per_caption < 1:
            raise ValueError(f"per_caption must be at least 1, got {per_caption}.")
        self.makers = list(makers)
        self.per_caption = per_caption
        self.seed = seed

    def for_caption(self, text: str, index: int, epoch: int) -> list[str]:
        """The negatives of caption ``index`` (text ``text``) in ``epoch``."""
        rng = np.random.default_rng([self.seed, epoch, int(index)])
        made: list[str] = []
        for k in rng.permutation(len(self.makers)):
            negative = self.makers[int(k)](text, rng)
            if negative is not None and negative.lower() != text.lower() and negative not in made:
                made.append(negative)
                if len(made) == self.per_caption:
                    break
        return made

    def draw(self, texts: Sequence[str], indices: Sequence[int] | torch.Tensor, epoch: int) -> NegativeTexts:
        """The negatives of a batch of captions (their dataset indices ``indices``)."""
        indices = indices.tolist() if isinstance(indices, torch.Tensor) else list(indices)
        if len(indices) != len(texts):
            raise ValueError(f"{len(texts)} captions but {len(indices)} caption indices.")
        out, owner = [], []
        for row, (text, index) in enumerate(zip(texts, indices)):
            made = self.for_caption(text, index, epoch)
            out += made
            owner += [row] * len(made)
        return NegativeTexts(out, torch.tensor(owner, dtype=torch.long))


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


def training_groups(dataset: Any) -> list[tuple[int, ...]]:
    """The hard-negative groups a training set declares (``hard_negative_groups()``: member
    image indices per group), or ``[]``."""
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
        negative_scores: ``[B, M]`` scores of the batch images against the negative captions
            (None: no caption negatives).
        owner: ``[M]`` the batch row each negative caption was made from.
        margin: the hinge margin.
        group_ids: ``[B]`` each row's hard-negative group (-1: none); None: no group terms.
        image_ids: ``[B]`` image ids: members of one image are never each other's negatives.

    Returns:
        ``(loss, logs)`` with the terms' sums in ``logs`` (``negatives_captions``, ``negatives_groups``).

    Example:
        >>> scores = torch.tensor([[1.0, 0.9], [0.95, 1.0]])
        >>> loss, logs = structural_hinge(scores, torch.tensor([[0.7], [0.2]]), torch.tensor([0]),
        ...                               group_ids=torch.tensor([4, 4]), image_ids=torch.tensor([0, 1]))
        >>> round(logs["negatives_captions"].item(), 2), round(logs["negatives_groups"].item(), 2)
        (0.0, 0.5)
    """
    positive = scores.diagonal()
    zero = scores.new_zeros(())
    captions = zero
    if negative_scores is not None and owner is not None and owner.numel():
        owner = owner.to(scores.device)
        own = negative_scores[owner, torch.arange(len(owner), device=scores.device)]
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
    "ReplaceRelation", "SwapBoundAttributes", "SwapRoles", "build_makers", "converse", "noun_phrases",
    "structural_hinge", "tagger_for", "training_groups",
]
