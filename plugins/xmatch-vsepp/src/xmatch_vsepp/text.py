"""VSE++ caption encoder (Faghri et al., BMVC 2018; fartashf/vsepp ``model.py:EncoderText``).

Words -> ``Embedding(vocab, 300)`` initialised U(-0.1, 0.1) -> one-layer unidirectional GRU
(batch first, on the packed sequence) -> the hidden state at each caption's last word
(``<start>`` ... ``<end>`` inclusive, as the original) -> one global slot. The zoo entries set
``text_projection = false``, so the model l2-normalises this state directly, as the original
does (the output width ``hidden_dim`` is then the model's ``embed_dim``).

The vocabulary and word splitting are xmatch's (:class:`xmatch.components.text_rnn.Vocabulary`,
NLTK-like clitic splitting); ``<start>`` and ``<end>`` are ordinary words of it, added when
``start_end`` is on.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from xmatch.components.base import EncoderOutput, TextEncoder, TokenBatch
from xmatch.components.text_rnn import SPECIALS, VOCAB_FILE, Vocabulary, load_vocabulary
from xmatch.masks import lengths_to_mask

START, END = "<start>", "<end>"


class VSEPPTextEncoder(TextEncoder):
    """Unidirectional GRU over word embeddings; the last hidden state is the caption vector.

    Args:
        vocab: a word list, a ``vocab.json`` (``Vocabulary.save``) or a caption file to build
            the vocabulary from.
        min_count: when building from captions, keep words seen this often (VSE++: 4).
        word_dim: word-embedding width (300).
        hidden_dim: GRU hidden size (VSE++: ``embed_size`` = 1024).
        layers: stacked GRU layers (``--num_layers``, 1).
        start_end: wrap every caption in ``<start>`` / ``<end>`` as the original does.
        max_length: longest caption in words (without ``<start>``/``<end>``); longer ones are
            truncated with a warning. None: no limit.

    Example:
        >>> enc = VSEPPTextEncoder(["a", "dog"], word_dim=8, hidden_dim=6)
        >>> enc(enc.tokenize(["a dog", "dog"])).tokens.shape
        torch.Size([2, 1, 6])
    """

    def __init__(
        self,
        vocab: str | list[str] | None = None,
        min_count: int = 4,
        word_dim: int = 300,
        hidden_dim: int = 1024,
        layers: int = 1,
        start_end: bool = True,
        max_length: int | None = None,
    ) -> None:
        super().__init__()
        if min_count < 1:
            raise ValueError(f"text encoder 'vsepp-gru': min_count must be at least 1, got {min_count}.")
        if max_length is not None and max_length < 1:
            raise ValueError(f"text encoder 'vsepp-gru': max_length must be at least 1, got {max_length}.")
        vocabulary = load_vocabulary(vocab, min_count, "vsepp-gru")
        if start_end and START not in vocabulary.words[len(SPECIALS):]:
            vocabulary = Vocabulary([START, END, *vocabulary.words[len(SPECIALS):]])
        self.vocabulary = vocabulary
        self.start_end = start_end
        # Looked up directly: the word splitter would cut "<start>" into "<", "start", ">".
        self._start_end_ids = (vocabulary.words.index(START), vocabulary.words.index(END)) if start_end else None
        self.max_length = max_length
        self.output_dim = hidden_dim
        self.embed = nn.Embedding(len(vocabulary), word_dim, padding_idx=0)
        with torch.no_grad():
            self.embed.weight.uniform_(-0.1, 0.1)  # EncoderText.init_weights
            self.embed.weight[0].zero_()
        self.rnn = nn.GRU(word_dim, hidden_dim, num_layers=layers, batch_first=True)

    def tokenize(self, texts: list[str]) -> TokenBatch:
        if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
            raise TypeError("tokenize expects a list of strings (wrap a single caption in a list).")
        ids = [self.vocabulary.encode(t) for t in texts]
        empty = [k for k, seq in enumerate(ids) if not seq]
        if empty:
            raise ValueError(f"captions {empty} have no words ({[texts[k] for k in empty[:3]]!r}); remove them.")
        if self.max_length is not None:
            too_long = [k for k, seq in enumerate(ids) if len(seq) > self.max_length]
            if too_long:
                warnings.warn(
                    f"captions {too_long[:10]} have more than {self.max_length} words and are truncated.",
                    stacklevel=3,
                )
            ids = [seq[: self.max_length] for seq in ids]
        if self._start_end_ids is not None:
            start, end = self._start_end_ids
            ids = [[start, *seq, end] for seq in ids]
        sequences = [torch.tensor(seq) for seq in ids]
        input_ids = nn.utils.rnn.pad_sequence(sequences, batch_first=True, padding_value=0)
        mask = lengths_to_mask(torch.tensor([len(s) for s in sequences]), input_ids.shape[1])
        return TokenBatch({"input_ids": input_ids}, mask, mask.clone(), list(texts))

    def forward(self, batch: TokenBatch) -> EncoderOutput:
        lengths = batch.mask.sum(dim=1)
        if bool((lengths == 0).any()):
            raise ValueError("every caption needs at least one token; tokenize() never gives empty ones.")
        x = self.embed(batch.inputs["input_ids"])
        # Packing: the state after the last real word is h_n (the original gathers the
        # output at length - 1, the same vector); lengths must live on the CPU.
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        _, h_n = self.rnn(packed)
        last = h_n[-1]
        mask = torch.ones(last.shape[0], 1, dtype=torch.bool, device=last.device)
        return EncoderOutput(last.unsqueeze(1), mask, torch.zeros_like(mask), global_slot=True)

    def save_assets(self, directory: str | os.PathLike) -> dict[str, Any]:
        self.vocabulary.save(Path(directory) / VOCAB_FILE)
        return {"vocab": VOCAB_FILE}
