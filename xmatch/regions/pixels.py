"""A model trained on ``xmatch extract`` features, turned into one that encodes pictures."""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from typing import Any

from xmatch.regions.manifest import ManifestError, manifest_path, read_manifest
from xmatch.model.inputs import PixelInputs, input_type_of


def pixel_encoder_table(features: str | os.PathLike | Mapping[str, Any], encoder: Mapping[str, Any]) -> dict[str, Any]:
    """The ``pixel-regions`` image encoder table that reproduces the extraction of ``features``
    (a folder written by ``xmatch extract``, or its manifest) around the region encoder table
    ``encoder``, with the weights' fingerprint to check.

    Example:
        >>> pixel_encoder_table("feats", {"name": "bottomup", "feature_dim": 1280})["proposer"]  # needs an extraction folder  # doctest: +SKIP
        {'name': 'windows', 'regions': 36, 'scales': [1.0, 0.5, 0.333..., 0.25], 'overlap': 0.5}
    """
    manifest = features if isinstance(features, Mapping) else read_manifest(features)
    pipeline = manifest["pipeline"]
    return {"name": "pixel-regions", "proposer": copy.deepcopy(pipeline["proposer"]), "roi": dict(pipeline["roi"]),
            "fingerprint": pipeline["fingerprint"], "encoder": dict(encoder)}


def on_pixels(model: Any, features: str | os.PathLike) -> Any:
    """The same model with an image encoder that takes pictures: the extraction recorded in
    ``features/extract.json`` (proposer, backbone and weights, resizing, pooling) followed by
    the model's own, trained region encoder. ``encode_images(images=[...])`` then gives the
    embeddings that encoding the extracted features gives (to float precision), and
    ``Embeddings.boxes`` holds the regions' boxes. ``model`` itself is left as it is.

    Args:
        model: a :class:`~xmatch.MatchingModel` with a region image encoder (built from a
            spec, e.g. loaded with ``xmatch.build(..., pretrained=True)``).
        features: the folder ``xmatch extract`` wrote the model's training features into.

    Raises:
        ManifestError: no manifest there, or features of another width than the model reads.
        ValueError: the model already takes pixels.

    Example:
        >>> trained = xmatch.build("local-dir:runs/teran/best", pretrained=True)  # needs a trained model and an extraction folder  # doctest: +SKIP
        >>> model = on_pixels(trained, "feats").eval()  # doctest: +SKIP
        >>> img = model.encode_images(images=["photo.jpg"])  # doctest: +SKIP
        >>> img.boxes[0][img.mask[0]]  # the regions' boxes, normalised to the photo  # doctest: +SKIP
    """
    from xmatch.core.spec import check_component, instantiate

    encoder = model.image_encoder
    if input_type_of(encoder) is PixelInputs:
        raise ValueError(f"the model's image encoder {type(encoder).__name__} already takes pixels.")
    manifest = read_manifest(features)
    width = getattr(encoder, "feature_dim", None)
    if width is not None and width != manifest["feature_dim"]:
        raise ManifestError(
            f"{manifest_path(features)}: the features are {manifest['feature_dim']}-wide but the model's image encoder "
            f"reads {width}-wide regions; it was not trained on these features."
        )
    table = check_component(pixel_encoder_table(manifest, model.spec["image_encoder"]), "image_encoders", "image_encoder")
    wrapper = instantiate(table, "image_encoders")
    out = copy.deepcopy(model)
    wrapper.encoder = out.image_encoder  # the trained region encoder, not the fresh one
    out.image_encoder = wrapper.to(model.device)
    out._spec = {**out.spec, "image_encoder": table}
    return out.train(model.training)
