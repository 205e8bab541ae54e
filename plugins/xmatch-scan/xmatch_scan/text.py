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

This is xmatch's ``bigru`` encoder (:class:`xmatch.plugin.BiGRUTextEncoder`, ``merge="mean"``)
with ``<start>`` / ``<end>`` and SCAN's vocabulary rules (words seen at least 4 times by
default); xmatch's word pipeline (:mod:`xmatch.plugin`) also reads the original
``<data_name>_vocab.json`` files.
"""

from __future__ import annotations

import os
from typing import Any

from xmatch.plugin import BiGRUTextEncoder, Vocabulary, WordTextEncoder, read_original_vocabulary, with_markers


def load_original_vocab(path: str | os.PathLike) -> Vocabulary:
    """Read a vocabulary file of the original code (``vocab/<data_name>_vocab.json``: JSON with
    ``word2idx``, ``idx2word`` and ``idx``), keeping its word order.

    The ids differ from the original's (``<pad>`` 0, ``<start>`` 1, ``<end>`` 2, ``<unk>`` 3): the
    four specials come first in xmatch's own order, then the words in the original id order.

    Example:
        >>> load_original_vocab("vocab/f30k_precomp_vocab.json")  # needs the original SCAN vocabulary file  # doctest: +SKIP
        Vocabulary(8481 words)
    """
    return with_markers(read_original_vocabulary(path))


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
    start_end = True

    def __init__(
        self,
        vocab: str | list[str] | None = None,
        min_count: int = 4,
        word_dim: int = 300,
        hidden_dim: int = 1024,
        layers: int = 1,
        max_length: int = 512,
    ) -> None:
        super().__init__(
            [] if vocab is None else vocab,
            min_count=min_count,
            word_dim=word_dim,
            hidden_dim=hidden_dim,
            layers=layers,
            merge="mean",
            max_length=max_length,
        )

    def save_assets(self, directory: str | os.PathLike) -> dict[str, Any]:
        # SCAN has no GloVe arguments: only the vocabulary (the word pipeline's assets)
        return WordTextEncoder.save_assets(self, directory)
