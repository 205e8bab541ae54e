"""The transformer reasoner's relative box geometry (``geometry = "relative"``): an additive
attention bias per layer and head computed from every two positions' boxes.

The default (``"none"``) must stay the papers' reasoner: the same state-dict keys and the same
outputs as torch's encoder layers, so converted checkpoints and the parity tests are untouched.
"""

from __future__ import annotations

import pytest
import torch
from conftest import random_regions, tiny_spec
from torch import nn

import xmatch
from xmatch.cli.options import model_overrides
from xmatch.components.reasoners import TransformerReasoner, edge_features, relative_box_features
from xmatch.core.spec import SpecError
from xmatch.model.inputs import RegionInputs
from xmatch.testing import one_torch_thread  # noqa: F401  (fixture)

DIM, HEADS = 16, 4


def inputs(seed: int = 0, n: int = 3, positions: int = 6) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``x``, ``mask`` and ``boxes`` laid out as the model hands them over: position 0 a global
    slot with a zero box, the last two positions of item 1 padding (zero boxes)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, positions, DIM, generator=g)
    mask = torch.ones(n, positions, dtype=torch.bool)
    mask[1, -2:] = False
    lo = torch.rand(n, positions, 2, generator=g) * 0.7
    boxes = torch.cat([lo, lo + 0.05 + torch.rand(n, positions, 2, generator=g) * 0.25], -1)
    boxes[:, 0] = 0
    boxes[~mask] = 0
    return x, mask, boxes


def geometric(seed: int = 0, **kwargs) -> TransformerReasoner:
    """A relative-geometry reasoner whose bias MLP is not at its zero start (it would be a no-op)."""
    torch.manual_seed(seed)
    r = TransformerReasoner(DIM, layers=2, heads=HEADS, ff_dim=32, dropout=0.0, geometry="relative", **kwargs)
    nn.init.normal_(r.geometry_bias.net[2].weight, std=1.0)
    nn.init.normal_(r.geometry_bias.net[2].bias, std=1.0)
    return r


def reference_stack(r: TransformerReasoner, layers: int) -> nn.ModuleList:
    """torch's own encoder layers with the reasoner's weights: what ``geometry = "none"`` was."""
    stack = nn.ModuleList(
        nn.TransformerEncoderLayer(DIM, HEADS, 32, 0.0, activation="relu", batch_first=True) for _ in range(layers)
    )
    stack.load_state_dict({k.removeprefix("layers."): v for k, v in r.state_dict().items()})
    return stack


def test_the_default_keeps_the_papers_keys_and_outputs():
    torch.manual_seed(0)
    r = TransformerReasoner(DIM, layers=2, heads=HEADS, ff_dim=32, dropout=0.0)
    assert r.geometry == "none" and not r.uses_boxes and r.geometry_bias is None
    stack = reference_stack(r, 2)
    assert list(r.state_dict()) == [f"layers.{k}" for k in stack.state_dict()]
    x, mask, boxes = inputs()
    for train in (True, False):
        r.train(train), stack.train(train)
        with torch.no_grad():
            expected = x
            for layer in stack:
                expected = layer(expected, src_key_padding_mask=~mask)
            # the real positions exactly; in training the padding comes out zero (the reasoner
            # computes real positions only, tests/test_reasoner_real_positions.py)
            torch.testing.assert_close(r(x, mask)[mask], expected[mask], rtol=0, atol=0)
            # boxes handed to a reasoner without geometry are not read
            torch.testing.assert_close(r(x, mask, boxes=boxes)[mask], expected[mask], rtol=0, atol=0)


def test_the_zoo_entry_builds_the_same_parameters_as_before():
    model = xmatch.build("teran-mrsw-scenes")
    assert model.spec["image_reasoner"]["geometry"] == "none"
    assert not any("geometry" in k for k in model.state_dict())
    assert sum(p.numel() for p in model.image_reasoner.parameters()) == 2 * (4 * 256 * 256 + 4 * 256 + 2 * 256 * 512 + 512 + 256 + 4 * 256)


