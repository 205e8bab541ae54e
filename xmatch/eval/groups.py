"""Hard-negative groups: images (with their captions) that differ in one declared detail.

A group lists two or more images of a dataset split whose captions are near-identical but
describe different scenes: the scenes benchmark's twins (two objects swapped, or their colours
or sizes), Winoground-style pairs, or any groups a user lists in a JSON file. Recall@K over the
whole gallery hides whether a model tells such items apart; here every query competes only
with the other members of its own group:

- ``t2i``: a caption's own image scores above every other image of the group;
- ``i2t``: an image scores its own caption above every caption of the other members;
- for groups of two (pairs), the Winoground scores (Thrush et al., CVPR 2022) over every
  pairing of a caption of the first image with a caption of the second: ``text`` (each image
  prefers its own caption), ``image`` (each caption prefers its own image), ``group`` (both).

Ties count as wrong. Every figure is also broken down by the group's ``kind`` (the declared
kind of difference, e.g. ``relation``, ``colour``, ``size``).

A dataset declares its groups with a ``hard_negative_groups()`` method (the scenes benchmark
does: :func:`xmatch.scenes.dataset.scene_groups`); a JSON file declares them for any dataset
(:meth:`GroupSet.from_json`).

Example:
    >>> groups = GroupSet([Group((0, 1), "relation")], caption_image=np.repeat([0, 1], 2))
    >>> scores = np.array([[0.9, 0.8, 0.1, 0.2], [0.2, 0.1, 0.7, 0.9]])
    >>> score_groups(scores, groups).overall["t2i"]
    100.0
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from xmatch.core.errors import XmatchError

#: the figures of a :class:`GroupResult` row, in table order
FIGURES = ("t2i", "i2t", "text", "image", "group")


class GroupsFileError(XmatchError, ValueError):
    """A groups file that cannot be used: not JSON, not the groups layout, or a group that does
    not fit the split (the message names the file, the group and the fix)."""


@dataclass(frozen=True)
class Group:
    """One hard-negative group.

    Attributes:
        images: indices (in the dataset split) of the member images, at least two, distinct.
        kind: the declared kind of difference (``relation``, ``colour``, ``swap-attribute``...).
        captions: per member, the indices (into ``dataset.captions``) of the captions that take
            part; None = all captions of each member image.
    """

    images: tuple[int, ...]
    kind: str = "group"
    captions: tuple[tuple[int, ...], ...] | None = None


class GroupSet:
    """Groups over one dataset split, held as padded index arrays for vectorised scoring.

    Args:
        groups: the groups.
        caption_image: the image index of every caption of the split (``dataset.caption_image``).

    Raises:
        ValueError: a group with fewer than two images, an image twice, an index out of range,
            a caption that does not belong to its member image, or a member without captions.

    Example:
        >>> gs = GroupSet([Group((0, 1), "colour")], caption_image=np.array([0, 0, 1, 1]))
        >>> len(gs), gs.kinds
        (1, ['colour'])
    """

    def __init__(self, groups: Sequence[Group], caption_image: Sequence[int] | np.ndarray) -> None:
        owner = np.asarray(caption_image, dtype=np.int64)
        n_images = int(owner.max()) + 1 if len(owner) else 0
        by_image = _captions_by_image(owner, n_images)
        if not groups:
            raise ValueError("a group set needs at least one group.")
        self.kinds: list[str] = []
        member_image, member_group, unit_caption, unit_member = [], [], [], []
        for g, group in enumerate(groups):
            images = [int(i) for i in group.images]
            where = f"group {g} ({group.kind})"
            if len(images) < 2 or len(set(images)) != len(images):
                raise ValueError(f"{where}: a group needs at least two different images, got {images}.")
            bad = [i for i in images if not 0 <= i < n_images]
            if bad:
                raise ValueError(f"{where}: image index {bad[0]} is outside the split's {n_images} images.")
            if group.captions is not None and len(group.captions) != len(images):
                raise ValueError(f"{where}: captions must list one caption selection per image ({len(images)}).")
            for m, image in enumerate(images):
                chosen = by_image[image] if group.captions is None else [int(k) for k in group.captions[m]]
                if not chosen:
                    raise ValueError(f"{where}: image {image} has no captions in the group.")
                foreign = [k for k in chosen if not 0 <= k < len(owner) or owner[k] != image]
                if foreign:
                    raise ValueError(f"{where}: caption {foreign[0]} is not a caption of image {image}.")
                member = len(member_image)
                member_image.append(image)
                member_group.append(g)
                unit_caption += chosen
                unit_member += [member] * len(chosen)
            self.kinds.append(str(group.kind))
        self.member_image = np.asarray(member_image, dtype=np.int64)
        self.member_group = np.asarray(member_group, dtype=np.int64)
        #: one unit per (member, caption): the caption and its member
        self.unit_caption = np.asarray(unit_caption, dtype=np.int64)
        self.unit_member = np.asarray(unit_member, dtype=np.int64)
        self.group_members = _pad_rows(self.member_group, np.arange(len(member_image)), len(groups))
        self.group_units = _pad_rows(self.member_group[self.unit_member], np.arange(len(unit_caption)), len(groups))
        self.groups = list(groups)

    def __len__(self) -> int:
        return len(self.kinds)

    @property
    def sizes(self) -> np.ndarray:
        """Members per group ``[G]``."""
        return (self.group_members >= 0).sum(axis=1)

    @classmethod
    def from_json(cls, path: str | os.PathLike, dataset: Any) -> GroupSet:
        """Groups listed in a JSON file, over ``dataset`` (a split with ``image_names``,
        ``caption_image``).

        The file is ``{"groups": [...]}`` (or the list itself); each group is
        ``{"images": [...], "kind": "...", "captions": [[...], ...]}``. An image is its name
        in the split (``dataset.image_names``; a file name also matches by its stem, so
        ``"900"`` finds ``images/900.png``) or, as a JSON integer, its index. ``captions``
        (optional) gives per image the positions of the captions that take part among that
        image's own captions (``0`` = its first caption). ``kind`` defaults to ``"group"``.

        Raises:
            FileNotFoundError: no such file.
            GroupsFileError: the file is not UTF-8 JSON in this layout, or a group does not fit
                the split (an unknown image, an image twice, a caption position out of range);
                the message names the file and the group.

        Example:
            >>> from types import SimpleNamespace
            >>> split = SimpleNamespace(image_names=["images/900.png", "images/901.png"], caption_image=np.array([0, 0, 1, 1]))
            >>> _ = Path("groups.json").write_text('{"groups": [{"images": ["900", 1], "kind": "colour"}]}')
            >>> gs = GroupSet.from_json("groups.json", split)
            >>> len(gs), gs.kinds
            (1, ['colour'])
        """
        path = Path(path)
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise FileNotFoundError(f"groups file {path} does not exist.") from None
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            raise GroupsFileError(f"groups file {path} is not valid UTF-8 JSON: {exc}.") from None
        items = doc.get("groups") if isinstance(doc, dict) else doc
        if not isinstance(items, list) or not items:
            raise GroupsFileError(f"groups file {path}: expected {{\"groups\": [...]}} with at least one group.")
        owner = np.asarray(dataset.caption_image, dtype=np.int64)
        by_image = _captions_by_image(owner, len(dataset.image_names))
        find = _image_finder(list(dataset.image_names))
        groups = []
        for g, item in enumerate(items):
            where = f"groups file {path}, group {g}"
            if not isinstance(item, dict) or not isinstance(item.get("images"), list):
                raise GroupsFileError(f"{where} must be an object with an 'images' list.")
            kind = item.get("kind", "group")
            if not isinstance(kind, str):
                raise GroupsFileError(f"{where}: 'kind' must be a string such as \"colour\", got {kind!r}.")
            images = tuple(find(ref, where) for ref in item["images"])
            captions = None
            if item.get("captions") is not None:
                selection = item["captions"]
                if not isinstance(selection, list) or len(selection) != len(images):
                    raise GroupsFileError(f"{where}: 'captions' needs one list per image.")
                captions = []
                for image, positions in zip(images, selection):
                    own = by_image[image]
                    if not isinstance(positions, list):
                        raise GroupsFileError(f"{where}: an image's captions are a list of positions, got {positions!r:.60}.")
                    bad = [p for p in positions if type(p) is not int or not 0 <= p < len(own)]
                    if bad:
                        raise GroupsFileError(
                            f"{where}: caption position {bad[0]!r} of image "
                            f"{dataset.image_names[image]!r}, which has {len(own)} captions."
                        )
                    captions.append(tuple(own[p] for p in positions))
                captions = tuple(captions)
            groups.append(Group(images, kind, captions))
        try:
            return cls(groups, owner)
        except ValueError as exc:  # a group that does not fit the split: name the file
            raise GroupsFileError(f"groups file {path}: {exc}") from None


def _captions_by_image(owner: np.ndarray, n_images: int) -> list[list[int]]:
    order = np.argsort(owner, kind="stable")
    bounds = np.searchsorted(owner[order], np.arange(n_images + 1))
    return [order[bounds[i] : bounds[i + 1]].tolist() for i in range(n_images)]


def _pad_rows(row_of: np.ndarray, values: np.ndarray, rows: int) -> np.ndarray:
    """``values`` laid out in rows by ``row_of`` (stable), padded with -1."""
    counts = np.bincount(row_of, minlength=rows)
    out = np.full((rows, int(counts.max()) if len(counts) else 0), -1, dtype=np.int64)
    order = np.argsort(row_of, kind="stable")
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    column = np.arange(len(order)) - starts[row_of[order]]
    out[row_of[order], column] = values[order]
    return out


def _image_finder(names: list[str]) -> Callable[[Any, str], int]:
    exact = {n: i for i, n in enumerate(names)}
    stems: dict[str, list[int]] = {}
    for i, n in enumerate(names):
        stems.setdefault(Path(n).stem, []).append(i)

    def find(ref: Any, where: str) -> int:
        if isinstance(ref, bool) or not isinstance(ref, (int, str)):
            raise GroupsFileError(f"{where}: an image is a name (string) or an index (integer), got {ref!r}.")
        if isinstance(ref, int):
            if not 0 <= ref < len(names):
                raise GroupsFileError(f"{where}: image index {ref} is outside the split's {len(names)} images.")
            return ref
        if ref in exact:
            return exact[ref]
        if len(stems.get(ref, [])) == 1:
            return stems[ref][0]
        close = ", ".join(repr(n) for n in names[:3])
        raise GroupsFileError(f"{where}: no image named {ref!r} in the split (names look like {close}, ...).")

    return find


def _cell(value: float | None) -> str:
    """A figure in the table: ``n/a`` where it cannot be computed (None), NaN as ``nan``."""
    return f"{'n/a':>8s}" if value is None else f"{value:8.1f}"


@dataclass
class GroupResult:
    """Group figures, in percent: overall and per kind of difference.

    Each row holds ``t2i``, ``i2t`` (accuracy within the group), ``text``, ``image``, ``group``
    (Winoground scores over the pair groups; None without pairs), their chance levels
    (``t2i_chance``...) and counts (``groups``, ``pairs``, ``queries``).
    """

    overall: dict[str, Any]
    by_kind: dict[str, dict[str, Any]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """Plain data (JSON)."""
        return {"overall": dict(self.overall), "by_kind": {k: dict(v) for k, v in self.by_kind.items()}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GroupResult:
        return cls(dict(data["overall"]), {k: dict(v) for k, v in data.get("by_kind", {}).items()})

    def table(self) -> str:
        """One row per kind of difference, then all groups."""
        head = f"{'kind':14s}{'groups':>7s}" + "".join(f"{f:>8s}" for f in FIGURES)
        rows = [head]
        for name, row in [*sorted(self.by_kind.items()), ("all", self.overall)]:
            rows.append(f"{name:14s}{row['groups']:7d}" + "".join(_cell(row.get(f)) for f in FIGURES))
        rows.append(f"{'chance':14s}{'':7s}" + "".join(_cell(self.overall.get(f + "_chance")) for f in FIGURES))
        if any(row.get(f) is None for row in [self.overall, *self.by_kind.values()] for f in FIGURES):
            rows.append("n/a: no groups of two (pairs) of that kind; the Winoground scores (text, image, group) "
                        "are defined on pairs only.")
        return "\n".join(rows)


def _as_scores(scores: Any) -> np.ndarray:
    if hasattr(scores, "detach"):
        scores = scores.detach().float().cpu().numpy()
    return np.asarray(scores)


def _unit_outcomes(scores: np.ndarray, gs: GroupSet) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per unit (member caption): t2i success and i2t success, and their chance levels."""
    own_image = gs.member_image[gs.unit_member]
    own = scores[own_image, gs.unit_caption]
    group = gs.member_group[gs.unit_member]

    members = gs.group_members[group]  # [U, Gmax]
    valid = (members >= 0) & (members != gs.unit_member[:, None])
    images = gs.member_image[np.where(members >= 0, members, 0)]
    rivals = np.where(valid, scores[images, gs.unit_caption[:, None]], -np.inf)
    t2i = own > rivals.max(axis=1)

    units = gs.group_units[group]  # [U, Umax]: every caption of the group
    safe = np.where(units >= 0, units, 0)
    valid = (units >= 0) & (gs.unit_member[safe] != gs.unit_member[:, None])
    rivals = np.where(valid, scores[own_image[:, None], gs.unit_caption[safe]], -np.inf)
    i2t = own > rivals.max(axis=1)
    return t2i, i2t, 1.0 / (gs.sizes[group]), 1.0 / (1 + valid.sum(axis=1))


