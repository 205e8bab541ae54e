"""A verifier head's own validation: what tells a head that learned from one that did not.

The frozen model's validation figures cannot move while only its verifier trains, so they
cannot pick ``best/``. The head is measured on the validation split instead:

- ``accuracy``: each caption's pair with its own image against its negatives, the image the
  pooler scores highest among the others (``image``) and the recipe's structural negatives of
  the caption on its own image (``structural``): the share of those comparisons in which the
  positive pair's logit is the higher (ties count half, so a head that says the same for every
  pair scores chance, 50 %);
- ``twins``: with declared hard-negative groups, the verifier's text-to-image accuracy within
  each group (a caption against its group's images, the twins), beside its chance level;
- the pooler's Recall@K and groups figures and the same with each query's top ``k`` re-ranked
  by the head (:func:`xmatch.eval.rerank.rerank_figures`), so that a head which lowers them is
  seen while it trains.

Example:
    >>> v = validate_verifier(model, val, k=20, negatives=negatives, groups=dataset_groups(val))  # a model with a verifier and a split (minutes)  # doctest: +SKIP
    >>> v.accuracy, v.chance  # doctest: +SKIP
    (93.4, 50.0)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from xmatch.eval.evaluate import RetrievalSet, encode_captions, encode_dataset
from xmatch.model.model import MatchingModel
from xmatch.model.rerank import RowGatherer
from xmatch.train.negatives import CaptionNegatives

#: a head that cannot tell a positive pair from a negative one scores this (percent)
CHANCE = 50.0


@dataclass
class VerifierValidation:
    """A verifier head's validation (percent).

    Attributes:
        accuracy: share of (positive, negative) comparisons the positive wins, ties half.
        image: the same over the hardest other images only (None on a split of one image).
        structural: the same over the structural negatives only (None without them).
        pairs: comparisons counted in ``accuracy``.
        twins: text-to-image accuracy within the declared groups (None without groups).
        twins_chance: its chance level.
        k: candidates re-ranked per query for ``rerank``.
        rerank: :func:`~xmatch.eval.rerank.rerank_figures`'s figures (``pooler`` beside the
            re-ranked ``recall`` and ``groups``, ``lowered``).
        chance: the chance level of ``accuracy``.
    """

    accuracy: float
    image: float | None
    structural: float | None
    pairs: int
    twins: float | None
    twins_chance: float | None
    k: int
    rerank: dict[str, Any]
    chance: float = CHANCE

    def pooler_figures(self) -> dict[str, Any]:
        """The pooler's own Recall@K figures (:meth:`xmatch.eval.EvalResult.figures`)."""
        return self.rerank["pooler"]["recall"]

    def figures(self) -> dict[str, Any]:
        """The pooler's figures with the head's beside them under ``verifier``: what
        :func:`xmatch.train.selection.metric_value` reads (``verifier_accuracy``, ``rerank_rsum``...)."""
        recall = self.rerank.get("recall") or {}
        verifier = {
            "accuracy": self.accuracy, "image": self.image, "structural": self.structural, "pairs": self.pairs,
            "twins": self.twins, "twins_chance": self.twins_chance, "chance": self.chance, "k": self.k,
            "rerank_rsum": recall.get("rsum"), "lowered": [d["figure"] for d in self.rerank.get("lowered", [])],
        }
        return {**self.pooler_figures(), "verifier": verifier}

    def record(self, split: str | None, step: int) -> dict[str, Any]:
        """What a bundle keeps of it (:func:`xmatch.io.bundle.read_verifier_validation`)."""
        recall, pooler = self.rerank.get("recall") or {}, self.pooler_figures()
        return {
            "accuracy": self.accuracy, "chance": self.chance, "image": self.image, "structural": self.structural,
            "pairs": self.pairs, "twins": self.twins, "twins_chance": self.twins_chance, "split": split, "step": step,
            "k": self.k, "pooler_rsum": pooler.get("rsum"), "rerank_rsum": recall.get("rsum"),
        }


