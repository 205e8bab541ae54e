"""Evaluating models on a dataset: each image and caption encoded once, results independent of
batch and chunk sizes, ensembles = averaged scores, COCO 1K computes only its fold blocks."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

import xmatch
from xmatch.eval import encode_dataset, evaluate, evaluate_scores
from xmatch.model.inputs import ImageBatch, RegionInputs

from conftest import random_regions, tiny_spec

WORDS = "dog cat bus car red blue small large man woman bench beach tree horse".split()


@dataclass
class TinySet:
    """A RetrievalSet held in memory: 12 images with 5 captions each."""

    regions: torch.Tensor
    boxes: torch.Tensor
    mask: torch.Tensor
    captions: list[str]
    captions_per_image: int = 5

    def image_batches(self, batch_size: int):
        for i in range(0, len(self.regions), batch_size):
            images = RegionInputs(self.regions[i : i + batch_size], self.boxes[i : i + batch_size], self.mask[i : i + batch_size])
            yield ImageBatch(images)


@pytest.fixture(scope="module")
def tiny_set() -> TinySet:
    regions, boxes, mask = random_regions(12, 6, 12, seed=3)
    rng = np.random.default_rng(0)
    captions = [" ".join(rng.choice(WORDS, size=rng.integers(3, 8))) for _ in range(60)]
    return TinySet(regions, boxes, mask, captions)


@pytest.fixture(scope="module")
def models(fixture_bert):
    torch.manual_seed(0)
    a = xmatch.build(tiny_spec(fixture_bert)).eval()
    b = xmatch.build(tiny_spec(fixture_bert, pooler="Symm")).eval()
    return a, b


def _direct_scores(model, data: TinySet) -> np.ndarray:
    with torch.no_grad():
        img = model.encode_images(RegionInputs(data.regions, data.boxes, data.mask))
        txt = model.encode_texts(data.captions)
        return model.similarity(img, txt).numpy()


def test_evaluate_equals_scoring_the_whole_matrix(models, tiny_set):
    model = models[0]
    result = evaluate(model, tiny_set, "full", progress=False)
    expected = evaluate_scores(_direct_scores(model, tiny_set), "full")
    assert result.figures()["i2t"] == pytest.approx(expected.i2t)
    assert result.t2i == pytest.approx(expected.t2i)
    np.testing.assert_array_equal(result.queries["t2i_ranks"], expected.queries["t2i_ranks"])
    assert set(result.timings) == {"model0_encode_s", "model0_similarity_s"}


def test_each_image_and_caption_is_encoded_once(models, tiny_set, monkeypatch):
    model = models[0]
    seen = {"images": 0, "texts": 0}
    image_forward, text_forward = model.image_encoder.forward, model.text_encoder.forward

    def count_images(regions, *args, **kwargs):
        seen["images"] += len(regions)
        return image_forward(regions, *args, **kwargs)

    def count_texts(batch, *args, **kwargs):
        seen["texts"] += len(batch)
        return text_forward(batch, *args, **kwargs)

    monkeypatch.setattr(model.image_encoder, "forward", count_images)
    monkeypatch.setattr(model.text_encoder, "forward", count_texts)
    encoded = encode_dataset(model, tiny_set, image_batch_size=5, text_batch_size=7, progress=False)
    assert seen == {"images": 12, "texts": 60}
    assert len(encoded.images) == 12 and len(encoded.captions) == 60


def test_batch_and_chunk_sizes_do_not_change_the_figures(models, tiny_set):
    model = models[1]
    reference = evaluate(model, tiny_set, "full", progress=False)
    model.pooler.block_elements = 50  # tiny blocks: many image x text chunks
    try:
        chunked = evaluate(model, tiny_set, "full", image_batch_size=5, text_batch_size=7, progress=False)
    finally:
        model.pooler.block_elements = type(model.pooler).block_elements
    assert chunked.i2t == pytest.approx(reference.i2t, abs=1e-9)
    assert chunked.t2i == pytest.approx(reference.t2i, abs=1e-9)
    np.testing.assert_array_equal(chunked.queries["i2t_ranks"], reference.queries["i2t_ranks"])


def test_folds_score_only_their_own_block(models, tiny_set):
    model = models[0]
    direct = _direct_scores(model, tiny_set)
    result = evaluate(model, tiny_set, "coco-1k", fold_images=4, progress=False)
    expected = evaluate_scores(direct, "coco-1k", fold_images=4)
    assert len(result.folds) == 3
    assert result.i2t == pytest.approx(expected.i2t) and result.rsum == pytest.approx(expected.rsum)


def test_an_ensemble_averages_the_score_matrices(models, tiny_set):
    result = evaluate(list(models), tiny_set, "full", progress=False)
    averaged = (_direct_scores(models[0], tiny_set) + _direct_scores(models[1], tiny_set)) / 2
    expected = evaluate_scores(averaged, "full")
    assert result.i2t == pytest.approx(expected.i2t) and result.t2i == pytest.approx(expected.t2i)
    assert len(result.timings) == 4


def test_mismatched_dataset_is_a_clear_error(models, tiny_set):
    broken = TinySet(tiny_set.regions[:10], tiny_set.boxes[:10], tiny_set.mask[:10], tiny_set.captions)
    with pytest.raises(ValueError, match="yielded 10 images for 60 captions"):
        evaluate(models[0], broken, "full", progress=False)
    uneven = TinySet(tiny_set.regions, tiny_set.boxes, tiny_set.mask, tiny_set.captions, captions_per_image=None)
    with pytest.raises(ValueError, match="same number of captions for every image"):
        evaluate(models[0], uneven, "full", progress=False)
    with pytest.raises(ValueError, match="folds of 5"):
        evaluate(models[0], tiny_set, "coco-1k", fold_images=5, progress=False)
