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
import zlib
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

    def blocks(self, groups_per_block: int = 8) -> list[tuple[np.ndarray, np.ndarray]]:
        """The ``(image indices, caption indices)`` blocks whose scores hold every pair the
        groups read: ``groups_per_block`` neighbouring groups at a time, their member images
        against their captions (:class:`PairScores` reads them back). A block scores a few
        pairs across its groups too: one product of 8 groups costs less than 8 tiny ones.

        Example:
            >>> gs = GroupSet([Group((0, 1)), Group((2, 3))], caption_image=np.repeat(np.arange(4), 2))
            >>> [(i.tolist(), c.tolist()) for i, c in gs.blocks(groups_per_block=1)]
            [([0, 1], [0, 1, 2, 3]), ([2, 3], [4, 5, 6, 7])]
        """
        if groups_per_block < 1:
            raise ValueError(f"groups_per_block must be at least 1, got {groups_per_block}.")
        out = []
        for start in range(0, len(self), groups_per_block):
            members = self.group_members[start : start + groups_per_block]
            units = self.group_units[start : start + groups_per_block]
            out.append((np.unique(self.member_image[members[members >= 0]]),
                        np.unique(self.unit_caption[units[units >= 0]])))
        return out

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


class PairScores:
    """Scores of chosen (image, caption) pairs of a split, read like the ``[images, captions]``
    matrix (``scores[rows, cols]`` with index arrays): what :func:`score_groups` needs without
    scoring every image against every caption.

    Args:
        blocks: ``(image indices, caption indices)`` of each scored block
            (:meth:`GroupSet.blocks`).
        scores: each block's ``[len(images), len(captions)]`` scores.
        shape: ``(images, captions)`` of the whole split.

    Raises:
        KeyError: on reading a pair that no block scored (named).

    Example:
        >>> blocks = [(np.array([0, 1]), np.array([0, 1]))]
        >>> pairs = PairScores(blocks, [np.array([[0.9, 0.2], [0.3, 0.8]])], shape=(4, 4))
        >>> pairs[np.array([1, 0]), np.array([1, 1])]
        array([0.8, 0.2])
    """

    def __init__(self, blocks: Sequence[tuple[np.ndarray, np.ndarray]], scores: Sequence[Any],
                 shape: tuple[int, int]) -> None:
        self.shape = (int(shape[0]), int(shape[1]))
        keys, values = [], []
        for (rows, cols), block in zip(blocks, scores, strict=True):
            rows, cols, block = np.asarray(rows, np.int64), np.asarray(cols, np.int64), _as_scores(block)
            if block.shape != (len(rows), len(cols)):
                raise ValueError(f"a block of {len(rows)} images x {len(cols)} captions has scores of shape {block.shape}.")
            keys.append((rows[:, None] * self.shape[1] + cols[None, :]).ravel())
            values.append(block.ravel())
        keys_all = np.concatenate(keys) if keys else np.zeros(0, np.int64)
        self._keys, first = np.unique(keys_all, return_index=True)
        self._values = (np.concatenate(values) if values else np.zeros(0))[first]

    def __getitem__(self, index: tuple[Any, Any]) -> np.ndarray:
        rows, cols = np.broadcast_arrays(np.asarray(index[0], np.int64), np.asarray(index[1], np.int64))
        keys = rows * self.shape[1] + cols
        at = np.minimum(np.searchsorted(self._keys, keys), max(len(self._keys) - 1, 0))
        found = self._keys[at] == keys if len(self._keys) else np.zeros(keys.shape, bool)
        if not found.all():
            k = np.flatnonzero(~found.ravel())[0]
            raise KeyError(f"image {rows.ravel()[k]} with caption {cols.ravel()[k]} was not scored; "
                           "score the blocks of GroupSet.blocks() or pass the whole matrix.")
        return self._values[at]


def _cell(value: float | None, interval: Sequence[float] | None = None) -> str:
    """A figure in the table: ``n/a`` where it cannot be computed (None), NaN as ``nan``, with
    its interval ``[low, high]`` when there is one."""
    if value is None:
        return "n/a"
    return f"{value:.1f}" if interval is None else f"{value:.1f} [{interval[0]:.1f}, {interval[1]:.1f}]"


