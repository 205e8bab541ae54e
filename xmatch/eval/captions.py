"""Caption lists ordered image by image: the input every relevance measure
(:mod:`xmatch.eval.relevance`, :mod:`xmatch.eval.spice`) checks before it scores."""

from __future__ import annotations

from collections.abc import Sequence


def check_captions(captions: Sequence[str], captions_per_image: int) -> list[str]:
    """Validate a caption list ordered image by image and return it as a list of str.

    Args:
        captions: every caption of the set, image by image (caption k belongs to image
            ``k // captions_per_image``).
        captions_per_image: captions of each image (5 for COCO and Flickr30k).

    Raises:
        ValueError: empty list, a non-string entry, ``captions_per_image < 1`` or a length that
            is not a multiple of ``captions_per_image``; the message says how to fix it.

    Example:
        >>> check_captions(["a dog", "the dog"], captions_per_image=2)
        ['a dog', 'the dog']
    """
    if isinstance(captions, str):
        raise ValueError("captions must be a sequence of strings, got a single string; wrap it in a list.")
    captions = list(captions)
    if not isinstance(captions_per_image, int) or isinstance(captions_per_image, bool) or captions_per_image < 1:
        raise ValueError(f"captions_per_image must be a positive integer, got {captions_per_image!r}.")
    if not captions:
        raise ValueError("captions is empty; pass every caption of the set, image by image.")
    for k, caption in enumerate(captions):
        if not isinstance(caption, str):
            raise ValueError(
                f"caption {k} is {type(caption).__name__} ({caption!r}), not str; decode bytes and "
                "convert every caption to str before computing relevances."
            )
    if len(captions) % captions_per_image:
        raise ValueError(
            f"{len(captions)} captions do not split into images of {captions_per_image} captions; "
            f"order them image by image with exactly {captions_per_image} per image (pad or drop "
            "captions), or set captions_per_image."
        )
    return captions
