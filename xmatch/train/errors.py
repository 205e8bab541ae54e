"""The trainer's errors (a module of their own so that every part of training can raise them)."""

from __future__ import annotations

from xmatch.core.errors import XmatchError


class TrainingError(XmatchError, RuntimeError):
    """Training cannot go on; the message says why and what to change."""


class NonFiniteLossError(TrainingError):
    """The loss became NaN or infinite; nothing of the step was applied or saved.

    Attributes:
        step: the optimizer step that failed (0-based count of steps done before it).
        epoch: its epoch.
        caption_indices: the dataset indices of this process's pairs in the failing batch.
    """

    def __init__(self, message: str, step: int, epoch: int, caption_indices: list[int]) -> None:
        super().__init__(message)
        self.step, self.epoch, self.caption_indices = step, epoch, caption_indices
