"""Region models on pixels: proposer -> timm backbone -> RoI features -> a region encoder.

TERAN, TERN, SCAN, VSE++ and OAN read precomputed bottom-up regions (Anderson et al., CVPR
2018). This encoder computes them from the picture with the same code as ``xmatch extract``
(:class:`xmatch.regions.pipeline.RegionPipeline`: a registered proposer, a frozen timm backbone,
RoI-align), then hands them to any registered region encoder (``bottomup`` for TERAN / TERN,
the plugins' ``scan-precomp``, ``vsepp-precomp``, ``oan-regions``). A model trained on the
features of ``xmatch extract`` therefore encodes pictures directly and gets the same
embeddings (:func:`xmatch.extract.on_pixels` builds it from the features' manifest), and the
boxes of the regions come back in ``Embeddings.boxes`` for drawing the alignment.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from xmatch.model.interfaces import EncoderOutput, ImageEncoder
from xmatch.model.inputs import normalize_boxes
from xmatch.components.image.timm_grid import _drop_own_keys, _keep_own_tensors
from xmatch.model.inputs import PixelInputs, RegionInputs, input_type_of


class PixelRegionsImageEncoder(ImageEncoder):
    """Pictures -> proposals -> RoI features of a frozen timm backbone -> a region encoder.

    Args:
        proposer: the proposer's name or spec table (``{"name": "windows", "regions": 36}``;
            ``grid``, ``windows``, ``boxes``, ``torchvision-detector`` or a plugin's).
        roi: the RoI features' settings as a table (``{"backbone": "efficientnet_lite0", "weights":
            "auto", "image_size": 224}``; keys and defaults of
            :class:`xmatch.regions.config.RoIConfig`; ``weights = "auto"``: the packaged offline
            weights of EfficientNet-Lite0/1/2).
        fingerprint: ``sha256:...`` of the backbone weights the region encoder was trained
            with (``extract.json``); checked at build time, so that features of other weights
            are never fed to it silently.
        encoder: the region encoder's spec table (default ``{"name": "bottomup"}``); its
            ``feature_dim`` is the backbone's width (set when absent).

    The backbone and a detector proposer are frozen and rebuilt from their weight source at
    build time, so they are not part of ``state_dict()`` (a bundle holds only what trains).
    ``forward(images)`` takes PIL images, image paths (read upright by their EXIF orientation)
    or uint8 HWC arrays; the output carries each region's box normalised to its picture.

    Example:
        >>> enc = PixelRegionsImageEncoder({"name": "windows"}, {"image_size": 224}, encoder={"name": "bottomup", "layers": 1})  # needs a photo and the packaged backbone (seconds)  # doctest: +SKIP
        >>> out = enc(["photo.jpg"])  # doctest: +SKIP
        >>> out.tokens.shape, out.boxes.shape  # I-CLS slot + 36 regions  # doctest: +SKIP
        (torch.Size([1, 37, 1280]), torch.Size([1, 37, 4]))
    """

    input_type = PixelInputs

    def __init__(
        self,
        proposer: str | Mapping[str, Any] = "windows",
        roi: Mapping[str, Any] | None = None,
        fingerprint: str | None = None,
        encoder: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        from xmatch.regions.config import RoIConfig
        from xmatch.regions.pipeline import RegionPipeline

        self.pipeline = RegionPipeline(proposer, RoIConfig.from_table(roi))
        self.feature_dim = self.pipeline.feature_dim
        extractor = self.pipeline.extractor
        if fingerprint is not None and fingerprint != extractor.fingerprint:
            raise ValueError(
                f"the {extractor.roi.backbone} weights '{extractor.roi.weights}' have the fingerprint "
                f"{extractor.fingerprint}, but the region encoder was trained on features of weights "
                f"{fingerprint} (spec image_encoder.fingerprint, from extract.json); use the same weights."
            )
        self.encoder = _region_encoder(encoder, self.feature_dim)
        self.output_dim = self.encoder.output_dim
        self.pipeline.requires_grad_(False).eval()
        # rebuilt from its weight source at build time, never saved (like timm-grid's store_backbone=false)
        self.pipeline.register_state_dict_post_hook(_drop_own_keys)
        self.pipeline.register_load_state_dict_pre_hook(_keep_own_tensors)

    def train(self, mode: bool = True) -> PixelRegionsImageEncoder:
        super().train(mode)
        self.pipeline.eval()  # frozen: the regions must be those of xmatch extract
        return self

    def regions(self, images: Sequence[Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The pictures' regions, padded: features ``[B, R, C]``, boxes normalised to each
        picture ``[B, R, 4]`` and mask ``[B, R]`` (what the extracted dataset would give)."""
        inputs = self.region_inputs(images)
        return inputs.regions, inputs.boxes, inputs.mask

    def region_inputs(self, images: Sequence[Any]) -> RegionInputs:
        """:meth:`regions` as a :class:`~xmatch.model.inputs.RegionInputs`, checked on the CPU and
        then moved to the encoder's device (so the checks never wait for a GPU)."""
        found = self.pipeline.regions_of(images)
        device = next(self.encoder.parameters(), torch.empty(0)).device
        width = max(len(r.features) for r in found)
        features = torch.zeros(len(found), width, self.feature_dim)
        boxes = torch.zeros(len(found), width, 4)
        mask = torch.zeros(len(found), width, dtype=torch.bool)
        for i, r in enumerate(found):
            n = len(r.features)
            features[i, :n] = r.features
            # float64 division, float32 result: exactly what the teran dataset does with the files
            boxes[i, :n] = normalize_boxes(r.boxes.double(), torch.tensor([r.width, r.height]))
            mask[i, :n] = True
        return RegionInputs(features, boxes, mask).to(device)

    def forward(self, images: Sequence[Any]) -> EncoderOutput:
        if isinstance(images, torch.Tensor):
            raise TypeError(
                "the pixel-regions encoder takes pictures (PIL images, paths or uint8 arrays), not a pixel tensor: "
                "its proposer needs each picture's own size."
            )
        inputs = self.region_inputs(images)
        boxes = inputs.boxes
        out = self.encoder.encode(inputs)
        slot = 1 if out.global_slot else 0
        if out.tokens.shape[1] != boxes.shape[1] + slot:
            return out  # the encoder does not keep one token per region (e.g. VSE++'s average)
        return dataclasses.replace(out, boxes=nn.functional.pad(boxes, (0, 0, slot, 0)))


def _region_encoder(table: Mapping[str, Any] | None, feature_dim: int) -> ImageEncoder:
    """The inner region encoder from its spec table, with the backbone's width as feature_dim."""
    from xmatch.core.registry import get_registry
    from xmatch.core.spec import check_component, instantiate, signature_of

    table = dict(table or {"name": "bottomup"})
    checked = check_component(table, "image_encoders", "pixel-regions -> encoder")
    builder = get_registry("image_encoders").get(checked["name"])
    if input_type_of(builder) is PixelInputs:
        raise ValueError(f"pixel-regions -> encoder: '{checked['name']}' takes pixels; give a region encoder (e.g. bottomup).")
    if "feature_dim" in signature_of(builder).parameters:
        if "feature_dim" in table and table["feature_dim"] != feature_dim:
            raise ValueError(
                f"pixel-regions -> encoder -> feature_dim: {table['feature_dim']}, but the backbone's features are "
                f"{feature_dim}-wide; leave feature_dim out (it is set from the backbone) or change the backbone."
            )
        checked["feature_dim"] = feature_dim
    return instantiate(checked, "image_encoders")
