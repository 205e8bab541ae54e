"""VSE++ caption encoder (Faghri et al., BMVC 2018; fartashf/vsepp ``model.py:EncoderText``).

Words -> ``Embedding(vocab, 300)`` initialised U(-0.1, 0.1) -> one-layer unidirectional GRU
(batch first, on the packed sequence) -> the hidden state at each caption's last word
(``<start>`` ... ``<end>`` inclusive, as the original) -> one global slot. The zoo entries set
``text_projection = false``, so the model l2-normalises this state directly, as the original
does (the output width ``hidden_dim`` is then the model's ``embed_dim``).

The vocabulary, word splitting (NLTK-like clitic splitting), ``<start>`` / ``<end>`` (added when
``start_end`` is on) and truncation are xmatch's word pipeline
(:class:`xmatch.plugin.WordTextEncoder`).
"""

from __future__ import annotations

from torch import nn

from xmatch.plugin import EncoderOutput, TokenBatch, WordTextEncoder, uniform_word_embedding


class VSEPPTextEncoder(WordTextEncoder):
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

    component_name = "vsepp-gru"

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
        super().__init__(vocab, min_count, max_length, start_end=start_end)
        self.output_dim = hidden_dim
        self.embed = uniform_word_embedding(len(self.vocabulary), word_dim)  # EncoderText.init_weights
        self.rnn = nn.GRU(word_dim, hidden_dim, num_layers=layers, batch_first=True)

    def forward(self, batch: TokenBatch) -> EncoderOutput:
        lengths = batch.mask.sum(dim=1)
        if bool((lengths == 0).any()):
            raise ValueError("every caption needs at least one token; tokenize() never gives empty ones.")
        x = self.embed(batch.inputs["input_ids"])
        # Packing: the state after the last real word is h_n (the original gathers the
        # output at length - 1, the same vector); lengths must live on the CPU.
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        _, h_n = self.rnn(packed)
        return EncoderOutput.global_vector(h_n[-1])
