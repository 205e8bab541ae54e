"""Base classes of the component kinds and the small typed records passed between them."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from xmatch.model.buckets import BucketedEmbeddings
from xmatch.model.embeddings import Embeddings
from xmatch.model.inputs import PixelInputs, RegionInputs


@dataclass
class EncoderOutput:
    """What an encoder hands to the model before projection and reasoning.

    Attributes:
        tokens: ``[B, T, F]`` element features.
        mask: ``[B, T]`` True for every real position (the reasoner attends over these).
        content: ``[B, T]`` True for the positions that take part in the alignment: real
            regions / words, never the special slots ([CLS], [SEP], the image CLS slot).
        global_slot: whether position 0 is a global slot (I-CLS / [CLS]) whose reasoned
            output becomes ``Embeddings.pooled``.
        boxes: ``[B, T, 4]`` normalised box of every position, for image encoders that choose
            their regions (zeros for the global slot and padding); it becomes
            ``Embeddings.boxes``.
    """

    tokens: torch.Tensor
    mask: torch.Tensor
    content: torch.Tensor
    global_slot: bool = False
    boxes: torch.Tensor | None = None

    @classmethod
    def global_vector(cls, vectors: torch.Tensor) -> EncoderOutput:
        """One global slot per item (``[B, D]`` -> tokens ``[B, 1, D]``): it becomes
        ``Embeddings.pooled`` and never enters an alignment (VSE++-style global encoders).

        Example:
            >>> out = EncoderOutput.global_vector(torch.ones(2, 3))
            >>> out.tokens.shape, out.global_slot, out.content.any().item()
            (torch.Size([2, 1, 3]), True, False)
        """
        mask = torch.ones(vectors.shape[0], 1, dtype=torch.bool, device=vectors.device)
        return cls(vectors.unsqueeze(1), mask, torch.zeros_like(mask), global_slot=True)


@dataclass
class TokenBatch:
    """Tokenised captions, on the CPU until the model moves them.

    Attributes:
        inputs: tensors the text encoder's ``forward`` consumes (e.g. ``input_ids``).
        mask: ``[B, L]`` True for real tokens.
        content: ``[B, L]`` True for tokens that take part in the alignment.
    """

    inputs: dict[str, torch.Tensor]
    mask: torch.Tensor
    content: torch.Tensor
    texts: list[str] = field(default_factory=list)

    def to(self, device: torch.device | str) -> TokenBatch:
        return TokenBatch(
            {k: v.to(device) for k, v in self.inputs.items()},
            self.mask.to(device),
            self.content.to(device),
            self.texts,
        )

    def __len__(self) -> int:
        return self.mask.shape[0]


def check_caption_list(texts: Any, what: str = "tokenize") -> None:
    """Refuse anything but a list of captions (strings), naming the first item that is not one.

    Args:
        texts: the captions.
        what: the call, for the message.

    Raises:
        TypeError: ``texts`` is one string (wrap it in a list) or holds an item that is not a
            string (named by its position).

    Example:
        >>> check_caption_list(["a cat", None])
        Traceback (most recent call last):
        ...
        TypeError: tokenize: caption 1 is None, not a string; captions must be strings (remove or replace it).
    """
    if isinstance(texts, str):
        raise TypeError(f"{what} expects a list of captions (a list of strings), got one string: wrap a single caption in a list.")
    for k, text in enumerate(texts):
        if not isinstance(text, str):
            shown = repr(text) if len(repr(text)) <= 60 else f"a {type(text).__name__}"
            raise TypeError(f"{what}: caption {k} is {shown}, not a string; captions must be strings (remove or replace it).")


class ImageEncoder(nn.Module):
    """Turns region features (+ boxes) or pixels into a set of region features.

    Subclasses set ``output_dim``, declare what they read with ``input_type``
    (:class:`~xmatch.model.inputs.RegionInputs`, the default, or :class:`~xmatch.model.inputs.PixelInputs`)
    and implement ``forward``: ``forward(regions, boxes, mask)`` or ``forward(images)``.
    The model calls :meth:`encode` with the typed inputs.

    Example:
        >>> from xmatch.model.inputs import PixelInputs
        >>> class MeanPixels(ImageEncoder):
        ...     input_type = PixelInputs
        ...     output_dim = 3
        ...     def forward(self, images):
        ...         return EncoderOutput.global_vector(images.mean(dim=(2, 3)))
        >>> MeanPixels().encode(PixelInputs(torch.ones(2, 3, 4, 4))).tokens.shape
        torch.Size([2, 1, 3])
    """

    output_dim: int
    input_type: type[RegionInputs | PixelInputs] = RegionInputs

    def encode(self, inputs: RegionInputs | PixelInputs) -> EncoderOutput:
        """Encode typed inputs (what the model calls): ``forward(regions, boxes, mask)`` or
        ``forward(images=...)``. Encoders that read a checked :class:`RegionInputs` whole
        override this to hand it to ``forward``."""
        if not isinstance(inputs, self.input_type):
            raise TypeError(
                f"the image encoder {type(self).__name__} reads {self.input_type.__name__}, got {type(inputs).__name__}."
            )
        if isinstance(inputs, PixelInputs):
            return self(images=inputs.images)
        return self(inputs.regions, inputs.boxes, inputs.mask)

    def forward(self, *args: Any, **kwargs: Any) -> EncoderOutput:  # pragma: no cover - interface
        raise NotImplementedError(f"{type(self).__name__} must implement forward()")


class TextEncoder(nn.Module):
    """Owns its tokenizer: ``tokenize(list[str]) -> TokenBatch``, ``forward(TokenBatch)``."""

    output_dim: int

    def tokenize(self, texts: list[str]) -> TokenBatch:  # pragma: no cover - interface
        raise NotImplementedError(f"{type(self).__name__} must implement tokenize()")

    def forward(self, batch: TokenBatch) -> EncoderOutput:  # pragma: no cover - interface
        raise NotImplementedError(f"{type(self).__name__} must implement forward()")

    def save_assets(self, directory: str | os.PathLike) -> dict[str, Any]:
        """Write what the encoder needs besides its weights (tokenizer, vocabulary) into
        ``directory`` and return the spec arguments that point at it. Default: nothing."""
        return {}


class Reasoner(nn.Module):
    """``[B, N, D]`` + mask -> ``[B, N, D]``; one instance used for both modalities shares weights.

    A reasoner that reads region geometry sets ``uses_boxes = True`` and takes a keyword
    ``forward(x, mask, boxes=None)``: the model then hands it the encoder's ``[B, N, 4]``
    normalised ``x1, y1, x2, y2`` boxes (zeros for a global slot and padding), or None where the
    encoder has none (every text side, so a reasoner shared by both modalities must work
    without them). Every other reasoner is called as ``forward(x, mask)``.

    Attributes:
        uses_boxes: whether the model passes ``boxes`` to :meth:`forward`.

    Example:
        >>> class Boxes(Reasoner):
        ...     uses_boxes = True
        ...     def forward(self, x, mask, boxes=None):
        ...         return x if boxes is None else x + boxes.sum(-1, keepdim=True)
        >>> Boxes()(torch.zeros(1, 2, 3), torch.ones(1, 2, dtype=torch.bool), boxes=torch.ones(1, 2, 4))[0, 0]
        tensor([4., 4., 4.])
    """

    uses_boxes: bool = False

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError(f"{type(self).__name__} must implement forward()")


class Pooler(nn.Module):
    """Scores every image against every text: ``(img, txt) -> [n_img, n_txt]``.

    Subclasses implement :meth:`pairwise` on one block; :meth:`forward` cuts the inputs into
    blocks so memory stays bounded, and the result is the same for every block size.

    Attributes:
        uses_tokens: whether the pooler reads the token sets (else only ``pooled``).
    """

    uses_tokens: bool = True
    #: elements (images x texts x regions x words) scored at once; bounds peak memory. None
    #: takes the device's default (:meth:`elements_per_block`).
    block_elements: int | None = None

    def elements_per_block(self, device: torch.device | str) -> int:
        """``block_elements``, or where that is None the default for ``device``: 2**23 on a
        CPU, where a matmul of ~2,900 rows a side already runs at the machine's rate and the
        smaller block keeps a COCO-5K evaluation near 4 GB; 2**25 on an accelerator, where
        fewer, larger launches matter more than memory.

        Example:
            >>> Pooler().elements_per_block("cpu") == 1 << 23
            True
        """
        if self.block_elements is not None:
            return self.block_elements
        return 1 << 23 if torch.device(device).type == "cpu" else 1 << 25

    def pairwise(self, img: Embeddings, txt: Embeddings, **context: Any) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} must implement pairwise()")  # pragma: no cover

    def context(self, img: Embeddings, txt: Embeddings, batch_layout: bool) -> dict[str, Any]:
        """Values computed once over the whole inputs and passed to every block."""
        return {}

    def paired(self, img: Embeddings, txt: Embeddings, *, batch_layout: bool = False) -> torch.Tensor:
        """Scores ``[n]`` of the row-aligned pairs ``(img[k], txt[k])``: the diagonal of
        ``self(img, txt)`` without the ``n x n`` others (a training step scores each structural
        negative against its own caption's image only). This default scores pair by pair with
        :meth:`pairwise`; the built-in poolers override it with one batched computation. (A
        pooler that compares a batch's images or captions with each other, as OAN's intra
        poolers do, has no image-caption pairs to score.)

        Raises:
            ValueError: ``img`` and ``txt`` differ in length.

        Example:
            >>> from xmatch.components.poolers import MrSwPooler
            >>> e = Embeddings(torch.eye(2).expand(3, 2, 2), torch.ones(3, 2, dtype=torch.bool))
            >>> MrSwPooler().paired(e, e)
            tensor([2., 2., 2.])
        """
        _check_pairs(img, txt)
        context = self.context(img, txt, batch_layout)
        if not len(img):
            return img.tokens.new_zeros(0)
        return torch.cat([self.pairwise(img[k], txt[k], **context).reshape(1) for k in range(len(img))])

    def chunk_sizes(
        self, img: Embeddings, txt: Embeddings, image_chunk: int | None = None, text_chunk: int | None = None
    ) -> tuple[int, int]:
        """Images and texts scored per block so that a block holds about
        :meth:`elements_per_block` region x word products.

        Blocks are kept square in matmul rows (images x regions ~ texts x words): a long, thin
        block would re-read the other side's tokens once per block and become memory-bound.
        """
        n_img, n_txt = len(img), len(txt)
        rows_img = img.tokens.shape[1] if self.uses_tokens else 1
        rows_txt = txt.tokens.shape[1] if self.uses_tokens else 1
        elements = self.elements_per_block(img.tokens.device)
        given_image, given_text = image_chunk is not None, text_chunk is not None
        side = int(elements**0.5)
        per_pair = rows_img * rows_txt
        if image_chunk is None and text_chunk is None:
            text_chunk = max(1, min(n_txt, elements // (min(n_img, max(1, side // rows_img)) * per_pair)))
        if image_chunk is None:
            # with few texts, the image side widens to fill the block
            image_chunk = max(1, min(n_img, elements // (text_chunk * per_pair)))
        if text_chunk is None:
            text_chunk = max(1, min(n_txt, elements // (image_chunk * per_pair)))
        # equal chunks: 256 images in blocks of 80 would leave a thin last block of 16, whose
        # matmul runs well below the rate of the others
        return (
            image_chunk if given_image else _even(n_img, image_chunk),
            text_chunk if given_text else _even(n_txt, text_chunk),
        )

    def forward(
        self,
        img: Embeddings | BucketedEmbeddings,
        txt: Embeddings | BucketedEmbeddings,
        *,
        batch_layout: bool = False,
        image_chunk: int | None = None,
        text_chunk: int | None = None,
    ) -> torch.Tensor:
        if isinstance(img, BucketedEmbeddings) or isinstance(txt, BucketedEmbeddings):
            return self._bucketed(img, txt, batch_layout, image_chunk, text_chunk)
        if img.dim != txt.dim:
            raise ValueError(
                f"image and text embeddings have different widths ({img.dim} vs {txt.dim}); "
                "they must come from the same model."
            )
        context = self.context(img, txt, batch_layout)
        n_img, n_txt = len(img), len(txt)
        if image_chunk is None or text_chunk is None:
            image_chunk, text_chunk = self.chunk_sizes(img, txt, image_chunk, text_chunk)
        if image_chunk >= n_img and text_chunk >= n_txt:
            return self.pairwise(img, txt, **context)
        out = img.tokens.new_empty(n_img, n_txt)
        for i in range(0, n_img, image_chunk):
            img_block = img[i : i + image_chunk]
            for j in range(0, n_txt, text_chunk):
                out[i : i + image_chunk, j : j + text_chunk] = self.pairwise(
                    img_block, txt[j : j + text_chunk], **context
                )
        return out

    def _bucketed(
        self,
        img: Embeddings | BucketedEmbeddings,
        txt: Embeddings | BucketedEmbeddings,
        batch_layout: bool,
        image_chunk: int | None,
        text_chunk: int | None,
    ) -> torch.Tensor:
        """Score bucket against bucket (each block as narrow as its items) and scatter the
        blocks back into corpus order. Every built-in context is computable per bucket outside
        the training batch layout, which needs the whole batch's widths."""
        if batch_layout:
            raise ValueError("the training batch layout scores one padded batch; pass Embeddings, not BucketedEmbeddings.")
        if img.dim != txt.dim:
            raise ValueError(
                f"image and text embeddings have different widths ({img.dim} vs {txt.dim}); "
                "they must come from the same model."
            )
        img_parts = _parts(img)
        txt_parts = _parts(txt)
        first = img_parts[0][0].tokens
        out = first.new_empty(len(img), len(txt))
        for ip, ipos in img_parts:
            rows = slice(None) if ipos is None else ipos.to(out.device)
            for tp, tpos in txt_parts:
                block = self.forward(ip, tp, image_chunk=image_chunk, text_chunk=text_chunk)
                if ipos is None and tpos is None:
                    out = block
                elif tpos is None:
                    out[rows] = block
                elif ipos is None:
                    out[:, tpos.to(out.device)] = block
                else:
                    out[rows[:, None], tpos.to(out.device)[None, :]] = block
        return out


def _check_pairs(img: Embeddings, txt: Embeddings) -> None:
    if len(img) != len(txt):
        raise ValueError(
            f"paired scores row-aligned pairs (img[k], txt[k]): got {len(img)} images and {len(txt)} texts; "
            "to score every image against every text call the pooler itself."
        )


def _even(n: int, chunk: int) -> int:
    """The smallest chunk that cuts ``n`` items into as many chunks as ``chunk`` does."""
    return -(-n // -(-n // chunk))


def _parts(e: Embeddings | BucketedEmbeddings) -> list[tuple[Embeddings, torch.Tensor | None]]:
    if isinstance(e, BucketedEmbeddings):
        return list(zip(e.parts, e.positions))
    return [(e, None)]


@dataclass
class LossOutput:
    """A loss value to optimise plus figures to log (``*_sum`` and ``*_mean`` for hinge terms).

    Log values are floats or detached 0-d tensors. Tensors are better on a GPU: reading a float
    waits for the device, and the trainer reads all of a step's figures at once, after
    ``backward`` has been queued.
    """

    loss: torch.Tensor
    logs: dict[str, torch.Tensor | float] = field(default_factory=dict)


class Verifier(nn.Module):
    """A second-stage head that reads one (image, caption) pair per row and outputs a match
    logit: ``forward(img, txt) -> [n]`` for row-aligned ``Embeddings`` (``len(img) ==
    len(txt)``), higher = a better match. The model re-ranks a short list with it
    (``model.verify``, ``model.similarity(..., rerank=K)``).

    ``training_loss(img, txt, scores, negatives=None, owner=None, image_ids=None)`` returns
    its :class:`LossOutput` for a training batch (see the built-in ``cross-attention`` and
    ``grounded``, which share it through ``xmatch.components.verifier.PairVerifier``).
    """

    def forward(self, img: Embeddings, txt: Embeddings) -> torch.Tensor:  # pragma: no cover - interface
        raise NotImplementedError(f"{type(self).__name__} must implement forward()")

    def training_loss(
        self,
        img: Embeddings,
        txt: Embeddings,
        scores: torch.Tensor,
        negatives: Embeddings | None = None,
        owner: torch.Tensor | None = None,
        image_ids: torch.Tensor | None = None,
    ) -> LossOutput:  # pragma: no cover - interface
        raise NotImplementedError(f"{type(self).__name__} must implement training_loss()")


class Loss(nn.Module):
    """``(scores: {name: [B, B]}, image_ids) -> LossOutput``; positives sit on the diagonal."""

    def forward(
        self, scores: dict[str, torch.Tensor], image_ids: torch.Tensor | None = None
    ) -> LossOutput:  # pragma: no cover - interface
        raise NotImplementedError(f"{type(self).__name__} must implement forward()")
