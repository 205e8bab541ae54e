"""Region features for any folder of images, without a Caffe detector.

A proposer (``grid``, ``windows``, ``boxes``, ``torchvision-detector`` or a plugin's, from
the ``proposers`` registry / entry-point group ``xmatch_proposers``) gives each image's boxes;
a timm backbone's feature map is pooled over them with RoI-align
(:class:`RoIFeatureExtractor`); :func:`extract` writes the result in the TERAN bottom-up or
the SCAN precomp layout with a manifest (``extract.json``), and :func:`on_pixels` turns a
model trained on such features into one that encodes pictures directly.

Example:
    >>> from xmatch.extract import extract, on_pixels
    >>> extract("my_photos", "feats", {"proposer": "windows"})  # needs the user's photos and a trained model  # doctest: +SKIP
    >>> model = on_pixels(xmatch.build("local-dir:runs/x/best", pretrained=True), "feats")  # doctest: +SKIP
    >>> img = model.encode_images(images=["my_photos/rex.jpg"])  # doctest: +SKIP
    >>> img.boxes.shape  # the regions' boxes, normalised to the picture  # doctest: +SKIP
    torch.Size([1, 36, 4])
"""

from __future__ import annotations

from xmatch.extract.features import RoIFeatureExtractor, fingerprint, roi_features
from xmatch.extract.images import find_images, load_image
from xmatch.extract.manifest import describe_features, read_manifest
from xmatch.extract.pipeline import RegionPipeline, Regions, build_proposer
from xmatch.extract.pixels import on_pixels, pixel_encoder_table
from xmatch.extract.proposals import ImageInfo, Proposals, Proposer, pyramid_boxes, select_and_pad
from xmatch.extract.run import ExtractError, ExtractResult, extract

__all__ = [
    "ExtractError", "ExtractResult", "ImageInfo", "Proposals", "Proposer", "RegionPipeline", "Regions",
    "RoIFeatureExtractor", "build_proposer", "describe_features", "extract", "find_images", "fingerprint",
    "load_image", "on_pixels", "pixel_encoder_table", "pyramid_boxes", "read_manifest", "roi_features", "select_and_pad",
]