def test_relative_geometry_reads_where_boxes_are_not_where_the_picture_is():
    r = geometric().eval()
    x, mask, boxes = inputs()
    with torch.no_grad():
        before = r(x, mask, boxes=boxes)
        torch.testing.assert_close(r(x, mask, boxes=boxes.clone()), before, rtol=0, atol=0)
        moved = boxes.clone()
        moved[0, 2] += torch.tensor([0.2, 0.0, 0.2, 0.0])  # one region moves right
        after = r(x, mask, boxes=moved)
        assert (after[0] - before[0]).abs().amax() > 1e-2
        torch.testing.assert_close(after[1:], before[1:], rtol=0, atol=0)
        # every region shifted alike keeps every relative position: the same outputs
        shifted = boxes + torch.tensor([0.1, 0.05, 0.1, 0.05]) * (boxes != 0).any(-1, keepdim=True)
        torch.testing.assert_close(r(x, mask, boxes=shifted), before, rtol=1e-5, atol=1e-5)
        assert (r(x, mask) - before)[mask].abs().amax() > 1e-2


def test_the_bias_starts_at_zero_so_a_fresh_option_computes_what_the_weights_did():
    torch.manual_seed(0)
    r = TransformerReasoner(DIM, layers=2, heads=HEADS, ff_dim=32, dropout=0.0, geometry="relative")
    x, mask, boxes = inputs()
    torch.testing.assert_close(r(x, mask, boxes=boxes), r(x, mask), rtol=1e-6, atol=1e-6)


def test_regions_in_another_order_give_the_same_outputs_in_that_order():
    r = geometric().eval()
    x, mask, boxes = inputs(positions=7)
    mask[:] = True
    perm = torch.tensor([0, 4, 2, 6, 1, 5, 3])  # the global slot stays first, as the model lays it out
    with torch.no_grad():
        torch.testing.assert_close(
            r(x[:, perm], mask[:, perm], boxes=boxes[:, perm]), r(x, mask, boxes=boxes)[:, perm], rtol=1e-5, atol=1e-5
        )


def test_the_global_slot_and_padding_get_no_bias():
    r = geometric()
    x, mask, boxes = inputs()
    bias = r.geometry_bias(boxes, mask, torch.float32).view(2, 3, HEADS, 6, 6)
    assert bias[:, :, :, 0, :].abs().amax() == 0 and bias[:, :, :, :, 0].abs().amax() == 0
    assert bias[:, 1, :, -2:, :].abs().amax() == 0 and bias[:, 1, :, :, -2:].abs().amax() == 0
    assert bias[:, :, :, 1:4, 1:4].abs().amin() > 0
    # a padded slot's box, whatever it holds, changes nothing of the real positions
    r.eval()
    junk = boxes.clone()
    junk[1, -2:] = torch.tensor([0.1, 0.2, 0.9, 0.8])
    with torch.no_grad():
        torch.testing.assert_close(r(x, mask, boxes=junk)[mask], r(x, mask, boxes=boxes)[mask], rtol=0, atol=0)


def test_boxes_none_is_the_computation_without_geometry_with_the_same_weights():
    r = geometric()
    plain = TransformerReasoner(DIM, layers=2, heads=HEADS, ff_dim=32, dropout=0.0)
    plain.load_state_dict({k: v for k, v in r.state_dict().items() if not k.startswith("geometry_bias.")})
    x, mask, _ = inputs()
    torch.testing.assert_close(r(x, mask, boxes=None), plain(x, mask), rtol=0, atol=0)


@pytest.mark.parametrize("norm_first", [False, True])
def test_training_and_evaluation_agree_so_the_fast_path_keeps_the_bias(norm_first):
    # in eval mode without gradients torch's fused encoder layer reads a float src_mask as a
    # boolean one (pytorch#118628): the bias would be dropped and rows would come out NaN
    r = geometric(norm_first=norm_first)
    x, mask, boxes = inputs()
    trained = r.train()(x, mask, boxes=boxes)
    with torch.no_grad():
        evaluated = r.eval()(x, mask, boxes=boxes)
    assert not evaluated.isnan().any()
    torch.testing.assert_close(evaluated[mask], trained[mask].detach(), rtol=1e-5, atol=1e-5)
    # and the biased layer is exactly torch's slow path
    biases = r.geometry_bias(boxes, mask, torch.float32)
    padding = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
    expected = x
    for layer, bias in zip(r.train().layers, biases):
        expected = layer(expected, src_mask=bias, src_key_padding_mask=padding)
    torch.testing.assert_close(trained[mask], expected[mask], rtol=0, atol=0)


