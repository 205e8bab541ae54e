"""The word-level text pipeline shared by every text encoder that reads word ids: the Bi-GRU /
Bi-LSTM of TERAN's ablation, and the plugins' SCAN Bi-GRU, VSE++ GRU and OAN text CNN.

One path from a caption to padded ids: the caption is lower-cased and split into words and
punctuation (:func:`split_words`), each word looked up in a :class:`Vocabulary` (unknown words
become ``<unk>``), captions longer than ``max_length`` words are truncated with a warning,
``<start>`` / ``<end>`` are put around the words when the encoder uses them (SCAN, VSE++), and
the batch is padded with ``<pad>`` = 0. A text encoder subclasses :class:`WordTextEncoder` and
gets the vocabulary loading (:func:`load_vocabulary`), ``tokenize``, ``token_coverage`` and
``save_assets``; it writes only its network.

Example:
    >>> vocab = load_vocabulary(["a", "dog"], min_count=1, component="demo", start_end=True)
    >>> vocab.words
    ['<pad>', '<unk>', '<start>', '<end>', 'a', 'dog']
    >>> tokenize_words(vocab, ["a dog", "a cat"], max_length=None, start_end=True).inputs["input_ids"].tolist()
    [[2, 4, 5, 3], [2, 4, 1, 3]]
"""

from __future__ import annotations

import json
import os
import re
import warnings
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from xmatch.core.errors import XmatchError
from xmatch.model.interfaces import TextEncoder, TokenBatch, check_caption_list
from xmatch.components.text.side import TextSide, TokenCoverage
from xmatch.model.masks import lengths_to_mask
from xmatch.core.sources import resolve_local_source

PAD, UNK = "<pad>", "<unk>"
SPECIALS = (PAD, UNK)
START, END = "<start>", "<end>"
MARKERS = (START, END)
#: the specials of the original SCAN / VSE++ ``vocab.py`` (ids 0-3), left out when reading its files
ORIGINAL_SPECIALS = ("<pad>", "<start>", "<end>", "<unk>")
VOCAB_FORMAT = "xmatch.vocabulary/1"
VOCAB_FILE = "vocab.json"

# Clitics are split off the way NLTK's word_tokenize (SCAN, VSE++) and GloVe's tokenizer do
# ("don't" -> "do", "n't"; "dog's" -> "dog", "'s"), so such words still find a GloVe vector.
_WORD = re.compile(r"\w+(?=n't\b)|n't\b|'\w+|\w+|[^\w\s]")


def split_words(text: str) -> list[str]:
    """Lower-case ``text`` and split it into words and punctuation marks.

    Example:
        >>> split_words("A dog's ball, isn't it?")
        ['a', 'dog', "'s", 'ball', ',', 'is', "n't", 'it', '?']
    """
    return _WORD.findall(text.lower())


def word_counts(captions: Iterable[str]) -> Counter[str]:
    """How often each word (:func:`split_words`) occurs in ``captions``.

    Example:
        >>> word_counts(["a dog", "a cat"])["a"]
        2
    """
    counts: Counter[str] = Counter()
    for caption in captions:
        counts.update(split_words(caption))
    return counts


class VocabularyFileError(XmatchError, ValueError):
    """A vocabulary or caption file a word-level encoder cannot read its vocabulary from: not
    UTF-8, not JSON, not a vocabulary layout, or without a usable word (the message names it)."""


