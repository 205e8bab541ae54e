"""Region proposals from any torchvision detection model (Faster R-CNN, RetinaNet, FCOS, SSD...).

Bottom-up attention's boxes come from a Faster R-CNN trained on Visual Genome, run through a
Caffe fork that no longer builds. Here any detector of ``torchvision.models.detection`` stands
in: its detections after a score threshold and a class-agnostic non-maximum suppression, the
best ``regions`` of them, padded with the whole image and grid cells up to ``min_regions``
(:func:`xmatch.regions.proposals.select_and_pad`) -- 36 fixed, or 10 to 100 as the original
variable-size feature sets.

Weights come from torchvision's own download and cache (``$TORCH_HOME/hub/checkpoints``, with
torchvision's hash check, read with ``weights_only=True``), or from a local file.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from xmatch.core.errors import XmatchError
from xmatch.regions.proposals import ImageInfo, Proposals, Proposer, check_counts, select_and_pad

#: weight sources that xmatch.io.hub fetches (besides local files)
HUB_SOURCES = ("hf-hub:", "https://", "http://", "file://", "package:")


class DetectorWeightsError(XmatchError, OSError):
    """Detector weights that cannot be fetched or do not fit (the message says what to do)."""


def detection_models() -> list[str]:
    """Names of torchvision's detection models.

    Example:
        >>> "fasterrcnn_resnet50_fpn" in detection_models()
        True
    """
    import torchvision

    return torchvision.models.list_models(module=torchvision.models.detection)


class TorchvisionDetector(Proposer):
    """Boxes from a torchvision detection model, bottom-up style.

    Args:
        backbone: a torchvision detection model name (:func:`detection_models`), e.g.
            ``fasterrcnn_resnet50_fpn_v2``, ``fasterrcnn_mobilenet_v3_large_fpn`` (fast on a
            CPU), ``retinanet_resnet50_fpn_v2``, ``fcos_resnet50_fpn``.
        weights: ``"DEFAULT"`` or a weight tag of that model (``"COCO_V1"``): downloaded once by
            torch's hub into ``$TORCH_HOME`` and checked against torchvision's hash; a local
            ``.pth`` / ``.safetensors`` state dict, or any :mod:`xmatch.io.hub` weight source, fetched
            and checked as zoo weights are (strict load); or None (``"none"`` on the command
            line: ``--proposer-option weights=none``): random initialisation, seeded (tests
            only: its boxes mean nothing).
        regions: at most this many boxes per image (36 in the fixed bottom-up set, 100 in the
            variable one).
        min_regions: at least this many (default ``regions``: a fixed count); missing ones
            are the whole image and grid cells, scoring 0 (10 in the variable bottom-up set).
        score_threshold: detections below this score are dropped (bottom-up: 0.2).
        nms_iou: class-agnostic non-maximum suppression at this IoU, over the detector's
            per-class detections (bottom-up: 0.3), so one object yields one box.
        num_classes: the classifier's class count, for a local weight file trained on another
            label set (default: the weights' categories, or the model's default).
        min_size, max_size: the detector's input resizing (default: the model's own, 800 /
            1333 for Faster R-CNN R50); smaller is faster and finds fewer small objects.
        seed: seed of a random initialisation.

    Example:
        >>> det = TorchvisionDetector("fasterrcnn_mobilenet_v3_large_fpn", weights="DEFAULT")  # downloads the detector's weights  # doctest: +SKIP
        >>> det([ImageInfo(640, 480, image=pil_image)])[0].boxes.shape  # doctest: +SKIP
        torch.Size([36, 4])
    """

    needs_pixels = True

    def __init__(
        self,
        backbone: str = "fasterrcnn_resnet50_fpn_v2",
        weights: str | None = "DEFAULT",
        regions: int = 36,
        min_regions: int | None = None,
        score_threshold: float = 0.2,
        nms_iou: float = 0.3,
        num_classes: int | None = None,
        min_size: int | None = None,
        max_size: int | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.min_regions = check_counts(regions, min_regions)
        self.regions = regions
        if not 0 <= score_threshold <= 1:
            raise ValueError(f"score_threshold must be in [0, 1], got {score_threshold}.")
        if not 0 < nms_iou <= 1:
            raise ValueError(f"nms_iou must be in (0, 1], got {nms_iou}.")
        self.score_threshold = float(score_threshold)
        self.nms_iou = float(nms_iou)
        self.model_name = backbone
        if isinstance(weights, str) and weights.lower() == "none":  # the command line's spelling of None
            weights = None
        self.net = _build_detector(backbone, weights, num_classes, seed)
        # The detector's own filters must let through everything this proposer may keep.
        _set_detector_limits(self.net, score_threshold, max(regions, 100))
        if min_size is not None:
            self.net.transform.min_size = (int(min_size),)
        if max_size is not None:
            self.net.transform.max_size = int(max_size)
        self.net.requires_grad_(False)
        self.net.eval()

    def train(self, mode: bool = True) -> TorchvisionDetector:
        super().train(mode)
        self.net.eval()  # frozen: BatchNorm statistics and the eval-time post-processing stay
        return self

    @torch.no_grad()
    def forward(self, images: Sequence[ImageInfo]) -> list[Proposals]:
        from torchvision.ops import nms
        from torchvision.transforms.functional import pil_to_tensor

        if not images:
            return []
        missing = [k for k, info in enumerate(images) if info.image is None]
        if missing:
            raise ValueError(f"the detector proposer needs the pictures; images {missing} came without one.")
        device = next(self.net.parameters()).device
        pixels = [pil_to_tensor(info.image.convert("RGB")).to(device=device, dtype=torch.float32) / 255 for info in images]
        detections = self.net(pixels)
        out = []
        for info, found in zip(images, detections, strict=True):
            boxes, scores = found["boxes"].float(), found["scores"].float()
            keep = scores >= self.score_threshold
            boxes, scores = boxes[keep], scores[keep]
            keep = nms(boxes, scores, self.nms_iou)  # sorted by score
            out.append(select_and_pad(boxes[keep], scores[keep], info.width, info.height, self.regions, self.min_regions))
        return out


def _build_detector(model: str, weights: str | None, num_classes: int | None, seed: int) -> torch.nn.Module:
    import torchvision

    known = detection_models()
    if model not in known:
        import difflib

        close = difflib.get_close_matches(model, known, n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"'{model}' is not a torchvision detection model.{hint} Available: {', '.join(known)}.")
    enum = _weights_enum(model, weights)
    kwargs: dict[str, Any] = {"weights": None, "weights_backbone": None}  # nothing downloaded here
    if enum is not None:
        kwargs["num_classes"] = len(enum.meta["categories"])
    if num_classes is not None:
        kwargs["num_classes"] = num_classes
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = torchvision.models.get_model(model, **kwargs)
    if enum is not None:
        state = _download(enum, model)
    elif weights is not None:
        from xmatch.io import hub
        from xmatch.components.image.backbone_weights import read_state_dict

        state = read_state_dict(hub.fetch(os.path.expanduser(weights), local_pickle=True))
    else:
        return net
    try:
        net.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise DetectorWeightsError(
            f"detector weights {weights} do not fit {model}: {exc}. Is it a {model} state dict "
            "(pass num_classes= for another label set)?"
        ) from None
    return net


def _weights_enum(model: str, weights: str | None) -> Any:
    """torchvision's weight entry named by ``weights`` (``DEFAULT``, ``COCO_V1``), or None for a
    file or a random initialisation."""
    import torchvision

    if weights is None:
        return None
    table = torchvision.models.get_model_weights(model)
    tags = [w.name for w in table]
    if weights.upper() == "DEFAULT":
        return table.DEFAULT
    if weights in tags:
        return table[weights]
    if Path(weights).expanduser().is_file() or weights.startswith(HUB_SOURCES):
        return None
    raise ValueError(
        f"detector weights '{weights}' are neither a weight tag of {model} (DEFAULT, {', '.join(tags)}) "
        "nor an existing file or weight source (hf-hub:, https://, package:)."
    )


def _download(enum: Any, model: str) -> dict[str, torch.Tensor]:
    """torchvision's weights, from its cache or downloaded into it, hash-checked, read as
    plain tensors (``weights_only=True``: no pickled code from the network)."""
    try:
        return torch.hub.load_state_dict_from_url(enum.url, progress=True, check_hash=True, weights_only=True)
    except Exception as exc:  # URLError, HTTPError, hash mismatch, unpickling refusal
        cache = Path(torch.hub.get_dir()) / "checkpoints" / Path(enum.url).name
        raise DetectorWeightsError(
            f"could not get the {model} weights {enum} from {enum.url} ({exc}). Offline, copy that file to "
            f"{cache} (torch's hub cache) or pass weights=<local file>."
        ) from None


def _set_detector_limits(net: torch.nn.Module, score_threshold: float, detections: int) -> None:
    """Lower the detector's internal score threshold to ours and let enough detections out."""
    owner = getattr(net, "roi_heads", net)  # two-stage models filter in their RoI heads
    if hasattr(owner, "score_thresh"):
        owner.score_thresh = min(owner.score_thresh, score_threshold)
    if hasattr(owner, "detections_per_img"):
        owner.detections_per_img = max(owner.detections_per_img, detections)
