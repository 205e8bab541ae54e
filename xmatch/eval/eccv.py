"""ECCV Caption and CxC: COCO 5K test retrieval judged with more than one positive per query.

COCO gives each caption one right image and each image its own five captions, although many
captions fit many images. Two re-annotations of the COCO 5K Karpathy test split add the
missing positives:

- **CxC** (Parekh et al., "Crisscrossed Captions", EACL 2021): extra image-caption positives
  from human similarity ratings; reported as Recall@K in both directions (a query counts as
  found when any of its positives is in the top K).
- **ECCV Caption** (Chun et al., "ECCV Caption: Correcting False Negatives by Collecting
  Machine-and-Human-verified Image-Caption Associations for MS-COCO", ECCV 2022): 1,261
  image queries and 1,332 caption queries with on average 17.9 and 8.5 verified positives;
  reported as mAP@R, R-Precision and R@1. **PMRP** (Plausible-Match R-Precision) needs the
  authors' plausible-match files, which the package does not ship.

The positives, as COCO image ids and caption annotation ids, come from the ``eccv-caption``
package (``pip install eccv-caption``). Here they are read against xmatch's whole 5K
similarity matrix, so the figures come from xmatch's own vectorised ranking; the tests check
that they equal the package's evaluator on the same rankings.

Rankings: each query ranks the whole gallery by score, ties in gallery order (a stable
descending sort; only the top R or K of each ranking is materialised, see :func:`top_lists`).
R is the number of a query's positives (those outside the gallery too, as the package counts
them); mAP@R = (1/R) sum over r <= R of precision@r at each rank r that
holds a positive; R-Precision = the share of positives in the top R.

Example:
    >>> ids = coco_ids(dataset, caption_ids="data/coco/annotations/coco_test_ids.npy")  # needs the COCO caption ids and eccv-caption  # doctest: +SKIP
    >>> eccv_caption_metrics(scores, ids)["t2i"]["map_at_r"]  # doctest: +SKIP
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from xmatch.eval.metrics import all_finite

#: queries ranked at once; bounds the temporary [block, gallery] arrays
QUERY_BLOCK = 512
PMRP_FILES = ("pm_image_to_caption.json", "pm_caption_to_image.json")
PMRP_HINT = (
    "PMRP needs the ECCV Caption authors' plausible-match files pm_image_to_caption.json and "
    "pm_caption_to_image.json (over 140 MB, not in the eccv-caption package; see "
    "https://github.com/naver-ai/eccv-caption); pass their folder with --pmrp DIR (pmrp_dir=)."
)


def load_package(pmrp_dir: str | os.PathLike | None = None) -> Any:
    """The ``eccv_caption.Metrics`` object: the package's positives (and, with ``pmrp_dir``,
    the plausible-match files).

    Raises:
        ImportError: the package is not installed (names the pip command).
        FileNotFoundError: ``pmrp_dir`` lacks one of the plausible-match files.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "failed to import ujson", harmless
            import eccv_caption
    except ImportError:
        raise ImportError(
            "the ECCV Caption and CxC protocols read their positives from the eccv-caption package: "
            "pip install eccv-caption (or pip install 'xmatch-zoo[eval]')."
        ) from None
    if pmrp_dir is not None:
        missing = [name for name in PMRP_FILES if not (Path(pmrp_dir) / name).is_file()]
        if missing:
            raise FileNotFoundError(f"{pmrp_dir} lacks {', '.join(missing)}. {PMRP_HINT}")
    return eccv_caption.Metrics(extra_file_dir=str(pmrp_dir) if pmrp_dir is not None else None)


@dataclass
class CocoIds:
    """The COCO ids of a dataset split's images and captions, in dataset order.

    Attributes:
        image_ids: ``[N]`` COCO image ids.
        caption_ids: ``[C]`` COCO caption annotation ids.
    """

    image_ids: np.ndarray
    caption_ids: np.ndarray


def _read_ids(source: str | os.PathLike | Sequence[int] | np.ndarray) -> np.ndarray:
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(f"caption id file {path} does not exist.")
        if path.suffix == ".npy":
            ids = np.load(path, allow_pickle=False)
        else:
            ids = np.array([int(line) for line in path.read_text().split()], dtype=np.int64)
    else:
        ids = np.asarray(source)
    if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"caption ids must be a 1-D list of integers, got {ids.dtype} {ids.shape}.")
    return ids.astype(np.int64)


