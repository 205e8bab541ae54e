"""Re-ranking a score matrix's short lists with a pair scorer (the model's verifier).

A query's top-K candidates by the first-stage scores are re-scored pair by pair; the returned
matrix puts them first, in the order of their new scores, and leaves every other candidate's
score (and so its order) as it was:

- ``t2i`` (a caption queries the images: a column of ``[n_images, n_texts]``): the K images
  with the highest scores in column ``j`` get ``top_j + 1 + (logit - min_logit_j)``, where
  ``top_j`` is the column's highest first-stage score and ``min_logit_j`` the lowest verifier
  logit among its K; the other images keep their score, which is at most ``top_j``.
- ``i2t`` (an image queries the captions: a row): the same along each row.

With ``image_neighbours`` (:func:`nearest_items` of the images' own similarities), a caption's
list also holds the nearest images of each of its top K (``t2i``): a hard negative is usually a
near-duplicate of the picture it is confused with, so a picture and its twin enter the list
together, and the verifier, not the first stage's tie, orders them. The top K are then drawn
by each image's score plus half its nearest image's (:data:`TWIN_WEIGHT`), so that a picture
whose near-duplicate also scores high rises with it and the pair takes the list's places
together, and each direction reads every verified pair: an image's ``i2t`` list also holds
every caption whose list held the image, and a caption's list every image whose list held the
caption (no pair more to verify), so a twin's captions are ordered against the image's own.

Only the order along the query's axis is meaningful afterwards: a re-scored entry is a shifted
logit, not a similarity, so values of different queries (or the other axis) do not compare.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from xmatch.model.buckets import BucketedEmbeddings
from xmatch.model.embeddings import Embeddings

DIRECTIONS = ("t2i", "i2t")
#: pairs scored by one verifier call by default
PAIR_BATCH = 256
#: with image neighbours, a caption's top K are drawn by ``score + TWIN_WEIGHT * score of the
#: image's nearest image``; on the scenes groups split 0.5 reached the figures of the plain top K
#: with 18 % fewer pairs (0.25 and 1.0 did as well; docs/evaluation.md, "Twins drawn together")
TWIN_WEIGHT = 0.5


def check_rerank(k: object, directions: Sequence[str]) -> None:
    """Refuse a K that is not a positive whole number, or an unknown direction."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"rerank takes the number of top candidates to re-score per query, a positive int; got {k!r}.")
    bad = [d for d in directions if d not in DIRECTIONS]
    if bad or not directions:
        raise ValueError(
            f"rerank direction {bad[0] if bad else None!r}: choose 't2i' (each caption's images) or 'i2t' (each image's captions)."
        )


def nearest_items(similarity: torch.Tensor, m: int) -> torch.Tensor:
    """Each item's ``m`` nearest other items, ``[n, m]`` rows, by a square ``[n, n]``
    similarity (e.g. the pooler scoring the images against themselves), made symmetric by
    averaging it with its transpose; an item is never its own neighbour.

    Example:
        >>> sim = torch.tensor([[1.0, 0.9, 0.1], [0.8, 1.0, 0.2], [0.1, 0.3, 1.0]])
        >>> nearest_items(sim, 1).flatten().tolist()
        [1, 0, 1]
    """
    if similarity.dim() != 2 or similarity.shape[0] != similarity.shape[1]:
        raise ValueError(f"nearest_items needs a square [n, n] similarity, got {tuple(similarity.shape)}.")
    n = similarity.shape[0]
    if isinstance(m, bool) or not isinstance(m, int) or not 1 <= m < n:
        raise ValueError(f"neighbours must be a whole number from 1 to {n - 1} (the other items there are), got {m!r}.")
    sym = (similarity.float() + similarity.float().T) / 2
    sym.fill_diagonal_(float("-inf"))
    return sym.topk(m, dim=1).indices


def _checked_neighbours(near: torch.Tensor, n: int) -> torch.Tensor:
    """``near`` as ``[n, m]`` long rows, or a clear error."""
    if near.dim() != 2 or near.shape[0] != n or near.shape[1] < 1:
        raise ValueError(f"image_neighbours must be [n_images, m] = [{n}, m >= 1] image rows, got {tuple(near.shape)}.")
    if near.is_floating_point() or near.dtype == torch.bool:
        raise TypeError(f"image_neighbours must hold integer image rows, got {near.dtype}.")
    if len(near) and (int(near.min()) < 0 or int(near.max()) >= n):
        raise ValueError(f"image_neighbours holds rows outside 0..{n - 1}.")
    return near.long()


