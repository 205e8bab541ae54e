"""Reading one validation figure by name, to pick the best model."""

from __future__ import annotations

import fnmatch
from typing import Any

_DIRECTIONS = ("i2t", "t2i")
_RANKS = ("medr", "meanr")
#: the figures of a model's verifier head (:mod:`xmatch.train.verifier_validation`): the name
#: ``select_metric`` takes, and the key under the validation's ``verifier`` figures
VERIFIER_FIGURES = {"verifier_accuracy": "accuracy", "verifier_image": "image", "verifier_structural": "structural",
                    "verifier_twins": "twins", "rerank_rsum": "rerank_rsum"}


def metric_value(figures: dict[str, Any], name: str) -> float:
    """The figure ``name`` of :meth:`xmatch.eval.EvalResult.figures`.

    ``rsum``; ``i2t_<key>`` / ``t2i_<key>`` for one direction (``r1``, ``r5``, ``r10``,
    ``medr``, ``meanr``, ``ndcg_<relevance>``, and ``rsum`` = R@1 + R@5 + R@10 of that
    direction); a bare ``<key>`` is the mean of both directions. A model with a verifier adds
    its head's own figures (:data:`VERIFIER_FIGURES`): ``verifier_accuracy``,
    ``verifier_image``, ``verifier_structural``, ``verifier_twins`` and ``rerank_rsum``.

    Example:
        >>> figs = {"rsum": 300.0, "i2t": {"r1": 40.0, "r5": 60.0, "r10": 80.0},
        ...         "t2i": {"r1": 20.0, "r5": 40.0, "r10": 60.0}}
        >>> metric_value(figs, "t2i_rsum"), metric_value(figs, "r1")
        (120.0, 30.0)
    """
    if name == "rsum":
        return float(figures["rsum"])
    if name in VERIFIER_FIGURES:
        value = (figures.get("verifier") or {}).get(VERIFIER_FIGURES[name])
        if value is None:
            raise KeyError(
                f"select_metric '{name}' is not among this validation's figures: a model with a verifier "
                "measures it (verifier_twins needs a validation split with hard-negative groups)."
            )
        return float(value)
    direction, _, key = name.partition("_")
    if direction in _DIRECTIONS:
        return _direction_value(figures, direction, key, name)
    return sum(_direction_value(figures, d, name, name) for d in _DIRECTIONS) / 2


def _direction_value(figures: dict[str, Any], direction: str, key: str, name: str) -> float:
    values = figures[direction]
    if key == "rsum":
        return float(values["r1"] + values["r5"] + values["r10"])
    if key not in values:
        available = ["rsum"] + [f"{d}_{k}" for d in _DIRECTIONS for k in [*figures[d], "rsum"]] + list(figures[direction])
        raise KeyError(
            f"select_metric '{name}' is not among the validation figures: {', '.join(available)} "
            "(NDCG figures need train.val_relevance)."
        )
    return float(values[key])


def minimised(name: str) -> bool:
    """Ranks are better when lower; every other figure when higher."""
    return name.endswith(_RANKS)


def check_metric_name(name: str, relevance: list[str], verifier: bool = False, verifier_only: bool = False) -> None:
    """Fail before training when ``select_metric`` can never be read from validation, or can
    never change: a figure of the frozen model while only its verifier trains.

    Args:
        name: ``select_metric``.
        relevance: ``val_relevance``.
        verifier: the model has a verifier head (its figures can be read).
        verifier_only: the head is all that trains.

    Example:
        >>> check_metric_name("rsum", [], verifier=True, verifier_only=True)
        Traceback (most recent call last):
        ...
        ValueError: train -> select_metric: 'rsum' is a figure of the frozen model, which cannot change while only its verifier trains (best/ would keep the first validation's head); set select_metric = "verifier_accuracy" (or "verifier_twins" with hard-negative groups, "rerank_rsum").
    """
    keys = ["r1", "r5", "r10", "medr", "meanr", "rsum"] + [f"ndcg_{r.lower()}" for r in relevance]
    valid = {"rsum", *keys, *(f"{d}_{k}" for d in _DIRECTIONS for k in keys)}
    if name in VERIFIER_FIGURES:
        if not verifier:
            raise ValueError(
                f"train -> select_metric: '{name}' is a figure of a verifier head and this model has none; choose a "
                "figure of the pooler (rsum, t2i_r1...) or add a head (--model-set verifier.name=grounded)."
            )
        return
    if verifier_only and name in valid:
        raise ValueError(
            f"train -> select_metric: '{name}' is a figure of the frozen model, which cannot change while only its "
            "verifier trains (best/ would keep the first validation's head); set select_metric = "
            "\"verifier_accuracy\" (or \"verifier_twins\" with hard-negative groups, \"rerank_rsum\")."
        )
    if name not in valid:
        raise ValueError(
            f"train -> select_metric: '{name}' is not a validation figure; choose one of "
            f"{', '.join(sorted(valid | (set(VERIFIER_FIGURES) if verifier else set())))} "
            "(NDCG figures need train.val_relevance)."
        )


def trains_only_verifier(model: Any, param_groups: list[Any]) -> bool:
    """Whether ``model`` has a verifier and the recipe's ``param_groups`` (first match wins)
    leave its ``verifier.*`` parameters the only ones that train.

    Example:
        >>> from xmatch.train.config import ParamGroup
        >>> model = xmatch.build("teran-mrsw-scenes", verifier={"name": "grounded"})
        >>> trains_only_verifier(model, [ParamGroup("verifier.*"), ParamGroup("*", freeze=True)])
        True
    """
    if getattr(model, "verifier", None) is None:
        return False
    for name, param in model.named_parameters():
        rule = next((g for g in param_groups if fnmatch.fnmatchcase(name, g.match)), None)
        trains = param.requires_grad and not (rule is not None and rule.freeze)
        if trains and not name.startswith("verifier."):
            return False
    return True