def coco_ids(dataset: Any, caption_ids: str | os.PathLike | Sequence[int] | np.ndarray | None = None,
             package: Any = None) -> CocoIds:
    """Map a dataset split onto the package's COCO ids.

    Caption ids (COCO annotation ids, one per caption in the dataset's caption order) come from
    ``caption_ids`` (an array, a ``.npy`` file such as VSE++'s ``coco_test_ids.npy``, or a text
    file with one id a line such as the precomp layout's ``testall_ids.txt``), else from the
    dataset's own ``caption_ids`` attribute. Image ids follow from the captions through COCO's
    caption -> image map, and each dataset image's captions must agree on one COCO image.

    Raises:
        ValueError: no caption ids, a wrong count, ids that are not COCO 5K test captions, or
            captions of one dataset image that belong to different COCO images.

    Example:
        >>> coco_ids(test, "data/coco_precomp/testall_ids.txt").image_ids[:2]  # needs the COCO precomp ids file  # doctest: +SKIP
        array([391895, 522418])
    """
    if caption_ids is None:
        caption_ids = getattr(dataset, "caption_ids", None)
    if caption_ids is None:
        raise ValueError(
            f"ECCV Caption and CxC need the COCO annotation id of every caption, and the "
            f"{type(dataset).__name__} split does not record them. Pass --caption-ids FILE (caption_ids=): "
            "VSE++'s coco_test_ids.npy or the precomp layout's testall_ids.txt, one id per caption in the "
            "dataset's caption order."
        )
    ids = _read_ids(caption_ids)
    owner = np.asarray(dataset.caption_image, dtype=np.int64)
    if len(ids) != len(owner):
        raise ValueError(f"{len(ids)} caption ids for {len(owner)} captions; give one id per caption, in order.")
    package = package or load_package()
    image_of = package.coco_gts["t2i"]
    unknown = [int(i) for i in ids if int(i) not in image_of]
    if unknown:
        raise ValueError(
            f"{len(unknown)} caption ids are not COCO 5K test captions (e.g. {unknown[:3]}); ECCV Caption "
            "and CxC are defined on the Karpathy 5K test split only."
        )
    coco_image = np.array([image_of[int(i)][0] for i in ids], dtype=np.int64)
    n_images = int(owner.max()) + 1
    image_ids = np.full(n_images, -1, dtype=np.int64)
    image_ids[owner] = coco_image
    if (image_ids[owner] != coco_image).any():
        k = int(np.flatnonzero(image_ids[owner] != coco_image)[0])
        raise ValueError(
            f"the captions of dataset image {owner[k]} belong to different COCO images (caption {k}, id "
            f"{ids[k]}); the caption ids are not in the dataset's caption order."
        )
    if len(set(image_ids.tolist())) != n_images:
        raise ValueError("two dataset images map to one COCO image; the caption ids are not in the dataset's order.")
    return CocoIds(image_ids, ids)


