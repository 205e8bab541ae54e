"""The grounded head's layout likelihood: a caption's density over the geometry of its words'
referents, trained on positive pairs alone (xmatch.components.layout_likelihood)."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

import xmatch
from xmatch.components.layout_likelihood import LAYOUT_FEATURES, LayoutLikelihood, layout_features
from xmatch.components.verifier_grounded import GroundedVerifier
from xmatch.model.embeddings import Embeddings

from test_verifier import small_spec
from test_verifier_grounded import DIM, relation_batch


def test_layout_features_keep_signed_and_absolute_offsets():
    boxes = torch.tensor([[[0.0, 0.0, 0.2, 0.2], [0.6, 0.0, 0.8, 0.2]]])
    f = layout_features(boxes)
    assert f.shape == (1, 2, 2, LAYOUT_FEATURES)
    assert f[0, 0, 1, 0].item() == pytest.approx(0.6) and f[0, 1, 0, 0].item() == pytest.approx(-0.6)
    # "next to" fixes how far apart, not on which side: the absolute offset is the same both ways
    assert f[0, 0, 1, 7].item() == pytest.approx(0.6) and f[0, 1, 0, 7].item() == pytest.approx(0.6)


def test_gates_follow_the_grounding_and_leave_padding_out():
    layout = LayoutLikelihood(dim=8)
    best = torch.tensor([[0.6, 0.1, 0.55, 0.2, 0.9]])
    mask = torch.tensor([[True, True, True, True, False]])
    gate = layout.gates(best, mask)[0]
    assert gate[4] == 0  # padding, however well it "grounds"
    assert gate[0] > 0.8 and gate[2] > 0.8 and gate[1] < 0.2 and gate[3] < 0.2


def test_a_caption_without_two_boxed_words_has_no_layout_to_check():
    layout = LayoutLikelihood(dim=8)
    boxes = torch.zeros(2, 3, 4)
    boxes[1, 0] = torch.tensor([0.1, 0.1, 0.3, 0.3])  # one boxed word: no pair
    fit = layout(torch.randn(2, 3, 8), torch.ones(2, 3, dtype=torch.bool), boxes, torch.rand(2, 3))
    assert torch.equal(fit.surprise, torch.zeros(2)) and torch.equal(fit.loss, torch.zeros(2))


def caption_boxes(image: Embeddings) -> torch.Tensor:
    """The boxes of "<a> <left|right> <b>": a's, none for the relation word, b's."""
    boxes = torch.zeros(len(image), 3, 4)
    boxes[:, 0], boxes[:, 2] = image.boxes[:, 0], image.boxes[:, 1]
    return boxes


@pytest.mark.cpu_kernels  # a training run's outcome depends on the CPU's kernels (docs/testing.md)
def test_the_density_learns_a_relation_from_positives_alone():
    # no twin, no negative: the caption's likelihood of its own picture's layout only; the
    # twin (a and b trade places) is then the less likely layout for 500 fresh captions
    torch.manual_seed(0)
    layout = LayoutLikelihood(dim=DIM, width=32)
    optimiser = torch.optim.Adam(layout.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(1)
    best = torch.tensor([1.0, 0.0, 1.0])
    for _ in range(200):  # 9 seeds: 8 at 100 % after 150 steps, the ninth at 87 % (100 % by 200)
        image, _, caption = relation_batch(64, generator)
        loss = layout(caption.tokens, caption.mask, caption_boxes(image), best.expand(64, 3)).loss.mean()
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    with torch.no_grad():
        image, twin, caption = relation_batch(500, torch.Generator().manual_seed(99))
        own = layout(caption.tokens, caption.mask, caption_boxes(image), best.expand(500, 3)).surprise
        swapped = layout(caption.tokens, caption.mask, caption_boxes(twin), best.expand(500, 3)).surprise
    assert (own < swapped).float().mean().item() > 0.97


def pairs(n: int = 4, words: int = 6, regions: int = 5, seed: int = 0) -> tuple[Embeddings, Embeddings]:
    g = torch.Generator().manual_seed(seed)
    lo = torch.rand(n, regions, 2, generator=g) * 0.7
    boxes = torch.cat([lo, lo + 0.1], -1)
    img = Embeddings(F.normalize(torch.randn(n, regions, DIM, generator=g), dim=-1), torch.ones(n, regions, dtype=torch.bool),
                     boxes=boxes)
    txt = Embeddings(F.normalize(torch.randn(n, words, DIM, generator=g), dim=-1), torch.ones(n, words, dtype=torch.bool))
    return img, txt


def test_the_head_trains_its_layout_on_the_positives():
    torch.manual_seed(0)
    head = GroundedVerifier(dim=DIM, width=32, heads=2, layout=True)
    img, txt = pairs()
    out = head.training_loss(img, txt, torch.randn(4, 4))
    assert "verifier_layout" in out.logs and torch.isfinite(out.loss)
    out.loss.backward()
    assert head.layout.pair[-1].weight.grad.abs().sum() > 0 and head.layout_scale.grad is not None
    assert "verifier_layout" not in GroundedVerifier(dim=DIM, width=32, heads=2).training_loss(img, txt, torch.randn(4, 4)).logs


def test_the_layout_changes_the_logit_and_keeps_regions_orderless():
    torch.manual_seed(0)
    head = GroundedVerifier(dim=DIM, width=32, heads=2, layout=True).eval()
    img, txt = pairs()
    with torch.no_grad():
        logits = head(img, txt)
        order = torch.randperm(5)
        permuted = Embeddings(img.tokens[:, order], img.mask[:, order], boxes=img.boxes[:, order])
        torch.testing.assert_close(head(permuted, txt), logits, rtol=1e-5, atol=1e-5)
        head.layout_scale.fill_(0.0)
        assert not torch.allclose(head(img, txt), logits)


def test_a_bundle_keeps_its_layout(tmp_path, caplog):
    torch.manual_seed(0)
    xmatch.save_pretrained(xmatch.build(small_spec()), tmp_path / "base")
    with caplog.at_level(logging.WARNING, logger="xmatch.model.factory"):
        model = xmatch.build(f"local-dir:{tmp_path / 'base'}", pretrained=True, verifier={"name": "grounded", "layout": True})
    assert model.verifier.layout is not None
    xmatch.save_pretrained(model, tmp_path / "with-layout")
    again = xmatch.build(f"local-dir:{tmp_path / 'with-layout'}", pretrained=True)
    assert again.verifier.layout is not None
    for key, value in model.state_dict().items():
        torch.testing.assert_close(again.state_dict()[key], value, rtol=0, atol=0)
