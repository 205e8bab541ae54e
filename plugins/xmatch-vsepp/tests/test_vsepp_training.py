"""A short training run on small learnable synthetic data lifts R@1 far above chance."""

from __future__ import annotations

import itertools

import pytest
import torch

import xmatch
from xmatch.testing import one_torch_thread, retrieval_r1  # noqa: F401  (autouse: one torch thread)

CONCEPTS = ["dog", "cat", "car", "tree", "boat", "horse", "bird", "chair"]


def synthetic(feature_dim: int, seed: int = 0) -> tuple[torch.Tensor, list[str]]:
    """One global feature per image = the sum of its two concepts' patterns plus noise; its
    caption names the two concepts. 28 images, so chance R@1 is 1/28 = 3.6%."""
    g = torch.Generator().manual_seed(seed)
    patterns = torch.randn(len(CONCEPTS), feature_dim, generator=g)
    pairs = list(itertools.combinations(range(len(CONCEPTS)), 2))
    features = torch.stack([patterns[a] + patterns[b] for a, b in pairs])
    features = features + 0.1 * torch.randn(features.shape, generator=g)
    captions = [f"a {CONCEPTS[a]} next to a {CONCEPTS[b]}" for a, b in pairs]
    return features.unsqueeze(1), captions


@pytest.mark.cpu_kernels  # a training run's outcome depends on the CPU's kernels (docs/testing.md)
@pytest.mark.parametrize("entry", ["vsepp-precomp-coco", "vsepp-orderpp-precomp-coco"])
def test_training_lifts_recall_far_above_chance(entry):
    torch.manual_seed(0)
    features, captions = synthetic(feature_dim=24)
    model = xmatch.build(entry, embed_dim=32, image_encoder={"feature_dim": 24},
                         text_encoder={"vocab": ["a", "next", "to", *CONCEPTS], "word_dim": 16, "hidden_dim": 32})
    before = retrieval_r1(model, features, captions)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    batch = xmatch.PairBatch(xmatch.RegionInputs(features, torch.zeros(len(features), 1, 4)), captions)
    for _ in range(100):
        optimizer.zero_grad()
        out = model(batch)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 2.0)  # VSE++ grad_clip
        optimizer.step()
    after = retrieval_r1(model, features, captions)
    chance = 100 / len(captions)
    assert max(before) < 5 * chance
    assert min(after) >= 60, (before, after)
