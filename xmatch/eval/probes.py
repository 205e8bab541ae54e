"""Perturbation probes: how much does a model lose when the captions lose their structure?

The analysis of the OAN paper's section 3 as reusable caption transforms: evaluate a model with
every caption altered (words shuffled, one word class dropped, attribute bindings swapped) and
report what each perturbation costs in Recall@K. A model that matches bags of words loses
nothing when the words are shuffled; one that reads word order and attribute binding does.

Word classes come from a *tagger*: word lists (:class:`WordListTagger`, with the scenes
grammar's own lists: :func:`xmatch.scenes.tagger.scenes_tagger`), a JSON file of lists, or any part-of-
speech function (:class:`PosTagger`, e.g. NLTK's, with the universal tag set).

The transforms are plain callables ``(caption, rng) -> caption``, so they serve as training
augmentations too (:class:`PerturbedCaptions` wraps a training set).

Example:
    >>> from xmatch.scenes.tagger import scenes_tagger
    >>> tagger = scenes_tagger()
    >>> rng = np.random.default_rng(0)
    >>> DropWords("relation", tagger)("a red 7 to the left of a blue circle", rng)
    'a red 7 a blue circle'
    >>> SwapAttributes("colour", tagger)("a red 7 to the left of a blue circle", rng)
    'a blue 7 to the left of a red circle'
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from xmatch.core.errors import XmatchError

logger = logging.getLogger(__name__)

_TOKEN = re.compile(r"[\w']+|[^\w\s]")
#: the word classes the default probes drop
DROP_CLASSES = ("noun", "adjective", "relation")
RECALL_KEYS = ("r1", "r5", "r10")


class WordClassError(XmatchError, ValueError):
    """A word-class file that cannot be used: not JSON, or not ``{class: [words...]}`` (the
    message names the file and the entry)."""


def split_words(text: str) -> list[str]:
    """Words and punctuation marks, in order.

    Example:
        >>> split_words("a red 7, left of a circle")
        ['a', 'red', '7', ',', 'left', 'of', 'a', 'circle']
    """
    return _TOKEN.findall(text)


def join_words(words: Sequence[str]) -> str:
    """The inverse of :func:`split_words` up to spacing: punctuation attaches to the word before.

    Example:
        >>> join_words(['a', 'red', '7', ',', 'left', 'of', 'a', 'circle'])
        'a red 7, left of a circle'
    """
    text = " ".join(words)
    return re.sub(r" ([^\w\s'])", r"\1", text).strip()


def respace(original: str, changed: str) -> str:
    """``changed`` (a caption made from ``original`` by moving or replacing words) with the
    spacing of ``original`` wherever two of its words still stand side by side: an edit changes
    the words it changes, not the spacing of the rest ("polka-dot", "12:45", the tokenised
    COCO captions' " ." stay as they were).

    Example:
        >>> respace("a polka-dot cup on a red box .", "a polka- dot cup under a red box.")
        'a polka-dot cup under a red box .'
    """
    gaps: dict[tuple[str, str], str] = {}
    tokens = list(_TOKEN.finditer(original))
    for left, right in zip(tokens, tokens[1:]):
        gaps.setdefault((left.group(), right.group()), original[left.end():right.start()])
    words = split_words(changed)
    if not words:
        return changed
    out = [words[0]]
    for left, right in zip(words, words[1:]):
        gap = gaps.get((left, right))
        if gap is None:
            gap = "" if re.fullmatch(r"[^\w\s']", right) else " "
        out += [gap, right]
    return "".join(out)


class Tagger(Protocol):
    """Finds the words of a class in a caption.

    ``classes`` names the classes it knows; ``spans(words, word_class)`` gives the
    ``(start, stop)`` word ranges of that class, in order, not overlapping (a class member may
    be a phrase such as ``to the left of``). ``attributes`` names the classes whose members
    bind to a noun (what :class:`SwapAttributes` swaps).
    """

    classes: tuple[str, ...]
    attributes: tuple[str, ...]

    def spans(self, words: Sequence[str], word_class: str) -> list[tuple[int, int]]: ...


class WordListTagger:
    """Word classes from word lists; an entry may be a phrase (matched longest first, case
    insensitive) or a list of synonyms (``["small", "little", "tiny"]``): words of one synonym
    list mean the same, so :class:`SwapAttributes` does not swap them for each other.

    Args:
        classes: ``{class: [word, phrase or [synonyms...], ...]}``.
        attributes: the classes that are attributes of a noun (default: ``adjective`` and,
            if present, ``colour`` and ``size``).

    Example:
        >>> t = WordListTagger({"noun": ["dog", "cat"], "relation": ["next to", "on"]})
        >>> t.spans(split_words("a dog next to a cat"), "relation")
        [(2, 4)]
    """

    def __init__(self, classes: Mapping[str, Iterable[str | Sequence[str]]], attributes: Sequence[str] | None = None) -> None:
        if not classes:
            raise ValueError("a word-list tagger needs at least one class.")
        self._phrases: dict[str, list[tuple[str, ...]]] = {}
        #: per class, the phrases by their first word (longest first, as in ``_phrases``): a
        #: position is tried against the phrases that can start there only
        self._starting: dict[str, dict[str, list[tuple[str, ...]]]] = {}
        self._meaning: dict[str, dict[tuple[str, ...], int]] = {}
        for name, entries in classes.items():
            meaning: dict[tuple[str, ...], int] = {}
            for k, entry in enumerate(entries):
                for word in [entry] if isinstance(entry, str) else entry:
                    phrase = tuple(split_words(str(word).lower()))
                    if phrase:
                        meaning.setdefault(phrase, k)
            if not meaning:
                raise ValueError(f"word class {name!r} has no words.")
            self._meaning[str(name)] = meaning
            self._phrases[str(name)] = sorted(meaning, key=len, reverse=True)
            starting: dict[str, list[tuple[str, ...]]] = {}
            for phrase in self._phrases[str(name)]:
                starting.setdefault(phrase[0], []).append(phrase)
            self._starting[str(name)] = starting
        self.classes = tuple(self._phrases)
        default = [c for c in ("adjective", "colour", "size") if c in self._phrases]
        self.attributes = tuple(attributes) if attributes is not None else tuple(default)
        unknown = [a for a in self.attributes if a not in self._phrases]
        if unknown:
            raise ValueError(f"attribute class {unknown[0]!r} is not one of the classes {list(self.classes)}.")

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> WordListTagger:
        """``{"noun": [...], "adjective": [...], "relation": [...], "attributes": [...]}``
        (entries are words, phrases or lists of synonyms; ``attributes`` optional: which
        classes :class:`SwapAttributes` may swap).

        Raises:
            FileNotFoundError: no such file.
            WordClassError: the file is not UTF-8 JSON in this layout (the message names the
                file and the entry at fault).

        Example:
            >>> doc = {"noun": ["dog", ["car", "auto"]], "adjective": ["red"], "relation": ["left of"]}
            >>> _ = Path("word_classes.json").write_text(json.dumps(doc))
            >>> WordListTagger.from_json("word_classes.json").classes
            ('noun', 'adjective', 'relation')
        """
        path = Path(path)
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise FileNotFoundError(f"word-class file {path} does not exist.") from None
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            raise WordClassError(f"word-class file {path} is not valid UTF-8 JSON: {exc}.") from None
        layout = '{"class": [word, phrase or [synonyms...], ...], ..., "attributes": [class, ...]}'
        if not isinstance(doc, dict):
            raise WordClassError(f"word-class file {path}: expected {layout}.")
        attributes = doc.pop("attributes", None)
        if attributes is not None and not _strings(attributes):
            raise WordClassError(f"word-class file {path}: 'attributes' must list class names, got {attributes!r}.")
        for name, entries in doc.items():
            if not isinstance(entries, list) or not all(isinstance(e, str) or _strings(e) for e in entries):
                raise WordClassError(
                    f"word-class file {path}: class {name!r} must list words, phrases or lists of synonyms "
                    f"(strings), got {entries!r:.80}; expected {layout}."
                )
        try:
            return cls(doc, attributes)
        except ValueError as exc:  # an empty class, an unknown attribute class
            raise WordClassError(f"word-class file {path}: {exc}") from None

    def meaning(self, words: Sequence[str], word_class: str) -> Any:
        """What a class member means: its synonym list (or itself)."""
        phrase = tuple(w.lower() for w in words)
        return self._meaning.get(word_class, {}).get(phrase, phrase)

    def spans(self, words: Sequence[str], word_class: str) -> list[tuple[int, int]]:
        starting = self._starting.get(word_class)
        if starting is None:
            raise ValueError(f"unknown word class {word_class!r}; this tagger knows {list(self.classes)}.")
        lower = [w.lower() for w in words]
        out, k = [], 0
        while k < len(lower):
            for phrase in starting.get(lower[k], ()):
                if tuple(lower[k : k + len(phrase)]) == phrase:
                    out.append((k, k + len(phrase)))
                    k += len(phrase)
                    break
            else:
                k += 1
        return out


#: universal part-of-speech tags -> the probes' word classes
UNIVERSAL_CLASSES: dict[str, str] = {"NOUN": "noun", "PROPN": "noun", "NUM": "noun", "ADJ": "adjective", "ADP": "relation"}


class PosTagger:
    """Word classes from a part-of-speech tagger: ``tag(words) -> [tag per word]``, mapped to
    classes by ``tag_classes`` (universal tags by default: NOUN, PROPN and NUM are nouns, ADJ
    adjectives, ADP relation words).

    Example:
        >>> import nltk  # needs nltk and its tagger data  # doctest: +SKIP
        >>> t = PosTagger(lambda ws: [tag for _, tag in nltk.pos_tag(ws, tagset="universal")])  # doctest: +SKIP
    """

    def __init__(self, tag: Callable[[list[str]], Sequence[str]], tag_classes: Mapping[str, str] | None = None) -> None:
        self._tag = tag
        self._classes = dict(tag_classes or UNIVERSAL_CLASSES)
        self.classes = tuple(dict.fromkeys(self._classes.values()))
        self.attributes = ("adjective",) if "adjective" in self.classes else ()

    def spans(self, words: Sequence[str], word_class: str) -> list[tuple[int, int]]:
        if word_class not in self.classes:
            raise ValueError(f"unknown word class {word_class!r}; this tagger knows {list(self.classes)}.")
        tags = list(self._tag(list(words)))
        if len(tags) != len(words):
            raise ValueError(f"the tagger gave {len(tags)} tags for {len(words)} words.")
        return [(k, k + 1) for k, t in enumerate(tags) if self._classes.get(t) == word_class]


def nltk_tagger() -> PosTagger:
    """NLTK's averaged-perceptron tagger with the universal tag set.

    Raises:
        ImportError: NLTK or its tagger data is not installed (names the commands).
    """
    try:
        import nltk
    except ImportError:
        raise ImportError("the nltk tagger needs NLTK: pip install nltk.") from None
    try:
        nltk.pos_tag(["a", "test"], tagset="universal")
    except LookupError:
        raise ImportError(
            "NLTK's tagger data is not installed: python -m nltk.downloader averaged_perceptron_tagger_eng "
            "universal_tagset (or use word lists: --word-classes FILE)."
        ) from None
    return PosTagger(lambda words: [tag for _, tag in nltk.pos_tag(words, tagset="universal")])


def make_tagger(source: str | os.PathLike | Tagger) -> Tagger:
    """``"spacy"`` (:class:`xmatch.eval.spacy_tagger.SpacyTagger`, ``pip install
    'xmatch-zoo[spacy]'``), ``"nltk"``, a JSON word-list file, or a tagger itself (the scenes
    grammar's lists are :func:`xmatch.scenes.tagger.scenes_tagger`, which the scenes datasets
    declare).

    Raises:
        MissingDependencyError: ``"spacy"`` without spaCy or its model installed (an
            ``ImportError`` that names the pip command).

    Example:
        >>> make_tagger(WordListTagger({"noun": ["dog"]})).classes
        ('noun',)
    """
    if not isinstance(source, (str, os.PathLike)):
        return source
    if str(source) == "spacy":
        from xmatch.eval.spacy_tagger import SpacyTagger

        return SpacyTagger()
    if str(source) == "nltk":
        return nltk_tagger()
    if not Path(source).is_file():
        raise FileNotFoundError(f"word classes {str(source)!r}: not 'scenes', 'spacy', 'nltk' or an existing JSON file.")
    return WordListTagger.from_json(source)


class Perturbation(Protocol):
    """A caption transform: ``perturb(caption, rng) -> caption``, with a ``name``."""

    name: str

    def __call__(self, text: str, rng: np.random.Generator) -> str: ...


@dataclass(frozen=True)
class ShuffleWords:
    """All words in a random order (punctuation keeps its place).

    Example:
        >>> ShuffleWords()("a red 7 left of a blue circle", np.random.default_rng(1))
        'a a red of 7 blue left circle'
    """

    name: str = "shuffle"

    def __call__(self, text: str, rng: np.random.Generator) -> str:
        words = split_words(text)
        slots = [k for k, w in enumerate(words) if _TOKEN.fullmatch(w) and w[0].isalnum()]
        if len({words[k] for k in slots}) < 2:
            return text
        for _ in range(10):  # a permutation that leaves the words in place is no probe
            order = rng.permutation(len(slots))
            shuffled = list(words)
            for k, j in zip(slots, order):
                shuffled[k] = words[slots[j]]
            if shuffled != words:
                return join_words(shuffled)
        return text


@dataclass(frozen=True)
class DropWords:
    """Every word (or phrase) of one class removed, e.g. all nouns or all relation words.

    A caption that would lose every word is left as it is.

    Example:
        >>> from xmatch.scenes.tagger import scenes_tagger
        >>> DropWords("noun", scenes_tagger())("a red 7 above a blue circle", None)
        'a red above a blue'
    """

    word_class: str
    tagger: Any = field(repr=False, compare=False)

    @property
    def name(self) -> str:
        return f"drop-{self.word_class}"

    def __call__(self, text: str, rng: np.random.Generator | None) -> str:
        words = split_words(text)
        dropped = np.zeros(len(words), dtype=bool)
        for start, stop in self.tagger.spans(words, self.word_class):
            dropped[start:stop] = True
        kept = [w for w, d in zip(words, dropped) if not d]
        return join_words(kept) if dropped.any() and any(w[0].isalnum() for w in kept) else text


@dataclass(frozen=True)
class SwapAttributes:
    """The first two different attributes of one class that belong to different nouns swap
    places ("a red 7 left of a blue circle" -> "a blue 7 left of a red circle"): the same
    words, another binding.

    Attributes belong to different nouns when a noun of the tagger lies between them; they
    differ when the tagger does not list them as synonyms (``small`` / ``little``).

    Example:
        >>> from xmatch.scenes.tagger import scenes_tagger
        >>> SwapAttributes("size", scenes_tagger())("a small red 7 above a big blue circle", None)
        'a big red 7 above a small blue circle'
    """

    word_class: str
    tagger: Any = field(repr=False, compare=False)

    @property
    def name(self) -> str:
        return f"swap-{self.word_class}"

    def __call__(self, text: str, rng: np.random.Generator | None) -> str:
        words = split_words(text)
        found = self.tagger.spans(words, self.word_class)
        noun_starts = np.array([s for s, _ in self.tagger.spans(words, "noun")], dtype=np.int64)
        meaning = getattr(self.tagger, "meaning", lambda ws, _: tuple(w.lower() for w in ws))
        for a, (s1, e1) in enumerate(found):
            for s2, e2 in found[a + 1 :]:
                first, second = words[s1:e1], words[s2:e2]
                if meaning(first, self.word_class) == meaning(second, self.word_class):
                    continue  # synonyms ("small", "little"): swapping them changes nothing
                if not ((noun_starts >= e1) & (noun_starts < s2)).any():
                    continue
                swapped = words[:s1] + second + words[e1:s2] + first + words[e2:]
                return join_words(swapped)
        return text


def default_probes(tagger: Tagger) -> list[Perturbation]:
    """Word shuffling, dropping each of noun / adjective / relation the tagger knows, and
    swapping each of its attribute classes.

    Example:
        >>> from xmatch.scenes.tagger import scenes_tagger
        >>> [p.name for p in default_probes(scenes_tagger())]
        ['shuffle', 'drop-noun', 'drop-adjective', 'drop-relation', 'swap-colour', 'swap-size']
    """
    probes: list[Perturbation] = [ShuffleWords()]
    probes += [DropWords(c, tagger) for c in DROP_CLASSES if c in tagger.classes]
    probes += [SwapAttributes(c, tagger) for c in tagger.attributes]
    return probes


def parse_probe(name: str, tagger: Tagger) -> Perturbation:
    """``shuffle``, ``drop-CLASS`` or ``swap-CLASS``.

    Example:
        >>> from xmatch.scenes.tagger import scenes_tagger
        >>> parse_probe("drop-relation", scenes_tagger()).name
        'drop-relation'
    """
    if name == "shuffle":
        return ShuffleWords()
    kind, _, word_class = name.partition("-")
    if kind in ("drop", "swap") and word_class:
        if word_class not in tagger.classes:
            raise ValueError(f"probe {name!r}: the tagger has no word class {word_class!r} (it has {list(tagger.classes)}).")
        return DropWords(word_class, tagger) if kind == "drop" else SwapAttributes(word_class, tagger)
    raise ValueError(f"unknown probe {name!r}; probes: shuffle, drop-CLASS, swap-CLASS (classes: {list(tagger.classes)}).")


def perturb_captions(captions: Sequence[str], perturbation: Perturbation, seed: int = 0) -> list[str]:
    """Every caption through ``perturbation``; the same seed gives the same captions.

    Example:
        >>> perturb_captions(["a red 7 above a blue circle"], ShuffleWords(), seed=3)
        ['red blue 7 above a a circle']
    """
    rng = np.random.default_rng([seed, zlib.crc32(perturbation.name.encode())])
    return [perturbation(c, rng) for c in captions]


@dataclass
class ProbeResult:
    """Recall@K under each perturbation and what it costs.

    Attributes:
        base: ``{"i2t": {"r1", "r5", "r10"}, "t2i": {...}}`` with the original captions.
        probes: per probe name: ``changed`` (percent of captions the perturbation altered),
            ``i2t`` / ``t2i`` figures with the perturbed captions, and ``cost`` (base minus
            perturbed, in R@K points; positive = the perturbation hurts).
        seed: the seed of the perturbations.
    """

    base: dict[str, dict[str, float]]
    probes: dict[str, dict[str, Any]]
    seed: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"base": self.base, "probes": self.probes, "seed": self.seed}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ProbeResult:
        return cls(dict(data["base"]), dict(data["probes"]), int(data.get("seed", 0)))

    def table(self) -> str:
        """One row per probe: captions changed, then the cost in R@1/5/10 per direction."""
        head = f"{'probe':16s}{'changed':>8s}" + "".join(f"{d + ' ' + k:>10s}" for d in ("i2t", "t2i") for k in RECALL_KEYS)
        rows = [head, "(cost = R@K with the original captions minus R@K with the perturbed ones)"]
        for name, probe in self.probes.items():
            cells = "".join(f"{probe['cost'][d][k]:10.1f}" for d in ("i2t", "t2i") for k in RECALL_KEYS)
            rows.append(f"{name:16s}{probe['changed']:7.0f}%{cells}")
        return "\n".join(rows)


def probe_figures(
    score_captions: Callable[[list[str]], list[np.ndarray]],
    captions: Sequence[str],
    evaluate_blocks: Callable[[list[np.ndarray]], Any],
    base: Any,
    perturbations: Sequence[Perturbation],
    seed: int = 0,
    progress: bool = False,
) -> ProbeResult:
    """Run the probes through callbacks (what :func:`xmatch.eval.suite.run_protocols` does).

    Args:
        score_captions: replacement captions -> the protocol's score blocks.
        captions: the original captions.
        evaluate_blocks: score blocks -> an :class:`~xmatch.eval.EvalResult`.
        base: the :class:`~xmatch.eval.EvalResult` of the original captions.
        perturbations: the probes.
        seed: seed of the perturbations.
        progress: a progress bar over the probes.
    """
    from xmatch.core.progress import progress_bar

    names = [p.name for p in perturbations]
    if len(set(names)) != len(names):
        raise ValueError(f"probe names must be unique, got {names}.")
    pick = lambda figures: {k: float(figures[k]) for k in RECALL_KEYS}  # noqa: E731
    base_figures = {"i2t": pick(base.i2t), "t2i": pick(base.t2i)}
    probes = {}
    for perturbation in progress_bar(perturbations, desc="probes", unit="probe", show=progress):
        start = time.perf_counter()
        altered = perturb_captions(captions, perturbation, seed)
        changed = 100.0 * float(np.mean([a != c for a, c in zip(altered, captions)]))
        result = evaluate_blocks(score_captions(altered))
        figures = {"i2t": pick(result.i2t), "t2i": pick(result.t2i)}
        cost = {d: {k: base_figures[d][k] - figures[d][k] for k in RECALL_KEYS} for d in ("i2t", "t2i")}
        probes[perturbation.name] = {"changed": changed, **figures, "cost": cost}
        logger.info("probe %s: %.0f%% of captions changed, t2i R@1 cost %.1f (%.1f s)", perturbation.name,
                    changed, cost["t2i"]["r1"], time.perf_counter() - start)
    return ProbeResult(base_figures, probes, seed)


class PerturbedCaptions:
    """A training set whose captions are perturbed on the fly (an augmentation).

    Each item's caption is replaced, with probability ``p``, by one of ``perturbations``
    (chosen at random). The draw depends only on ``(seed, epoch, index)``, so a resumed run
    sees the same captions; call :meth:`set_epoch` to draw anew each epoch. Everything else
    (images, the original ``captions`` list that vocabularies are built from) is the wrapped
    dataset's.

    Meaning-preserving transforms suit augmentation (e.g. dropping filler words); shuffles and
    swaps change what a caption says and are probes or negatives, not positives.

    Example:
        >>> train = PerturbedCaptions(open_dataset("scenes", None, split="train"), [ShuffleWords()], p=0.3)  # trains a model (minutes)  # doctest: +SKIP
        >>> Trainer(model, train, config).fit()  # doctest: +SKIP
    """

    def __init__(self, dataset: Any, perturbations: Sequence[Perturbation], p: float = 0.5, seed: int = 0) -> None:
        if not perturbations:
            raise ValueError("PerturbedCaptions needs at least one perturbation.")
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"p must be in [0, 1], got {p}.")
        self.dataset = dataset
        self.perturbations = list(perturbations)
        self.p = p
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Draw other perturbations from now on (e.g. once per epoch)."""
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        import dataclasses

        pair = self.dataset[index]
        rng = np.random.default_rng([self.seed, self.epoch, int(pair.index)])
        if rng.random() >= self.p:
            return pair
        perturbation = self.perturbations[int(rng.integers(len(self.perturbations)))]
        return dataclasses.replace(pair, text=perturbation(pair.text, rng))

    def loader(self, batch_size: int, *, shuffle: bool = True, num_workers: int = 0, **kwargs: Any) -> Any:
        """A DataLoader of the perturbed training pairs (as :meth:`ImageTextDataset.loader`)."""
        from torch.utils.data import DataLoader

        from xmatch.data.collate import collate

        return DataLoader(self, batch_size=batch_size, shuffle=shuffle, num_workers=num_workers, collate_fn=collate, **kwargs)

    def __getattr__(self, name: str) -> Any:
        # everything but the pairs is the wrapped dataset's (captions, images, loaders' needs)
        if name == "dataset":
            raise AttributeError(name)
        return getattr(self.dataset, name)


def _strings(value: Any) -> bool:
    """Whether ``value`` is a JSON list of strings."""
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


__all__ = [
    "DropWords", "PerturbedCaptions", "Perturbation", "PosTagger", "ProbeResult", "ShuffleWords",
    "SwapAttributes", "Tagger", "WordClassError", "WordListTagger", "default_probes", "join_words", "make_tagger", "nltk_tagger",
    "parse_probe", "perturb_captions", "probe_figures", "split_words",
]