def test_gradients_reach_the_bias_mlp():
    torch.manual_seed(0)
    r = TransformerReasoner(DIM, layers=2, heads=HEADS, ff_dim=32, dropout=0.0, geometry="relative")
    x, mask, boxes = inputs()
    target = torch.randn_like(x)
    opt = torch.optim.SGD(r.parameters(), lr=0.1)
    for _ in range(2):  # the output layer starts at zero: the first layer learns from the second step on
        opt.zero_grad()
        ((r(x, mask, boxes=boxes) - target)[mask] ** 2).mean().backward()
        grads = {name: p.grad.abs().sum().item() for name, p in r.geometry_bias.named_parameters()}
        opt.step()
    assert all(g > 0 for g in grads.values()), grads


def test_other_dtypes():
    r = geometric().double()
    x, mask, boxes = inputs()
    assert r(x.double(), mask, boxes=boxes.double()).dtype == torch.float64


def test_box_features_see_direction_size_and_overlap():
    boxes = torch.tensor([[[0.1, 0.1, 0.3, 0.3], [0.5, 0.1, 0.9, 0.3], [0.1, 0.1, 0.3, 0.3]]])
    f = relative_box_features(boxes)[0]
    assert f.shape == (3, 3, 7)
    torch.testing.assert_close(f[0, 1, :2], torch.tensor([0.5, 0.0]))  # 1 is right of 0, level
    torch.testing.assert_close(f[1, 0, :2], torch.tensor([-0.5, 0.0]))
    torch.testing.assert_close(f[0, 1, 4], torch.tensor(2.0).log())  # twice as wide
    torch.testing.assert_close(f[0, 2, 6], torch.tensor(1.0))  # the same box
    torch.testing.assert_close(f[0, 1, 6], torch.tensor(0.0))  # apart
    # a degenerate box stays finite
    assert torch.isfinite(relative_box_features(torch.tensor([[[0.2, 0.2, 0.2, 0.2], [0.0, 0.0, 1.0, 1.0]]]))).all()


def test_an_unknown_geometry_names_the_choices():
    with pytest.raises(ValueError, match=r"unknown geometry 'absolute'; use one of 'none', 'relative'"):
        TransformerReasoner(DIM, geometry="absolute")
    with pytest.raises(SpecError, match=r"image_reasoner \(transformer\): .*unknown geometry 'absolute'"):
        xmatch.build("teran-mrsw-scenes", image_reasoner={"geometry": "absolute"})


def test_the_option_goes_through_the_spec_and_a_bundle(tmp_path):
    model = xmatch.build("teran-mrsw-scenes", **model_overrides(["image_reasoner.geometry=relative"])).eval()
    assert model.image_reasoner.uses_boxes and not model.text_reasoner.uses_boxes
    assert model.spec["image_reasoner"]["geometry"] == "relative" and model.spec["text_reasoner"]["geometry"] == "none"
    nn.init.normal_(model.image_reasoner.geometry_bias.net[2].weight)
    regions, boxes, mask = random_regions(3, 5, 1280)
    captions = ["a red ball left of a cube", "a cube above a ball"]
    with torch.no_grad():
        img = model.encode_images(RegionInputs(regions, boxes, mask))
        scores = model.similarity(img, model.encode_texts(captions))
        moved = boxes.clone()
        moved[:, 0, [0, 2]] = 1 - boxes[:, 0, [2, 0]]  # the first region mirrored left-right
        assert not torch.equal(model.encode_images(RegionInputs(regions, moved, mask)).tokens, img.tokens)
    xmatch.save_pretrained(model, tmp_path / "bundle")
    again = xmatch.build(f"local-dir:{tmp_path / 'bundle'}", pretrained=True).eval()
    assert again.spec["image_reasoner"] == model.spec["image_reasoner"] and again.image_reasoner.uses_boxes
    with torch.no_grad():
        torch.testing.assert_close(
            again.similarity(again.encode_images(RegionInputs(regions, boxes, mask)), again.encode_texts(captions)),
            scores, rtol=0, atol=0,
        )


