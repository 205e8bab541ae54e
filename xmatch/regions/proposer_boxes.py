"""Boxes the user provides: one JSON file per image, or one COCO-style annotation file.

For images whose objects are already known (annotations, an external detector's output, the
drawn objects of a synthetic set), these boxes become the regions, padded like a detector's
(:func:`xmatch.regions.proposals.select_and_pad`).

Formats:

- a folder of JSON files, one per image, named after the image's path relative to the image
  folder with ``.json`` for its suffix (``photos/dogs/rex.jpg`` -> ``BOXES/dogs/rex.json``;
  ``BOXES/rex.json`` is also found), holding ``[[x1, y1, x2, y2], ...]`` pixel boxes or
  ``{"boxes": [...], "scores": [...]}``;
- a COCO-style file: ``images`` (``id``, ``file_name``) and ``annotations`` (``image_id``,
  ``bbox`` = ``[x, y, width, height]`` in pixels, optional ``score``); ``file_name`` is the
  image's relative path or its base name. An image listed without annotations has no boxes
  (only padding).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path, PurePosixPath
from typing import Any

import torch

from xmatch.core.errors import XmatchError
from xmatch.regions.proposals import ImageInfo, Proposals, Proposer, check_counts, select_and_pad


class BoxesError(XmatchError, ValueError):
    """A boxes file that is missing, malformed, or has no entry for an image (named)."""


class BoxesProposer(Proposer):
    """Boxes read from ``source`` (a folder of per-image JSON files or a COCO-style JSON file).

    Args:
        source: the folder or file (see the module docstring for the formats).
        regions: at most this many boxes per image (the best-scoring; without scores, the
            first ones in the file's order).
        min_regions: pad to at least this many with the whole image and grid cells (default
            ``regions``: a fixed count, like bottom-up attention's 36).

    Example:
        >>> Path("boxes").mkdir()
        >>> _ = Path("boxes/rex.json").write_text("[[10, 20, 300, 400]]")  # pixel boxes of photos/rex.jpg
        >>> p = BoxesProposer("boxes", regions=36)
        >>> proposals = p([ImageInfo(640, 480, name="rex.jpg")])[0]
        >>> proposals.boxes.shape, proposals.boxes[0].tolist()  # the given box, then padding
        (torch.Size([36, 4]), [10.0, 20.0, 300.0, 400.0])
    """

    def __init__(self, source: str, regions: int = 36, min_regions: int | None = None) -> None:
        super().__init__()
        self.min_regions = check_counts(regions, min_regions)
        self.regions = regions
        self.source = Path(source).expanduser()
        if not self.source.exists():
            raise BoxesError(f"boxes source {self.source} does not exist; give a folder of per-image JSON files or a COCO-style JSON file.")

    def forward(self, images: Sequence[ImageInfo]) -> list[Proposals]:
        out = []
        for info in images:
            boxes, scores = self.lookup(info.name)
            out.append(select_and_pad(boxes, scores, info.width, info.height, self.regions, self.min_regions))
        return out

    def lookup(self, name: str | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Pixel boxes ``[n, 4]`` (x1, y1, x2, y2) and scores (or None) of the image ``name``."""
        if name is None:
            raise BoxesError(
                "the boxes proposer finds an image's boxes by its file name; give image paths, not in-memory pictures."
            )
        if self.source.is_dir():
            return self._from_folder(name)
        return self._from_coco(name)

    # -- one JSON per image ------------------------------------------------------------

    def _from_folder(self, name: str) -> tuple[torch.Tensor, torch.Tensor | None]:
        rel = PurePosixPath(name.replace("\\", "/"))
        candidates = [self.source / rel.with_suffix(".json"), self.source / f"{rel.stem}.json"]
        if rel.is_absolute():
            candidates = candidates[1:]
        path = next((c for c in candidates if c.is_file()), None)
        if path is None:
            raise BoxesError(f"no boxes for image {name}: none of {', '.join(map(str, candidates))} exists.")
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise BoxesError(f"{path} is not a readable JSON file: {exc}") from None
        if not isinstance(doc, dict):
            return _xyxy(doc, path), None
        boxes, scores = _xyxy(doc.get("boxes"), path), _scores(doc.get("scores"), path)
        if scores is not None and len(scores) != len(boxes):
            raise BoxesError(f"{path}: {len(boxes)} boxes but {len(scores)} scores; give one score per box.")
        return boxes, scores

    # -- one COCO-style file -----------------------------------------------------------

    @cached_property
    def _coco(self) -> tuple[dict[str, Any], dict[str, list[Any]]]:
        try:
            doc = json.loads(self.source.read_text(encoding="utf-8"))
            images = {str(im["file_name"]).replace("\\", "/"): im["id"] for im in doc["images"]}
            by_image: dict[Any, list[Any]] = {}
            for ann in doc.get("annotations", []):
                by_image.setdefault(ann["image_id"], []).append(ann)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise BoxesError(f"{self.source} is not a readable JSON file: {exc}") from None
        except (KeyError, TypeError) as exc:
            raise BoxesError(
                f"{self.source} is not a COCO-style boxes file (images with id / file_name, annotations with "
                f"image_id / bbox [x, y, w, h]): missing {exc}."
            ) from None
        base: dict[str, Any] = {}
        for file_name, image_id in images.items():
            base.setdefault(PurePosixPath(file_name).name, []).append(image_id)
        index = dict(images)
        index.update({n: ids[0] for n, ids in base.items() if len(ids) == 1 and n not in index})
        return index, by_image

    def _from_coco(self, name: str) -> tuple[torch.Tensor, torch.Tensor | None]:
        index, by_image = self._coco
        key = name.replace("\\", "/")
        image_id = index.get(key, index.get(PurePosixPath(key).name))
        if image_id is None:
            raise BoxesError(f"no boxes for image {name}: {self.source} lists no image with that file_name.")
        anns = by_image.get(image_id, [])
        try:
            xywh = torch.tensor([[float(v) for v in a["bbox"]] for a in anns], dtype=torch.float64).reshape(-1, 4)
        except (KeyError, TypeError, ValueError):
            raise BoxesError(f"{self.source}: an annotation of image {name} has no bbox [x, y, width, height].") from None
        boxes = torch.cat([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]], dim=1)
        has_score = [("score" in a) for a in anns]
        if any(has_score) and not all(has_score):
            raise BoxesError(f"{self.source}: some annotations of image {name} have a score and some do not.")
        scores = torch.tensor([float(a["score"]) for a in anns]) if anns and all(has_score) else None
        return boxes, scores


def _xyxy(value: Any, path: Path) -> torch.Tensor:
    try:
        boxes = torch.tensor(value, dtype=torch.float64)
    except (TypeError, ValueError):
        boxes = None
    if boxes is None or (boxes.numel() and (boxes.dim() != 2 or boxes.shape[1] != 4)):
        raise BoxesError(f"{path}: boxes must be a list of [x1, y1, x2, y2] pixel boxes, got {str(value)[:80]}.")
    return boxes.reshape(-1, 4)


def _scores(value: Any, path: Path) -> torch.Tensor | None:
    if value is None:
        return None
    try:
        return torch.tensor(value, dtype=torch.float32).reshape(-1)
    except (TypeError, ValueError):
        raise BoxesError(f"{path}: scores must be a list of numbers, one per box.") from None
