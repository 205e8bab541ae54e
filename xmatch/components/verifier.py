"""The cross-attention verifier: a small head that reads one (image, caption) pair and outputs a
match logit, as ALBEF's / BLIP's image-text matching head does (Li et al., NeurIPS 2021; ICML 2022).

A late-interaction pooler scores every image against every caption from two token sets that
never saw each other; the verifier lets the caption's words attend to the image's regions, so it
can tell "a circle left of a square" from "a square left of a circle". It is too slow to score
a whole gallery, so the model uses it to re-rank a short list (``model.similarity(...,
rerank=K)``, ``xmatch eval --rerank K``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from xmatch.model.embeddings import Embeddings
from xmatch.model.interfaces import LossOutput, Verifier

#: the terms of :meth:`CrossAttentionVerifier.training_loss`, in the order its pairs are laid out
TERMS = ("positive", "image_negative", "text_negative", "structural")


def word_positions(length: int, dim: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """``[length, dim]`` sinusoidal position codes (Vaswani et al., 2017): no learned table, so
    no caption is too long.

    Example:
        >>> word_positions(3, 4)[0].tolist()
        [0.0, 1.0, 0.0, 1.0]
    """
    position = torch.arange(length, dtype=torch.float32, device=device)[:, None]
    rate = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32, device=device) * (-math.log(10000.0) / dim))
    codes = torch.zeros(length, dim, device=device)
    codes[:, 0::2] = torch.sin(position * rate)
    codes[:, 1::2] = torch.cos(position * rate)[:, : dim // 2]
    return codes


def box_geometry(boxes: torch.Tensor) -> torch.Tensor:
    """``[..., 4]`` normalised boxes -> ``[..., 5]`` = (x1, y1, x2, y2, area)."""
    area = (boxes[..., 2] - boxes[..., 0]) * (boxes[..., 3] - boxes[..., 1])
    return torch.cat([boxes, area.unsqueeze(-1)], dim=-1)


class PairVerifier(Verifier):
    """A verifier whose ``forward`` gives one match logit per row-aligned pair, trained by a
    balanced binary cross-entropy on the batch's positives and hard negatives
    (:meth:`training_loss`). The built-in heads (``cross-attention``, ``grounded``) share it;
    a subclass sets ``dim`` and ``loss_weight`` and implements ``forward`` (which refuses bad
    input with :meth:`check_pairs`).
    """

    loss_weight: float = 1.0
    dim: int

    def check_pairs(self, img: Embeddings, txt: Embeddings) -> None:
        """Refuse what ``forward`` cannot score: sides of different lengths, or embeddings of
        another width than the verifier's (``dim``)."""
        if len(img) != len(txt):
            raise ValueError(
                f"the verifier scores row-aligned pairs (img[k], txt[k]): got {len(img)} images and {len(txt)} "
                "captions; repeat or index the rows so both sides have one row per pair."
            )
        for side, e in (("image", img), ("caption", txt)):
            if e.dim != self.dim:
                raise ValueError(
                    f"the verifier is {self.dim} wide but the {side} embeddings are {e.dim} wide; "
                    "score embeddings of the model the verifier belongs to."
                )

    def score_pairs(self, img: Embeddings, txt: Embeddings) -> tuple[torch.Tensor, tuple[torch.Tensor, str] | None]:
        """The match logits ``[n]`` of the row-aligned pairs, and a head's own per-row training
        term with its log name (``None`` here): :meth:`training_loss` adds that term's mean over
        the positive pairs."""
        return self(img, txt), None

    def training_loss(
        self,
        img: Embeddings,
        txt: Embeddings,
        scores: torch.Tensor,
        negatives: Embeddings | None = None,
        owner: torch.Tensor | None = None,
        image_ids: torch.Tensor | None = None,
    ) -> LossOutput:
        """Binary cross-entropy of the verifier on a training batch's positives and hard negatives.

        The pairs (:func:`training_pairs`): every positive ``(img[k], txt[k])``; for every
        caption its hardest in-batch image and for every image its hardest in-batch caption by
        ``scores`` (pairs of the same image id are never negatives); and every structural
        negative caption with the image its caption belongs to, ``(img[owner[m]],
        negatives[m])``. The loss is ``loss_weight`` times the mean of two means, over the
        positives and over the negatives: a batch holds two to four times as many negatives as
        positives, and with one mean over all pairs the head settled on calling every pair a
        negative (on the scenes benchmark, 80 % "accuracy" for 100 steps). Gradients reach the
        embeddings too (pass detached embeddings to train the head alone).

        Args:
            img, txt: the batch's row-aligned embeddings (``B`` rows each).
            scores: ``[B, B]`` scores of the model's pooler (row = image, column = caption),
                positives on the diagonal; read only to choose the negatives.
            negatives: ``M`` structural negative captions, or None.
            owner: ``[M]`` the batch row whose caption each negative was made from.
            image_ids: ``[B]`` image id of each row (same id = same image), or None.

        Returns:
            ``loss`` and detached logs: ``verifier_loss`` (the weighted loss), the mean
            cross-entropy of each term (``verifier_positive``, ``verifier_image_negative``,
            ``verifier_text_negative``, ``verifier_structural`` when there are structural
            negatives), ``verifier_accuracy`` (share of pairs on the right side of 0) and, for
            a head with a term of its own (:meth:`score_pairs`), that term's mean over the
            positives (``verifier_layout``: the grounded head's layout likelihood).

        Example:
            >>> v = CrossAttentionVerifier(dim=32)
            >>> e = Embeddings(F.normalize(torch.randn(4, 5, 32), dim=-1), torch.ones(4, 5, dtype=torch.bool))
            >>> sorted(v.training_loss(e, e, torch.randn(4, 4)).logs)
            ['verifier_accuracy', 'verifier_image_negative', 'verifier_loss', 'verifier_positive', 'verifier_text_negative']
        """
        if len(img) != len(txt):
            raise ValueError(f"training_loss takes a batch of pairs: got {len(img)} images and {len(txt)} captions.")
        if (negatives is None) != (owner is None):
            raise ValueError("training_loss: give the structural negatives and their owner rows together (or neither).")
        if negatives is not None and len(negatives) != len(owner):
            raise ValueError(f"training_loss: {len(negatives)} negative captions but {len(owner)} owner rows.")
        pairs = training_pairs(scores, image_ids=image_ids, owner=owner, batch=len(img))
        texts = txt if negatives is None else Embeddings.cat([_tokens_only(txt), _tokens_only(negatives)])
        device = img.tokens.device
        logits, extra = self.score_pairs(img[pairs.image.to(device)], texts[pairs.text.to(texts.tokens.device)])
        label = pairs.label.to(logits.device)
        bce = F.binary_cross_entropy_with_logits(logits.float(), label, reduction="none")
        positive = label > 0.5
        loss = self.loss_weight * (bce[positive].mean() + bce[~positive].mean()) / 2
        logs: dict[str, torch.Tensor | float] = {}
        if extra is not None:
            extra_loss, name = extra
            extra_loss = extra_loss[positive].mean()
            loss = loss + self.loss_weight * extra_loss
            logs[f"verifier_{name}"] = extra_loss.detach()
        logs["verifier_loss"] = loss.detach()
        term = pairs.term.to(logits.device)
        for k, name in enumerate(TERMS):
            chosen = term == k
            if k < 3 or bool(chosen.any()):
                logs[f"verifier_{name}"] = bce.detach()[chosen].mean()
        logs["verifier_accuracy"] = ((logits.detach() > 0) == (label > 0.5)).float().mean()
        return LossOutput(loss, logs)



