"""Typed image inputs (RegionInputs / PixelInputs), typed batches, and inference builds."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from PIL import Image

import xmatch
from conftest import random_regions, tiny_spec
from xmatch.components.image import bottomup as image_bottomup
from xmatch.data import collate, collate_images
from xmatch.data.items import ImageItem, Pair, RegionImage
from xmatch.model.inputs import (
    ImageBatch,
    PairBatch,
    PixelInputs,
    RegionInputs,
    input_type_of,
)
from xmatch.core.registry import get_registry

BOX = torch.tensor([0.1, 0.2, 0.5, 0.9])


def regions_of(n: int = 2, r: int = 3, f: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.rand(n, r, f), BOX.expand(n, r, 4).clone()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda r, b, m: (r[0], b, m), r"regions must be \[batch, regions, features\]"),
        (lambda r, b, m: (r.long(), b, m), "regions must be a floating-point tensor"),
        (lambda r, b, m: (r, b[:, :2], m), r"boxes must be \[batch, regions, 4\]"),
        (lambda r, b, m: (r, b, m.int()), "mask must be a bool tensor of shape"),
        (lambda r, b, m: (r, b, m & torch.tensor([[True], [False]])), r"images \[1\] have zero regions"),
        (lambda r, b, m: (r.index_fill(0, torch.tensor([1]), float("nan")), b, m), r"images \[1\] contain NaN"),
        (lambda r, b, m: (r, b * 2, m), r"boxes must be normalised to \[0, 1\]"),
        (lambda r, b, m: (r, b[..., [2, 1, 0, 3]], m), "x2 >= x1"),
    ],
)
def test_region_inputs_are_checked_when_made(change, message):
    regions, boxes = regions_of()
    with pytest.raises((TypeError, ValueError), match=message):
        RegionInputs(*change(regions, boxes, torch.ones(2, 3, dtype=torch.bool)))


def test_region_inputs_read_no_padded_value():
    regions, boxes = regions_of()
    mask = torch.tensor([[True, True, False], [True] * 3])
    regions[0, 2], boxes[0, 2] = float("nan"), 7.0
    assert RegionInputs(regions, boxes, mask).mask.sum() == 5


def test_region_inputs_slice_and_move():
    regions, boxes = regions_of(4)
    inputs = RegionInputs(regions, boxes)
    assert inputs.mask.dtype == torch.bool and inputs.mask.all()
    part = inputs[1:3]
    assert isinstance(part, RegionInputs) and len(part) == 2
    torch.testing.assert_close(part.regions, regions[1:3])
    assert len(inputs[-1]) == 1 and torch.equal(inputs[-1].boxes, boxes[3:])
    moved = inputs.to("cpu")
    assert torch.equal(moved.regions, regions) and torch.equal(moved.mask, inputs.mask)
    with pytest.raises(AttributeError):
        inputs.regions = regions  # a record is not changed after its checks


def test_pixel_inputs():
    pictures = [Image.new("RGB", (8, 6)), Image.new("RGB", (4, 4)), Image.new("RGB", (2, 2))]
    inputs = PixelInputs(tuple(pictures))
    assert isinstance(inputs.images, list) and len(inputs) == 3 and inputs[1].images == [pictures[1]]
    assert len(PixelInputs(np.zeros((2, 5, 5, 3), np.uint8))) == 2
    assert PixelInputs(torch.rand(2, 3, 4, 4)).to("cpu")[0].images.shape == (1, 3, 4, 4)
    with pytest.raises(TypeError, match="wrap a single picture in a list"):
        PixelInputs("photo.jpg")
    with pytest.raises(ValueError, match=r"float \[batch, 3, height, width\]"):
        PixelInputs(torch.zeros(3, 4, 4))


def test_collate_makes_typed_batches():
    pairs = [Pair(RegionImage(np.ones((r, 8), np.float32), np.zeros((r, 4), np.float32)), f"c{r}", r, 10 + r) for r in (2, 3)]
    batch = collate(pairs)
    assert isinstance(batch, PairBatch) and isinstance(batch.images, RegionInputs) and len(batch) == 2
    assert batch.images.mask.tolist() == [[True, True, False], [True] * 3] and batch.texts == ["c2", "c3"]
    assert batch.image_ids.tolist() == [2, 3] and batch.indices.tolist() == [12, 13]
    pinned = batch.pin_memory() if torch.cuda.is_available() else batch
    assert isinstance(pinned, PairBatch) and isinstance(pinned.to("cpu").images, RegionInputs)
    images = collate_images([ImageItem(Image.new("RGB", (4, 4)), 5)])
    assert isinstance(images, ImageBatch) and isinstance(images.images, PixelInputs) and images.image_ids.tolist() == [5]


def test_collate_checks_values_on_the_cpu():
    bad = RegionImage(np.full((2, 8), np.nan, np.float32), np.zeros((2, 4), np.float32))
    with pytest.raises(ValueError, match=r"images \[0\] contain NaN"):
        collate([Pair(bad, "a", 0, 0)])


def test_pair_batch_checks_the_pairing():
    regions, boxes = regions_of(3)
    with pytest.raises(ValueError, match="one to one; got 3 images and 2 captions"):
        PairBatch(RegionInputs(regions, boxes), ["a", "b"])
    with pytest.raises(TypeError, match="RegionInputs or PixelInputs"):
        PairBatch(regions, ["a", "b", "c"])


@pytest.mark.parametrize("name", get_registry("image_encoders").names())
def test_image_encoders_declare_their_input(name):
    builder = get_registry("image_encoders").get(name)
    assert getattr(builder, "input_type", None) in (RegionInputs, PixelInputs), name
    assert input_type_of(builder) is builder.input_type


@pytest.mark.parametrize("encoder", [image_bottomup.BottomUpImageEncoder, image_bottomup.RegionFeaturesImageEncoder])
def test_encoders_do_not_check_a_checked_record_again(encoder, monkeypatch):
    regions, boxes, mask = random_regions(3, 5, 12)
    enc = encoder(feature_dim=12).eval()
    inputs = RegionInputs(regions, boxes, mask)
    expected = enc(regions, boxes, mask)

    def no_value_check(*args):
        raise AssertionError("the values were checked again")

    monkeypatch.setattr(image_bottomup, "check_region_values", no_value_check)
    out = enc.encode(inputs)
    torch.testing.assert_close(out.tokens, expected.tokens)
    with pytest.raises(AssertionError, match="checked again"):
        enc(regions, boxes, mask)  # raw tensors are still checked
    with pytest.raises(ValueError, match="expects 12"):
        enc.encode(RegionInputs(torch.rand(3, 5, 10), boxes))


def test_model_reads_records_and_refuses_batch_dicts(fixture_bert):
    torch.manual_seed(0)
    model = xmatch.build(tiny_spec(fixture_bert)).eval()
    regions, boxes, mask = random_regions(3, 5, 12)
    inputs = RegionInputs(regions, boxes, mask)
    img = model.encode_images(inputs)
    torch.testing.assert_close(img.tokens, model.encode_images(RegionInputs(regions.numpy(), boxes.numpy(), mask)).tokens)
    # the embeddings carry the regions' boxes: token t is region t
    assert img.boxes is not None
    torch.testing.assert_close(img.boxes[img.mask], boxes[mask])
    texts = ["a man", "a pan", "a dog"]
    assert torch.isfinite(model(PairBatch(inputs, texts)).loss)
    with pytest.raises(TypeError, match=r"a training batch is an xmatch.PairBatch \(xmatch.data.collate makes one\), got dict"):
        model({"regions": regions, "boxes": boxes, "region_mask": mask, "texts": texts})
    with pytest.raises(TypeError, match="either typed inputs or images=.*not both"):
        model.encode_images(inputs, images=[Image.new("RGB", (4, 4))])
    with pytest.raises(ValueError, match="reads RegionInputs, got PixelInputs"):
        model.encode_images(PixelInputs([Image.new("RGB", (4, 4))]))
    with pytest.raises(ValueError, match=r"reads precomputed regions: pass xmatch.RegionInputs\(regions, boxes, mask\)"):
        model.encode_images(images=[Image.new("RGB", (4, 4))])
    for raw in (regions, regions.numpy(), None):
        with pytest.raises(TypeError, match=r"takes typed inputs, got .*: wrap region features as xmatch.RegionInputs\(regions, boxes, mask\)"):
            model.encode_images(raw)


def test_an_inference_build_has_no_loss_and_reads_training_weights(fixture_bert, tmp_path):
    spec = tiny_spec(fixture_bert, loss={"name": "uncertainty"}, extra_poolers={"alignment": {"name": "MrSw"}})
    trained = xmatch.build(spec).eval()
    assert "loss.log_variances" in trained.state_dict()
    xmatch.save_pretrained(trained, tmp_path / "bundle")
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        served = xmatch.build(f"local-dir:{tmp_path / 'bundle'}", pretrained=True, loss=None).eval()
    assert served.loss is None and "loss" not in served.spec
    regions, boxes, mask = random_regions(2, 4, 12)
    txt = ["a man", "a pan"]
    torch.testing.assert_close(
        served.similarity(served.encode_images(RegionInputs(regions, boxes, mask)), served.encode_texts(txt)),
        trained.similarity(trained.encode_images(RegionInputs(regions, boxes, mask)), trained.encode_texts(txt)),
    )
    with pytest.raises(ValueError, match="built without a loss"):
        served(PairBatch(RegionInputs(regions, boxes, mask), txt))
    xmatch.save_pretrained(served, tmp_path / "served")  # an inference bundle round-trips too
    assert xmatch.build(f"local-dir:{tmp_path / 'served'}", pretrained=True).loss is None


#: the entries whose weights ship with xmatch (the others' are downloaded, which the tests never do)
SHIPPED = [n for n in xmatch.list_models(pretrained=True) if xmatch.info(n).weights[0]["source"].startswith("zoo:")]


@pytest.mark.parametrize("name", SHIPPED)
def test_zoo_weights_load_into_inference_builds(name):
    model = xmatch.build(name, pretrained=True, loss=None)
    assert model.loss is None and not any(k.startswith("loss.") for k in model.state_dict())
