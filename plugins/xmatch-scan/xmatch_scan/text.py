"""SCAN's text encoder: word embeddings, a bidirectional GRU, the two directions averaged.

Lee, Chen, Hua, Hu, He. "Stacked Cross Attention for Image-Text Matching", ECCV 2018, and
its code (kuanghuei/SCAN ``model.py:EncoderText``, ``data.py``, ``vocab.py``):

- captions are lower-cased and split into words; ``<start>`` and ``<end>`` are added around
  them and take part in the GRU and in the cross attention like any word;
- ``Embedding(vocabulary, 300)`` initialised U(-0.1, 0.1), then ``GRU(300, 1024,
  bidirectional)`` over the packed sequence; each word's feature is the mean of its forward
  and backward states (``e_j = (h_fwd_j + h_bwd_j) / 2``), L2-normalised by the model. The
  zoo entries set ``text_projection = false``, so no layer comes between the two (the
  output width ``hidden_dim`` is then the model's ``embed_dim``).

This is xmatch's ``bigru`` encoder (:class:`xmatch.components.text_rnn.BiGRUTextEncoder`,
``merge="mean"``) with SCAN's start / end markers and vocabulary rules (words seen at least 4
times by default; the original ``<data_name>_vocab.json`` files can be read directly).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn
from xmatch import TokenBatch
from xmatch.components.text_rnn import SPECIALS, VOCAB_FILE, BiGRUTextEncoder, Vocabulary
from xmatch.masks import lengths_to_mask
from xmatch.sources import resolve_local_source

START, END = "<start>", "<end>"
MARKERS = (START, END)
#: the specials of the original vocab.py, ids 0-3, which xmatch's Vocabulary lays out itself
ORIGINAL_SPECIALS = ("<pad>", "<start>", "<end>", "<unk>")


def with_markers(words: list[str]) -> Vocabulary:
    """A vocabulary of ``words`` with ``<start>`` and ``<end>`` as its first two words (ids 2
    and 3, after xmatch's ``<pad>`` = 0 and ``<unk>`` = 1); idempotent.

    Example:
        >>> with_markers(["dog", "<end>", "a"]).words
        ['<pad>', '<unk>', '<start>', '<end>', 'dog', 'a']
    """
    return Vocabulary([*MARKERS, *(w for w in words if w not in MARKERS and w not in SPECIALS)])


def load_original_vocab(path: str | os.PathLike) -> Vocabulary:
    """Read a vocabulary file of the original code (``vocab/<data_name>_vocab.json``: JSON with
    ``word2idx``, ``idx2word`` and ``idx``), keeping its word order.

    The ids differ from the original's (``<pad>`` 0, ``<start>`` 1, ``<end>`` 2, ``<unk>`` 3): the
    four specials come first in xmatch's own order, then the words in the original id order.

    Example:
        >>> load_original_vocab("vocab/f30k_precomp_vocab.json")  # needs the original SCAN vocabulary file  # doctest: +SKIP
        Vocabulary(8481 words)
    """
    path = Path(path)
    data = json.loads(path.read_text(encoding="utf-8"))
    word2idx = data.get("word2idx") if isinstance(data, dict) else None
    if not isinstance(word2idx, dict) or not all(isinstance(i, int) for i in word2idx.values()):
        raise ValueError(
            f"{path} is not a vocabulary of the original SCAN / VSE++ code (a JSON object whose "
            "\"word2idx\" maps words to int ids)."
        )
    words = sorted(word2idx, key=word2idx.__getitem__)
    return with_markers([w for w in words if w not in ORIGINAL_SPECIALS])


def scan_vocabulary(vocab: str | list[str] | None, min_count: int) -> Vocabulary:
    """The vocabulary from what a spec gives (see :class:`ScanBiGRUTextEncoder`)."""
    if vocab is None:
        return with_markers([])
    if not isinstance(vocab, str):
        return with_markers(list(vocab))
    path = Path(resolve_local_source(vocab))
    if not path.is_file():
        raise FileNotFoundError(
            f"text encoder 'scan-bigru': vocab='{vocab}' does not exist; give a caption file (one caption "
            "per line), a vocab.json saved with the model, or the original <data_name>_vocab.json."
        )
    if path.suffix == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(data, dict) and "word2idx" in data:
            return load_original_vocab(path)
        return with_markers(Vocabulary.load(path).words[len(SPECIALS) :])
    with open(path, encoding="utf-8") as f:
        return with_markers(Vocabulary.from_captions(f, min_count).words[len(SPECIALS) :])


class ScanBiGRUTextEncoder(BiGRUTextEncoder):
    """SCAN's Bi-GRU text encoder (directions averaged, ``<start>`` / ``<end>`` included).

    Args:
        vocab: a caption file (one caption per line) to build the vocabulary from (words seen
            ``min_count`` times), a ``vocab.json`` saved with an xmatch model, the original
            ``<data_name>_vocab.json``, or the list of words. Without one the model still
            builds (to inspect it or load a bundle), but tokenising raises.
        min_count: when building from captions, keep words seen at least this often (4, as
            the original ``vocab.py``).
        word_dim: word embedding width (300).
        hidden_dim: GRU hidden size per direction = output width (1024, the original's
            ``embed_size``).
        layers: stacked GRU layers (1).
        max_length: longest caption in words, without the two markers; longer ones are
            truncated with a warning.

    Example:
        >>> enc = ScanBiGRUTextEncoder(["a", "dog"], word_dim=8, hidden_dim=6)
        >>> batch = enc.tokenize(["a dog", "dog"])
        >>> batch.inputs["input_ids"].tolist(), enc(batch).tokens.shape
        ([[2, 4, 5, 3], [2, 5, 3, 0]], torch.Size([2, 4, 6]))
    """

    component_name = "scan-bigru"

    def __init__(
        self,
        vocab: str | list[str] | None = None,
        min_count: int = 4,
        word_dim: int = 300,
        hidden_dim: int = 1024,
        layers: int = 1,
        max_length: int = 512,
    ) -> None:
        vocabulary = scan_vocabulary(vocab, min_count)
        super().__init__(
            vocabulary.words[len(SPECIALS) :],
            word_dim=word_dim,
            hidden_dim=hidden_dim,
            layers=layers,
            merge="mean",
            max_length=max_length,
        )
        self.start_id, self.end_id = (self.vocabulary.words.index(m) for m in MARKERS)

    def tokenize(self, texts: list[str]) -> TokenBatch:
        """Word ids with ``<start>`` before and ``<end>`` after every caption; both are real
        tokens (mask and content True)."""
        if len(self.vocabulary) == len(SPECIALS) + len(MARKERS):
            raise ValueError(
                "text encoder 'scan-bigru' has no vocabulary: every word would be <unk>. Build the "
                "model with text_encoder={'vocab': ...}: a caption file, a vocab.json or a word list."
            )
        batch = super().tokenize(texts)
        lengths = batch.mask.sum(dim=1)
        ids = nn.functional.pad(batch.inputs["input_ids"], (1, 1), value=0)
        ids[:, 0] = self.start_id
        ids[torch.arange(len(ids)), lengths + 1] = self.end_id
        mask = lengths_to_mask(lengths + 2, ids.shape[1])
        return TokenBatch({"input_ids": ids}, mask, mask.clone(), batch.texts)

    def save_assets(self, directory: str | os.PathLike) -> dict[str, Any]:
        self.vocabulary.save(Path(directory) / VOCAB_FILE)
        return {"vocab": VOCAB_FILE}
