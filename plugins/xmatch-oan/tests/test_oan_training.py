"""A short training run on small learnable synthetic data lifts R@1 far above chance, with
both intra-modal sampling strategies."""

from __future__ import annotations

import itertools

import pytest
import torch

import xmatch
from xmatch.testing import one_torch_thread, retrieval_r1  # noqa: F401  (autouse: one torch thread)

CONCEPTS = ["dog", "cat", "car", "tree", "boat", "horse", "bird", "chair"]


def synthetic(feature_dim: int, seed: int = 0) -> tuple[torch.Tensor, list[str]]:
    """Each image: one region per named concept (its pattern plus noise) and one noise region;
    its caption names the two concepts. 28 images: chance R@1 is 1/28 = 3.6%."""
    g = torch.Generator().manual_seed(seed)
    patterns = torch.randn(len(CONCEPTS), feature_dim, generator=g)
    pairs = list(itertools.combinations(range(len(CONCEPTS)), 2))
    regions = torch.stack([torch.stack([patterns[a], patterns[b], torch.zeros(feature_dim)]) for a, b in pairs])
    regions = regions + 0.3 * torch.randn(regions.shape, generator=g)
    captions = [f"a {CONCEPTS[a]} next to a {CONCEPTS[b]}" for a, b in pairs]
    return regions, captions


@pytest.mark.cpu_kernels  # a training run's outcome depends on the CPU's kernels (docs/testing.md)
@pytest.mark.parametrize("sampling", ["hardest", "all"])
def test_training_lifts_recall_far_above_chance(sampling):
    torch.manual_seed(0)
    regions, captions = synthetic(feature_dim=24)
    model = xmatch.build(
        "oan-coco", embed_dim=32, image_encoder={"feature_dim": 24},
        text_encoder={"vocab": ["a", "next", "to", *CONCEPTS], "word_dim": 16, "channels": 16},
        image_reasoner={"heads": 2}, text_reasoner={"heads": 2}, loss={"intra_sampling": sampling},
    )
    before = retrieval_r1(model, regions, captions)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    batch = xmatch.PairBatch(xmatch.RegionInputs(regions, torch.zeros(*regions.shape[:2], 4)), captions)
    for _ in range(100):
        optimizer.zero_grad()
        out = model(batch)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 2.0)  # the paper's gradient clip
        optimizer.step()
    after = retrieval_r1(model, regions, captions)
    chance = 100 / len(captions)
    assert max(before) < 5 * chance
    assert min(after) >= 60, (before, after)