class CrossAttentionVerifier(PairVerifier):
    """Word tokens self-attend and cross-attend to the regions; a linear head on a [CLS] token
    gives the match logit.

    The caption's words (``txt.tokens``, real ones by ``txt.mask``, with sinusoidal codes of
    their positions, so word order is read even from order-free tokens) follow a learned [CLS]
    token through ``layers`` pre-norm transformer decoder layers: self-attention over the
    caption, cross-attention to the image's regions (``img.tokens``, plus an embedding of
    ``img.boxes`` when the image encoder gives boxes), a feed-forward block. Padding is masked
    out on both sides, and a learned empty region is always present, so an image without
    regions still gets a finite logit. Regions carry no order: permuting them (with their
    boxes) leaves the logit unchanged.

    Args:
        dim: the model's embedding width (set by the model builder: ``embed_dim``).
        layers: decoder layers.
        heads: attention heads (``dim`` must be divisible by it).
        ff_dim: feed-forward width (default ``4 * dim``).
        dropout: dropout of the attention weights and the residual branches.
        loss_weight: the factor of :meth:`training_loss` in the training objective.

    Example:
        >>> v = CrossAttentionVerifier(dim=32).eval()
        >>> img = Embeddings(F.normalize(torch.randn(3, 5, 32), dim=-1), torch.ones(3, 5, dtype=torch.bool))
        >>> txt = Embeddings(F.normalize(torch.randn(3, 7, 32), dim=-1), torch.ones(3, 7, dtype=torch.bool))
        >>> v(img, txt).shape
        torch.Size([3])
    """

    def __init__(
        self,
        dim: int,
        layers: int = 2,
        heads: int = 4,
        ff_dim: int | None = None,
        dropout: float = 0.1,
        loss_weight: float = 1.0,
    ) -> None:
        super().__init__()
        if layers < 1:
            raise ValueError(f"cross-attention verifier: layers must be >= 1, got {layers}.")
        if heads < 1 or dim % heads:
            raise ValueError(f"cross-attention verifier: dim {dim} is not divisible by heads {heads}.")
        if ff_dim is not None and ff_dim < 1:
            raise ValueError(f"cross-attention verifier: ff_dim must be positive, got {ff_dim}.")
        if not 0 <= dropout < 1:
            raise ValueError(f"cross-attention verifier: dropout must be in [0, 1), got {dropout}.")
        if loss_weight < 0:
            raise ValueError(f"cross-attention verifier: loss_weight must be >= 0, got {loss_weight}.")
        self.dim = dim
        self.loss_weight = loss_weight
        self.cls = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.empty_region = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.box_embedding = nn.Linear(5, dim)
        self.region_norm = nn.LayerNorm(dim)
        self.word_norm = nn.LayerNorm(dim)
        self.layers = nn.ModuleList(
            nn.TransformerDecoderLayer(
                d_model=dim, nhead=heads, dim_feedforward=ff_dim or 4 * dim, dropout=dropout,
                activation="gelu", batch_first=True, norm_first=True,
            )
            for _ in range(layers)
        )
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, 1)

    def forward(self, img: Embeddings, txt: Embeddings) -> torch.Tensor:
        """Match logits ``[n]`` of the row-aligned pairs ``(img[k], txt[k])``.

        Raises:
            ValueError: ``img`` and ``txt`` hold different numbers of rows, or a width other
                than the verifier's.
        """
        self.check_pairs(img, txt)
        dtype = self.head.weight.dtype
        n = len(img)
        scale = self.dim**0.5  # unit-norm tokens: elements of about 1 / sqrt(dim)
        regions = img.tokens.to(dtype) * scale
        if img.boxes is not None:
            regions = regions + self.box_embedding(box_geometry(img.boxes.to(dtype)))
        memory = torch.cat([self.empty_region.expand(n, 1, -1), self.region_norm(regions)], dim=1)
        always = torch.ones(n, 1, dtype=torch.bool, device=img.mask.device)
        memory_padding = ~torch.cat([always, img.mask], dim=1)
        words = self.word_norm(txt.tokens.to(dtype) * scale)
        words = words + word_positions(words.shape[1], self.dim, words.device).to(dtype)
        x = torch.cat([self.cls.expand(n, 1, -1), words], dim=1)
        padding = ~torch.cat([always.to(txt.mask.device), txt.mask], dim=1)
        for layer in self.layers:
            x = layer(x, memory, tgt_key_padding_mask=padding, memory_key_padding_mask=memory_padding)
        return self.head(self.norm(x[:, 0])).squeeze(-1)


