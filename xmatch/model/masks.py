"""Vectorised helpers for padded sets and their boolean masks (``True`` = real element)."""

from __future__ import annotations

import torch


def lengths_to_mask(lengths: torch.Tensor, width: int | None = None) -> torch.Tensor:
    """Boolean mask ``[B, width]`` that is True below each length.

    Example:
        >>> lengths_to_mask(torch.tensor([1, 3]))
        tensor([[ True, False, False],
                [ True,  True,  True]])
    """
    lengths = torch.as_tensor(lengths)
    if width is None:
        width = int(lengths.max()) if lengths.numel() else 0
    positions = torch.arange(width, device=lengths.device)
    return positions.unsqueeze(0) < lengths.unsqueeze(1)


def last_true_mask(mask: torch.Tensor) -> torch.Tensor:
    """Mask of the last True position of every row (rows without True give none).

    Example:
        >>> last_true_mask(torch.tensor([[True, True, False]]))
        tensor([[False,  True, False]])
    """
    lengths = mask.sum(dim=1, keepdim=True)
    positions = torch.cumsum(mask.long(), dim=1)
    return mask & (positions == lengths)


def pad_stack(tensors: list[torch.Tensor], value: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad a list of ``[n_i, ...]`` tensors to ``[B, max n_i, ...]`` and return it with its mask."""
    lengths = torch.tensor([t.shape[0] for t in tensors], device=tensors[0].device)
    padded = torch.nn.utils.rnn.pad_sequence(tensors, batch_first=True, padding_value=value)
    return padded, lengths_to_mask(lengths, padded.shape[1])
