"""Reading one validation figure by name, to pick the best model."""

from __future__ import annotations

from typing import Any

_DIRECTIONS = ("i2t", "t2i")
_RANKS = ("medr", "meanr")


def metric_value(figures: dict[str, Any], name: str) -> float:
    """The figure ``name`` of :meth:`xmatch.eval.EvalResult.figures`.

    ``rsum``; ``i2t_<key>`` / ``t2i_<key>`` for one direction (``r1``, ``r5``, ``r10``,
    ``medr``, ``meanr``, ``ndcg_<relevance>``, and ``rsum`` = R@1 + R@5 + R@10 of that
    direction); a bare ``<key>`` is the mean of both directions.

    Example:
        >>> figs = {"rsum": 300.0, "i2t": {"r1": 40.0, "r5": 60.0, "r10": 80.0},
        ...         "t2i": {"r1": 20.0, "r5": 40.0, "r10": 60.0}}
        >>> metric_value(figs, "t2i_rsum"), metric_value(figs, "r1")
        (120.0, 30.0)
    """
    if name == "rsum":
        return float(figures["rsum"])
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


def check_metric_name(name: str, relevance: list[str]) -> None:
    """Fail before training when ``select_metric`` can never be read from validation."""
    keys = ["r1", "r5", "r10", "medr", "meanr", "rsum"] + [f"ndcg_{r.lower()}" for r in relevance]
    valid = {"rsum", *keys, *(f"{d}_{k}" for d in _DIRECTIONS for k in keys)}
    if name not in valid:
        raise ValueError(
            f"train -> select_metric: '{name}' is not a validation figure; choose one of "
            f"{', '.join(sorted(valid))} (NDCG figures need train.val_relevance)."
        )
