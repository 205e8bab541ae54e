"""Object-like region proposals without a detector: selective search over Felzenszwalb segments.

Selective search (Uijlings, van de Sande, Gevers and Smeulders, "Selective Search for Object
Recognition", IJCV 2013) over-segments the picture with Felzenszwalb and Huttenlocher's graph
method ("Efficient Graph-Based Image Segmentation", IJCV 2004; scikit-image's
``skimage.segmentation.felzenszwalb``), then merges the two most similar adjacent regions
until one is left; every region of that hierarchy (the segments and each merge) is a candidate
box. Similarity is the paper's sum of colour-histogram intersection, texture-histogram
intersection, size (small regions merge first) and fill (regions whose union fills its box).

The paper ranks boxes by their level in the hierarchy times a random number and keeps
thousands; a region model keeps 36, and level ranking puts the big merged regions first, so
small objects lose their box. :class:`SelectiveSearchProposer` ranks by default by
*contrast* instead: the mean-colour distance between a region and the regions around it,
averaged along its border, plus the distance to the ring around its box (centre-surround, as
objectness measures do), weighted by the log of its size. It is high for a region that stands
out from all of its surroundings (an object) and low for a piece of background or an object
with a piece of background attached. The paper's ranking is there as ``ranking="hierarchy"``.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from xmatch.regions.proposals import ImageInfo, Proposals, Proposer, check_counts, select_and_pad

#: the paper's similarity measures, summed (each in [0, 1])
STRATEGIES = ("colour", "texture", "size", "fill")
#: how the hierarchy's boxes are ordered before the first ``regions`` are kept
RANKINGS = ("contrast", "hierarchy")
#: colour histogram bins per channel (the paper's 25)
COLOUR_BINS = 25
#: texture stand-in: gradient orientations (the paper's 8) x gradient magnitude bins, on grey
ORIENTATIONS = 8
MAGNITUDE_EDGES = np.array([4.0, 16.0, 48.0])
#: the contrast ranking's ring around a box: the box grown by this fraction of its sides
SURROUND = 0.5


class SelectiveSearchProposer(Proposer):
    """Selective search boxes (Uijlings et al. 2013) from Felzenszwalb segments, bottom-up style:
    the ``regions`` best, padded with the whole image and grid cells up to ``min_regions``
    (:func:`~xmatch.regions.proposals.select_and_pad`).

    The picture is segmented at ``segment_side`` pixels on its longer side (it is never
    enlarged) and the boxes are scaled back to its own frame. Every region of the merge
    hierarchy is a candidate; a candidate overlapping an already kept box by more than
    ``duplicate_iou`` is dropped. The picture's whole box (the hierarchy's last region) always
    comes first.

    The defaults (``scale=300``, ``sigma=0.5``, ``duplicate_iou=0.6``, the contrast ranking)
    were chosen on scenes objects of 16-40 px pasted onto photo backgrounds
    (``benchmarks/proposer_recall.py``, ``clutter`` set): 93 % of the objects get a box of IoU
    >= 0.5 among the 36 (also on the pictures not used for choosing), against 63 % with the
    paper's ranking over the same hierarchy and none with ``windows``.

    Args:
        regions: at most this many boxes per image (36 as the fixed bottom-up set).
        min_regions: at least this many (default ``regions``: a fixed count); missing ones are
            the whole image and grid cells, scoring 0.
        scale: Felzenszwalb's ``k`` (larger: fewer, larger segments).
        sigma: Gaussian smoothing before segmenting, in pixels of the segmented picture.
        min_size: smallest segment, in pixels of the segmented picture; an object smaller than
            this cannot get its own box.
        segment_side: the longer side the picture is shrunk to for segmenting (speed); small
            objects need it high enough to keep a few pixels across.
        strategies: the similarity measures summed when choosing the next merge, any of
            ``colour``, ``texture`` (a stand-in for the paper's Gaussian-derivative
            histograms: a histogram of gradient orientation x magnitude), ``size``, ``fill``.
        ranking: ``"contrast"`` (regions that differ most in mean colour from the regions
            along their border and from the ring around their box first, the sum weighted by
            the log of their size) or ``"hierarchy"`` (the paper's: level in the hierarchy times
            a random number in [0, 1], seeded).
        duplicate_iou: a box overlapping a better one by more than this is dropped.
        seed: seed of the ``hierarchy`` ranking's random numbers (the same picture gives the
            same boxes).
        proposals: at most this many of selective search's own boxes (its best; default:
            ``regions``); the others up to ``min_regions`` are the whole image and grid cells,
            so a set holds a few object-like boxes and the picture's context at fixed places.

    Example:
        >>> from PIL import Image
        >>> picture = Image.new("RGB", (96, 64), (128, 128, 128))
        >>> picture.paste((220, 40, 40), (10, 20, 30, 40))  # a red square
        >>> p = SelectiveSearchProposer(regions=4)([ImageInfo(96, 64, image=picture)])[0]
        >>> p.boxes[:2].tolist()  # the whole picture, then the square
        [[0.0, 0.0, 96.0, 64.0], [10.0, 20.0, 30.0, 40.0]]
    """

    needs_pixels = True

    def __init__(
        self,
        regions: int = 36,
        min_regions: int | None = None,
        scale: float = 300.0,
        sigma: float = 0.5,
        min_size: int = 20,
        segment_side: int = 224,
        strategies: Sequence[str] = STRATEGIES,
        ranking: str = "contrast",
        duplicate_iou: float = 0.6,
        seed: int = 0,
        proposals: int | None = None,
    ) -> None:
        super().__init__()
        self.min_regions = check_counts(regions, min_regions)
        self.regions = regions
        if proposals is not None and (isinstance(proposals, bool) or not isinstance(proposals, int) or not 1 <= proposals <= regions):
            raise ValueError(
                f"proposals must be a whole number from 1 to regions={regions} (selective search's own boxes; "
                f"grid cells fill the rest), got {proposals!r}."
            )
        self.proposals = regions if proposals is None else proposals
        if not scale > 0:
            raise ValueError(f"scale must be positive (Felzenszwalb's k, e.g. 300), got {scale!r}.")
        if not sigma >= 0:
            raise ValueError(f"sigma must be 0 or more (pixels of smoothing, e.g. 0.5), got {sigma!r}.")
        if not isinstance(min_size, int) or min_size < 1:
            raise ValueError(f"min_size must be a positive number of pixels (e.g. 20), got {min_size!r}.")
        if not isinstance(segment_side, int) or segment_side < 16:
            raise ValueError(f"segment_side must be a number of pixels of at least 16 (e.g. 224), got {segment_side!r}.")
        strategies = [strategies] if isinstance(strategies, str) else list(strategies)
        unknown = [s for s in strategies if s not in STRATEGIES]
        if unknown or not strategies:
            raise ValueError(f"strategies must be a non-empty list of {', '.join(STRATEGIES)}; got {strategies!r}.")
        if ranking not in RANKINGS:
            raise ValueError(f"ranking must be one of {', '.join(RANKINGS)}, got {ranking!r}.")
        if not 0 < duplicate_iou <= 1:
            raise ValueError(f"duplicate_iou must be in (0, 1] (1 keeps every box), got {duplicate_iou!r}.")
        _felzenszwalb()  # a missing scikit-image is reported when the proposer is built, not mid-extraction
        self.scale = float(scale)
        self.sigma = float(sigma)
        self.min_size = min_size
        self.segment_side = segment_side
        self.strategies = tuple(strategies)
        self.ranking = ranking
        self.duplicate_iou = float(duplicate_iou)
        self.seed = seed

    def forward(self, images: Sequence[ImageInfo]) -> list[Proposals]:
        missing = [k for k, info in enumerate(images) if info.image is None]
        if missing:
            raise ValueError(
                f"the selective-search proposer looks at pixels, but images {missing} came without a picture; "
                "pass ImageInfo(width, height, image=<RGB PIL image>) (RegionPipeline and xmatch extract do)."
            )
        out = []
        for info in images:
            boxes, scores = self.candidates(info.image, info.width, info.height)
            out.append(select_and_pad(torch.from_numpy(boxes), torch.from_numpy(scores), info.width, info.height,
                                      self.regions, self.min_regions))
        return out

    def candidates(self, picture: Any, width: int, height: int) -> tuple[np.ndarray, np.ndarray]:
        """The ranked, de-duplicated boxes of one picture in the ``width`` x ``height`` frame
        (at most ``proposals``): ``(boxes [n, 4] float32, scores [n] float32, non-increasing)``."""
        rgb = _shrunk(picture, self.segment_side)
        labels = _felzenszwalb()(rgb, scale=self.scale, sigma=self.sigma, min_size=self.min_size)
        tree = _Hierarchy(rgb, labels, self.strategies)
        tree.merge_all()
        if self.ranking == "contrast":
            score = (tree.contrast + tree.surround(rgb)) * np.log(tree.size)
        else:  # the paper: level (1 = the last merge) times a random number; small = first
            level = (len(tree.size) - np.arange(len(tree.size))).astype(np.float64)
            score = -level * np.random.default_rng(self.seed).random(len(level))
        score[-1] = np.inf  # the whole picture first: the context every region set keeps
        order = np.argsort(-score, kind="stable")
        keep = _drop_duplicates(tree.box[order], self.duplicate_iou, self.proposals)
        boxes = tree.box[order[keep]] * np.array([width, height, width, height]) / np.array(
            [rgb.shape[1], rgb.shape[0], rgb.shape[1], rgb.shape[0]])
        # scores for select_and_pad's stable sort: the rank, best = 1
        scores = 1.0 - np.arange(len(keep)) / max(len(keep), 1)
        return boxes.astype(np.float32), scores.astype(np.float32)


class _Hierarchy:
    """Selective search's greedy grouping of one segmentation.

    Regions ``0..n-1`` are the segments; merge ``k`` creates region ``n + k``. Per region:
    ``size`` (pixels), ``box`` (x1, y1, x2, y2, pixel edges), ``histograms`` (the colour and
    texture histograms the strategies use, each L1-normalised, merged as size-weighted
    means), ``mean`` colour, and ``contrast``: the mean colour distance to its neighbours at
    its creation, weighted by the shared border's length.
    """

    def __init__(self, rgb: np.ndarray, labels: np.ndarray, strategies: Sequence[str]) -> None:
        from scipy import ndimage

        labels = _consecutive(labels)
        n = int(labels.max()) + 1
        total = 2 * n - 1
        flat = labels.ravel()
        self.area = float(labels.size)
        self.strategies = set(strategies)
        self.size = np.zeros(total)
        self.size[:n] = np.bincount(flat, minlength=n)
        self.box = np.zeros((total, 4))
        slices = ndimage.find_objects(labels + 1)
        self.box[:n] = [(s[1].start, s[0].start, s[1].stop, s[0].stop) for s in slices]
        pixels = rgb.reshape(-1, 3).astype(np.float64)
        self.mean = np.zeros((total, 3))
        self.mean[:n] = np.stack([np.bincount(flat, pixels[:, c], n) for c in range(3)], 1) / self.size[:n, None]
        # the colour and texture histograms side by side: one intersection sums both measures
        parts = []
        if "colour" in self.strategies:
            parts.append(_histograms(flat, _colour_bins(rgb), n, 3 * COLOUR_BINS))
        if "texture" in self.strategies:
            parts.append(_histograms(flat, _texture_bins(rgb)[:, None], n, ORIENTATIONS * (len(MAGNITUDE_EDGES) + 1)))
        self.histograms = np.zeros((total, sum(p.shape[1] for p in parts)))
        self.histograms[:n] = np.concatenate(parts, 1) if parts else 0
        self.contrast = np.zeros(total)
        self.count = n
        # neighbours with the length of the shared border (pixel pairs across it)
        a = np.concatenate([labels[:, :-1].ravel(), labels[:-1, :].ravel()])
        b = np.concatenate([labels[:, 1:].ravel(), labels[1:, :].ravel()])
        cross = a != b
        lo, hi = np.minimum(a[cross], b[cross]), np.maximum(a[cross], b[cross])
        pairs, length = np.unique(lo * n + hi, return_counts=True)
        lo, hi = pairs // n, pairs % n
        self.neighbours: list[dict[int, int]] = [{} for _ in range(total)]
        for i, j, k in zip(lo.tolist(), hi.tolist(), length.tolist()):
            self.neighbours[i][j] = k
            self.neighbours[j][i] = k
        distance = np.sqrt(((self.mean[lo] - self.mean[hi]) ** 2).sum(1))
        border = np.bincount(lo, length, n) + np.bincount(hi, length, n)
        self.contrast[:n] = (np.bincount(lo, length * distance, n) + np.bincount(hi, length * distance, n)) / np.maximum(border, 1)
        similarity = self.similarity(lo, hi)
        self.heap = list(zip((-similarity).tolist(), lo.tolist(), hi.tolist()))
        heapq.heapify(self.heap)

    def surround(self, rgb: np.ndarray, grow: float = SURROUND) -> np.ndarray:
        """Centre-surround contrast of every region: the distance between its mean colour and
        the mean colour of the ring around its box (the box grown by ``grow`` of its sides,
        within the picture, less the box); 0 for a box that fills the picture."""
        h, w = rgb.shape[:2]
        table = np.zeros((h + 1, w + 1, 3))
        table[1:, 1:] = rgb.astype(np.float64).cumsum(0).cumsum(1)  # summed-area table
        box = self.box.astype(np.int64)
        pad = np.rint(np.concatenate([-(box[:, 2:] - box[:, :2]), box[:, 2:] - box[:, :2]], 1) * grow / 2).astype(np.int64)
        outer = np.clip(box + pad, 0, [w, h, w, h])

        def total(q: np.ndarray) -> np.ndarray:
            return table[q[:, 3], q[:, 2]] - table[q[:, 1], q[:, 2]] - table[q[:, 3], q[:, 0]] + table[q[:, 1], q[:, 0]]

        def area(q: np.ndarray) -> np.ndarray:
            return ((q[:, 2] - q[:, 0]) * (q[:, 3] - q[:, 1])).astype(np.float64)

        ring_area = area(outer) - area(box)
        ring = (total(outer) - total(box)) / np.maximum(ring_area, 1)[:, None]
        return np.where(ring_area > 0, np.sqrt(((self.mean - ring) ** 2).sum(1)), 0.0)

    def similarity(self, i: np.ndarray | int, j: np.ndarray) -> np.ndarray:
        """The paper's summed similarity of regions ``i`` and ``j`` (one to many or pairwise)."""
        s = np.minimum(self.histograms[i], self.histograms[j]).sum(-1)
        if "size" in self.strategies:
            s += 1 - (self.size[i] + self.size[j]) / self.area
        if "fill" in self.strategies:
            box = np.concatenate([np.minimum(self.box[i, :2], self.box[j, :2]), np.maximum(self.box[i, 2:], self.box[j, 2:])], -1)
            box_area = (box[..., 2] - box[..., 0]) * (box[..., 3] - box[..., 1])
            s += 1 - (box_area - self.size[i] - self.size[j]) / self.area
        return s

    def merge_all(self) -> None:
        """Merge the most similar adjacent pair until one region is left (the segments of a
        label image are all connected, so that is the whole picture)."""
        alive = np.zeros(len(self.size), dtype=bool)
        alive[: self.count] = True
        while self.heap:
            _, i, j = heapq.heappop(self.heap)
            if not (alive[i] and alive[j]):
                continue  # a pair whose region merged since it was pushed
            r = self.count
            self.count += 1
            alive[i] = alive[j] = False
            alive[r] = True
            si, sj = self.size[i], self.size[j]
            self.size[r] = si + sj
            self.box[r] = (*np.minimum(self.box[i, :2], self.box[j, :2]), *np.maximum(self.box[i, 2:], self.box[j, 2:]))
            for table in (self.mean, self.histograms):
                table[r] = (table[i] * si + table[j] * sj) / (si + sj)
            around = self.neighbours[i]
            for c, k in self.neighbours[j].items():
                around[c] = around.get(c, 0) + k
            around.pop(i, None)
            around.pop(j, None)
            self.neighbours[r] = around
            self.neighbours[i] = self.neighbours[j] = {}
            for c, k in around.items():
                table = self.neighbours[c]
                table.pop(i, None)
                table.pop(j, None)
                table[r] = k
            if not around:
                continue
            others = np.fromiter(around, dtype=np.int64, count=len(around))
            length = np.fromiter(around.values(), dtype=np.float64, count=len(around))
            distance = np.sqrt(((self.mean[others] - self.mean[r]) ** 2).sum(1))
            self.contrast[r] = float((length * distance).sum() / length.sum())
            for s, c in zip(self.similarity(r, others).tolist(), others.tolist()):
                heapq.heappush(self.heap, (-s, c, r))
        if self.count != len(self.size):  # pragma: no cover - a label image is connected
            raise RuntimeError(f"selective search ended with {len(self.size) - self.count + 1} regions instead of one.")