def _winoground(scores: np.ndarray, gs: GroupSet) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per pair group: (group indices, text, image, group scores in [0, 1]), each averaged
    over every pairing of a caption of the first image with a caption of the second."""
    pairs = np.flatnonzero(gs.sizes == 2)
    if not len(pairs):
        empty = np.zeros(0)
        return pairs, empty, empty, empty
    a_member, b_member = gs.group_members[pairs, 0], gs.group_members[pairs, 1]
    units = gs.group_units[pairs]  # [P, Umax]
    safe = np.where(units >= 0, units, 0)
    caption, owner = gs.unit_caption[safe], gs.unit_member[safe]
    in_a = (units >= 0) & (owner == a_member[:, None])
    in_b = (units >= 0) & (owner == b_member[:, None])
    img_a, img_b = gs.member_image[a_member][:, None], gs.member_image[b_member][:, None]
    s_aa, s_ba = scores[img_a, caption], scores[img_b, caption]  # image x caption, every slot
    s_ab, s_bb = s_aa, s_ba
    # pairing (k, l): caption k of the first image, caption l of the second
    text = (s_aa[:, :, None] > s_ab[:, None, :]) & (s_bb[:, None, :] > s_ba[:, :, None])
    image = (s_aa[:, :, None] > s_ba[:, :, None]) & (s_bb[:, None, :] > s_ab[:, None, :])
    valid = in_a[:, :, None] & in_b[:, None, :]
    count = valid.sum(axis=(1, 2))

    def mean(x: np.ndarray) -> np.ndarray:
        return (x & valid).sum(axis=(1, 2)) / count

    return pairs, mean(text), mean(image), mean(text & image)


def score_groups(scores: Any, groups: GroupSet) -> GroupResult:
    """Group accuracies and Winoground scores of a score matrix, overall and per kind.

    Args:
        scores: ``[images, captions]`` similarities over the whole split (numpy or torch).
        groups: the split's groups (:class:`GroupSet`).

    Returns:
        A :class:`GroupResult` in percent. ``t2i`` / ``i2t`` average over queries (every
        member caption, every member image-caption pair); the Winoground scores average over
        pair groups (each group weighs the same however many captions it has).

    Example:
        >>> gs = GroupSet([Group((0, 1), "relation")], caption_image=np.array([0, 1]))
        >>> score_groups(np.array([[0.9, 0.2], [0.3, 0.8]]), gs).overall["group"]
        100.0
    """
    scores = _as_scores(scores)
    if groups.member_image.max() >= scores.shape[0] or groups.unit_caption.max() >= scores.shape[1]:
        raise ValueError(
            f"scores are {list(scores.shape)} but the groups refer to image {groups.member_image.max()} and "
            f"caption {groups.unit_caption.max()}; pass the [images, captions] scores of the whole split."
        )
    t2i, i2t, t2i_chance, i2t_chance = _unit_outcomes(scores, groups)
    unit_group = groups.member_group[groups.unit_member]
    pairs, text, image, both = _winoground(scores, groups)
    kinds = np.asarray(groups.kinds)

    def row(selected: np.ndarray) -> dict[str, Any]:
        units = selected[unit_group]
        in_pairs = selected[pairs]
        n_pairs = int(in_pairs.sum())

        def pct(x: np.ndarray) -> float | None:
            return float(100.0 * x.mean()) if len(x) else None

        return {
            "t2i": pct(t2i[units]), "i2t": pct(i2t[units]),
            "text": pct(text[in_pairs]) if n_pairs else None,
            "image": pct(image[in_pairs]) if n_pairs else None,
            "group": pct(both[in_pairs]) if n_pairs else None,
            "t2i_chance": pct(t2i_chance[units]), "i2t_chance": pct(i2t_chance[units]),
            # random scores: each of the two comparisons holds with probability 1/2
            "text_chance": 25.0 if n_pairs else None, "image_chance": 25.0 if n_pairs else None,
            "group_chance": 100.0 / 6 if n_pairs else None,
            # a query is a member's caption (t2i) or a member image with that caption (i2t)
            "groups": int(selected.sum()), "pairs": n_pairs, "queries": int(units.sum()),
        }

    everything = np.ones(len(groups), dtype=bool)
    by_kind = {str(k): row(kinds == k) for k in sorted(set(groups.kinds))}
    return GroupResult(row(everything), by_kind if len(by_kind) > 1 else {})


def dataset_groups(dataset: Any, source: str | os.PathLike | None = None) -> GroupSet:
    """The hard-negative groups of a dataset split: from a JSON file when ``source`` is given,
    else the ones the dataset declares (``dataset.hard_negative_groups()``).

    Raises:
        ValueError: the dataset declares none and no file is given.

    Example:
        >>> dataset_groups(open_dataset("scenes", None, split="test")).kinds[:3]  # generates the scenes benchmark (minutes)  # doctest: +SKIP
        ['size', 'colour', 'colour']
    """
    if source is not None:
        return GroupSet.from_json(source, dataset)
    declare = getattr(dataset, "hard_negative_groups", None)
    if declare is None:
        raise ValueError(
            f"the {type(dataset).__name__} split declares no hard-negative groups; list them in a JSON "
            "file and pass it with --groups FILE (groups=... in Python; format in docs/evaluation.md)."
        )
    found = declare()
    return found if isinstance(found, GroupSet) else GroupSet(list(found), dataset.caption_image)


__all__ = ["FIGURES", "Group", "GroupResult", "GroupSet", "GroupsFileError", "dataset_groups", "score_groups"]