class Vocabulary:
    """Word <-> id table: ``<pad>`` = 0, ``<unk>`` = 1, then the words.

    Args:
        words: the words in id order, without the two specials (they are added in front).

    Example:
        >>> vocab = Vocabulary.from_captions(["a dog", "a cat"])
        >>> vocab.words
        ['<pad>', '<unk>', 'a', 'cat', 'dog']
        >>> vocab.encode("a red dog")
        [2, 1, 4]
    """

    def __init__(self, words: Iterable[str]) -> None:
        words = list(words)
        bad = [w for w in words if not isinstance(w, str) or not w or w in SPECIALS]
        if bad:
            raise ValueError(
                f"vocabulary words must be non-empty strings other than {list(SPECIALS)} "
                f"(those are added at ids 0 and 1); got {bad[:5]!r}."
            )
        duplicates = sorted(w for w, n in Counter(words).items() if n > 1)
        if duplicates:
            raise ValueError(f"vocabulary words repeat: {duplicates[:5]!r}.")
        self.words: list[str] = [*SPECIALS, *words]
        self._ids = {w: i for i, w in enumerate(self.words)}

    @classmethod
    def from_captions(cls, captions: Iterable[str], min_count: int = 1) -> Vocabulary:
        """Words of ``captions`` seen at least ``min_count`` times, most frequent first (ties
        alphabetically, so the same corpus always gives the same ids).

        Example:
            >>> Vocabulary.from_captions(["a dog", "a cat", "the dog"], min_count=2).words
            ['<pad>', '<unk>', 'a', 'dog']
        """
        return cls.from_counts(word_counts(captions), min_count)

    @classmethod
    def from_counts(cls, counts: Counter[str], min_count: int = 1) -> Vocabulary:
        """Words counted ``min_count``+ times (:func:`word_counts`), most frequent first, ties
        alphabetically.

        Example:
            >>> Vocabulary.from_counts(word_counts(["a dog", "a cat"]), min_count=2).words
            ['<pad>', '<unk>', 'a']
        """
        if min_count < 1:
            raise ValueError(f"min_count must be at least 1, got {min_count}.")
        kept = sorted(
            (w for w, n in counts.items() if n >= min_count and w not in SPECIALS), key=lambda w: (-counts[w], w)
        )
        return cls(kept)

    @property
    def plain_words(self) -> list[str]:
        """The words without the two specials, in id order."""
        return self.words[len(SPECIALS) :]

    def id_of(self, word: str) -> int:
        """The id of ``word`` itself (no splitting: ``"<start>"`` is one word here).

        Example:
            >>> Vocabulary(["<start>", "dog"]).id_of("<start>")
            2
        """
        return self._ids[word]

    def encode(self, text: str) -> list[int]:
        """Ids of the words of ``text``; unknown words map to ``<unk>`` (1)."""
        unk = self._ids[UNK]
        return [self._ids.get(w, unk) for w in split_words(text)]

    def coverage(self, texts: Iterable[str]) -> TokenCoverage:
        """How many words of ``texts`` are unknown to this vocabulary (map to ``<unk>``).

        Example:
            >>> cov = Vocabulary(["a", "dog"]).coverage(["a dog", "a red cat"])
            >>> cov.unknown, cov.tokens, cov.unknown_words
            (2, 5, [('red', 1), ('cat', 1)])
        """
        unknown_words: Counter[str] = Counter()
        unknown, tokens = [], []
        for text in texts:
            words = split_words(text)
            missing = [w for w in words if w not in self._ids]
            unknown_words.update(missing)
            unknown.append(len(missing))
            tokens.append(len(words))
        return TokenCoverage.from_counts(unknown, tokens, unknown_words)

    def __len__(self) -> int:
        return len(self.words)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocabulary) and self.words == other.words

    def __repr__(self) -> str:
        return f"Vocabulary({len(self)} words)"

    def save(self, path: str | os.PathLike) -> Path:
        """Write the vocabulary as JSON: ``{"format": "xmatch.vocabulary/1", "words": [...]}``,
        ``words`` in id order with the specials first."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".partial")
        tmp.write_text(json.dumps({"format": VOCAB_FORMAT, "words": self.words}, ensure_ascii=False), encoding="utf-8")
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> Vocabulary:
        """Read a vocabulary written by :meth:`save`."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(
                f"vocabulary file {path} does not exist; write one with Vocabulary.save, or give "
                "a caption file (one caption per line) to build it from."
            )
        data = _read_json(path)
        if not isinstance(data, dict) or data.get("format") != VOCAB_FORMAT:
            raise VocabularyFileError(
                f"vocabulary file {path} is not an xmatch vocabulary (expected a JSON object with "
                f"\"format\": \"{VOCAB_FORMAT}\" and \"words\"); write it with Vocabulary.save."
            )
        words = data.get("words")
        if not isinstance(words, list) or tuple(words[: len(SPECIALS)]) != SPECIALS:
            raise VocabularyFileError(
                f"vocabulary file {path}: \"words\" must be a list starting with {list(SPECIALS)}."
            )
        try:
            return cls(words[len(SPECIALS) :])
        except ValueError as exc:
            raise VocabularyFileError(f"vocabulary file {path}: {exc}") from None