def _felzenszwalb() -> Any:
    try:
        from skimage.segmentation import felzenszwalb
    except ImportError:
        raise ImportError(
            "the selective-search proposer segments pictures with scikit-image: pip install 'xmatch-zoo[regions]' (or scikit-image)"
        ) from None
    return felzenszwalb


def _consecutive(labels: np.ndarray) -> np.ndarray:
    """Segment labels renumbered ``0..n-1`` in their order (a label may be unused)."""
    used = np.bincount(labels.ravel()) > 0
    if used.all():
        return labels
    return (np.cumsum(used) - 1)[labels]


def _shrunk(picture: Any, side: int) -> np.ndarray:
    """The RGB picture as ``uint8 [h, w, 3]``, shrunk (area-averaged) to ``side`` on its longer
    side if it is larger."""
    from PIL import Image

    picture = picture.convert("RGB")
    w, h = picture.size
    if max(w, h) > side:
        f = side / max(w, h)
        picture = picture.resize((max(1, round(w * f)), max(1, round(h * f))), Image.Resampling.BOX)
    return np.asarray(picture)


def _colour_bins(rgb: np.ndarray) -> np.ndarray:
    """Each pixel's bin in each channel's histogram, offset per channel: ``[pixels, 3]``."""
    bins = rgb.reshape(-1, 3).astype(np.int64) * COLOUR_BINS // 256
    return bins + np.arange(3) * COLOUR_BINS