class RowGatherer:
    """Rows of :class:`Embeddings` or :class:`BucketedEmbeddings` by corpus position, as one
    padded :class:`Embeddings` (as wide as the widest row gathered).

    Example:
        >>> e = Embeddings(torch.randn(3, 4, 8), torch.arange(4)[None] < torch.tensor([[1], [4], [2]]))
        >>> RowGatherer(BucketedEmbeddings.from_embeddings(e))(torch.tensor([2, 0, 2])).lengths.tolist()
        [2, 1, 2]
    """

    def __init__(self, e: Embeddings | BucketedEmbeddings) -> None:
        self.e = e
        if isinstance(e, BucketedEmbeddings):
            n = len(e)
            self.part_of = torch.empty(n, dtype=torch.long)
            self.row_of = torch.empty(n, dtype=torch.long)
            for k, pos in enumerate(e.positions):
                self.part_of[pos.cpu()] = k
                self.row_of[pos.cpu()] = torch.arange(len(pos))

    def __len__(self) -> int:
        return len(self.e)

    def __call__(self, rows: torch.Tensor) -> Embeddings:
        rows = rows.cpu().long()
        if isinstance(self.e, Embeddings):
            return self.e[rows.to(self.e.tokens.device)].trimmed()
        part_of, row_of = self.part_of[rows], self.row_of[rows]
        used = part_of.unique().tolist()
        first = self.e.parts[used[0]]
        if len(used) == 1:  # one bucket (pictures with the same number of regions): a plain gather, no scatter
            src = row_of.to(first.tokens.device)
            return first[src].trimmed()
        width = max(self.e.parts[k].tokens.shape[1] for k in used)
        device = first.tokens.device
        tokens = first.tokens.new_zeros(len(rows), width, first.dim)
        mask = torch.zeros(len(rows), width, dtype=torch.bool, device=device)
        pooled = None if first.pooled is None else first.pooled.new_zeros(len(rows), first.dim)
        boxes = None if first.boxes is None else first.boxes.new_zeros(len(rows), width, 4)
        for k in used:
            part = self.e.parts[k]
            at = (part_of == k).nonzero().flatten()
            src = row_of[at].to(device)
            at = at.to(device)
            w = part.tokens.shape[1]
            tokens[at, :w] = part.tokens[src]
            mask[at, :w] = part.mask[src]
            if pooled is not None:
                pooled[at] = part.pooled[src]
            if boxes is not None:
                boxes[at, :w] = part.boxes[src]
        return Embeddings(tokens, mask, pooled, boxes).trimmed()


