"""Helpers for the tests of xmatch and of its plugins (needs pytest).

Importing this module makes the Hugging Face libraries offline unless the environment says
otherwise: tests never download.

- :func:`one_torch_thread`: a pytest fixture; imported into a test module, every test there
  runs on one torch thread (tiny models run fastest so, and leave the other cores alone).
- :func:`retrieval_r1`: R@1 of a model on a small set, both directions, for tests that train
  a few steps and check that recall rises far above chance.

Example:
    >>> from xmatch.testing import one_torch_thread, retrieval_r1  # in a plugin's test module  # doctest: +SKIP
    >>> i2t, t2i = retrieval_r1(model, regions, captions)  # doctest: +SKIP
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch

from xmatch.eval.protocol import evaluate_scores
from xmatch.model.inputs import RegionInputs
from xmatch.model.model import MatchingModel

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread() -> Iterator[None]:
    """Run the tests of the module that imports this fixture on one torch thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def retrieval_r1(
    model: MatchingModel,
    regions: torch.Tensor,
    captions: list[str],
    *,
    boxes: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    captions_per_image: int = 1,
) -> tuple[float, float]:
    """Image-to-text and text-to-image R@1 (percent) of ``model`` on one set scored at once, in
    eval mode (the model goes back to training mode afterwards).

    Args:
        regions: ``[images, regions, features]``; ``boxes`` default to zeros, ``mask`` to all real.
        captions: ``captions_per_image`` captions per image, image by image.
    """
    if boxes is None:
        boxes = torch.zeros(*regions.shape[:2], 4)
    model.eval()
    with torch.no_grad():
        img = model.encode_images(RegionInputs(regions, boxes, mask))
        scores = model.similarity(img, model.encode_texts(captions))
    model.train()
    result = evaluate_scores(scores, protocol="full", captions_per_image=captions_per_image)
    return result.i2t["r1"], result.t2i["r1"]