@dataclass
class TrainingPairs:
    """The pairs of :meth:`CrossAttentionVerifier.training_loss`, one per row.

    Attributes:
        image: batch row of the image.
        text: row of the caption: ``< B`` a batch caption, ``B + m`` structural negative ``m``.
        label: 1.0 for a positive, 0.0 for a negative.
        term: index into :data:`TERMS`.
    """

    image: torch.Tensor
    text: torch.Tensor
    label: torch.Tensor
    term: torch.Tensor


def training_pairs(
    scores: torch.Tensor,
    *,
    image_ids: torch.Tensor | None = None,
    owner: torch.Tensor | None = None,
    batch: int | None = None,
) -> TrainingPairs:
    """The verifier's training pairs of a batch: the ``B`` positives, then for each caption its
    hardest image negative, then for each image its hardest caption negative (by ``scores``,
    skipping pairs of the same image id; a caption or image with no negative at all is
    skipped), then ``(owner[m], B + m)`` for each structural negative.

    Example:
        >>> p = training_pairs(torch.tensor([[0.9, 0.8], [0.1, 0.7]]))
        >>> p.image.tolist(), p.text.tolist(), p.label.tolist()
        ([0, 1, 1, 0, 0, 1], [0, 1, 0, 1, 1, 0], [1.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    """
    if scores.dim() != 2 or scores.shape[0] != scores.shape[1]:
        raise ValueError(f"scores must be the [B, B] batch score matrix (positives on the diagonal), got {tuple(scores.shape)}.")
    b = scores.shape[0]
    if batch is not None and b != batch:
        raise ValueError(f"scores are {b} x {b} but the batch has {batch} pairs; pass the batch's own score matrix.")
    scores = scores.detach().float()
    rows = torch.arange(b, device=scores.device)
    if image_ids is None:
        same = rows[:, None] == rows[None, :]
    else:
        if image_ids.shape != (b,):
            raise ValueError(f"image_ids must hold one id per batch row ({b}), got shape {tuple(image_ids.shape)}.")
        ids = image_ids.to(scores.device)
        same = ids[:, None] == ids[None, :]
    masked = scores.masked_fill(same, float("-inf"))
    captions = (~same).any(dim=0).nonzero().flatten()  # captions with at least one image negative
    images = (~same).any(dim=1).nonzero().flatten()
    image = [rows, masked.argmax(dim=0)[captions], images]
    text = [rows, captions, masked.argmax(dim=1)[images]]
    term = [torch.full((b,), 0), torch.full((len(captions),), 1), torch.full((len(images),), 2)]
    if owner is not None:
        owner = owner.to(scores.device).long()
        if owner.dim() != 1 or (len(owner) and (int(owner.min()) < 0 or int(owner.max()) >= b)):
            raise ValueError(f"owner must be a [M] tensor of batch rows in 0 .. {b - 1}, got {owner.tolist()[:10]}.")
        image.append(owner)
        text.append(b + torch.arange(len(owner), device=scores.device))
        term.append(torch.full((len(owner),), 3))
    term_t = torch.cat(term).to(scores.device)
    return TrainingPairs(torch.cat(image), torch.cat(text), (term_t == 0).float(), term_t)


def _tokens_only(e: Embeddings) -> Embeddings:
    """``e`` without its pooled vectors (the verifier reads tokens only), so that captions with
    and without them concatenate."""
    return Embeddings(e.tokens, e.mask, None, e.boxes)