def with_markers(vocabulary: Vocabulary) -> Vocabulary:
    """``vocabulary`` with ``<start>`` and ``<end>`` as its first two words (ids 2 and 3, after
    ``<pad>`` and ``<unk>``), moved there if it has them elsewhere; idempotent.

    Example:
        >>> with_markers(Vocabulary(["dog", "<end>", "a"])).words
        ['<pad>', '<unk>', '<start>', '<end>', 'dog', 'a']
    """
    return Vocabulary([*MARKERS, *(w for w in vocabulary.plain_words if w not in MARKERS)])


def read_original_vocabulary(path: str | os.PathLike) -> Vocabulary:
    """Read a vocabulary file of the original SCAN / VSE++ code (``vocab/<data_name>_vocab.json``:
    JSON with ``word2idx``, ``idx2word`` and ``idx``), keeping its word order.

    The ids differ from the original's (``<pad>`` 0, ``<start>`` 1, ``<end>`` 2, ``<unk>`` 3): the
    original's four specials are left out, the words follow xmatch's ``<pad>`` and ``<unk>`` in
    the original id order (:func:`with_markers` puts ``<start>`` / ``<end>`` back in front).

    Example:
        >>> read_original_vocabulary("vocab/f30k_precomp_vocab.json")  # needs the authors' vocabulary file  # doctest: +SKIP
        Vocabulary(8479 words)
    """
    path = Path(path)
    data = _read_json(path)
    word2idx = data.get("word2idx") if isinstance(data, dict) else None
    if not isinstance(word2idx, dict) or not all(isinstance(i, int) and not isinstance(i, bool) for i in word2idx.values()):
        raise VocabularyFileError(
            f"{path} is not a vocabulary of the original SCAN / VSE++ code (a JSON object whose "
            "\"word2idx\" maps words to int ids)."
        )
    words = sorted(word2idx, key=word2idx.__getitem__)
    try:
        return Vocabulary(w for w in words if w not in ORIGINAL_SPECIALS)
    except ValueError as exc:
        raise VocabularyFileError(f"vocabulary file {path}: {exc}") from None


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise VocabularyFileError(
            f"vocabulary file {path} is not valid JSON ({reason}); save it again (Vocabulary.save)."
        ) from None


def _is_original_vocabulary(path: Path) -> bool:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        return False  # Vocabulary.load reports it
    return isinstance(data, dict) and "word2idx" in data