@dataclass
class GroupResult:
    """Group figures, in percent: overall and per kind of difference.

    Each row holds ``t2i``, ``i2t`` (accuracy within the group), ``text``, ``image``, ``group``
    (Winoground scores over the pair groups; None without pairs), their bootstrap intervals
    (``t2i_ci``: ``[low, high]``, see ``bootstrap``; absent in results made without them),
    their chance levels (``t2i_chance``...) and counts (``groups``, ``pairs``, ``queries``).

    Attributes:
        overall: the row over all groups.
        by_kind: a row per kind of difference (empty with a single kind).
        bootstrap: how the intervals were made (``resamples``, ``confidence``, ``seed``,
            ``method``); None without intervals.
    """

    overall: dict[str, Any]
    by_kind: dict[str, dict[str, Any]] = field(default_factory=dict)
    bootstrap: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        """Plain data (JSON)."""
        data = {"overall": dict(self.overall), "by_kind": {k: dict(v) for k, v in self.by_kind.items()}}
        if self.bootstrap is not None:
            data["bootstrap"] = dict(self.bootstrap)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GroupResult:
        """A result from :meth:`as_dict`'s data (results written before the intervals load
        without them)."""
        bootstrap = data.get("bootstrap")
        return cls(dict(data["overall"]), {k: dict(v) for k, v in data.get("by_kind", {}).items()},
                   None if bootstrap is None else dict(bootstrap))

    def table(self) -> str:
        """One row per kind of difference, then all groups, then chance; each figure with its
        bootstrap interval ``[low, high]`` when computed."""
        rows = [["kind", "groups", *FIGURES]]
        for name, row in [*sorted(self.by_kind.items()), ("all", self.overall)]:
            rows.append([name, str(row["groups"]), *(_cell(row.get(f), row.get(f"{f}_ci")) for f in FIGURES)])
        rows.append(["chance", "", *(_cell(self.overall.get(f + "_chance")) for f in FIGURES)])
        widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
        lines = ["  ".join(c.ljust(w) if k == 0 else c.rjust(w) for k, (c, w) in enumerate(zip(r, widths))) for r in rows]
        if any(row.get(f) is None for row in [self.overall, *self.by_kind.values()] for f in FIGURES):
            lines.append("n/a: no groups of two (pairs) of that kind; the Winoground scores (text, image, group) "
                         "are defined on pairs only.")
        if self.bootstrap is not None:
            b = self.bootstrap
            lines.append(f"[low, high]: {100 * b['confidence']:g}% bootstrap interval ({b['resamples']} resamples of "
                         f"the groups with replacement, a kind's within the kind; seed {b['seed']}).")
        return "\n".join(lines)


def _as_scores(scores: Any) -> np.ndarray | PairScores:
    if isinstance(scores, PairScores):
        return scores
    if hasattr(scores, "detach"):
        scores = scores.detach().float().cpu().numpy()
    return np.asarray(scores)


