"""The model API end to end: build from the zoo, encode, rank, align, save and reload, bad input."""

from __future__ import annotations

import warnings

import pytest
import torch

import xmatch
from xmatch import Embeddings
from xmatch.model.inputs import PairBatch, RegionInputs

from conftest import MINILM, random_regions, tiny_spec


@pytest.fixture(scope="module")
def teran_minilm():
    """The real zoo entry with the offline MiniLM (a BERT-family model) as text encoder."""
    torch.manual_seed(0)
    model = xmatch.build("teran-mrsw-coco", text_encoder={"backbone": MINILM})
    return model.eval()


def test_zoo_model_encodes_and_ranks(teran_minilm):
    model = teran_minilm
    assert model.text_encoder.output_dim == 384 and len(model.text_encoder.model.encoder.layer) == 6
    regions, boxes, mask = random_regions(3, 36, 2048)
    captions = ["a dog sitting on a bench", "two people riding horses on a beach", "a red bus"]
    with torch.no_grad():
        img = model.encode_images(RegionInputs(regions, boxes, mask))
        txt = model.encode_texts(captions)
        scores = model.similarity(img, txt)
    assert scores.shape == (3, 3) and torch.isfinite(scores).all()
    assert img.tokens.shape[2] == txt.tokens.shape[2] == 1024
    assert img.lengths.tolist() == mask.sum(1).tolist()  # the CLS slot is not a region
    assert torch.allclose(img.tokens[img.mask].norm(dim=-1), torch.ones(int(mask.sum())), atol=1e-5)
    # MrSw is a sum over words of cosines: bounded by the number of words
    assert (scores.abs() <= txt.lengths[None].float() + 1e-4).all()
    ranking = scores.argsort(dim=1, descending=True)
    assert sorted(ranking[0].tolist()) == [0, 1, 2]


def test_words_exclude_cls_and_sep(teran_minilm):
    batch = teran_minilm.tokenize(["a dog sitting on a bench"])
    words = teran_minilm.text_encoder.tokenizer.convert_ids_to_tokens(batch.inputs["input_ids"][0][batch.content[0]])
    assert words == ["a", "dog", "sitting", "on", "a", "bench"]


def test_alignment_matrix_of_one_pair(teran_minilm):
    regions, boxes, mask = random_regions(2, 10, 2048, seed=3)
    with torch.no_grad():
        img = teran_minilm.encode_images(RegionInputs(regions, boxes, mask))
        txt = teran_minilm.encode_texts(["a dog on a bench", "a cat"])
        A = teran_minilm.alignment(img[1], txt[0])
        scores = teran_minilm.similarity(img, txt)
    assert A.shape == (int(mask[1].sum()), 5)
    assert A.max(dim=0).values.sum().item() == pytest.approx(scores[1, 0].item(), abs=1e-4)
    with pytest.raises(ValueError, match="one image and one text"):
        teran_minilm.alignment(img, txt[0])


def test_batched_encoding_equals_one_batch(fixture_bert):
    model = xmatch.build(tiny_spec(fixture_bert)).eval()
    regions, boxes, mask = random_regions(7, 6, 12, seed=1)
    captions = ["a man is cooking dinner", "the stove", "a small kitchen with a pan and a man"] * 3
    with torch.no_grad():
        full = model.similarity(model.encode_images(RegionInputs(regions, boxes, mask)), model.encode_texts(captions))
        parts = model.similarity(
            model.encode_images(RegionInputs(regions, boxes, mask), batch_size=2), model.encode_texts(captions, batch_size=4)
        )
    torch.testing.assert_close(parts, full, rtol=1e-5, atol=1e-5)


def test_save_and_reload_round_trip(fixture_bert, tmp_path):
    model = xmatch.build(tiny_spec(fixture_bert, shared_reasoner=True)).eval()
    xmatch.save_pretrained(model, tmp_path / "bundle")
    again = xmatch.build(f"local-dir:{tmp_path / 'bundle'}", pretrained=True).eval()
    assert again.image_reasoner is again.text_reasoner
    regions, boxes, mask = random_regions(3, 4, 12)
    with torch.no_grad():
        a = model.similarity(model.encode_images(RegionInputs(regions, boxes, mask)), model.encode_texts(["a man", "a pan"]))
        b = again.similarity(again.encode_images(RegionInputs(regions, boxes, mask)), again.encode_texts(["a man", "a pan"]))
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert again.spec["image_encoder"] == model.spec["image_encoder"]


def test_save_in_float16_halves_the_file_and_loads_back_as_float32(fixture_bert, tmp_path):
    model = xmatch.build(tiny_spec(fixture_bert)).eval()
    full = xmatch.save_pretrained(model, tmp_path / "full") / "model.safetensors"
    half = xmatch.save_pretrained(model, tmp_path / "half", dtype=torch.float16) / "model.safetensors"
    assert next(model.parameters()).dtype == torch.float32  # the saved model is left as it was
    assert half.stat().st_size < 0.6 * full.stat().st_size
    again = xmatch.build(f"local-dir:{tmp_path / 'half'}", pretrained=True).eval()
    for name, value in again.state_dict().items():
        reference = model.state_dict()[name]
        assert value.dtype == reference.dtype, name
        if value.is_floating_point():
            torch.testing.assert_close(value, reference.half().float(), rtol=0, atol=0)
    with pytest.raises(ValueError, match="floating-point dtype"):
        xmatch.save_pretrained(model, tmp_path / "int", dtype=torch.int8)


