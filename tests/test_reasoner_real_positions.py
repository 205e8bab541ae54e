"""The transformer reasoner's training forward on real positions only.

Without dropout, a training forward computes every per-position product (projections,
feed-forward) on the real positions alone and runs attention on the padded layout with the
key padding as its mask: half of a batch of captions is padding. It must give what torch's
encoder layers give on every real position, the same gradients, and zeros on the padding;
with dropout (the papers' 0.1) the layers themselves run, drawing their masks as before.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import xmatch
from xmatch.components import reasoners
from xmatch.components.reasoners import TransformerReasoner
from xmatch.model.inputs import PairBatch, RegionInputs

DIM, HEADS = 16, 4


def ragged(seed: int = 0, n: int = 5, positions: int = 9, padded: bool = True):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, positions, DIM, generator=g, requires_grad=True)
    lengths = torch.tensor([positions, 1, 4, 7, 2][:n]) if padded else torch.full((n,), positions)
    mask = torch.arange(positions)[None] < lengths[:, None]
    lo = torch.rand(n, positions, 2, generator=g) * 0.7
    boxes = torch.cat([lo, lo + 0.05 + torch.rand(n, positions, 2, generator=g) * 0.25], -1) * mask[..., None]
    return x, mask, boxes


def reasoner(geometry: str, norm_first: bool, dropout: float = 0.0) -> TransformerReasoner:
    torch.manual_seed(0)
    r = TransformerReasoner(DIM, layers=2, heads=HEADS, ff_dim=32, dropout=dropout, norm_first=norm_first, geometry=geometry)
    if r.geometry_bias is not None:  # off its zero start, or the bias would add nothing
        nn.init.normal_(r.geometry_bias.net[2].weight, std=1.0)
    return r.train()


def layers_forward(r: TransformerReasoner, x: torch.Tensor, mask: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
    """torch's encoder layers, called as the reasoner calls them where it does not pack."""
    if r.geometry_bias is None:
        for layer in r.layers:
            x = layer(x, src_key_padding_mask=~mask)
        return x
    padding = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
    for layer, bias in zip(r.layers, r.geometry_bias(boxes, mask, x.dtype)):
        x = layer(x, src_mask=bias, src_key_padding_mask=padding)
    return x


@pytest.mark.parametrize("padded", [True, False])
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("geometry", ["none", "relative"])
def test_real_positions_and_gradients_are_the_layers_own(geometry, norm_first, padded):
    r = reasoner(geometry, norm_first)
    x, mask, boxes = ragged(padded=padded)
    target = torch.randn(x.shape, generator=torch.Generator().manual_seed(1))
    ours = r(x, mask, boxes=boxes)
    theirs = layers_forward(r, x, mask, boxes)
    torch.testing.assert_close(ours[mask], theirs[mask], rtol=1e-6, atol=1e-6)
    assert (ours[~mask] == 0).all()
    params = [x, *r.parameters()]
    grads = torch.autograd.grad(((ours - target)[mask] ** 2).sum(), params)
    expected = torch.autograd.grad(((theirs - target)[mask] ** 2).sum(), params)
    for got, want in zip(grads, expected):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_with_dropout_the_layers_run_and_draw_their_masks_as_before():
    r = reasoner("none", False, dropout=0.1)
    x, mask, boxes = ragged()
    torch.manual_seed(3)
    ours = r(x, mask)
    torch.manual_seed(3)
    theirs = layers_forward(r, x, mask, boxes)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)  # padding included: nothing packed


def test_evaluation_is_the_layers_own():
    r = reasoner("none", False).eval()
    x, mask, boxes = ragged()
    with torch.no_grad():
        torch.testing.assert_close(r(x, mask)[mask], layers_forward(r, x, mask, boxes)[mask], rtol=1e-6, atol=1e-6)


def test_under_bfloat16_autocast():
    for geometry in ("none", "relative"):
        r = reasoner(geometry, False)
        x, mask, boxes = ragged()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            ours = r(x, mask, boxes=boxes)
            theirs = layers_forward(r, x, mask, boxes)
        torch.testing.assert_close(ours[mask].float(), theirs[mask].float(), rtol=0.05, atol=0.05)


@pytest.mark.parametrize("geometry", ["none", "relative"])
def test_a_models_training_loss_and_gradients_do_not_change(geometry, monkeypatch):
    """The whole training step of the scenes model (captions of different lengths): nothing
    downstream reads the padded positions the layers used to fill."""
    torch.manual_seed(0)
    model = xmatch.build("teran-mrsw-scenes", image_reasoner={"geometry": geometry}).train()
    g = torch.Generator().manual_seed(0)
    regions = torch.relu(torch.randn(4, 36, 1280, generator=g))
    lo = torch.rand(4, 36, 2, generator=g) * 0.6
    boxes = torch.cat([lo, lo + 0.1 + torch.rand(4, 36, 2, generator=g) * 0.3], -1)
    captions = ["a red circle", "a small blue square left of a big green seven above a star",
                "two yellow stars", "a circle below a red 7"]
    batch = PairBatch(RegionInputs(regions, boxes), captions)

    def step():
        model.zero_grad()
        out = model(batch)
        out.loss.backward()
        return out.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    loss, grads = step()
    monkeypatch.setattr(reasoners.TransformerReasoner, "_dropout_active", lambda self: True)
    expected_loss, expected = step()
    torch.testing.assert_close(loss, expected_loss, rtol=1e-6, atol=1e-6)
    assert grads.keys() == expected.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], expected[name], rtol=1e-4, atol=1e-6, msg=name)