def _unit_outcomes(
    scores: np.ndarray, gs: GroupSet, i2t_scores: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per unit (member caption): t2i success (by ``scores``) and i2t success (by
    ``i2t_scores``), and their chance levels."""
    own_image = gs.member_image[gs.unit_member]
    own = scores[own_image, gs.unit_caption]
    group = gs.member_group[gs.unit_member]

    # padded slots read the unit's own pair (masked out below): every pair read lies within a
    # group, so scores of the groups' pairs only (PairScores) suffice
    members = gs.group_members[group]  # [U, Gmax]
    valid = (members >= 0) & (members != gs.unit_member[:, None])
    images = gs.member_image[np.where(members >= 0, members, gs.unit_member[:, None])]
    rivals = np.where(valid, scores[images, gs.unit_caption[:, None]], -np.inf)
    t2i = own > rivals.max(axis=1)

    units = gs.group_units[group]  # [U, Umax]: every caption of the group
    safe = np.where(units >= 0, units, np.arange(len(units))[:, None])
    valid = (units >= 0) & (gs.unit_member[safe] != gs.unit_member[:, None])
    rivals = np.where(valid, i2t_scores[own_image[:, None], gs.unit_caption[safe]], -np.inf)
    i2t = i2t_scores[own_image, gs.unit_caption] > rivals.max(axis=1)
    return t2i, i2t, 1.0 / (gs.sizes[group]), 1.0 / (1 + valid.sum(axis=1))


def _winoground(
    scores: np.ndarray, gs: GroupSet, i2t_scores: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per pair group: (group indices, text, image, group scores in [0, 1]), each averaged
    over every pairing of a caption of the first image with a caption of the second; ``text``
    (an image prefers its caption) reads ``i2t_scores``, ``image`` reads ``scores``."""
    pairs = np.flatnonzero(gs.sizes == 2)
    if not len(pairs):
        empty = np.zeros(0)
        return pairs, empty, empty, empty
    a_member, b_member = gs.group_members[pairs, 0], gs.group_members[pairs, 1]
    units = gs.group_units[pairs]  # [P, Umax]
    safe = np.where(units >= 0, units, units[:, :1])  # padding reads the group's first caption (masked out)
    caption, owner = gs.unit_caption[safe], gs.unit_member[safe]
    in_a = (units >= 0) & (owner == a_member[:, None])
    in_b = (units >= 0) & (owner == b_member[:, None])
    img_a, img_b = gs.member_image[a_member][:, None], gs.member_image[b_member][:, None]
    s_aa, s_ba = scores[img_a, caption], scores[img_b, caption]  # image x caption, every slot
    s_ab, s_bb = s_aa, s_ba
    # pairing (k, l): caption k of the first image, caption l of the second
    r_aa, r_ba = i2t_scores[img_a, caption], i2t_scores[img_b, caption]
    text = (r_aa[:, :, None] > r_aa[:, None, :]) & (r_ba[:, None, :] > r_ba[:, :, None])
    image = (s_aa[:, :, None] > s_ba[:, :, None]) & (s_bb[:, None, :] > s_ab[:, None, :])
    valid = in_a[:, :, None] & in_b[:, None, :]
    count = valid.sum(axis=(1, 2))

    def mean(x: np.ndarray) -> np.ndarray:
        return (x & valid).sum(axis=(1, 2)) / count

    return pairs, mean(text), mean(image), mean(text & image)


#: bootstrap resamples of :func:`score_groups`' intervals, by default
RESAMPLES = 1000
#: resample x group cells drawn at once (bounds the bootstrap's memory for large group sets)
BOOTSTRAP_CELLS = 1 << 22


def score_groups(
    scores: Any,
    groups: GroupSet,
    *,
    resamples: int = RESAMPLES,
    confidence: float = 0.95,
    seed: int = 0,
    i2t_scores: Any = None,
) -> GroupResult:
    """Group accuracies and Winoground scores of a score matrix, overall and per kind, each
    with a percentile bootstrap interval over the groups.

    Args:
        scores: ``[images, captions]`` similarities over the whole split (numpy or torch), or
            :class:`PairScores` holding at least the pairs within each group.
        groups: the split's groups (:class:`GroupSet`).
        resamples: bootstrap resamples (0: no intervals).
        confidence: the intervals' coverage (0.95: the 2.5th to the 97.5th percentile).
        seed: the resampling seed; the same seed gives the same intervals.
        i2t_scores: the scores that the image-to-text comparisons read (``i2t``, Winoground's
            ``text``), when they differ from ``scores`` (re-ranked per direction); default ``scores``.

    Returns:
        A :class:`GroupResult` in percent. ``t2i`` / ``i2t`` average over queries (every
        member caption, every member image-caption pair); the Winoground scores average over
        pair groups (each group weighs the same however many captions it has). A figure's
        interval (``t2i_ci``...) resamples the row's groups with replacement (a kind's within
        the kind, ``all`` over every group), ``resamples`` times, and takes the percentiles
        of the figure recomputed on each resample: queries stay with their group, so the
        captions of one group, which succeed or fail together, are not counted as independent.

    Example:
        >>> gs = GroupSet([Group((0, 1), "relation")], caption_image=np.array([0, 1]))
        >>> score_groups(np.array([[0.9, 0.2], [0.3, 0.8]]), gs).overall["group"]
        100.0
    """
    if resamples < 0:
        raise ValueError(f"resamples must be 0 (no intervals) or more, got {resamples}.")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie between 0 and 1 (e.g. 0.95), got {confidence}.")
    scores = _as_scores(scores)
    if groups.member_image.max() >= scores.shape[0] or groups.unit_caption.max() >= scores.shape[1]:
        raise ValueError(
            f"scores are {list(scores.shape)} but the groups refer to image {groups.member_image.max()} and "
            f"caption {groups.unit_caption.max()}; pass the [images, captions] scores of the whole split."
        )
    i2t_scores = scores if i2t_scores is None else _as_scores(i2t_scores)
    if i2t_scores.shape != scores.shape:
        raise ValueError(
            f"i2t_scores are {list(i2t_scores.shape)} but scores are {list(scores.shape)}; give both for the same split."
        )
    t2i, i2t, t2i_chance, i2t_chance = _unit_outcomes(scores, groups, i2t_scores)
    unit_group = groups.member_group[groups.unit_member]
    pairs, text, image, both = _winoground(scores, groups, i2t_scores)
    kinds = np.asarray(groups.kinds)
    # per group: sums and counts of each figure's outcomes, what a resample of groups adds up
    n = len(groups)
    is_pair = np.zeros(n)
    is_pair[pairs] = 1.0
    per_pair = np.zeros((3, n))
    per_pair[:, pairs] = [text, image, both]
    queries = np.bincount(unit_group, minlength=n).astype(np.float64)
    sums = np.stack([np.bincount(unit_group, t2i, n), np.bincount(unit_group, i2t, n), *per_pair])
    counts = np.stack([queries, queries, is_pair, is_pair, is_pair])

    def row(selected: np.ndarray, name: str) -> dict[str, Any]:
        units = selected[unit_group]
        in_pairs = selected[pairs]
        n_pairs = int(in_pairs.sum())

        def pct(x: np.ndarray) -> float | None:
            return float(100.0 * x.mean()) if len(x) else None

        figures = {
            "t2i": pct(t2i[units]), "i2t": pct(i2t[units]),
            "text": pct(text[in_pairs]) if n_pairs else None,
            "image": pct(image[in_pairs]) if n_pairs else None,
            "group": pct(both[in_pairs]) if n_pairs else None,
        }
        if resamples:
            rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
            low, high = _bootstrap(sums[:, selected], counts[:, selected], resamples, confidence, rng)
            figures |= {f"{f}_ci": None if figures[f] is None else [float(low[k]), float(high[k])]
                        for k, f in enumerate(FIGURES)}
        return {
            **figures,
            "t2i_chance": pct(t2i_chance[units]), "i2t_chance": pct(i2t_chance[units]),
            # random scores: each of the two comparisons holds with probability 1/2
            "text_chance": 25.0 if n_pairs else None, "image_chance": 25.0 if n_pairs else None,
            "group_chance": 100.0 / 6 if n_pairs else None,
            # a query is a member's caption (t2i) or a member image with that caption (i2t)
            "groups": int(selected.sum()), "pairs": n_pairs, "queries": int(units.sum()),
        }

    everything = np.ones(n, dtype=bool)
    by_kind = {str(k): row(kinds == k, str(k)) for k in sorted(set(groups.kinds))}
    bootstrap = None
    if resamples:
        bootstrap = {"resamples": resamples, "confidence": confidence, "seed": seed,
                     "method": "percentile; groups resampled with replacement (per kind within the kind)"}
    return GroupResult(row(everything, "all"), by_kind if len(by_kind) > 1 else {}, bootstrap)


def _bootstrap(sums: np.ndarray, counts: np.ndarray, resamples: int, confidence: float,
               rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Percentile interval of each figure ``sum(sums[f]) / sum(counts[f])`` (in percent) over
    ``resamples`` draws of the groups (the columns) with replacement: ``(low [F], high [F])``;
    NaN where no resample has a count (a figure without pairs)."""
    n = sums.shape[1]
    stats = np.empty((resamples, len(sums)))
    step = max(1, BOOTSTRAP_CELLS // n)
    for start in range(0, resamples, step):
        b = min(step, resamples - start)
        draws = rng.integers(0, n, size=(b, n)) + (np.arange(b) * n)[:, None]
        times = np.bincount(draws.ravel(), minlength=b * n).reshape(b, n).astype(np.float64)  # [b, groups]
        with np.errstate(invalid="ignore", divide="ignore"):
            stats[start : start + b] = 100.0 * (times @ sums.T) / (times @ counts.T)
    tail = 50.0 * (1 - confidence)
    low, high = np.full(len(sums), np.nan), np.full(len(sums), np.nan)
    defined = ~np.isnan(stats).all(axis=0)  # a resample without pairs has no Winoground score: left out
    if defined.any():
        low[defined], high[defined] = np.nanpercentile(stats[:, defined], [tail, 100 - tail], axis=0)
    return low, high


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


__all__ = [
    "FIGURES", "Group", "GroupResult", "GroupSet", "GroupsFileError", "PairScores", "dataset_groups", "score_groups",
]
