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
    ) -> None:
        if size < 1:
            raise ValueError("the training set is empty.")
        if batch_size < world_size:
            raise ValueError(
                f"batch_size {batch_size} is smaller than the {world_size} processes; every process "
                "needs at least one pair per batch (batch_size is the global batch)."
            )
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
        return np.random.default_rng([self.seed, epoch]).permutation(self.size)

    def epoch(self, epoch: int, start: int = 0) -> Iterator[list[int]]:
        """This process's share of global batches ``start, start + 1, ...`` of ``epoch``."""
        order = self.order(epoch)
        for b in range(start, self.batches_per_epoch):
            batch = order[b * self.batch_size : (b + 1) * self.batch_size]
            yield np.array_split(batch, self.world_size)[self.rank].tolist()

    def __len__(self) -> int:
        return self.batches_per_epoch


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
