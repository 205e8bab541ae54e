"""Evaluation with the verifier re-ranking each query's top K (``xmatch eval --rerank K``).

The pooler's own figures stay what they are (comparable with the papers); these are computed
beside them, on a pass of their own that times every stage: encoding, the pooler's scores, and
the verifier re-scoring each caption's top K images and each image's top K captions
(:meth:`~xmatch.model.model.MatchingModel.rerank`; a pair in both short lists is verified once).

- Recall@K: image-to-text figures from the ``i2t`` re-ranked scores, text-to-image figures from
  the ``t2i`` ones (each direction re-ranks its own queries' lists).
- Hard-negative groups, two ways: ``groups``, where a caption's group members that are among its
  top K over the whole split are ordered by the verifier, above the members that are not (which
  keep the pooler's order; the image-to-text comparisons, ``i2t`` and Winoground ``text``, read
  the ``i2t`` re-ranked scores, the text-to-image ones, ``t2i`` and ``image``, the ``t2i`` ones,
  ``group`` both), so the first stage must also find both members; and ``groups_within``, the
  verifier's logits of every pair inside each group, the candidates the groups protocol gives
  the pooler (a caption against its own group's images; a group is smaller than any useful K).

Example:
    >>> figures = rerank_figures(model, test, 20, recall="full", groups=dataset_groups(test))  # evaluates a model with a verifier on a split (minutes)  # doctest: +SKIP
    >>> figures["timings"]["ratio"]  # doctest: +SKIP
    1.4
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from xmatch.eval.evaluate import Encoded, RetrievalSet, encode_dataset, score_blocks
from xmatch.eval.protocol import EvalResult, evaluate_blocks, fold_layout
from xmatch.core.progress import progress_bar
from xmatch.model.model import MatchingModel
from xmatch.model.rerank import RowGatherer, rerank_scores

logger = logging.getLogger(__name__)

#: the verifier figures' key in a run record's extras (``xmatch eval --json``)
RERANK = "rerank"


def check_rerank_request(k: int | None, ensemble: int = 1, neighbours: int = 0) -> None:
    """Refuse a ``--rerank`` K below 1, ``--rerank`` on an ensemble of several models, or
    ``--rerank-neighbours`` that is negative or comes without ``--rerank``, before any data is read."""
    if isinstance(neighbours, bool) or not isinstance(neighbours, int) or neighbours < 0:
        raise ValueError(f"--rerank-neighbours takes the number of nearest images added per candidate, 0 or more; got {neighbours!r}.")
    if k is None:
        if neighbours:
            raise ValueError(f"--rerank-neighbours {neighbours} widens the verifier's lists; give --rerank K as well.")
        return
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"--rerank takes the number of candidates re-scored per query, at least 1; got {k!r}.")
    if ensemble > 1:
        raise ValueError(
            "--rerank re-scores one model's short lists with its own verifier; evaluate the models one by one "
            "(without --ensemble)."
        )


def check_rerank_models(models: Sequence[MatchingModel], names: Sequence[str], k: int | None, neighbours: int = 0) -> None:
    """Refuse ``--rerank`` before anything is encoded: a K below 1, several models scored as
    one ensemble, a model without a verifier (named), or neighbours without a K."""
    check_rerank_request(k, len(models), neighbours)
    if k is None:
        return
    for model, name in zip(models, names):
        if model.verifier is None:
            raise ValueError(
                f"--rerank {k}: the model {name} has no verifier to re-rank with; evaluate a model trained with a "
                "[verifier] table (docs/evaluation.md, \"Re-ranking with a verifier\"), or leave out --rerank."
            )


def rerank_figures(
    model: MatchingModel,
    dataset: RetrievalSet,
    k: int,
    *,
    recall: str | None = "full",
    fold_images: int | None = None,
    groups: Any = None,
    relevance: Mapping[str, np.ndarray] | None = None,
    image_batch_size: int = 64,
    text_batch_size: int = 256,
    verify_batch: int = 256,
    progress: bool = True,
    encoded: Encoded | None = None,
    warn: bool = True,
    neighbours: int = 0,
) -> dict[str, Any]:
    """The figures of ``model`` with its verifier re-ranking every query's top ``k``, the
    pooler's own figures of the same pass beside them, and the time that takes beside the
    pooler alone.

    Args:
        model: a model with a verifier.
        dataset: the split.
        k: candidates re-scored per query.
        recall: the Recall@K protocol (``full``, ``coco-1k``...), or None for no Recall@K.
        fold_images: images per fold.
        groups: the split's hard-negative groups (a :class:`~xmatch.eval.groups.GroupSet`), or None.
        relevance: NDCG relevance matrices, as for the pooler's figures.
        verify_batch: pairs per verifier call.
        encoded: ``dataset`` already encoded by ``model`` (:func:`~xmatch.eval.evaluate.encode_dataset`),
            to reuse; default: encoded here.
        warn: log a warning when re-ranking lowers the pooler's figures (:func:`lowered_message`).
        neighbours: also re-rank, in each caption's list, the ``neighbours`` images nearest to
            each of its top ``k`` (:meth:`~xmatch.model.model.MatchingModel.image_neighbours`,
            timed as part of the re-ranking; the lists as :func:`~xmatch.model.rerank.rerank_scores`
            draws them with ``image_neighbours``); 0: the top ``k`` alone.

    Returns:
        Plain data: ``k``, ``neighbours``, ``verifier`` (:func:`verifier_fingerprint`), ``recall`` (``protocol``, ``i2t``, ``t2i``, ``rsum``; None without
        Recall@K), ``groups`` (a :meth:`~xmatch.eval.groups.GroupResult.as_dict`, with
        ``groups``: each caption's top ``k`` over the split re-ranked), ``groups_within`` (the
        same, from the verifier deciding within each group, plus its ``pairs`` and
        ``seconds``), ``pairs`` (pairs the verifier re-ranked) and ``timings``: ``encode_s``,
        ``similarity_s``, ``rerank_s``, ``without_s`` (encode + similarity: the evaluation
        without re-ranking), ``with_s`` (+ re-ranking) and ``ratio`` (with / without);
        ``pooler`` (the pooler's ``recall`` and ``groups`` from the same scores) and
        ``lowered`` (:func:`lowered_figures`: what re-ranking made worse than the pooler).
    """
    c = dataset.captions_per_image
    n_images = len(dataset.captions) // c
    folds = [] if recall is None else fold_layout(n_images, recall, fold_images)
    # the groups read each caption's top k over the whole split: score the whole matrix then
    whole = groups is not None or not folds
    scored = [slice(0, n_images)] if whole else folds
    if encoded is None:
        encoded = encode_dataset(
            model, dataset, image_batch_size=image_batch_size, text_batch_size=text_batch_size, progress=progress
        )
    start = time.perf_counter()
    blocks = score_blocks(model, encoded, scored, c, progress=progress)
    similarity_s = time.perf_counter() - start

    start = time.perf_counter()
    reranked: dict[str, list[np.ndarray]] = {"i2t": [], "t2i": []}
    pairs = 0
    with torch.inference_mode(), progress_bar(total=len(scored), desc="verifier", unit="block", show=progress) as bar:
        for block, fold in zip(blocks, scored):
            block_images = encoded.images[fold]
            near = model.image_neighbours(block_images, neighbours) if neighbours else None
            block_texts = encoded.captions[c * fold.start : c * fold.stop]
            images, texts = RowGatherer(block_images), RowGatherer(block_texts)

            def verify(i: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
                nonlocal pairs
                pairs += len(i)
                return model.verify(images(i), texts(t), batch_size=verify_batch)

            out = rerank_scores(torch.from_numpy(block), k, verify, ("i2t", "t2i"), verify_batch, image_neighbours=near,
                                text_lengths=block_texts.lengths)
            for direction, scores in out.items():
                reranked[direction].append(scores.numpy())
            bar.update(1)
    rerank_s = time.perf_counter() - start
    within = None
    if groups is not None:
        start = time.perf_counter()
        within = _verify_within_groups(model, encoded, groups, verify_batch)
        within_s = time.perf_counter() - start
    encode_s = encoded.seconds
    del encoded

    without = encode_s + similarity_s
    figures: dict[str, Any] = {
        "k": k, "neighbours": neighbours, "verifier": verifier_fingerprint(model), "recall": None, "pairs": pairs,
        "pooler": {"recall": None, "groups": None},
        "timings": {
            "encode_s": encode_s, "similarity_s": similarity_s, "rerank_s": rerank_s,
            "without_s": without, "with_s": without + rerank_s, "ratio": (without + rerank_s) / without,
        },
    }
    if folds:
        by_fold = {**reranked, "pooler": blocks}
        if whole:  # one matrix: cut it into the protocol's folds
            by_fold = {d: [m[0][f, c * f.start : c * f.stop] for f in folds] for d, m in by_fold.items()}
        figures["recall"] = combine_directions(
            evaluate_blocks(by_fold["i2t"], recall, c, relevance), evaluate_blocks(by_fold["t2i"], recall, c, relevance)
        ).figures()
        figures["pooler"]["recall"] = evaluate_blocks(by_fold["pooler"], recall, c, relevance).figures()
    if groups is not None:
        from xmatch.eval.groups import score_groups

        figures["groups"] = score_groups(reranked["t2i"][0], groups, i2t_scores=reranked["i2t"][0]).as_dict()
        figures["pooler"]["groups"] = score_groups(blocks[0], groups).as_dict()
        scores, within_pairs = within
        figures["groups_within"] = {**score_groups(scores, groups).as_dict(), "pairs": within_pairs, "seconds": within_s}
    figures["lowered"] = lowered_figures(figures)
    if figures["lowered"] and warn:
        logger.warning("%s", lowered_message(figures, "the model"))
    return figures


#: the group figures whose fall under re-ranking is reported (:func:`lowered_figures`)
_GROUP_FIGURES = ("t2i", "i2t", "group")


def lowered_figures(figures: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The figures that re-ranking made worse than the pooler's own on the same split:
    ``rsum`` of Recall@K and the overall groups figures ``t2i``, ``i2t`` and ``group`` (each
    caption's top K over the split re-ranked), as ``{"figure", "pooler", "reranked"}``.

    Example:
        >>> lowered_figures({"recall": {"rsum": 110.0}, "pooler": {"recall": {"rsum": 169.5}, "groups": None}})
        [{'figure': 'rsum', 'pooler': 169.5, 'reranked': 110.0}]
    """
    pooler = figures.get("pooler") or {}
    out = []
    if figures.get("recall") and pooler.get("recall"):
        before, after = float(pooler["recall"]["rsum"]), float(figures["recall"]["rsum"])
        if after < before:
            out.append({"figure": "rsum", "pooler": before, "reranked": after})
    if figures.get("groups") and pooler.get("groups"):
        before_row, after_row = pooler["groups"]["overall"], figures["groups"]["overall"]
        for name in _GROUP_FIGURES:
            before, after = before_row.get(name), after_row.get(name)
            if before is not None and after is not None and after < before:
                out.append({"figure": f"groups {name}", "pooler": float(before), "reranked": float(after)})
    return out


def lowered_message(figures: Mapping[str, Any], name: str) -> str:
    """The warning of a re-ranking that lowers the pooler's figures (:func:`lowered_figures`),
    naming each figure and the fix."""
    falls = ", ".join(f"{d['figure']} {d['pooler']:.1f} -> {d['reranked']:.1f}" for d in figures["lowered"])
    return (
        f"--rerank {figures['k']}: re-ranking with {name}'s verifier LOWERS the pooler's figures ({falls}); its head "
        "reads these pairs worse than the pooler. Train the head longer or on more captions, picking best/ by "
        "its own validation (select_metric = \"verifier_accuracy\", docs/training.md, \"A verifier on a trained "
        "model\"), or leave out --rerank."
    )


#: a recorded verifier accuracy less than this many points above chance is reported (:func:`validation_warning`)
NEAR_CHANCE = 10.0


def validation_warning(record: Mapping[str, Any] | None, name: str, k: int) -> str | None:
    """The warning for re-ranking with a verifier head whose recorded validation
    (:func:`xmatch.io.bundle.read_verifier_validation`) is near chance (less than
    :data:`NEAR_CHANCE` points above it), says that re-ranking lowered the validation split's
    rsum below the pooler's, or is absent; None for a head that learned.

    Example:
        >>> validation_warning({"accuracy": 91.0, "chance": 50.0, "split": "val"}, "m", 20) is None
        True
        >>> print(validation_warning({"accuracy": 51.0, "chance": 50.0, "split": "val", "pairs": 800}, "m", 20))
        --rerank 20: m's verifier scored 51.0 % on its validation pairs (val split, 800 pairs), near chance (50.0 %): it may have learned nothing and re-ranking with it can lower the pooler's figures. Train the head longer or on more captions (docs/training.md, "A verifier on a trained model"), or leave out --rerank.
        >>> print(validation_warning({"accuracy": 67.5, "split": "val", "k": 20, "pooler_rsum": 479.6, "rerank_rsum": 425.4}, "m", 20))
        --rerank 20: re-ranking the top 20 with m's verifier lowered its validation rsum (val split) from the pooler's 479.6 to 425.4 (its accuracy on the validation pairs: 67.5 %): it reads these pairs worse than the pooler does. Train the head longer or on more captions (docs/training.md, "A verifier on a trained model"), or leave out --rerank.
    """
    fix = "(docs/training.md, \"A verifier on a trained model\"), or leave out --rerank."
    if record is None or record.get("accuracy") is None:
        return (
            f"--rerank {k}: {name}'s verifier has no recorded validation (a head saved without it, or trained "
            "without a validation split): nothing says it learned, and re-ranking with a head that learned nothing "
            f"lowers the pooler's figures. Train it with a validation split {fix}"
        )
    accuracy, chance = float(record["accuracy"]), float(record.get("chance", 50.0))
    split = f"{record['split']} split" if record.get("split") else ""
    if accuracy < chance + NEAR_CHANCE:
        where = ", ".join(x for x in (split, f"{record['pairs']:,} pairs" if record.get("pairs") else "") if x)
        return (
            f"--rerank {k}: {name}'s verifier scored {accuracy:.1f} % on its validation pairs"
            f"{f' ({where})' if where else ''}, near chance ({chance:.1f} %): it may have learned nothing and re-ranking "
            f"with it can lower the pooler's figures. Train the head longer or on more captions {fix}"
        )
    pooler, reranked = record.get("pooler_rsum"), record.get("rerank_rsum")
    if pooler is None or reranked is None or float(reranked) >= float(pooler):
        return None
    return (
        f"--rerank {k}: re-ranking the top {record.get('k', k)} with {name}'s verifier lowered its validation rsum"
        f"{f' ({split})' if split else ''} from the pooler's {float(pooler):.1f} to {float(reranked):.1f} (its accuracy "
        f"on the validation pairs: {accuracy:.1f} %): it reads these pairs worse than the pooler does. Train the head "
        f"longer or on more captions {fix}"
    )


def recorded_validation(reference: str) -> tuple[bool, dict[str, Any] | None]:
    """Whether the model ``reference`` names (as ``xmatch eval`` reads it) comes with weights
    that can keep a verifier's validation record, and the record: a bundle (``local-dir:``,
    ``hf-hub:``) or a ``.safetensors`` weights file. A zoo entry's published metrics stand for
    its head's record: ``(False, None)``.

    Example:
        >>> recorded_validation("teran-mrsw-hn-scenes")
        (False, None)
    """
    from xmatch.io.bundle import read_verifier_validation
    from xmatch.core.sources import WEIGHTS_FILE
    from xmatch.model.factory import HF_HUB, LOCAL_DIR

    if "=" in reference:
        weights = Path(reference.split("=", 1)[1])
        if weights.suffix != ".safetensors":  # an original checkpoint, converted: no record to keep
            return True, None
    elif reference.startswith(LOCAL_DIR):
        weights = Path(reference[len(LOCAL_DIR):]) / WEIGHTS_FILE
    elif reference.startswith(HF_HUB):
        from xmatch.io import hub

        weights = Path(hub.fetch(reference)) / WEIGHTS_FILE
    else:
        return False, None
    return True, read_verifier_validation(weights)


def _verify_within_groups(model: MatchingModel, encoded: Any, groups: Any, verify_batch: int) -> tuple[Any, int]:
    """The verifier's logits of every (image, caption) pair inside each group, as the groups
    protocol scores the pooler (a caption against its own group's images only), and how many
    pairs that is."""
    from xmatch.eval.groups import PairScores

    blocks = groups.blocks(groups_per_block=1)
    rows = torch.from_numpy(np.concatenate([np.repeat(i, len(c)) for i, c in blocks]))
    cols = torch.from_numpy(np.concatenate([np.tile(c, len(i)) for i, c in blocks]))
    with torch.inference_mode():
        logits = model.verify(RowGatherer(encoded.images)(rows), RowGatherer(encoded.captions)(cols),
                              batch_size=verify_batch).float().cpu().numpy()
    sizes = np.cumsum([len(i) * len(c) for i, c in blocks])[:-1]
    values = [v.reshape(len(i), len(c)) for v, (i, c) in zip(np.split(logits, sizes), blocks)]
    shape = (len(encoded.images), len(encoded.captions))
    return PairScores(blocks, values, shape), len(rows)


def verifier_fingerprint(model: MatchingModel) -> str:
    """12 hex digits over the verifier's spec and weights: the re-ranked figures depend on them,
    the pooler's figures (and the model fingerprint of the provenance) do not.

    Example:
        >>> len(verifier_fingerprint(xmatch.build("teran-mrsw-scenes", verifier={"name": "cross-attention"})))
        12
    """
    try:
        spec = model.spec.get("verifier")
    except AttributeError:  # a model made without a spec: its verifier's class
        spec = type(model.verifier).__name__
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode())
    for name, tensor in sorted(model.verifier.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()[:12]


def combine_directions(i2t: EvalResult, t2i: EvalResult) -> EvalResult:
    """One result of the image-to-text figures of ``i2t`` and the text-to-image figures of
    ``t2i`` (two evaluations of the same folds), ``rsum`` over both.

    Example:
        >>> from xmatch.eval.protocol import evaluate_scores
        >>> a, b = evaluate_scores(np.eye(2).repeat(5, axis=1)), evaluate_scores(-np.eye(2).repeat(5, axis=1))
        >>> combine_directions(a, b).rsum
        500.0
    """
    rsum = sum(i2t.i2t[f"r{n}"] + t2i.t2i[f"r{n}"] for n in (1, 5, 10))
    folds = [
        {"i2t": a["i2t"], "t2i": b["t2i"], "rsum": sum(a["i2t"][f"r{n}"] + b["t2i"][f"r{n}"] for n in (1, 5, 10))}
        for a, b in zip(i2t.folds, t2i.folds)
    ]
    queries = {k: v for k, v in i2t.queries.items() if k.startswith("i2t")}
    queries |= {k: v for k, v in t2i.queries.items() if k.startswith("t2i")}
    return EvalResult(i2t.protocol, dict(i2t.i2t), dict(t2i.t2i), float(rsum), folds, queries)


def rerank_table(figures: Mapping[str, Any], name: str) -> str:
    """The re-ranked figures of one run (``extras["rerank"]``) as text: Recall@K, the groups
    (each beside the pooler's own where the run has them: a line per figure it lowers) and the
    evaluation time with and without re-ranking.

    Example:
        >>> print(rerank_table({"k": 5, "recall": None, "pairs": 40, "timings": {"encode_s": 1.0, "similarity_s": 1.0,
        ...     "rerank_s": 0.5, "without_s": 2.0, "with_s": 2.5, "ratio": 1.25}}, "m"))
        Re-ranked: m's verifier re-scores each query's top 5 (the figures above are the pooler's own)
        evaluation time: 2.0 s without re-ranking (encode 1.0 s, pooler 1.0 s), 2.5 s with it (verifier 0.5 s, 40 pairs): 1.25x
    """
    from xmatch.eval.groups import GroupResult

    near = figures.get("neighbours") or 0
    widened = f" and, for each caption, the {near} nearest image{'s' if near > 1 else ''} of each" if near else ""
    lines = [f"Re-ranked: {name}'s verifier re-scores each query's top {figures['k']}{widened} "
             "(the figures above are the pooler's own)"]
    recall = figures.get("recall")
    pooler = figures.get("pooler") or {}
    if recall:
        lines.append(EvalResult(recall["protocol"], recall["i2t"], recall["t2i"], recall["rsum"]).table())
        if pooler.get("recall"):
            before = pooler["recall"]["rsum"]
            lines.append(f"rsum {recall['rsum']:.1f} re-ranked beside the pooler's {before:.1f} "
                         f"({recall['rsum'] - before:+.1f})")
    if figures.get("groups"):
        lines += [f"hard-negative groups, each caption's top {figures['k']} over the split re-ranked:",
                  GroupResult.from_dict(figures["groups"]).table()]
        if pooler.get("groups"):
            before, after = pooler["groups"]["overall"], figures["groups"]["overall"]
            lines.append("beside the pooler's: " + ", ".join(
                f"{f} {after[f]:.1f} ({after[f] - before[f]:+.1f})" for f in _GROUP_FIGURES
                if after.get(f) is not None and before.get(f) is not None
            ))
    for fall in figures.get("lowered") or []:
        lines.append(f"WARNING: re-ranking lowers {fall['figure']} from the pooler's {fall['pooler']:.1f} to "
                     f"{fall['reranked']:.1f}")
    if figures.get("groups_within"):
        within = figures["groups_within"]
        lines += [f"hard-negative groups, the verifier deciding within each group (as the groups protocol scores the "
                  f"pooler; {within['pairs']:,} pairs, {within['seconds']:.1f} s):",
                  GroupResult.from_dict(within).table()]
    t = figures["timings"]
    lines.append(
        f"evaluation time: {t['without_s']:.1f} s without re-ranking (encode {t['encode_s']:.1f} s, pooler "
        f"{t['similarity_s']:.1f} s), {t['with_s']:.1f} s with it (verifier {t['rerank_s']:.1f} s, "
        f"{figures['pairs']:,} pairs): {t['ratio']:.2f}x"
    )
    return "\n".join(lines)
