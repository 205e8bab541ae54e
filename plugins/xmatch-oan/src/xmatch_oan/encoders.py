"""OAN's object-oriented encoders (Huang et al., ICMR 2019): a text CNN over word embeddings
and the bottom-up regions, both ending in a tanh perceptron to ``D = 512``.

The perceptron's linear part is the model's projection (``embed_dim = 512``) and its tanh
opens the ``oan-context`` reasoner, so no extra layer is added: these encoders return the
features the perceptron reads (regions as given; the concatenated tanh convolutions).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch import nn

from xmatch.components.base import EncoderOutput, ImageEncoder, TextEncoder, TokenBatch
from xmatch.components.image_bottomup import check_region_inputs
from xmatch.components.text_rnn import VOCAB_FILE, load_vocabulary
from xmatch.masks import lengths_to_mask


class OANRegionEncoder(ImageEncoder):
    """Bottom-up region features ``u_i`` with their mask; boxes are not used by OAN.

    Args:
        feature_dim: region feature width (2048).

    Example:
        >>> enc = OANRegionEncoder(feature_dim=4)
        >>> enc(torch.rand(2, 3, 4), torch.zeros(2, 3, 4)).tokens.shape
        torch.Size([2, 3, 4])
    """

    def __init__(self, feature_dim: int = 2048) -> None:
        super().__init__()
        self.feature_dim = feature_dim
        self.output_dim = feature_dim

    def forward(
        self, regions: torch.Tensor, boxes: torch.Tensor, mask: torch.Tensor | None = None
    ) -> EncoderOutput:
        mask = check_region_inputs(regions, boxes, mask, self.feature_dim)
        # Padded slots become zeros so that what they held can never leak anywhere.
        tokens = regions.masked_fill(~mask.unsqueeze(-1), 0)
        return EncoderOutput(tokens, mask, mask.clone(), global_slot=False)


class OANTextCNN(TextEncoder):
    """Word embeddings -> 1-D convolutions of several widths -> tanh -> concatenated, per word.

    Every convolution is zero-padded (``(k - 1) // 2`` before, ``k // 2`` after) so that each
    word keeps one output; padded words are zero embeddings, exactly like the zero padding
    of a caption alone, so batch padding never changes a real word's features.

    Args:
        vocab: a word list, a ``vocab.json`` (``Vocabulary.save``) or a caption file.
        min_count: when building from captions, keep words seen this often (OAN: 4).
        word_dim: word-embedding width (300).
        kernel_sizes: convolution widths ({1, 2, 3, 5, 7}).
        channels: output channels per convolution (not stated in the paper summary; 512).
        max_length: longest caption in words (OAN: 60 on COCO, 80 on Flickr30k); longer
            captions are truncated with a warning. None: no limit.

    Example:
        >>> enc = OANTextCNN(["a", "dog"], word_dim=4, kernel_sizes=[1, 2], channels=3)
        >>> enc(enc.tokenize(["a dog", "dog"])).tokens.shape
        torch.Size([2, 2, 6])
    """

    def __init__(
        self,
        vocab: str | list[str] | None = None,
        min_count: int = 4,
        word_dim: int = 300,
        kernel_sizes: list[int] = (1, 2, 3, 5, 7),
        channels: int = 512,
        max_length: int | None = None,
    ) -> None:
        super().__init__()
        kernel_sizes = list(kernel_sizes)
        if not kernel_sizes or any(not isinstance(k, int) or k < 1 for k in kernel_sizes):
            raise ValueError(f"text encoder 'oan-textcnn': kernel_sizes must be positive ints, got {kernel_sizes}.")
        if min_count < 1 or channels < 1:
            raise ValueError(f"text encoder 'oan-textcnn': min_count and channels must be >= 1, got {min_count}, {channels}.")
        if max_length is not None and max_length < 1:
            raise ValueError(f"text encoder 'oan-textcnn': max_length must be at least 1, got {max_length}.")
        self.vocabulary = load_vocabulary(vocab, min_count, "oan-textcnn")
        self.kernel_sizes = kernel_sizes
        self.max_length = max_length
        self.output_dim = channels * len(kernel_sizes)
        self.embed = nn.Embedding(len(self.vocabulary), word_dim, padding_idx=0)
        self.convs = nn.ModuleList(nn.Conv1d(word_dim, channels, k) for k in kernel_sizes)

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
        sequences = [torch.tensor(seq) for seq in ids]
        input_ids = nn.utils.rnn.pad_sequence(sequences, batch_first=True, padding_value=0)
        mask = lengths_to_mask(torch.tensor([len(s) for s in sequences]), input_ids.shape[1])
        return TokenBatch({"input_ids": input_ids}, mask, mask.clone(), list(texts))

    def forward(self, batch: TokenBatch) -> EncoderOutput:
        e = self.embed(batch.inputs["input_ids"]).masked_fill(~batch.mask.unsqueeze(-1), 0).transpose(1, 2)
        features = [
            torch.tanh(conv(nn.functional.pad(e, ((k - 1) // 2, k // 2))))
            for k, conv in zip(self.kernel_sizes, self.convs, strict=True)
        ]
        return EncoderOutput(torch.cat(features, dim=1).transpose(1, 2), batch.mask, batch.content, global_slot=False)

    def save_assets(self, directory: str) -> dict[str, str]:
        self.vocabulary.save(Path(directory) / VOCAB_FILE)
        return {"vocab": VOCAB_FILE}
