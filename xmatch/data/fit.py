"""Whether a dataset's images fit a model's image encoder: precomputed regions or pixels, and
the region feature width. Checked before training and evaluation, so that a mismatch is one
clear sentence instead of a shape error deep inside the encoder."""

from __future__ import annotations

from typing import Any

from xmatch.data.items import RegionImage
from xmatch.model.inputs import PixelInputs, input_type_of


def check_images_fit(model: Any, dataset: Any, role: str) -> None:
    """Raise when ``dataset``'s images are not what ``model.image_encoder`` reads.

    Args:
        model: a :class:`~xmatch.MatchingModel`.
        dataset: a dataset of :mod:`xmatch.data` (its first image is looked at).
        role: how the message names the set (``"training"``, ``"evaluation"``).

    Raises:
        ValueError: regions for a pixel encoder, pixels for a region encoder, or region
            features of another width; the message says what to change.

    Example:
        >>> check_images_fit(model, xmatch.data.open_dataset("scenes", None, split="test"), "evaluation")  # generates the scenes benchmark (minutes)  # doctest: +SKIP
    """
    if len(dataset) == 0:
        raise ValueError(f"the {role} set is empty.")
    image = dataset[0].image
    encoder = model.image_encoder
    name = type(encoder).__name__
    reads = input_type_of(encoder)
    if isinstance(image, RegionImage):
        if reads is PixelInputs:
            raise ValueError(
                f"the {role} set gives precomputed region features but the image encoder {name} takes "
                "pixels; use an image-captions dataset (for the scenes benchmark: --data-option "
                "layout=images), or a region encoder (e.g. 'bottomup') in the spec."
            )
        expected = getattr(encoder, "feature_dim", None)
        width = int(image.regions.shape[1])
        if expected is not None and width != expected:
            from xmatch.regions.manifest import describe_features

            made = describe_features(getattr(dataset, "root", None))  # features of xmatch extract say how
            raise ValueError(
                f"the {role} set's region features are {width}-wide but the spec's image encoder expects "
                f"feature_dim = {expected}; set image_encoder.feature_dim = {width} in the spec "
                "(--model-set image_encoder.feature_dim=...) or use features of the matching extractor"
                + (f" ({made})." if made else ".")
            )
    elif reads is not PixelInputs:
        raise ValueError(
            f"the {role} set gives raw images but the image encoder {name} takes precomputed regions; "
            "use a pixel image encoder (e.g. 'timm-grid') or a dataset of region features (for the "
            "scenes benchmark: leave out layout=images)."
        )
