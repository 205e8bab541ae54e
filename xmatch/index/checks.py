"""What an index refuses to store: token sets with NaN or infinite values, and token sets whose
global (pooled) vectors do not match what the index's model makes.

A NaN token would rank first for every query (a NaN score compares above everything in a
descending sort); a batch without pooled vectors in an index of a model that has them commits,
and every later search that reads them fails. Both are refused at ``add``, before anything is
written; :meth:`SearchIndex.verify` finds non-finite values already on disk, and a search
leaves out (and reports) any item that scores NaN or infinity (:func:`finite_scores`).
"""

from __future__ import annotations

import torch

from xmatch.index.errors import DamagedIndexError, SearchIndexError
from xmatch.model.embeddings import Embeddings


def non_finite_items(tokens: torch.Tensor, mask: torch.Tensor, pooled: torch.Tensor | None = None) -> torch.Tensor:
    """Rows ``[n]`` (bool) holding a NaN or infinite value in a real token or the pooled vector.

    Example:
        >>> tokens = torch.zeros(2, 3, 4); tokens[1, 0, 0] = float("nan")
        >>> non_finite_items(tokens, torch.ones(2, 3, dtype=torch.bool)).tolist()
        [False, True]
    """
    bad = (~torch.isfinite(tokens)).any(dim=-1) & mask
    rows = bad.any(dim=1)
    if pooled is not None:
        rows |= (~torch.isfinite(pooled)).any(dim=-1)
    return rows


def finite_scores(scores: torch.Tensor) -> torch.Tensor:
    """``scores`` with every NaN or infinite value made ``-inf``: such an item ranks below every
    real score (a NaN would rank first in a descending sort, +inf too), and the hits built
    from the scores leave it out.

    Example:
        >>> finite_scores(torch.tensor([0.5, float("nan"), float("inf"), -1.0])).tolist()
        [0.5, -inf, -inf, -1.0]
    """
    return scores.masked_fill(~torch.isfinite(scores), -torch.inf)


def verify_finite(store: object, root: object) -> None:
    """Walk every stored token set of ``store`` (any engine: what its ``blocks()`` reads) for
    NaN and infinity.

    Raises:
        DamagedIndexError: naming the first such item, how many there are and the fix.
    """
    bad, first = 0, None
    for start, block in store.blocks():  # type: ignore[attr-defined]
        rows = non_finite_items(block.tokens, block.mask, block.pooled)
        if first is None and bool(rows.any()):
            first = store.ids_of([start + int(rows.nonzero()[0])])[0]  # type: ignore[attr-defined]
        bad += int(rows.sum())
    if first is not None:
        raise DamagedIndexError(
            f"item {first!r} of the index {root} (and {bad - 1} more) holds NaN or infinite values: the stored "
            "vectors are damaged. Searches leave such items out; rebuild the index (xmatch index ... --overwrite) "
            "or restore it from a copy."
        )


def check_finite(embeddings: Embeddings, ids: list[str]) -> None:
    """Refuse a batch with a non-finite value in a real token or a pooled vector.

    Raises:
        SearchIndexError: naming the first such item and how many there are.
    """
    bad = non_finite_items(embeddings.tokens, embeddings.mask, embeddings.pooled)
    if bool(bad.any()):
        first = int(bad.nonzero()[0])
        raise SearchIndexError(
            f"item {ids[first]!r} (and {int(bad.sum()) - 1} more of this batch) has NaN or infinite values in its "
            "embeddings; nothing was added. Such an item would rank first for every query. Check the model's "
            "inputs for NaNs (or the embeddings you computed) and add again."
        )


def check_pooled(has_pooled: bool, model_has_pooled: bool, root: object) -> None:
    """Refuse a batch whose pooled vectors are present where the model makes none, or missing
    where it makes them.

    Raises:
        SearchIndexError: naming what the index's model makes and the fix.
    """
    if has_pooled == model_has_pooled:
        return
    if model_has_pooled:
        raise SearchIndexError(
            f"these embeddings have no pooled (global) vectors, but the model of the index {root} makes them and "
            "its searches read them; nothing was added. Encode the items with the index's model "
            "(model.encode_images / encode_texts keep them), or pass the inputs to add() to have them encoded."
        )
    raise SearchIndexError(
        f"these embeddings have pooled (global) vectors, but the model of the index {root} makes none: they "
        "come from another model; nothing was added. Encode the items with the index's model."
    )
