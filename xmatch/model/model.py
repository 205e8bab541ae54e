"""The matching model: two encoders, projections, reasoners, a pooler and a loss."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from xmatch.model.interfaces import (
    EncoderOutput,
    ImageEncoder,
    Loss,
    LossOutput,
    Pooler,
    Reasoner,
    TextEncoder,
    TokenBatch,
    Verifier,
    check_caption_list,
)
from xmatch.model.buckets import BucketedEmbeddings
from xmatch.model.embeddings import Embeddings
from xmatch.model.inputs import ImageInputs, PairBatch, PixelInputs, RegionInputs, input_type_of
from xmatch.core.progress import progress_bar

#: inputs of at least this many items get a progress bar by default (on a terminal)
LONG_INPUT = 2048


def _projection(width: int, embed_dim: int, learned: bool) -> nn.Module:
    """The layer from an encoder's width to the joint space: linear, or none at all."""
    return nn.Linear(width, embed_dim) if learned else nn.Identity()


class MatchingModel(nn.Module):
    """Image encoder -> projection -> image reasoner; text encoder -> projection -> text
    reasoner; a pooler scores image-text pairs; a loss trains them; optionally a verifier
    re-scores a short list of pairs (:meth:`verify`, ``similarity(..., rerank=K)``).

    Built from a spec by :func:`xmatch.build`; ``model.spec`` gives the full spec back. An
    inference build needs no loss: ``xmatch.build(name, loss=None)`` (or a spec without a
    ``[loss]`` table) encodes and scores, and reads the weights of a training build.

    Example:
        >>> model = xmatch.build("teran-mrsw-scenes").eval()
        >>> regions, boxes = torch.rand(3, 36, 1280), torch.tensor([0.1, 0.2, 0.5, 0.9]).expand(3, 36, 4)
        >>> img = model.encode_images(xmatch.RegionInputs(regions, boxes))
        >>> txt = model.encode_texts(["a red circle left of a blue seven"])
        >>> model.similarity(img, txt).shape
        torch.Size([3, 1])
    """

    def __init__(
        self,
        image_encoder: ImageEncoder,
        text_encoder: TextEncoder,
        image_reasoner: Reasoner,
        text_reasoner: Reasoner,
        pooler: Pooler,
        loss: Loss | None,
        embed_dim: int,
        extra_poolers: Mapping[str, Pooler] | None = None,
        spec: dict[str, Any] | None = None,
        image_projection: bool = True,
        text_projection: bool = True,
        verifier: Verifier | None = None,
    ) -> None:
        super().__init__()
        self.image_encoder = image_encoder
        self.text_encoder = text_encoder
        self.image_projection = _projection(image_encoder.output_dim, embed_dim, image_projection)
        self.text_projection = _projection(text_encoder.output_dim, embed_dim, text_projection)
        self.image_reasoner = image_reasoner
        self.text_reasoner = text_reasoner
        self.pooler = pooler
        self.extra_poolers = nn.ModuleDict(dict(extra_poolers or {}))
        self.loss = loss
        self.verifier = verifier
        self.embed_dim = embed_dim
        self._spec = copy.deepcopy(spec) if spec is not None else None

    @property
    def spec(self) -> dict[str, Any]:
        """The full spec this model was built from (defaults filled in)."""
        if self._spec is None:
            raise AttributeError("this model was not built from a spec; use xmatch.build().")
        return copy.deepcopy(self._spec)

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(p for p in self.parameters() if p.is_floating_point()).dtype

    def _finish(self, out: EncoderOutput, projection: nn.Module, reasoner: Reasoner) -> Embeddings:
        x = projection(out.tokens.to(self.dtype))
        # only reasoners that read geometry get the boxes: every other reasoner keeps its
        # two-argument forward (plugins included)
        x = reasoner(x, out.mask, boxes=out.boxes) if getattr(reasoner, "uses_boxes", False) else reasoner(x, out.mask)
        pooled = F.normalize(x[:, 0], dim=-1) if out.global_slot else None
        tokens, content = (x[:, 1:], out.content[:, 1:]) if out.global_slot else (x, out.content)
        boxes = out.boxes[:, 1:] if out.boxes is not None and out.global_slot else out.boxes
        return Embeddings(F.normalize(tokens, dim=-1), content, pooled, boxes).trimmed()

    def encode_images(
        self,
        inputs: ImageInputs | None = None,
        *,
        images: Sequence[Any] | torch.Tensor | None = None,
        batch_size: int | None = 64,
        progress: bool | None = None,
    ) -> Embeddings:
        """Encode images into region embeddings, ``batch_size`` images at a time so that memory
        stays bounded for any number of images.

        The images come as the typed inputs the image encoder reads (checked once, when they are
        made, where they are: on the CPU for NumPy arrays and CPU tensors; moved to the model's
        device batch by batch). For encoders that take pixels, ``images=[...]`` is the one
        shorthand, as in open_clip and transformers: the pictures themselves.

        Args:
            inputs: :class:`~xmatch.model.inputs.RegionInputs` (precomputed region features,
                their boxes normalised to [0, 1] and a mask) or
                :class:`~xmatch.model.inputs.PixelInputs` (pictures).
            images: instead of ``inputs``, for encoders that take pixels: a list of PIL images,
                image paths or uint8 ``[H, W, 3]`` arrays, or one preprocessed float tensor
                ``[B, 3, H, W]`` (what ``PixelInputs(images)`` holds).
            batch_size: images per forward pass (default 64; None: all at once).
            progress: show a progress bar (default: for long inputs, on a terminal).

        Raises:
            TypeError: anything but typed inputs (region tensors: wrap them as
                ``xmatch.RegionInputs(regions, boxes, mask)``), or both ``inputs`` and ``images``.
            ValueError: inputs the image encoder does not read (regions for a pixel encoder,
                pictures for a region encoder).

        Example:
            >>> model = xmatch.build("teran-mrsw-scenes").eval()
            >>> inputs = xmatch.RegionInputs(torch.rand(2, 36, 1280), torch.tensor([0.1, 0.2, 0.5, 0.9]).expand(2, 36, 4))
            >>> model.encode_images(inputs).tokens.shape
            torch.Size([2, 36, 256])
        """
        inputs = self._image_inputs(inputs, images)
        device = self.device
        return self._batched(len(inputs), batch_size, lambda s: self._finish(
            self.image_encoder.encode(inputs[s].to(device)), self.image_projection, self.image_reasoner,
        ), progress, "images")

    def _image_inputs(self, inputs: Any, images: Any) -> ImageInputs:
        """The typed inputs of :meth:`encode_images`'s arguments, checked against what the
        image encoder reads."""
        encoder = type(self.image_encoder).__name__
        reads = input_type_of(self.image_encoder)
        if inputs is not None and images is not None:
            raise TypeError("give encode_images either typed inputs or images=[...], not both.")
        if images is not None:
            if reads is not PixelInputs:
                raise ValueError(
                    f"the image encoder {encoder} reads precomputed regions: pass "
                    "xmatch.RegionInputs(regions, boxes, mask); build a model with a pixel image encoder for raw images."
                )
            return PixelInputs(images)
        if not isinstance(inputs, (RegionInputs, PixelInputs)):
            got = "nothing" if inputs is None else type(inputs).__name__
            raise TypeError(
                f"encode_images takes typed inputs, got {got}: wrap region features as "
                "xmatch.RegionInputs(regions, boxes, mask); give pictures as images=[...] or xmatch.PixelInputs([...])."
            )
        if not isinstance(inputs, reads):  # the wrong kind of images: a ValueError, as for images= to a region encoder
            raise ValueError(f"the image encoder {encoder} reads {reads.__name__}, got {type(inputs).__name__}.")  # noqa: TRY004
        return inputs

    def tokenize(self, texts: Sequence[str]) -> TokenBatch:
        """Tokenise captions with the text encoder's own tokenizer."""
        check_caption_list(texts)
        return self.text_encoder.tokenize(list(texts))

    def encode_texts(
        self, texts: Sequence[str] | TokenBatch, *, batch_size: int = 256, progress: bool | None = None
    ) -> Embeddings:
        """Encode captions into word embeddings (in batches of ``batch_size``; ``progress``: a
        progress bar, by default for long inputs on a terminal)."""
        if isinstance(texts, TokenBatch):
            return self._finish(self.text_encoder(texts.to(self.device)), self.text_projection, self.text_reasoner)
        texts = texts if isinstance(texts, str) else list(texts)
        check_caption_list(texts, "encode_texts")  # here, where an item's position is in the whole list
        return self._batched(len(texts), batch_size, lambda s: self._finish(
            self.text_encoder(self.tokenize(texts[s]).to(self.device)),
            self.text_projection,
            self.text_reasoner,
        ), progress, "captions")

    @staticmethod
    def _batched(n: int, batch_size: int | None, encode, progress: bool | None, unit: str) -> Embeddings:
        if n == 0:
            raise ValueError("nothing to encode: the input is empty.")
        step = batch_size or n
        show = progress if progress is not None else n >= LONG_INPUT  # by default a bar only for long inputs
        parts = []
        with progress_bar(total=n, desc=f"encode {unit}", unit=unit[:3], show=show) as bar:
            for i in range(0, n, step):
                parts.append(encode(slice(i, i + step)))
                bar.update(len(parts[-1]))
        return parts[0] if len(parts) == 1 else Embeddings.cat(parts)

    def similarity(
        self,
        img: Embeddings | BucketedEmbeddings,
        txt: Embeddings | BucketedEmbeddings,
        *,
        image_chunk: int | None = None,
        text_chunk: int | None = None,
        rerank: int | None = None,
        direction: str = "t2i",
        verify_batch: int = 256,
    ) -> torch.Tensor:
        """Scores ``[n_images, n_texts]`` with the model's pooler, computed in bounded memory;
        with ``rerank=K``, each query's top K re-scored by the verifier.

        Either side may be :class:`~xmatch.model.buckets.BucketedEmbeddings` (length buckets): each
        bucket is then scored at its own width, so the work follows the real token count.

        With ``rerank=K`` (a model with a verifier), the pooler's scores are re-ranked for one
        ``direction``:

        - ``"t2i"`` (each caption searches the images): in every column, the K images the pooler
          scores highest come first, in the verifier's order, each scored
          ``column's best pooler score + 1 + (its logit - the lowest logit of the K)``; every
          other image keeps its pooler score, below them.
        - ``"i2t"`` (each image searches the captions): the same along every row.

        Only the order along the direction's axis means something afterwards (columns for
        ``t2i``, rows for ``i2t``); the result is float32. ``rerank=None`` returns the pooler's
        scores exactly as without the argument.

        Args:
            img, txt: the embeddings to score.
            image_chunk, text_chunk: the pooler's block sizes (default: from its memory bound).
            rerank: candidates per query re-scored by the verifier (K >= the candidates there
                are re-scores them all), or None.
            direction: ``"t2i"`` or ``"i2t"``, with ``rerank``.
            verify_batch: pairs per verifier call, with ``rerank``.

        Raises:
            ValueError: ``rerank`` on a model without a verifier, a K that is not a positive
                int, or an unknown direction.

        Example:
            >>> model = xmatch.build("teran-mrsw-scenes", verifier={"name": "cross-attention"}).eval()
            >>> img = model.encode_images(xmatch.RegionInputs(torch.rand(3, 36, 1280), torch.tensor([0.1, 0.2, 0.5, 0.9]).expand(3, 36, 4)))
            >>> txt = model.encode_texts(["a red circle left of a blue seven", "a small green square"])
            >>> model.similarity(img, txt, rerank=2).shape
            torch.Size([3, 2])
        """
        if rerank is None:
            return self.pooler(img, txt, image_chunk=image_chunk, text_chunk=text_chunk)
        from xmatch.model.rerank import check_rerank

        check_rerank(rerank, (direction,))
        self._require_verifier("similarity(..., rerank=K)")
        scores = self.pooler(img, txt, image_chunk=image_chunk, text_chunk=text_chunk)
        return self.rerank(scores, img, txt, rerank, directions=(direction,), batch_size=verify_batch)[direction]

    def rerank(
        self,
        scores: torch.Tensor,
        img: Embeddings | BucketedEmbeddings,
        txt: Embeddings | BucketedEmbeddings,
        k: int,
        *,
        directions: Sequence[str] = ("t2i",),
        batch_size: int = 256,
        neighbours: int = 0,
    ) -> dict[str, torch.Tensor]:
        """Re-rank first-stage ``scores`` (``[len(img), len(txt)]``, e.g. the pooler's) with the
        verifier: ``{direction: scores}`` as :meth:`similarity` with ``rerank=k`` returns them,
        for each of ``directions``; a pair in the top ``k`` of both its caption and its image is
        verified once. The verifier runs ``batch_size`` pairs at a time.

        With ``neighbours=m`` each caption's list (``t2i``) also holds the ``m`` images nearest
        to each of its top ``k`` by the pooler scoring the images against each other
        (:func:`~xmatch.model.rerank.nearest_items`; ``len(img)`` squared pairs, a fifth of the
        pooler's work on five captions an image): a near-duplicate that differs in a relation or
        a colour enters the list with its twin, and the verifier orders the two. The top ``k``
        are then drawn by each image's score plus half its nearest image's
        (:data:`~xmatch.model.rerank.TWIN_WEIGHT`), and each direction reads every verified
        pair: an image's list (``i2t``) also holds every caption whose list held the image, a
        caption's list every image whose list held the caption. Long lists cost coarse recall
        on a small gallery (docs/evaluation.md, "Relations over the whole split").

        Example:
            >>> model = xmatch.build("teran-mrsw-scenes", verifier={"name": "cross-attention"}).eval()
            >>> img = model.encode_images(xmatch.RegionInputs(torch.rand(3, 36, 1280), torch.tensor([0.1, 0.2, 0.5, 0.9]).expand(3, 36, 4)))
            >>> txt = model.encode_texts(["a red circle", "a blue seven"])
            >>> sorted(model.rerank(model.similarity(img, txt), img, txt, 2, directions=("t2i", "i2t")))
            ['i2t', 't2i']
        """
        from xmatch.model.rerank import RowGatherer, rerank_scores

        self._require_verifier("rerank")
        if tuple(scores.shape) != (len(img), len(txt)):
            raise ValueError(
                f"scores are {tuple(scores.shape)} but there are {len(img)} images and {len(txt)} captions; "
                "pass the [images, captions] scores of these embeddings."
            )
        near = self.image_neighbours(img, neighbours) if neighbours else None
        images, texts = RowGatherer(img), RowGatherer(txt)
        return rerank_scores(
            scores, k, lambda i, t: self.verify(images(i), texts(t), batch_size=batch_size), directions, batch_size,
            image_neighbours=near, text_lengths=txt.lengths,
        )

    def image_neighbours(self, img: Embeddings | BucketedEmbeddings, m: int) -> torch.Tensor:
        """Each image's ``m`` nearest other images, ``[len(img), m]`` rows, by the pooler
        scoring the images against each other (the pooler reads a set of regions as it reads a
        caption's words); what :meth:`rerank` widens the captions' lists with.

        Example:
            >>> model = xmatch.build("teran-mrsw-scenes").eval()
            >>> img = model.encode_images(xmatch.RegionInputs(torch.rand(4, 36, 1280), torch.tensor([0.1, 0.2, 0.5, 0.9]).expand(4, 36, 4)))
            >>> model.image_neighbours(img, 2).shape
            torch.Size([4, 2])
        """
        from xmatch.model.rerank import nearest_items

        return nearest_items(self.pooler(img, img), m)

    def verify(self, img: Embeddings, txt: Embeddings, *, batch_size: int = 256) -> torch.Tensor:
        """The verifier's match logits ``[n]`` of the row-aligned pairs ``(img[k], txt[k])``
        (higher = a better match), ``batch_size`` pairs per call.

        Raises:
            ValueError: the model has no verifier, or ``img`` and ``txt`` differ in length.

        Example:
            >>> model = xmatch.build("teran-mrsw-scenes", verifier={"name": "cross-attention"}).eval()
            >>> img = model.encode_images(xmatch.RegionInputs(torch.rand(2, 36, 1280), torch.tensor([0.1, 0.2, 0.5, 0.9]).expand(2, 36, 4)))
            >>> model.verify(img, model.encode_texts(["a red circle", "a blue seven"])).shape
            torch.Size([2])
        """
        verifier = self._require_verifier("verify")
        if len(img) != len(txt):
            raise ValueError(
                f"verify scores row-aligned pairs (img[k], txt[k]): got {len(img)} images and {len(txt)} captions; "
                "to score every image against every caption use similarity()."
            )
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}.")
        device = self.device
        parts = [
            verifier(img[s : s + batch_size].to(device), txt[s : s + batch_size].to(device))
            for s in range(0, len(img), batch_size)
        ]
        return torch.cat(parts) if parts else torch.empty(0, device=device)

    def _require_verifier(self, what: str) -> Verifier:
        if self.verifier is None:
            raise ValueError(
                f"{what} needs a verifier and this model has none: build it with a [verifier] table "
                "(xmatch.build(name, verifier={'name': 'cross-attention'}), then train it) or load a model that has one."
            )
        return self.verifier

    def alignment(self, img: Embeddings, txt: Embeddings) -> torch.Tensor:
        """Region x word cosine matrix ``[regions, words]`` of one image and one text
        (real regions and words only, in order), e.g. for grounding."""
        if len(img) != 1 or len(txt) != 1:
            raise ValueError(f"alignment takes one image and one text (img[k], txt[k]), got {len(img)} and {len(txt)}.")
        return img.tokens[0][img.mask[0]] @ txt.tokens[0][txt.mask[0]].T

    def encode_batch(self, batch: PairBatch) -> tuple[Embeddings, Embeddings]:
        """Encode a training batch of (image, caption) pairs: ``(images, captions)``.

        ``batch`` is a :class:`~xmatch.model.inputs.PairBatch`, as :func:`xmatch.data.collate` makes it.
        """
        if not isinstance(batch, PairBatch):
            raise TypeError(f"a training batch is an xmatch.PairBatch (xmatch.data.collate makes one), got {type(batch).__name__}.")
        img = self.encode_images(batch.images, batch_size=None, progress=False)
        txt = self.encode_texts(batch.texts, batch_size=len(batch.texts))
        return img, txt

    def batch_loss(self, img: Embeddings, txt: Embeddings, image_ids: torch.Tensor | None = None) -> LossOutput:
        """The loss of paired embeddings (row k of ``img`` goes with row k of ``txt``): every
        pooler scores the batch against itself, the loss reads the score matrices.

        Separate from :meth:`encode_batch` so a trainer can gather embeddings across processes
        in between (hardest negatives mined over the global batch).
        """
        if self.loss is None:
            raise ValueError(
                "this model was built without a loss (an inference build: loss=None or a spec without [loss]); "
                "build it with a loss table to train it."
            )
        scores = self.batch_scores(img, txt)
        with torch.autocast(img.tokens.device.type, enabled=False):
            return self.loss(scores, image_ids)

    def batch_scores(self, img: Embeddings, txt: Embeddings) -> dict[str, torch.Tensor]:
        """Every pooler's ``[n_img, n_txt]`` scores in the training batch layout, in float32:
        ``{"main": ..., <extra pooler>: ...}`` (what :meth:`batch_loss` and the trainer's
        extra loss terms read)."""
        # Scores and hinge in float32 even under autocast: in bfloat16 a word-summed score near
        # 10 is resolved to 0.06, too coarse beside the 0.2 margin; the batch's region x word
        # products are a small share of a training step.
        with torch.autocast(img.tokens.device.type, enabled=False):
            img, txt = _at_least_float32(img), _at_least_float32(txt)
            scores = {"main": self.pooler(img, txt, batch_layout=True)}
            for name, pooler in self.extra_poolers.items():
                scores[name] = pooler(img, txt, batch_layout=True)
            return scores

    def paired_scores(self, img: Embeddings, txt: Embeddings) -> torch.Tensor:
        """The main pooler's scores ``[n]`` of the row-aligned pairs ``(img[k], txt[k])``, in the
        training batch layout and in float32 like :meth:`batch_scores`: a step scores each
        structural negative against its own caption's image only, not against the whole batch.

        Example:
            >>> model = xmatch.build("teran-mrsw-scenes")
            >>> img = model.encode_images(xmatch.RegionInputs(torch.rand(2, 36, 1280), torch.tensor([0.1, 0.2, 0.5, 0.9]).expand(2, 36, 4)))
            >>> txt = model.encode_texts(["a red circle", "a blue seven"])
            >>> torch.allclose(model.paired_scores(img, txt), model.batch_scores(img, txt)["main"].diagonal())
            True
        """
        with torch.autocast(img.tokens.device.type, enabled=False):
            return self.pooler.paired(_at_least_float32(img), _at_least_float32(txt), batch_layout=True)

    def forward(self, batch: PairBatch) -> LossOutput:
        """Training step: encode a batch of (image, caption) pairs and return the loss.

        ``batch`` is a :class:`~xmatch.model.inputs.PairBatch` (images, captions, optionally
        ``image_ids``: same id = same image), as :func:`xmatch.data.collate` makes it.

        Example:
            >>> model = xmatch.build("teran-mrsw-scenes")
            >>> images = xmatch.RegionInputs(torch.rand(2, 36, 1280), torch.tensor([0.1, 0.2, 0.5, 0.9]).expand(2, 36, 4))
            >>> model(xmatch.PairBatch(images, ["a red circle", "a blue seven"])).loss.shape
            torch.Size([])
        """
        img, txt = self.encode_batch(batch)
        return self.batch_loss(img, txt, batch.image_ids)


def _at_least_float32(e: Embeddings) -> Embeddings:
    return e.to(torch.float32) if e.tokens.dtype in (torch.float16, torch.bfloat16) else e