def _texture_bins(rgb: np.ndarray) -> np.ndarray:
    """Each pixel's texture bin: its grey gradient's orientation (of :data:`ORIENTATIONS`) x
    magnitude (:data:`MAGNITUDE_EDGES`); flat pixels all fall in the lowest magnitude bin."""
    grey = rgb.astype(np.float64).mean(2)
    gx, gy = np.zeros_like(grey), np.zeros_like(grey)
    gx[:, :-1] = np.diff(grey, axis=1)  # forward differences: defined for a picture 1 pixel wide too
    gy[:-1] = np.diff(grey, axis=0)
    magnitude = np.hypot(gx, gy)
    orientation = ((np.arctan2(gy, gx) + np.pi) / (2 * np.pi) * ORIENTATIONS).astype(np.int64) % ORIENTATIONS
    level = np.searchsorted(MAGNITUDE_EDGES, magnitude)
    orientation[level == 0] = 0
    return (orientation * (len(MAGNITUDE_EDGES) + 1) + level).ravel()


def _histograms(labels: np.ndarray, bins: np.ndarray, n: int, width: int) -> np.ndarray:
    """Per-segment histograms ``[n, width]`` of pixels' ``bins`` (``[pixels, k]``: k entries
    per pixel), each summing to 1 (the paper's L1 normalisation)."""
    index = (labels[:, None] * width + bins).ravel()
    counts = np.bincount(index, minlength=n * width).reshape(n, width).astype(np.float64)
    return counts / counts.sum(1, keepdims=True).clip(min=1)


def _drop_duplicates(boxes: np.ndarray, threshold: float, limit: int) -> np.ndarray:
    """Indices of ``boxes`` (in order) kept greedily: each overlaps every kept one by at most
    ``threshold`` (IoU); at most ``limit``."""
    keep: list[int] = []
    area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    for k in range(len(boxes)):
        if keep:
            kept = boxes[keep]
            wh = (np.minimum(kept[:, 2:], boxes[k, 2:]) - np.maximum(kept[:, :2], boxes[k, :2])).clip(min=0)
            inter = wh[:, 0] * wh[:, 1]
            if (inter / (area[keep] + area[k] - inter)).max() > threshold:
                continue
        keep.append(k)
        if len(keep) == limit:
            break
    return np.asarray(keep, dtype=np.int64)
