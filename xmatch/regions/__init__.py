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

from xmatch.core.lazy import lazy_names

# torch-backed: imported on first use, so that the command line reads RoIConfig's defaults alone
__getattr__, __dir__ = lazy_names(__name__, {
    "RoIConfig": "xmatch.regions.config",
    **dict.fromkeys(("RoIFeatureExtractor", "fingerprint", "roi_features"), "xmatch.regions.features"),
    **dict.fromkeys(("find_images", "load_image"), "xmatch.regions.images"),
    **dict.fromkeys(("describe_features", "read_manifest"), "xmatch.regions.manifest"),
    **dict.fromkeys(("RegionPipeline", "Regions", "build_proposer"), "xmatch.regions.pipeline"),
    **dict.fromkeys(("on_pixels", "pixel_encoder_table"), "xmatch.regions.pixels"),
    **dict.fromkeys(("ImageInfo", "Proposals", "Proposer", "pyramid_boxes", "select_and_pad"), "xmatch.regions.proposals"),
})

__all__ = [
    "ImageInfo", "Proposals", "Proposer", "RegionPipeline", "Regions", "RoIConfig", "RoIFeatureExtractor",
    "build_proposer", "describe_features", "find_images", "fingerprint", "load_image", "on_pixels",
    "pixel_encoder_table", "pyramid_boxes", "read_manifest", "roi_features", "select_and_pad",
]