def load_vocabulary(
    vocab: str | list[str] | None, min_count: int, component: str, *, start_end: bool = False
) -> Vocabulary:
    """A word-level encoder's vocabulary from what its spec gives.

    Args:
        vocab: a caption file (one caption per line; words seen ``min_count``+ times), a
            ``vocab.json`` saved with a model, the original SCAN / VSE++
            ``<data_name>_vocab.json``, a ``package:`` path to any of them, or the list of words.
        min_count: when building from captions, keep words seen at least this often.
        component: the encoder's registered name, for the error messages.
        start_end: put ``<start>`` and ``<end>`` at ids 2 and 3 (:func:`with_markers`).

    Raises:
        FileNotFoundError: ``vocab`` names no file.
        VocabularyFileError: the file is not UTF-8, not JSON, not a vocabulary, or gives no word
            (the message names it).

    Example:
        >>> load_vocabulary(["a", "dog"], 1, "bigru").words[-2:]
        ['a', 'dog']
    """
    if min_count < 1:
        raise ValueError(f"text encoder '{component}': min_count must be at least 1, got {min_count}.")
    if vocab is None:
        raise ValueError(
            f"text encoder '{component}' needs a vocabulary: vocab='captions.txt' (a caption file, one "
            "caption per line, to build it from), a vocab.json saved with the model, or a list of words; "
            "`xmatch train ... --build-text-side` builds it from the training captions."
        )
    if not isinstance(vocab, str):
        vocabulary = Vocabulary(vocab)
    else:
        path = Path(resolve_local_source(vocab))
        if not path.is_file():
            raise FileNotFoundError(
                f"text encoder '{component}': vocab='{vocab}' does not exist; give a caption file (one caption "
                "per line), a vocab.json saved with the model, or the original <data_name>_vocab.json."
            )
        if path.suffix == ".json":
            vocabulary = read_original_vocabulary(path) if _is_original_vocabulary(path) else Vocabulary.load(path)
        else:
            try:
                with open(path, encoding="utf-8") as f:
                    vocabulary = Vocabulary.from_captions(f, min_count)
            except UnicodeDecodeError as exc:
                raise VocabularyFileError(
                    f"text encoder '{component}': caption file {path} is not UTF-8 text ({exc}); give captions "
                    "one per line, in UTF-8."
                ) from None
            if len(vocabulary) == len(SPECIALS):
                raise VocabularyFileError(f"text encoder '{component}': no word of {path} is seen {min_count}+ times.")
    return with_markers(vocabulary) if start_end else vocabulary


def build_vocabulary(captions: list[str], directory: str | os.PathLike, min_count: int = 1) -> TextSide:
    """Build the word vocabulary of ``captions`` and write it as ``directory/vocab.json`` for
    any word-level text encoder that takes ``vocab`` (``bigru``, ``bilstm``, the plugins'
    ``scan-bigru``, ``vsepp-gru``, ``oan-textcnn``).

    Args:
        captions: the training captions.
        directory: where ``vocab.json`` goes (created).
        min_count: keep words seen at least this often; rarer ones become ``<unk>``.

    Example:
        >>> side = build_vocabulary(["a dog", "a cat"], "runs/mine/text_side")
        >>> side.words, side.arguments
        (3, {'vocab': 'vocab.json'})
    """
    counts = word_counts(captions)
    vocabulary = Vocabulary.from_counts(counts, min_count)
    if len(vocabulary) == len(SPECIALS):
        raise ValueError(
            f"no word of the {len(captions):,} captions is seen {min_count}+ times; lower min_count."
        )
    directory = Path(directory)
    vocabulary.save(directory / VOCAB_FILE)
    longest = max((len(split_words(c)) for c in captions), default=0)
    return TextSide(
        kind="vocabulary", directory=directory, arguments={"vocab": VOCAB_FILE}, words=len(vocabulary) - len(SPECIALS),
        distinct_words=len(counts), min_count=min_count, captions=len(captions), longest=longest,
    )


