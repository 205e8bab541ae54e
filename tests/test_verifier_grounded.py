"""The grounded verifier (issue 27): words grounded in regions by the model's similarities,
then reasoned over with their referents' boxes. Its grounding, that it learns a relation that
bag-of-words matching cannot see, adding it to a trained model, and its recipe."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import xmatch
from xmatch.components.verifier_grounded import GroundedVerifier
from xmatch.io.bundle import BundleError
from xmatch.model.embeddings import Embeddings
from xmatch.train.config import load_recipe

from test_verifier import small_spec

DIM = 16


def relation_batch(n: int, generator: torch.Generator) -> tuple[Embeddings, Embeddings, Embeddings]:
    """``n`` captions "<a> <left|right> <b>" over images of four objects in a row, each with its
    twin: the same objects with ``a`` and ``b`` trading places, which makes the caption false.
    Words and regions share their vectors (what a trained matching model's alignment gives), so
    a bag of words cannot tell a picture from its twin; only the boxes can."""
    vocab = F.normalize(torch.randn(10, DIM, generator=torch.Generator().manual_seed(7)), dim=-1)  # 8 objects, left, right
    objects = torch.stack([torch.randperm(8, generator=generator)[:4] for _ in range(n)])  # [n, 4], a = 0, b = 1
    slots = torch.stack([torch.randperm(4, generator=generator) for _ in range(n)]).float()  # x slot of each object
    boxes = torch.stack([slots * 0.25, torch.full_like(slots, 0.4), slots * 0.25 + 0.2, torch.full_like(slots, 0.6)], dim=-1)
    twin_boxes = boxes.clone()
    twin_boxes[:, [0, 1]] = boxes[:, [1, 0]]
    relation = torch.where(slots[:, 0] < slots[:, 1], 8, 9)  # "left" when a's slot is left of b's
    words = torch.stack([objects[:, 0], relation, objects[:, 1]], dim=1)
    mask = torch.ones(n, 4, dtype=torch.bool)
    regions = vocab[objects]
    image = Embeddings(regions, mask, None, boxes)
    twin = Embeddings(regions, mask, None, twin_boxes)
    caption = Embeddings(vocab[words], torch.ones(n, 3, dtype=torch.bool))
    return image, twin, caption


def train_and_score(steps: int = 250) -> float:
    torch.manual_seed(0)
    head = GroundedVerifier(dim=DIM, width=32, layers=2, heads=2)
    optimiser = torch.optim.Adam(head.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        image, twin, caption = relation_batch(64, generator)
        logits = torch.cat([head(image, caption), head(twin, caption)])
        labels = torch.cat([torch.ones(64), torch.zeros(64)])
        loss = F.binary_cross_entropy_with_logits(logits, labels)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    head.eval()
    with torch.no_grad():
        image, twin, caption = relation_batch(500, torch.Generator().manual_seed(99))
        return (head(image, caption) > head(twin, caption)).float().mean().item()


@pytest.mark.cpu_kernels  # a training run's outcome depends on the CPU's kernels (docs/testing.md)
def test_it_learns_which_side_an_object_is_on():
    # the twins hold the same regions and words (without boxes their logits are equal): only
    # where the words' referents lie tells them apart; 500 fresh captions, ties count as wrong
    assert train_and_score() > 0.97


def test_words_ground_in_their_most_similar_regions():
    head = GroundedVerifier(dim=DIM)
    image, _, caption = relation_batch(8, torch.Generator().manual_seed(3))
    weights, similarity, usable = head.ground(image, caption)
    assert weights.shape == (8, 3, 4) and usable.all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(8, 3))
    # the nouns' own regions (0 and 1) take almost all the weight at the starting temperature
    assert (weights[:, 0, 0] > 0.9).all() and (weights[:, 2, 1] > 0.9).all()
    # regions without a box (a global slot) take no part in grounding
    boxless = Embeddings(image.tokens, image.mask, None, image.boxes.clone())
    boxless.boxes[:, 0] = 0
    assert head.ground(boxless, caption)[0][:, :, 0].abs().max() == 0


def test_a_trained_model_gains_a_fresh_verifier_and_keeps_its_weights(tmp_path, caplog):
    torch.manual_seed(0)
    base = xmatch.build(small_spec())
    xmatch.save_pretrained(base, tmp_path / "base")
    with caplog.at_level(logging.WARNING, logger="xmatch.model.factory"):
        model = xmatch.build(f"local-dir:{tmp_path / 'base'}", pretrained=True, verifier={"name": "grounded"})
    assert "verifier newly initialised" in caplog.text
    assert isinstance(model.verifier, GroundedVerifier)
    for key, value in base.state_dict().items():
        torch.testing.assert_close(model.state_dict()[key], value, rtol=0, atol=0)
    # saved with its verifier, the bundle loads strictly again
    xmatch.save_pretrained(model, tmp_path / "with-verifier")
    again = xmatch.build(f"local-dir:{tmp_path / 'with-verifier'}", pretrained=True)
    for key, value in model.state_dict().items():
        torch.testing.assert_close(again.state_dict()[key], value, rtol=0, atol=0)


def test_only_an_added_head_may_be_missing(tmp_path):
    torch.manual_seed(0)
    xmatch.save_pretrained(xmatch.build(small_spec()), tmp_path / "base")
    changed = {"name": "transformer", "layers": 1, "heads": 2, "ff_dim": 32, "geometry": "relative"}
    with pytest.raises(BundleError, match="missing .*geometry_bias"):
        xmatch.build(f"local-dir:{tmp_path / 'base'}", pretrained=True, verifier={"name": "grounded"}, image_reasoner=changed)


def test_the_verifier_recipe_trains_the_head_alone():
    recipe = load_recipe("scenes-verifier")
    groups = [(g.match, g.freeze) for g in recipe.param_groups]
    assert groups == [("verifier.*", False), ("*", True)]
    assert recipe.negatives is not None and recipe.negatives.groups


def test_the_model_scores_and_reranks_with_a_grounded_head():
    torch.manual_seed(0)
    model = xmatch.build(small_spec(verifier={"name": "grounded", "width": 16, "heads": 2})).eval()
    regions = torch.rand(3, 5, 256)
    boxes = torch.tensor([0.1, 0.1, 0.4, 0.4]).expand(3, 5, 4).clone()
    with torch.no_grad():
        img = model.encode_images(xmatch.RegionInputs(regions, boxes))
        txt = model.encode_texts(["a red circle left of a blue square", "a big 7", "a small green star above a cross"])
        plain = model.similarity(img, txt)
        reranked = model.similarity(img, txt, rerank=2)
    assert reranked.shape == plain.shape == (3, 3)
    assert torch.isfinite(reranked).all()


def test_rerank_coverage_counts_the_own_image_and_both_twins_in_the_top_k():
    import numpy as np
    from scripts import load_script

    from xmatch.eval.groups import Group, GroupSet

    module = load_script(Path(__file__).resolve().parents[1] / "benchmarks" / "rerank_coverage.py")
    # 4 images (two twin pairs), one caption each; columns: caption 0 ranks images 0, 1, 2, 3; caption 1
    # ranks 1, 2, 3, 0; caption 2 ranks 3, 1, 0, 2; caption 3 ranks 3, 1, 0, 2
    scores = np.array([[0.9, 0.1, 0.5, 0.2], [0.8, 0.9, 0.6, 0.3], [0.7, 0.3, 0.1, 0.1], [0.1, 0.2, 0.9, 0.8]])
    groups = GroupSet([Group((0, 1), "relation"), Group((2, 3), "colour")], caption_image=np.arange(4))
    figures = module.coverage(scores, np.arange(4), groups, [1, 2, 4])
    assert figures[1]["relation"] == {"own": 1.0, "both": 0.0, "ceiling": 1.0, "list": 1}
    assert figures[2]["relation"] == {"own": 1.0, "both": 0.5, "ceiling": 1.0, "list": 2}  # caption 1's top 2 misses its twin, image 0
    assert figures[2]["colour"] == {"own": 0.5, "both": 0.0, "ceiling": 0.5, "list": 2}    # caption 2 ranks its own image last, its twin first
    assert figures[4]["colour"] == {"own": 1.0, "both": 1.0, "ceiling": 1.0, "list": 4}
    # each image's nearest image is its twin: a list of one then holds both twins
    widened = module.coverage(scores, np.arange(4), groups, [1], near=np.array([[1], [0], [3], [2]]))
    assert widened[1]["colour"] == widened[1]["relation"] == {"own": 1.0, "both": 1.0, "ceiling": 1.0, "list": 2.0}
    assert module.twin_nearest(np.array([[1], [0], [0], [2]]), groups) == {"colour": 0.5, "relation": 1.0}
