"""Proposers without weights: a regular grid and multi-scale sliding windows.

Grid features (Jiang et al., "In Defense of Grid Features for Visual Question Answering",
CVPR 2020) showed that a CNN's grid cells do as well as detector regions for VQA; ``grid``
pools the backbone's map over the cells of a ``k x k`` grid of the whole image. ``windows``
is the classic multi-scale sliding window: the whole image, then overlapping windows of half,
a third, a quarter... of its sides, coarse to fine, which covers objects of most sizes
without a detector.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from xmatch.regions.proposals import ImageInfo, Proposals, Proposer, level_boxes, spread


class GridProposer(Proposer):
    """The cells of a ``k x k`` grid over the whole image, ``k = floor(sqrt(regions))``, row by
    row (6 x 6 = 36 cells by default); every cell scores 1.

    Args:
        regions: at most this many boxes; the grid is the largest square one that fits.

    Example:
        >>> p = GridProposer(regions=4)([ImageInfo(width=64, height=32)])[0]
        >>> p.boxes.tolist()
        [[0.0, 0.0, 32.0, 16.0], [32.0, 0.0, 64.0, 16.0], [0.0, 16.0, 32.0, 32.0], [32.0, 16.0, 64.0, 32.0]]
    """

    def __init__(self, regions: int = 36) -> None:
        super().__init__()
        if not isinstance(regions, int) or regions < 1:
            raise ValueError(f"regions must be a positive number of boxes per image, got {regions!r}.")
        self.regions = regions
        self.side = math.isqrt(regions)

    def forward(self, images: Sequence[ImageInfo]) -> list[Proposals]:
        out = []
        for info in images:
            boxes = level_boxes(info.width, info.height, 1 / self.side, 1 / self.side).float()
            out.append(Proposals(boxes, torch.ones(len(boxes))))
        return out


class WindowsProposer(Proposer):
    """Multi-scale sliding windows: for each scale ``s`` (a fraction of the image's width and
    height) windows ``s`` wide and high, shifted by ``s * (1 - overlap)``, spread evenly from
    edge to edge; levels in the order given, the first ``regions`` windows kept (a level that
    does not fit whole is thinned out evenly). A window scores its scale.

    With the defaults (scales 1, 1/2, 1/3, 1/4, overlap 0.5) the levels hold 1, 9, 25 and 49
    windows: 36 regions are the whole image, the 9 half-size and 25 third-size windows, and
    the centre quarter-size window.

    Args:
        regions: boxes per image.
        scales: window sides as fractions of the image's sides, in (0, 1].
        overlap: fraction of a window shared with its neighbour, in [0, 1).

    Example:
        >>> p = WindowsProposer(regions=10)([ImageInfo(width=100, height=100)])[0]
        >>> len(p), p.boxes[0].tolist(), p.boxes[1].tolist()
        (10, [0.0, 0.0, 100.0, 100.0], [0.0, 0.0, 50.0, 50.0])
    """

    def __init__(
        self,
        regions: int = 36,
        scales: Sequence[float] = (1.0, 1 / 2, 1 / 3, 1 / 4),
        overlap: float = 0.5,
    ) -> None:
        super().__init__()
        if not isinstance(regions, int) or regions < 1:
            raise ValueError(f"regions must be a positive number of boxes per image, got {regions!r}.")
        scales = [float(s) for s in scales]
        if not scales or any(not 0 < s <= 1 for s in scales):
            raise ValueError(f"scales must be fractions of the image side in (0, 1], got {scales}.")
        if not 0 <= overlap < 1:
            raise ValueError(f"overlap must be in [0, 1), got {overlap}.")
        self.regions = regions
        self.scales = scales
        self.overlap = float(overlap)

    def forward(self, images: Sequence[ImageInfo]) -> list[Proposals]:
        out = []
        for info in images:
            boxes, scores, have = [], [], 0
            for s in self.scales:
                if have >= self.regions:
                    break
                level = level_boxes(info.width, info.height, s, s * (1 - self.overlap))
                level = level[spread(self.regions - have, len(level))]
                boxes.append(level)
                scores.append(torch.full((len(level),), s))
                have += len(level)
            out.append(Proposals(torch.cat(boxes).float(), torch.cat(scores).float()))
        return out
