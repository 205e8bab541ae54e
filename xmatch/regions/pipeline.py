"""Pictures -> proposals -> RoI features: the one code path of ``xmatch extract`` and of the
``pixel-regions`` image encoder, so a model encoding pictures sees exactly the regions that
the extraction wrote."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from xmatch.io.archive import ArchiveMember
from xmatch.io.pictures import MAX_PIXELS
from xmatch.regions.config import RoIConfig
from xmatch.regions.features import InputSize, RoIFeatureExtractor
from xmatch.regions.images import load_image
from xmatch.regions.proposals import ImageInfo, Proposer


@dataclass
class Prepared:
    """One picture, decoded and resized for the backbone (what DataLoader workers hand over).

    Attributes:
        pixels: ``uint8 [3, h, w]`` at the backbone's input size.
        width, height: the original picture's size (boxes are in its frame).
        name: the image's name for the proposer (relative path), or None.
        picture: the original RGB picture, kept only for proposers that look at pixels.
    """

    pixels: torch.Tensor
    width: int
    height: int
    name: str | None = None
    picture: Any = None


@dataclass
class Regions:
    """The regions of one image.

    Attributes:
        features: ``[n, C]`` float32 RoI features.
        boxes: ``[n, 4]`` float32 pixel boxes x1, y1, x2, y2 of the original picture.
        scores: ``[n]`` the proposer's scores.
        width, height: the picture's size.
    """

    features: torch.Tensor
    boxes: torch.Tensor
    scores: torch.Tensor
    width: int
    height: int


@dataclass(frozen=True)
class PictureLoader:
    """Decodes and resizes one picture; picklable, so DataLoader workers can run it. A file
    whose header declares more than ``max_pixels`` is refused (``ImageTooLargeError``) before
    it is decoded.

    Example:
        >>> loader = pipeline.loader()  # needs a pipeline and the user's photos  # doctest: +SKIP
        >>> loader("my_photos/rex.jpg", "rex.jpg").pixels.shape  # doctest: +SKIP
        torch.Size([3, 224, 288])
    """

    input: InputSize
    keep_picture: bool
    max_pixels: int = MAX_PIXELS

    def __call__(self, image: Any, name: str | None = None) -> Prepared:
        picture = to_picture(image, max_pixels=self.max_pixels)
        return Prepared(self.input.apply(picture), picture.width, picture.height, name,
                        picture if self.keep_picture else None)


def to_picture(image: Any, index: int = 0, max_pixels: int = MAX_PIXELS) -> Any:
    """A PIL image (converted to RGB), an image path or a tar member (a WebDataset shard's
    picture; either read upright by :func:`load_image`, within ``max_pixels``) or a ``uint8``
    HWC array, as an RGB PIL image."""
    if isinstance(image, ArchiveMember):
        return load_image(image, max_pixels)
    if isinstance(image, (str, os.PathLike)):
        return load_image(Path(image), max_pixels)
    from xmatch.components.image.backbone import to_pil

    return to_pil(image, index)


def build_proposer(proposer: str | Mapping[str, Any] | Proposer, path: str = "proposer") -> Proposer:
    """A registered proposer from its name or spec table (``{"name": "windows", "regions": 36}``);
    a :class:`Proposer` instance is returned as is.

    Raises:
        xmatch.SpecError: unknown name or arguments (close matches listed).

    Example:
        >>> build_proposer({"name": "grid", "regions": 16}).side
        4
    """
    if isinstance(proposer, Proposer):
        return proposer
    from xmatch.core.spec import check_component, instantiate

    table = {"name": proposer} if isinstance(proposer, str) else dict(proposer)
    return instantiate(check_component(table, "proposers", path), "proposers")


def proposer_table(proposer: str | Mapping[str, Any]) -> dict[str, Any]:
    """The full spec table of a proposer (defaults filled in, registered spelling)."""
    from xmatch.core.spec import check_component

    table = {"name": proposer} if isinstance(proposer, str) else dict(proposer)
    return check_component(table, "proposers", "proposer")


class RegionPipeline(nn.Module):
    """A proposer and a :class:`RoIFeatureExtractor`: pictures in, regions out.

    Args:
        proposer: a registered proposer's name or spec table (``{"name": "windows"}``).
        roi: the RoI features' settings (default: EfficientNet-Lite0 with its packaged offline
            weights, see :class:`~xmatch.regions.config.RoIConfig`).

    Example:
        >>> pipe = RegionPipeline({"name": "windows", "regions": 36}, RoIConfig(image_size=320))  # needs the user's photos and the packaged backbone  # doctest: +SKIP
        >>> regions = pipe.regions_of(["my_photos/rex.jpg"])[0]  # doctest: +SKIP
        >>> regions.features.shape, regions.boxes.shape  # doctest: +SKIP
        (torch.Size([36, 1280]), torch.Size([36, 4]))
    """

    def __init__(self, proposer: str | Mapping[str, Any] = "windows", roi: RoIConfig | None = None) -> None:
        super().__init__()
        self.proposer_table = proposer_table(proposer)
        self.proposer = build_proposer(self.proposer_table)
        self.extractor = RoIFeatureExtractor(roi)
        self.feature_dim = self.extractor.feature_dim

    @classmethod
    def from_table(cls, table: Mapping[str, Any]) -> RegionPipeline:
        """A pipeline from its settings table, as :meth:`settings` returns it and
        ``extract.json`` records it: ``{"proposer": ..., "roi": {...}}`` (either may be left out).

        Raises:
            ValueError: a key other than ``proposer`` and ``roi``, or an unknown or bad RoI
                setting (named).
            xmatch.SpecError: an unknown proposer or proposer argument.

        Example:
            >>> pipe = RegionPipeline.from_table({"proposer": "grid", "roi": {"image_size": 320}})  # needs the packaged backbone  # doctest: +SKIP
            >>> RegionPipeline.from_table(pipe.settings()).settings() == pipe.settings()  # doctest: +SKIP
            True
        """
        unknown = sorted(set(table) - {"proposer", "roi"})
        if unknown:
            raise ValueError(
                f"pipeline: unknown key(s) {', '.join(unknown)}; a pipeline table holds 'proposer' (a proposer's name "
                "or table) and 'roi' (RoI settings: backbone, weights, image_size...)."
            )
        return cls(table.get("proposer", "windows"), RoIConfig.from_table(table.get("roi")))

    @property
    def fixed_regions(self) -> bool:
        """Whether every image gets the same number of regions."""
        return getattr(self.proposer, "min_regions", self.proposer.regions) == self.proposer.regions

    def settings(self) -> dict[str, Any]:
        """The table that rebuilds this pipeline (:meth:`from_table`): ``{"proposer": <full
        proposer table>, "roi": <RoI settings, the weights resolved to their source>}``."""
        return {"proposer": dict(self.proposer_table), "roi": asdict(self.extractor.roi)}

    def describe(self) -> dict[str, Any]:
        """:meth:`settings` plus what they resolved to (feature width, stride, input rule,
        weights fingerprint)."""
        return {"proposer": dict(self.proposer_table), **self.extractor.describe()}

    def loader(self, max_pixels: int = MAX_PIXELS) -> PictureLoader:
        """The picklable picture loader for this pipeline (decode files of at most
        ``max_pixels``, keep the picture for a detector, resize for the backbone)."""
        return PictureLoader(self.extractor.input, self.proposer.needs_pixels, max_pixels)

    @torch.no_grad()
    def forward(self, prepared: Sequence[Prepared]) -> list[Regions]:
        """Regions of prepared pictures (:meth:`loader`)."""
        infos = [ImageInfo(p.width, p.height, p.name, p.picture) for p in prepared]
        proposals = self.proposer(infos)
        if len(proposals) != len(prepared):
            raise ValueError(f"the proposer {type(self.proposer).__name__} returned {len(proposals)} box sets for {len(prepared)} images.")
        features = self.extractor([p.pixels for p in prepared], [q.boxes for q in proposals],
                                  [(p.width, p.height) for p in prepared])
        return [Regions(f.cpu(), q.boxes, q.scores, p.width, p.height)
                for f, q, p in zip(features, proposals, prepared, strict=True)]

    def regions_of(self, images: Sequence[Any], names: Sequence[str | None] | None = None) -> list[Regions]:
        """Regions of PIL images, image paths or uint8 arrays (names for the ``boxes``
        proposer default to the paths as given)."""
        if isinstance(images, (str, os.PathLike)) or not isinstance(images, Sequence):
            raise TypeError(
                f"images must be a list of PIL images, paths or uint8 arrays, got {type(images).__name__}; "
                "wrap a single image in a list."
            )
        if names is None:
            names = [str(im) if isinstance(im, (str, os.PathLike)) else None for im in images]
        load = self.loader()
        return self([load(to_picture(im, i), n) for i, (im, n) in enumerate(zip(images, names, strict=True))])