def test_mismatched_weights_are_an_error(fixture_bert, tmp_path):
    xmatch.save_pretrained(xmatch.build(tiny_spec(fixture_bert)), tmp_path / "a")
    other = tiny_spec(fixture_bert, embed_dim=8)
    with pytest.raises(ValueError, match="does not fit this model"):
        xmatch.build(other, checkpoint=tmp_path / "a" / "model.safetensors")
    (tmp_path / "broken.safetensors").write_bytes(b"\x00" * 20)
    with pytest.raises(ValueError, match="not a readable safetensors"):
        xmatch.build(tiny_spec(fixture_bert), checkpoint=tmp_path / "broken.safetensors")


def test_embeddings_save_load_slice_and_cat(tmp_path):
    e = Embeddings(torch.randn(4, 3, 8), torch.rand(4, 3) > 0.3, torch.randn(4, 8))
    e.save(tmp_path / "e.safetensors", metadata={"model": "x"})
    back = Embeddings.load(tmp_path / "e.safetensors")
    torch.testing.assert_close(back.tokens, e.tokens)
    assert torch.equal(back.mask, e.mask) and back.pooled is not None
    both = Embeddings.cat([e[:2], Embeddings(torch.randn(1, 5, 8), torch.ones(1, 5, dtype=torch.bool), torch.randn(1, 8))])
    assert both.tokens.shape == (3, 5, 8) and not both.mask[:2, 3:].any()
    with pytest.raises(ValueError, match="mask must be a bool"):
        Embeddings(torch.randn(2, 3, 4), torch.ones(2, 3))
    with pytest.raises(FileNotFoundError):
        Embeddings.load(tmp_path / "missing.safetensors")


@pytest.fixture(scope="module")
def tiny_model(fixture_bert):
    return xmatch.build(tiny_spec(fixture_bert)).eval()


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda r, b, m: (r[..., :10], b, m), "expects 12"),
        (lambda r, b, m: (r[0], b, m), r"regions must be \[batch, regions, features\]"),
        (lambda r, b, m: (r.masked_fill(torch.zeros_like(r, dtype=torch.bool).index_fill_(0, torch.tensor([1]), True), float("nan")), b, m), r"images \[1\] contain NaN"),
        (lambda r, b, m: (r, b * 300, m), r"normalised to \[0, 1\]"),
        (lambda r, b, m: (r, b[..., [2, 1, 0, 3]], m), "x2 >= x1"),
        (lambda r, b, m: (r, b, m & False), "zero regions"),
        (lambda r, b, m: (r, b[:, :3], m), r"boxes must be \[batch, regions, 4\]"),
        (lambda r, b, m: (r, b, m.long()), "mask must be a bool"),
        (lambda r, b, m: (r.long(), b, m), "floating-point"),
    ],
)
def test_bad_image_input_is_a_clear_error(tiny_model, change, message):
    regions, boxes, mask = random_regions(3, 4, 12)
    mask[:] = True
    with pytest.raises((ValueError, TypeError), match=message):
        tiny_model.encode_images(RegionInputs(*change(regions, boxes, mask)))


def test_bad_text_input(tiny_model):
    with pytest.raises(ValueError, match=r"captions \[1\] have no words"):
        tiny_model.encode_texts(["a man", "   "])
    with pytest.raises(TypeError, match="list of captions"):
        tiny_model.encode_texts("a man")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        txt = tiny_model.encode_texts(["a man " * 400])
    assert any("truncated" in str(w.message) for w in caught)
    assert txt.tokens.shape[1] <= 512


def test_mismatched_training_batch(tiny_model):
    regions, boxes, mask = random_regions(3, 4, 12)
    with pytest.raises(ValueError, match="one to one"):
        tiny_model(PairBatch(RegionInputs(regions, boxes, mask), ["a man", "a pan"]))


def test_training_step_lowers_the_loss(fixture_bert):
    torch.manual_seed(0)
    model = xmatch.build(tiny_spec(fixture_bert, pooler="Symm"))
    regions, boxes, mask = random_regions(6, 5, 12, seed=4)
    texts = ["a man cooking", "the stove", "a pan", "a small kitchen", "a person", "the counter"]
    batch = PairBatch(RegionInputs(regions, boxes, mask), texts)
    model.eval()  # no dropout: the comparison is about the step, not the noise
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    first = model(batch).loss
    for _ in range(15):
        opt.zero_grad()
        loss = model(batch).loss
        loss.backward()
        opt.step()
    assert model(batch).loss.item() < 0.5 * first.item()


def test_pretrained_true_without_weights_says_how_to_get_them():
    with pytest.raises(ValueError, match=r"build\(.teran-mrsw-coco., checkpoint=.model_best.pth.\)"):
        xmatch.build("teran-mrsw-coco", pretrained=True, text_encoder={"backbone": MINILM})


def test_pretrained_true_on_a_plain_spec_is_a_clear_error(fixture_bert):
    with pytest.raises(ValueError, match="'<spec dict>' is a spec without weights"):
        xmatch.build(tiny_spec(fixture_bert), pretrained=True)


def test_a_side_without_projection_uses_the_encoder_output_as_is(fixture_bert):
    spec = tiny_spec(fixture_bert, embed_dim=40, text_projection=False)  # the tiny BERT is 40-wide
    model = xmatch.build(spec)
    assert isinstance(model.text_projection, torch.nn.Identity)
    assert isinstance(model.image_projection, torch.nn.Linear)
    assert model.spec["text_projection"] is False and model.spec["image_projection"] is True
    assert not any(n.startswith("text_projection.") for n, _ in model.named_parameters())
    with pytest.raises(xmatch.SpecError, match=r"text_projection = false uses the text encoder's 40-wide output .* embed_dim = 16"):
        xmatch.build(tiny_spec(fixture_bert, text_projection=False))
