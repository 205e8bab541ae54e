"""OAN's object-oriented encoders (Huang et al., ICMR 2019): a text CNN over word embeddings
and the bottom-up regions, both ending in a tanh perceptron to ``D = 512``.

The perceptron's linear part is the model's projection (``embed_dim = 512``) and its tanh
opens the ``oan-context`` reasoner, so no extra layer is added: these encoders return the
features the perceptron reads (regions as given; the concatenated tanh convolutions).
"""

from __future__ import annotations

import torch
from torch import nn

from xmatch.plugin import EncoderOutput, RegionFeaturesImageEncoder, TokenBatch, WordTextEncoder


class OANRegionImageEncoder(RegionFeaturesImageEncoder):
    """Bottom-up region features ``u_i`` with their mask, padded slots zeroed; boxes are not
    used by OAN.

    Args:
        feature_dim: region feature width (2048).

    Example:
        >>> enc = OANRegionImageEncoder(feature_dim=4)
        >>> enc(torch.rand(2, 3, 4), torch.zeros(2, 3, 4)).tokens.shape
        torch.Size([2, 3, 4])
    """


class OANCNNTextEncoder(WordTextEncoder):
    """Word embeddings -> 1-D convolutions of several widths -> tanh -> concatenated, per word.

    Every convolution is zero-padded (``(k - 1) // 2`` before, ``k // 2`` after) so that each
    word keeps one output; padded words are zero embeddings, exactly like the zero padding
    of a caption alone, so batch padding never changes a real word's features.

    Args:
        vocab: a word list, a ``vocab.json`` (``Vocabulary.save``) or a caption file (xmatch's
            word pipeline, :class:`xmatch.plugin.WordTextEncoder`).
        min_count: when building from captions, keep words seen this often (OAN: 4).
        word_dim: word-embedding width (300).
        kernel_sizes: convolution widths ({1, 2, 3, 5, 7}).
        channels: output channels per convolution (not stated in the paper summary; 512).
        max_length: longest caption in words (OAN: 60 on COCO, 80 on Flickr30k); longer
            captions are truncated with a warning. None: no limit.

    Example:
        >>> enc = OANCNNTextEncoder(["a", "dog"], word_dim=4, kernel_sizes=[1, 2], channels=3)
        >>> enc(enc.tokenize(["a dog", "dog"])).tokens.shape
        torch.Size([2, 2, 6])
    """

    component_name = "oan-textcnn"

    def __init__(
        self,
        vocab: str | list[str] | None = None,
        min_count: int = 4,
        word_dim: int = 300,
        kernel_sizes: list[int] = (1, 2, 3, 5, 7),
        channels: int = 512,
        max_length: int | None = None,
    ) -> None:
        kernel_sizes = list(kernel_sizes)
        if not kernel_sizes or any(not isinstance(k, int) or k < 1 for k in kernel_sizes):
            raise ValueError(f"text encoder 'oan-textcnn': kernel_sizes must be positive ints, got {kernel_sizes}.")
        if channels < 1:
            raise ValueError(f"text encoder 'oan-textcnn': channels must be >= 1, got {channels}.")
        super().__init__(vocab, min_count, max_length)
        self.kernel_sizes = kernel_sizes
        self.output_dim = channels * len(kernel_sizes)
        self.embed = nn.Embedding(len(self.vocabulary), word_dim, padding_idx=0)
        self.convs = nn.ModuleList(nn.Conv1d(word_dim, channels, k) for k in kernel_sizes)

    def forward(self, batch: TokenBatch) -> EncoderOutput:
        e = self.embed(batch.inputs["input_ids"]).masked_fill(~batch.mask.unsqueeze(-1), 0).transpose(1, 2)
        features = [
            torch.tanh(conv(nn.functional.pad(e, ((k - 1) // 2, k // 2))))
            for k, conv in zip(self.kernel_sizes, self.convs, strict=True)
        ]
        return EncoderOutput(torch.cat(features, dim=1).transpose(1, 2), batch.mask, batch.content, global_slot=False)
