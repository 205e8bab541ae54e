"""Region proposals: the record every proposer returns, the proposer interface, and the rule
that turns raw candidate boxes into a bounded, padded set.

Bottom-up attention (Anderson et al., "Bottom-Up and Top-Down Attention for Image Captioning
and Visual Question Answering", CVPR 2018) keeps a detector's boxes above a confidence
threshold, at most 100 and at least 10 per image (or exactly 36 in the fixed-size release).
:func:`select_and_pad` is that rule for any proposer: the ``regions`` best-scoring boxes, and
when fewer than ``min_regions`` survive, the whole image and the cells of ever finer grids
(:func:`pyramid_boxes`) fill the set up.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

#: boxes narrower or lower than this (pixels) are dropped: RoI pooling cannot see them
MIN_SIDE = 1.0


@dataclass
class ImageInfo:
    """What a proposer may look at for one image.

    Attributes:
        width, height: the image's size in pixels (boxes are in this frame).
        name: the image's path relative to the image folder (``"dogs/rex.jpg"``), or the path
            as the user gave it; None for an in-memory picture. The ``boxes`` proposer finds
            an image's boxes by it.
        image: the RGB picture, for proposers that look at pixels (``needs_pixels``).
    """

    width: int
    height: int
    name: str | None = None
    image: Any = None


@dataclass
class Proposals:
    """Boxes of one image, best first.

    Attributes:
        boxes: ``[N, 4]`` float32 pixel boxes ``x1, y1, x2, y2`` inside the image.
        scores: ``[N]`` float32, non-increasing (padding boxes score 0).

    Example:
        >>> p = Proposals(torch.tensor([[0., 0., 10., 10.]]), torch.tensor([1.0]))
        >>> len(p)
        1
    """

    boxes: torch.Tensor
    scores: torch.Tensor

    def __len__(self) -> int:
        return int(self.boxes.shape[0])


class Proposer(nn.Module):
    """Proposes up to ``regions`` pixel boxes per image, each with a score.

    Subclasses implement :meth:`forward`; a proposer with weights (a detector) is an
    ``nn.Module`` so that it moves with ``.to(device)``. ``needs_pixels`` tells the extraction
    whether to hand it the decoded picture (otherwise only sizes and names).

    Register one with ``@xmatch.register_proposer("name")`` or the entry-point group
    ``xmatch_proposers``.
    """

    needs_pixels: bool = False
    regions: int

    def forward(self, images: Sequence[ImageInfo]) -> list[Proposals]:  # pragma: no cover - interface
        raise NotImplementedError(f"{type(self).__name__} must implement forward()")


def check_counts(regions: int, min_regions: int | None) -> int:
    """Validate ``regions`` / ``min_regions`` and return the minimum (default: ``regions``)."""
    if not isinstance(regions, int) or regions < 1:
        raise ValueError(f"regions must be a positive number of boxes per image, got {regions!r}.")
    low = regions if min_regions is None else min_regions
    if not isinstance(low, int) or not 1 <= low <= regions:
        raise ValueError(f"min_regions must be between 1 and regions={regions}, got {min_regions!r}.")
    return low


def level_boxes(width: float, height: float, side: float, stride: float) -> torch.Tensor:
    """Windows of ``side`` x ``side`` (fractions of the image) every ``stride``, row by row,
    spread evenly so the first starts at 0 and the last ends at 1; pixel boxes ``[k*k, 4]``.

    Example:
        >>> level_boxes(100, 50, 0.5, 0.5).tolist()
        [[0.0, 0.0, 50.0, 25.0], [50.0, 0.0, 100.0, 25.0], [0.0, 25.0, 50.0, 50.0], [50.0, 25.0, 100.0, 50.0]]
    """
    steps = max(1, math.ceil((1 - side) / stride - 1e-9) + 1)
    starts = torch.linspace(0, 1 - side, steps, dtype=torch.float64) if steps > 1 else torch.zeros(1, dtype=torch.float64)
    y, x = torch.meshgrid(starts, starts, indexing="ij")
    x, y = x.reshape(-1), y.reshape(-1)
    return torch.stack([x * width, y * height, (x + side) * width, (y + side) * height], dim=1)


def spread(count: int, available: int) -> torch.Tensor:
    """``count`` indices spread evenly over ``range(available)``: the middle one of each of
    ``count`` equal stretches (a level that does not fit whole is thinned out evenly rather
    than cut off at the bottom; a single window is the centre one).

    Example:
        >>> spread(1, 9).tolist(), spread(3, 9).tolist()
        ([4], [1, 4, 7])
    """
    if count >= available:
        return torch.arange(available)
    return ((torch.arange(count, dtype=torch.float64) + 0.5) * available / count).floor().long()


def pyramid_boxes(width: float, height: float, count: int) -> torch.Tensor:
    """The whole image, then the cells of a 2 x 2, 3 x 3, ... grid, coarse to fine, until
    ``count`` boxes (the last grid thinned out evenly): ``[count, 4]`` float32 pixels.

    Example:
        >>> pyramid_boxes(64, 32, 3).tolist()  # the whole image, 2 of the 4 cells of the 2 x 2 grid
        [[0.0, 0.0, 64.0, 32.0], [32.0, 0.0, 64.0, 16.0], [32.0, 16.0, 64.0, 32.0]]
    """
    parts, have, k = [], 0, 1
    while have < count:
        level = level_boxes(width, height, 1 / k, 1 / k)
        keep = spread(count - have, len(level))
        parts.append(level[keep])
        have += len(keep)
        k += 1
    return torch.cat(parts).float() if parts else torch.zeros(0, 4)


def clip_boxes(boxes: torch.Tensor, width: float, height: float) -> torch.Tensor:
    """Pixel boxes clipped into the image."""
    limit = boxes.new_tensor([width, height, width, height])
    return torch.minimum(boxes.clamp(min=0), limit)


def select_and_pad(
    boxes: torch.Tensor,
    scores: torch.Tensor | None,
    width: float,
    height: float,
    regions: int,
    min_regions: int,
) -> Proposals:
    """The bottom-up rule: clip candidate boxes into the image, drop degenerate ones, keep the
    ``regions`` best (a stable sort: equal scores keep their order; no scores = the given
    order), and pad up to ``min_regions`` with :func:`pyramid_boxes` (score 0, skipping boxes
    already present).

    Example:
        >>> p = select_and_pad(torch.tensor([[5., 5., 20., 20.]]), torch.tensor([0.5]), 40, 40, 36, 3)
        >>> p.boxes.tolist(), p.scores.tolist()
        ([[5.0, 5.0, 20.0, 20.0], [0.0, 0.0, 40.0, 40.0], [0.0, 0.0, 20.0, 20.0]], [0.5, 0.0, 0.0])
    """
    boxes = clip_boxes(boxes.detach().float().cpu().reshape(-1, 4), width, height)
    scores = (
        torch.ones(len(boxes)) if scores is None else scores.detach().float().cpu().reshape(-1)
    )
    if len(scores) != len(boxes):
        raise ValueError(f"{len(boxes)} boxes but {len(scores)} scores; give one score per box.")
    ok = ((boxes[:, 2] - boxes[:, 0]) >= MIN_SIDE) & ((boxes[:, 3] - boxes[:, 1]) >= MIN_SIDE) & torch.isfinite(scores)
    boxes, scores = boxes[ok], scores[ok]
    order = torch.sort(scores, descending=True, stable=True).indices[:regions]
    boxes, scores = boxes[order], scores[order]
    if len(boxes) < min_regions:
        # more candidates than needed, so that dropping duplicates still leaves enough
        pad = pyramid_boxes(width, height, min_regions + len(boxes))
        fresh = ~(pad[:, None, :] == boxes[None, :, :]).all(-1).any(-1) if len(boxes) else torch.ones(len(pad), dtype=torch.bool)
        pad = pad[fresh][: min_regions - len(boxes)]
        boxes = torch.cat([boxes, pad])
        scores = torch.cat([scores, torch.zeros(len(pad))])
    return Proposals(boxes.contiguous(), scores.contiguous())