def tokenize_words(
    vocabulary: Vocabulary, texts: list[str], max_length: int | None, start_end: bool, component: str = "text encoder"
) -> TokenBatch:
    """Captions -> padded word ids (``<pad>`` = 0) with their mask; every token, the markers
    included, is real and takes part in the alignment.

    Args:
        max_length: longest caption in words, the markers not counted; longer captions are
            truncated with a warning. None: no limit.
        start_end: put ``<start>`` before and ``<end>`` after the words (ids from
            ``vocabulary``, see :func:`with_markers`).

    Example:
        >>> tokenize_words(Vocabulary(["a", "dog"]), ["a dog", "dog"], 8, False).inputs["input_ids"].tolist()
        [[2, 3], [3, 0]]
    """
    check_caption_list(texts)
    reserved = len(SPECIALS) + (len(MARKERS) if start_end else 0)
    if len(vocabulary) == reserved:
        raise ValueError(
            f"text encoder '{component}' has no vocabulary: every word would be <unk>. Build the model with "
            "text_encoder={'vocab': ...}: a caption file, a vocab.json or a word list."
        )
    ids = [vocabulary.encode(t) for t in texts]
    empty = [k for k, seq in enumerate(ids) if not seq]
    if empty:
        raise ValueError(f"captions {empty} have no words ({[texts[k] for k in empty[:3]]!r}); remove empty captions.")
    if max_length is not None:
        too_long = [k for k, seq in enumerate(ids) if len(seq) > max_length]
        if too_long:
            warnings.warn(
                f"captions {too_long[:10]} have more than {max_length} words and are truncated to the "
                "encoder's max_length.",
                stacklevel=4,
            )
            ids = [seq[:max_length] for seq in ids]
    if start_end:
        start, end = vocabulary.id_of(START), vocabulary.id_of(END)
        ids = [[start, *seq, end] for seq in ids]
    sequences = [torch.tensor(seq) for seq in ids]
    input_ids = nn.utils.rnn.pad_sequence(sequences, batch_first=True, padding_value=0)
    mask = lengths_to_mask(torch.tensor([len(s) for s in sequences]), input_ids.shape[1])
    return TokenBatch({"input_ids": input_ids}, mask, mask.clone(), list(texts))


def uniform_word_embedding(words: int, dim: int) -> nn.Embedding:
    """``Embedding(words, dim)`` initialised U(-0.1, 0.1), ``<pad>`` (row 0) zero: the
    initialisation of SCAN's and VSE++'s ``EncoderText.init_weights``.

    Example:
        >>> uniform_word_embedding(5, 3).weight[0].tolist()
        [0.0, 0.0, 0.0]
    """
    embed = nn.Embedding(words, dim, padding_idx=0)
    with torch.no_grad():
        embed.weight.uniform_(-0.1, 0.1)
        embed.weight[0].zero_()
    return embed


class WordTextEncoder(TextEncoder):
    """Base of the text encoders that read word ids: owns the :class:`Vocabulary` and the
    tokenizer (:func:`tokenize_words`), measures unknown words, saves ``vocab.json``.

    A subclass sets ``component_name`` (its registered name, for messages), calls
    ``super().__init__(vocab, min_count, max_length)`` and builds its network over
    ``len(self.vocabulary)`` ids.

    Args:
        vocab, min_count: as :func:`load_vocabulary`.
        max_length: longest caption in words (markers not counted); None: no limit.
        start_end: wrap every caption in ``<start>`` / ``<end>`` (default: the class attribute
            ``start_end``, False).

    Example:
        >>> class Bag(WordTextEncoder):
        ...     component_name = "bag"
        ...     def __init__(self, vocab=None, min_count=1, max_length=None):
        ...         super().__init__(vocab, min_count, max_length)
        >>> Bag(["a", "dog"]).tokenize(["a dog"]).inputs["input_ids"].tolist()
        [[2, 3]]
    """

    component_name: ClassVar[str] = "text encoder"
    start_end: bool = False

    def __init__(
        self, vocab: str | list[str] | None, min_count: int, max_length: int | None, *, start_end: bool | None = None
    ) -> None:
        super().__init__()
        if start_end is not None:
            self.start_end = start_end
        if max_length is not None and max_length < 1:
            raise ValueError(f"text encoder '{self.component_name}': max_length must be at least 1, got {max_length}.")
        self.vocabulary = load_vocabulary(vocab, min_count, self.component_name, start_end=self.start_end)
        self.max_length = max_length

    def tokenize(self, texts: list[str]) -> TokenBatch:
        return tokenize_words(self.vocabulary, texts, self.max_length, self.start_end, self.component_name)

    def token_coverage(self, texts: list[str]) -> TokenCoverage:
        """How many words of ``texts`` this encoder's vocabulary maps to ``<unk>``."""
        return self.vocabulary.coverage(texts)

    def save_assets(self, directory: str | os.PathLike) -> dict[str, Any]:
        self.vocabulary.save(Path(directory) / VOCAB_FILE)
        return {"vocab": VOCAB_FILE}