def _positives(gts: Mapping[int, Sequence[int]], query_ids: np.ndarray, gallery_ids: np.ndarray,
               what: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(query rows [Q], positive gallery columns [Q, P] (-1 = none or not in the gallery),
    R [Q] = number of positives)`` for the queries of ``gts``."""
    row_of = {int(q): k for k, q in enumerate(query_ids)}
    column_of = {int(g): k for k, g in enumerate(gallery_ids)}
    missing = [q for q in gts if q not in row_of]
    if missing:
        raise ValueError(
            f"{len(missing)} of the {len(gts)} {what} queries are not in the dataset (e.g. {missing[:3]}); "
            "this protocol needs the whole COCO 5K test split (5,000 images, 25,000 captions)."
        )
    queries = list(gts)
    width = max(len(set(v)) for v in gts.values())
    columns = np.full((len(queries), width), -1, dtype=np.int64)
    counts = np.empty(len(queries), dtype=np.int64)
    for k, q in enumerate(queries):  # building the index, once per protocol: not a hot path
        found = sorted({column_of.get(int(p), -1) for p in set(gts[q])} - {-1})
        columns[k, : len(found)] = found
        counts[k] = len(set(gts[q]))
    return np.array([row_of[q] for q in queries], dtype=np.int64), columns, counts


def top_lists(scores: np.ndarray, length: int) -> np.ndarray:
    """The first ``length`` columns of each row's stable descending ranking ``[Q, length]``
    (ties in column order), without sorting whole rows: a partition finds each row's
    ``length``-th score, and only the candidates at or above it are sorted.

    Example:
        >>> top_lists(np.array([[0.1, 0.9, 0.5, 0.9]]), 3).tolist()
        [[1, 3, 2]]
    """
    neg = -np.asarray(scores)
    n_rows, n_cols = neg.shape
    length = min(length, n_cols)
    kth = np.partition(neg, length - 1, axis=1)[:, length - 1 : length]
    rows, cols = np.nonzero(neg <= kth)  # every candidate, ties at the boundary included
    order = np.lexsort((cols, neg[rows, cols], rows))
    rows, cols = rows[order], cols[order]
    rank = np.arange(len(rows)) - np.searchsorted(rows, np.arange(n_rows))[rows]
    keep = rank < length
    out = np.empty((n_rows, length), dtype=np.int64)
    out[rows[keep], rank[keep]] = cols[keep]
    return out


def _positive_ranks(scores: np.ndarray, rows: np.ndarray, columns: np.ndarray, length: int) -> np.ndarray:
    """0-based rank of every positive in its query's ranking, sorted per query; ``inf`` for a
    padded slot or a positive ranked at ``length`` or below (every figure here looks no
    deeper than R or K)."""
    out = np.full(columns.shape, np.inf)
    for start in range(0, len(rows), QUERY_BLOCK):
        block = slice(start, start + QUERY_BLOCK)
        top = top_lists(np.asarray(scores[rows[block]]), length)
        cols = columns[block]
        match = (top[:, None, :] == cols[:, :, None]) & (cols >= 0)[:, :, None]  # [Q, P, length]
        out[block] = np.where(match.any(axis=2), match.argmax(axis=2), np.inf)
    return np.sort(out, axis=1)


def _direction_scores(scores: np.ndarray, direction: str) -> np.ndarray:
    return scores if direction == "i2t" else scores.T


def _queries(ids: CocoIds, direction: str) -> tuple[np.ndarray, np.ndarray]:
    return (ids.image_ids, ids.caption_ids) if direction == "i2t" else (ids.caption_ids, ids.image_ids)


def rprecision_figures(ranks: np.ndarray, counts: np.ndarray) -> dict[str, float]:
    """mAP@R, R-Precision and R@1 (percent) from sorted positive ranks ``[Q, P]`` and R ``[Q]``.

    Example:
        >>> rprecision_figures(np.array([[0.0, 2.0]]), np.array([2]))  # positives at ranks 1 and 3
        {'map_at_r': 50.0, 'rprecision': 50.0, 'r1': 100.0}
    """
    j = np.arange(1, ranks.shape[1] + 1)[None, :]  # the j-th positive found
    hit = ranks < counts[:, None]  # found within the top R
    precision_at_hit = np.where(hit, j / (np.where(hit, ranks, 0) + 1), 0.0)
    return {
        "map_at_r": float(100 * np.mean(precision_at_hit.sum(axis=1) / counts)),
        "rprecision": float(100 * np.mean(hit.sum(axis=1) / counts)),
        "r1": float(100 * np.mean(ranks[:, 0] == 0)),
    }


def _check_scores(scores: Any, ids: CocoIds) -> np.ndarray:
    if hasattr(scores, "detach"):
        scores = scores.detach().float().cpu().numpy()
    scores = np.asarray(scores)
    expected = (len(ids.image_ids), len(ids.caption_ids))
    if scores.shape != expected:
        raise ValueError(
            f"scores must be [images, captions] = {list(expected)} over the whole split, got {list(scores.shape)}."
        )
    if not all_finite(scores):
        raise ValueError("scores contain NaN or inf; check the embeddings.")
    return scores


def eccv_caption_metrics(scores: Any, ids: CocoIds, package: Any = None) -> dict[str, Any]:
    """ECCV Caption mAP@R, R-Precision and R@1 (percent) in both directions.

    Args:
        scores: ``[images, captions]`` similarities over the whole COCO 5K test split.
        ids: the split's COCO ids (:func:`coco_ids`).
        package: an ``eccv_caption.Metrics`` (default: loaded here).

    Returns:
        ``{"i2t": {...}, "t2i": {...}, "queries": {"i2t": 1261, "t2i": 1332}}``.
    """
    scores = _check_scores(scores, ids)
    package = package or load_package()
    return _rprecision_protocol(scores, ids, package.eccv_gts, "ECCV Caption")


def _rprecision_protocol(scores: np.ndarray, ids: CocoIds, gts: Mapping[str, Any], name: str) -> dict[str, Any]:
    out: dict[str, Any] = {"queries": {}}
    for direction in ("i2t", "t2i"):
        query_ids, gallery_ids = _queries(ids, direction)
        rows, columns, counts = _positives(gts[direction], query_ids, gallery_ids, f"{name} {direction}")
        ranks = _positive_ranks(_direction_scores(scores, direction), rows, columns, int(counts.max()))
        out[direction] = rprecision_figures(ranks, counts)
        out["queries"][direction] = len(rows)
    return out


def cxc_recalls(scores: Any, ids: CocoIds, ks: Sequence[int] = (1, 5, 10), package: Any = None) -> dict[str, Any]:
    """CxC Recall@K (percent) in both directions: a query is found when any of its CxC
    positives is in the top K.

    Returns:
        ``{"i2t": {"r1": ..., "r5": ..., "r10": ...}, "t2i": {...}, "queries": {...}}``.
    """
    scores = _check_scores(scores, ids)
    package = package or load_package()
    out: dict[str, Any] = {"queries": {}}
    for direction in ("i2t", "t2i"):
        query_ids, gallery_ids = _queries(ids, direction)
        rows, columns, _ = _positives(package.cxc_gts[direction], query_ids, gallery_ids, f"CxC {direction}")
        best = _positive_ranks(_direction_scores(scores, direction), rows, columns, max(ks))[:, 0]
        out[direction] = {f"r{k}": float(100 * np.mean(best < k)) for k in ks}
        out["queries"][direction] = len(rows)
    return out


def pmrp(scores: Any, ids: CocoIds, package: Any) -> dict[str, Any]:
    """Plausible-Match R-Precision (percent) in both directions; ``package`` must have been
    loaded with the plausible-match files (:func:`load_package` with ``pmrp_dir``)."""
    if not getattr(package, "pm_gts", None):
        raise FileNotFoundError(PMRP_HINT)
    scores = _check_scores(scores, ids)
    figures = _rprecision_protocol(scores, ids, package.pm_gts, "PMRP")
    return {"i2t": figures["i2t"]["rprecision"], "t2i": figures["t2i"]["rprecision"], "queries": figures["queries"]}


def retrieved_items(scores: Any, ids: CocoIds, k: int = 100) -> dict[str, dict[int, list[int]]]:
    """The top-``k`` ranked lists in the package's input format (``{"i2t": {image id: [caption
    ids]}, "t2i": {caption id: [image ids]}}``), ranked exactly as this module ranks, for its
    evaluator (the cross-check in the tests).

    Example:
        >>> package.eccv_metrics(retrieved_items(scores, ids), "all")  # needs eccv-caption's annotations  # doctest: +SKIP
    """
    scores = _check_scores(scores, ids)
    out: dict[str, dict[int, list[int]]] = {}
    for direction in ("i2t", "t2i"):
        query_ids, gallery_ids = _queries(ids, direction)
        s = _direction_scores(scores, direction)
        lists = {}
        for start in range(0, len(query_ids), QUERY_BLOCK):
            top = top_lists(np.asarray(s[start : start + QUERY_BLOCK]), k)
            lists.update(zip(query_ids[start : start + QUERY_BLOCK].tolist(), gallery_ids[top].tolist()))
        out[direction] = lists
    return out


__all__ = [
    "CocoIds", "PMRP_FILES", "coco_ids", "cxc_recalls", "eccv_caption_metrics", "load_package", "pmrp",
    "retrieved_items", "rprecision_figures", "top_lists",
]