def validate_verifier(
    model: MatchingModel,
    dataset: RetrievalSet,
    *,
    k: int = 20,
    recall: str = "full",
    negatives: CaptionNegatives | None = None,
    groups: Any = None,
    relevance: Mapping[str, np.ndarray] | None = None,
    verify_batch: int = 256,
) -> VerifierValidation:
    """Measure ``model``'s verifier head on ``dataset`` (a validation split); the split is
    encoded once.

    Args:
        model: a model with a verifier.
        dataset: the split.
        k: candidates re-ranked per query for the re-ranked figures.
        recall: the Recall@K protocol of the pooler's and the re-ranked figures.
        negatives: the recipe's structural negatives (drawn as in epoch 0, the same at every
            validation), or None.
        groups: the split's hard-negative groups (:class:`~xmatch.eval.groups.GroupSet`), or None.
        relevance: NDCG relevance matrices for the pooler's figures.
        verify_batch: pairs per verifier call.

    Raises:
        ValueError: the model has no verifier.
    """
    from xmatch.eval.rerank import rerank_figures

    if model.verifier is None:
        raise ValueError("validate_verifier measures a verifier head and this model has none.")
    encoded = encode_dataset(model, dataset, progress=False)
    figures = rerank_figures(model, dataset, k, recall=recall, groups=groups, relevance=relevance,
                             verify_batch=verify_batch, progress=False, encoded=encoded, warn=False)
    c = dataset.captions_per_image
    n_captions = len(dataset.captions)
    own = torch.arange(n_captions) // c
    captions = torch.arange(n_captions)
    images, texts = RowGatherer(encoded.images), RowGatherer(encoded.captions)
    wins: dict[str, np.ndarray] = {}
    with torch.inference_mode():
        positive = model.verify(images(own), texts(captions), batch_size=verify_batch).float().cpu()
        if len(encoded.images) > 1:
            hardest = _hardest_other_image(model, encoded, own)
            negative = model.verify(images(hardest), texts(captions), batch_size=verify_batch).float().cpu()
            wins["image"] = _wins(positive, negative)
        if negatives is not None:
            made = negatives.draw(list(dataset.captions), captions, epoch=0)
            if made.texts:
                owner = made.owner.long()
                negative_texts = RowGatherer(encode_captions(model, made.texts, progress=False))
                negative = model.verify(images(own[owner]), negative_texts(torch.arange(len(made.texts))),
                                        batch_size=verify_batch).float().cpu()
                wins["structural"] = _wins(positive[owner], negative)
    every = np.concatenate(list(wins.values())) if wins else np.zeros(0)
    within = (figures.get("groups_within") or {}).get("overall", {})
    return VerifierValidation(
        accuracy=_percent(every) if len(every) else CHANCE,
        image=_percent(wins["image"]) if "image" in wins else None,
        structural=_percent(wins["structural"]) if "structural" in wins else None,
        pairs=len(every), twins=within.get("t2i"), twins_chance=within.get("t2i_chance"), k=k, rerank=figures,
    )


def _hardest_other_image(model: MatchingModel, encoded: Any, own: torch.Tensor) -> torch.Tensor:
    """For each caption, the image the pooler scores highest among those it does not belong to."""
    from xmatch.eval.evaluate import score_blocks

    n_images = len(encoded.images)
    c = len(own) // n_images
    scores = torch.from_numpy(score_blocks(model, encoded, [slice(0, n_images)], c, progress=False)[0])
    scores[own, torch.arange(len(own))] = -torch.inf
    return scores.argmax(dim=0)


def _wins(positive: torch.Tensor, negative: torch.Tensor) -> np.ndarray:
    """1 where the positive pair's logit is the higher, 0.5 for a tie, 0 otherwise."""
    return ((positive > negative).float() + 0.5 * (positive == negative).float()).numpy()


def _percent(wins: np.ndarray) -> float:
    return float(100.0 * wins.mean())
