"""Region features for any picture, without a Caffe detector: the processor of region models.

A proposer (``grid``, ``windows``, ``boxes``, ``torchvision-detector`` or a plugin's, from
the ``proposers`` registry / entry-point group ``xmatch_proposers``) gives each image's boxes;
a timm backbone's feature map is pooled over them with RoI-align
(:class:`RoIFeatureExtractor`, its settings a :class:`RoIConfig`); :class:`RegionPipeline` runs
both, and :func:`on_pixels` turns a model trained on ``xmatch extract`` features into one that
encodes pictures directly.

Example:
    >>> from xmatch.regions import on_pixels
    >>> model = on_pixels(xmatch.build("local-dir:runs/x/best", pretrained=True), "feats")  # needs a trained model and its extraction folder  # doctest: +SKIP
    >>> img = model.encode_images(images=["my_photos/rex.jpg"])  # needs the user's photos  # doctest: +SKIP
    >>> img.boxes.shape  # the regions' boxes, normalised to the picture  # doctest: +SKIP
    torch.Size([1, 36, 4])
"""

from __future__ import annotations

from xmatch.regions.config import RoIConfig
from xmatch.regions.features import RoIFeatureExtractor, fingerprint, roi_features
from xmatch.regions.images import find_images, load_image
from xmatch.regions.manifest import describe_features, read_manifest
from xmatch.regions.pipeline import RegionPipeline, Regions, build_proposer
from xmatch.regions.pixels import on_pixels, pixel_encoder_table
from xmatch.regions.proposals import ImageInfo, Proposals, Proposer, pyramid_boxes, select_and_pad

__all__ = [
    "ImageInfo", "Proposals", "Proposer", "RegionPipeline", "Regions", "RoIConfig", "RoIFeatureExtractor",
    "build_proposer", "describe_features", "find_images", "fingerprint", "load_image", "on_pixels",
    "pixel_encoder_table", "pyramid_boxes", "read_manifest", "roi_features", "select_and_pad",
]
