"""Seeded, resumable, distributed batch order.

Epoch ``e`` visits the captions in the order of a permutation drawn from ``(seed, e)`` alone,
cut into global batches; process ``r`` of ``N`` takes the ``r``-th share of every global batch.
The order is therefore the same for any number of processes and any restart point: a resumed
run skips the batches it has done and sees exactly the batches an uninterrupted run would.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np


class EpochBatches:
    """Batches of caption indices for one process.

    Args:
        size: number of training items.
        batch_size: the global batch (over all processes).
        seed: with the epoch, fixes the order.
        shuffle: draw a permutation per epoch (False: dataset order).
        drop_last: skip the last, smaller global batch.
        rank, world_size: this process and the number of processes.
        units: items that are visited together, next to each other (e.g. the captions of a
            hard-negative group's images, :func:`group_units`): the permutation shuffles the
            units, and every item is in exactly one unit. None: every item on its own.

    Example:
        >>> batches = EpochBatches(10, 4, seed=0)
        >>> [len(b) for b in batches.epoch(0)]
        [4, 4, 2]
        >>> list(batches.epoch(0, start=2)) == list(batches.epoch(0))[2:]
        True
    """

    def __init__(
        self,
        size: int,
        batch_size: int,
        seed: int = 0,
        *,
        shuffle: bool = True,
        drop_last: bool = False,
        rank: int = 0,
        world_size: int = 1,
        units: list[list[int]] | None = None,
    ) -> None:
        if size < 1:
            raise ValueError("the training set is empty.")
        if batch_size < world_size:
            raise ValueError(
                f"batch_size {batch_size} is smaller than the {world_size} processes; every process "
                "needs at least one pair per batch (batch_size is the global batch)."
            )
        if units is not None:
            flat = np.concatenate([np.asarray(u, dtype=np.int64) for u in units]) if units else np.zeros(0, np.int64)
            if len(flat) != size or not np.array_equal(np.sort(flat), np.arange(size)):
                raise ValueError(f"units must hold every one of the {size} items exactly once.")
        self.units = units
        self.size = size
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.rank = rank
        self.world_size = world_size
        full, rest = divmod(size, batch_size)
        # a last batch smaller than the number of processes would leave a process without pairs
        self.drop_last = drop_last or (0 < rest < world_size)
        self.batches_per_epoch = full + (1 if rest and not self.drop_last else 0)
        if self.batches_per_epoch == 0:
            raise ValueError(f"{size} training pairs do not fill one batch of {batch_size} (drop_last).")

    def order(self, epoch: int) -> np.ndarray:
        """The global visiting order of epoch ``epoch``."""
        if not self.shuffle:
            return np.arange(self.size)
        if self.units is None:
            return np.random.default_rng([self.seed, epoch]).permutation(self.size)
        order = np.random.default_rng([self.seed, epoch]).permutation(len(self.units))
        return np.concatenate([np.asarray(self.units[k], dtype=np.int64) for k in order])

    def epoch(self, epoch: int, start: int = 0) -> Iterator[list[int]]:
        """This process's share of global batches ``start, start + 1, ...`` of ``epoch``."""
        order = self.order(epoch)
        for b in range(start, self.batches_per_epoch):
            batch = order[b * self.batch_size : (b + 1) * self.batch_size]
            yield np.array_split(batch, self.world_size)[self.rank].tolist()

    def __len__(self) -> int:
        return self.batches_per_epoch


def group_units(caption_image: np.ndarray, groups: list[tuple[int, ...]]) -> list[list[int]]:
    """Units of :class:`EpochBatches` that put each hard-negative group's captions side by
    side: the k-th caption of every member image of a group forms one unit (a group of two
    images with five captions each gives five units of two); captions of images in no group
    are units of one. An image in several groups joins only the first.

    Example:
        >>> group_units(np.array([0, 0, 1, 1, 2]), [(0, 1)])
        [[0, 2], [1, 3], [4]]
    """
    captions_of: dict[int, list[int]] = {}
    for caption, image in enumerate(np.asarray(caption_image).tolist()):
        captions_of.setdefault(int(image), []).append(caption)
    units: list[list[int]] = []
    placed: set[int] = set()
    for members in groups:
        members = [m for m in members if m not in placed and m in captions_of]
        if len(members) < 2:
            continue
        placed.update(members)
        lists = [captions_of[m] for m in members]
        for k in range(max(map(len, lists))):
            units.append([c[k] for c in lists if k < len(c)])
    units += [[c] for image, captions in captions_of.items() if image not in placed for c in captions]
    return sorted(units, key=lambda u: u[0])


class _EpochSampler:
    """A ``batch_sampler`` for DataLoader over one epoch from a start batch."""

    def __init__(self, batches: EpochBatches, epoch: int, start: int) -> None:
        self.batches, self.epoch_index, self.start = batches, epoch, start

    def __iter__(self) -> Iterator[list[int]]:
        return self.batches.epoch(self.epoch_index, self.start)

    def __len__(self) -> int:
        return len(self.batches) - self.start


def epoch_sampler(batches: EpochBatches, epoch: int, start: int = 0) -> _EpochSampler:
    """The DataLoader ``batch_sampler`` of ``epoch`` from batch ``start``."""
    return _EpochSampler(batches, epoch, start)