def rerank_scores(
    scores: torch.Tensor,
    k: int,
    score_pairs: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    directions: Sequence[str] = ("t2i",),
    batch_size: int = PAIR_BATCH,
    image_neighbours: torch.Tensor | None = None,
    text_lengths: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Re-rank each query's top-``k`` of ``scores`` by ``score_pairs`` (see the module's
    docstring for what the returned matrices hold).

    Every pair that is among the top-``k`` of its caption or of its image (in any of the
    ``directions``) is scored once, ``batch_size`` pairs per call; nothing larger than the
    score matrix and the ``k`` candidates of each query is held. With ``text_lengths`` the
    pairs are scored shortest caption first, so that a call holds captions of about one
    length: a verifier pads a call's captions to its longest, and pairs in corpus order mix a
    long caption into nearly every call.

    Args:
        scores: ``[n_images, n_texts]`` first-stage scores.
        k: candidates re-scored per query (clipped to the candidates there are).
        score_pairs: ``(image rows, text rows) -> [len] logits`` of row-aligned pairs.
        directions: ``"t2i"`` and / or ``"i2t"``.
        batch_size: pairs per ``score_pairs`` call.
        image_neighbours: ``[n_images, m]`` image rows (:func:`nearest_items`): a caption's
            top ``k`` are drawn by its scores plus :data:`TWIN_WEIGHT` times each image's first
            neighbour's, and its ``t2i`` list also holds the ``m`` nearest images of each of
            them (so up to ``k * (1 + m)`` candidates a caption); each direction's list then
            holds every verified pair of its query (no pair more to verify); None: the top
            ``k`` of the scores alone.
        text_lengths: ``[n_texts]`` words of each caption (``Embeddings.lengths``), to order
            the calls by; None: pairs in image order. The logits are the same either way.

    Returns:
        ``{direction: [n_images, n_texts] float32 scores}``, on the device of ``scores``.

    Example:
        >>> scores = torch.tensor([[0.9, 0.1], [0.8, 0.2], [0.1, 0.3]])
        >>> logit = lambda i, t: (i == 1).float()  # the verifier prefers image 1 for every caption
        >>> rerank_scores(scores, 2, logit)["t2i"][:, 0].argsort(descending=True).tolist()
        [1, 0, 2]
    """
    check_rerank(k, directions)
    if image_neighbours is not None and "t2i" not in directions:
        raise ValueError("image_neighbours widen the t2i lists (each caption's images); add 't2i' to the directions.")
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}.")
    scores = scores.float()
    n_img, n_txt = scores.shape
    if text_lengths is not None and tuple(text_lengths.shape) != (n_txt,):
        raise ValueError(f"text_lengths must hold one length per caption, [{n_txt}]; got {tuple(text_lengths.shape)}.")
    top = {}
    if "t2i" in directions:
        if image_neighbours is None:
            top["t2i"] = scores.topk(min(k, n_img), dim=0).indices  # [k, n_txt]: image rows
        else:
            near = _checked_neighbours(image_neighbours, n_img).to(scores.device)
            # a picture rises with a near-duplicate that also scores high: the two take the list's places together
            top["t2i"] = (scores + TWIN_WEIGHT * scores[near[:, 0]]).topk(min(k, n_img), dim=0).indices
            # a candidate listed twice gets the same pair's logit twice: writing it twice is harmless
            top["t2i"] = torch.cat([top["t2i"], near[top["t2i"]].permute(0, 2, 1).flatten(0, 1)])
    if "i2t" in directions:
        top["i2t"] = scores.topk(min(k, n_txt), dim=1).indices  # [n_img, k]: text columns
    ids = []
    if "t2i" in top:
        ids.append((top["t2i"] * n_txt + torch.arange(n_txt, device=scores.device)).flatten())
    if "i2t" in top:
        ids.append((torch.arange(n_img, device=scores.device)[:, None] * n_txt + top["i2t"]).flatten())
    # pairs in both short lists are scored once; in image order a batch holds few images
    unique, inverse = torch.cat(ids).unique(return_inverse=True)
    if text_lengths is None:
        order = torch.arange(len(unique), device=scores.device)
    else:  # stable: captions of one length stay in image order
        order = torch.sort(text_lengths.to(scores.device)[unique % n_txt], stable=True).indices
    logits = torch.empty(len(unique), dtype=torch.float32, device=scores.device)
    for s in range(0, len(unique), batch_size):
        at = order[s : s + batch_size]
        chunk = unique[at]
        logits[at] = score_pairs(chunk // n_txt, chunk % n_txt).float().to(scores.device)
    out: dict[str, torch.Tensor] = {}
    if image_neighbours is not None:
        # each query's list holds every verified pair of it (verified anyway): an image's list the
        # captions whose widened list held it, so its twin's captions are ordered against its own,
        # and a caption's list the images whose list held the caption
        rows, columns = unique // n_txt, unique % n_txt
        for direction in top:
            query, size, axis = (columns, n_txt, 0) if direction == "t2i" else (rows, n_img, 1)
            lowest = torch.full((size,), float("inf"), device=scores.device).scatter_reduce(0, query, logits, "amin")
            out[direction] = scores.clone()
            out[direction][rows, columns] = scores.amax(dim=axis)[query] + 1 + (logits - lowest[query])
        return out
    start = 0
    for direction, index in top.items():
        pair_logits = logits[inverse[start : start + index.numel()]].view(index.shape)
        start += index.numel()
        axis = 0 if direction == "t2i" else 1
        best = scores.amax(dim=axis, keepdim=True)
        shifted = best + 1 + (pair_logits - pair_logits.amin(dim=axis, keepdim=True))
        out[direction] = scores.clone().scatter_(axis, index, shifted)
    return out