def test_a_shared_reasoner_reads_boxes_for_images_only(fixture_bert):
    spec = tiny_spec(fixture_bert, shared_reasoner=True)
    spec["image_reasoner"] = {"name": "transformer", "layers": 1, "ff_dim": 32, "dropout": 0.0, "geometry": "relative"}
    del spec["text_reasoner"]
    model = xmatch.build(spec).eval()
    assert model.image_reasoner is model.text_reasoner and model.image_reasoner.uses_boxes
    nn.init.normal_(model.image_reasoner.geometry_bias.net[2].weight)
    plain_spec = tiny_spec(fixture_bert, shared_reasoner=True)
    plain_spec["image_reasoner"] = {"name": "transformer", "layers": 1, "ff_dim": 32, "dropout": 0.0}
    del plain_spec["text_reasoner"]
    plain = xmatch.build(plain_spec).eval()
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if ".geometry_bias." not in k})
    captions = ["a man is cooking dinner", "the stove"]
    regions, boxes, mask = random_regions(2, 4, 12)
    with torch.no_grad():
        torch.testing.assert_close(model.encode_texts(captions).tokens, plain.encode_texts(captions).tokens, rtol=0, atol=0)
        assert not torch.allclose(
            model.encode_images(RegionInputs(regions, boxes, mask)).tokens,
            plain.encode_images(RegionInputs(regions, boxes, mask)).tokens,
        )


def spatial_task(g: torch.Generator, n: int, markers: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Six regions of random features, two of them marked A and B, at random places and in a
    random order; the label is whether A's centre lies left of B's. The features say nothing of
    the boxes, so only geometry can read the label."""
    x = torch.randn(n, 6, DIM, generator=g)
    x[:, 0] += markers[0]
    x[:, 1] += markers[1]
    lo = torch.rand(n, 6, 2, generator=g) * 0.8
    boxes = torch.cat([lo, lo + 0.05 + torch.rand(n, 6, 2, generator=g) * 0.15], -1)
    order = torch.argsort(torch.rand(n, 6, generator=g), 1)
    x, boxes = x.gather(1, order[..., None].expand_as(x)), boxes.gather(1, order[..., None].expand_as(boxes))
    a, b = (order == 0).int().argmax(1), (order == 1).int().argmax(1)
    centre = boxes[..., 0] + boxes[..., 2]
    rows = torch.arange(n)
    return x, boxes, a, (centre[rows, a] < centre[rows, b]).float()


@pytest.mark.cpu_kernels  # a training run's outcome depends on the CPU's kernels (docs/testing.md)
@pytest.mark.parametrize("geometry", ["none", "relative"])
def test_geometry_learns_left_of(geometry, one_torch_thread):  # noqa: F811
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    markers = torch.randn(2, DIM, generator=g) * 2
    r = TransformerReasoner(DIM, layers=1, heads=HEADS, ff_dim=32, dropout=0.0, geometry=geometry, geometry_dim=32)
    head = nn.Linear(DIM, 1)
    opt = torch.optim.Adam([*r.parameters(), *head.parameters()], lr=3e-3)
    mask = torch.ones(128, 6, dtype=torch.bool)
    for _ in range(100):
        x, boxes, a, label = spatial_task(g, 128, markers)
        logit = head(r(x, mask, boxes=boxes)[torch.arange(128), a]).squeeze(-1)
        opt.zero_grad()
        nn.functional.binary_cross_entropy_with_logits(logit, label).backward()
        opt.step()
    x, boxes, a, label = spatial_task(g, 2000, markers)
    with torch.no_grad():
        logit = head(r.eval()(x, torch.ones(2000, 6, dtype=torch.bool), boxes=boxes)[torch.arange(2000), a]).squeeze(-1)
    accuracy = ((logit > 0).float() == label).float().mean().item()
    # 2,000 test pairs: chance is 0.50 +- 0.03 at two standard deviations
    if geometry == "relative":
        assert accuracy > 0.9
    else:
        assert 0.45 < accuracy < 0.55


def test_edge_features_see_touching_and_containment():
    boxes = torch.tensor([[[0.0, 0.0, 0.4, 0.4], [0.1, 0.1, 0.2, 0.2], [0.0, 0.4, 0.4, 0.6]]])
    f = edge_features(boxes)[0]
    assert f[1, 0, 4].item() == pytest.approx(1.0)  # the small box lies wholly inside the large one
    assert f[0, 1, 5].item() == pytest.approx(1.0)
    assert f[0, 2, 2].item() == pytest.approx(0.0)  # box 2 starts where box 0 ends: they touch
    assert f[0, 1, 0].item() == pytest.approx(-0.3)  # overlapping along x: a negative gap
