"""A whole xmatch model built from a SCAN spec computes the original SCAN pipeline; bundles,
ensembles and the image encoder's input checks."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import xmatch
from _scan_reference import l2norm, xattn_score
from xmatch.eval import evaluate, evaluate_scores

from xmatch_scan import ScanPrecompImageEncoder, init_like_original

WORDS = ["a", "dog", "on", "the", "bench", "cat", "red", "car", "man", "riding"]
CAPTIONS = ["a dog on the bench", "a red car", "the man riding a red car", "cat", "a cat on a car"]
TINY = {"embed_dim": 16, "image_encoder": {"feature_dim": 12}, "text_encoder": {"vocab": WORDS, "word_dim": 8, "hidden_dim": 16}}


def inputs(n=4, r=5, f=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    regions = torch.relu(torch.randn(n, r, f, generator=g, dtype=torch.float64))
    return regions, torch.tensor([0.0, 0.0, 1.0, 1.0], dtype=torch.float64).expand(n, r, 4)


def original_scores_and_loss(model, regions, captions):
    """The original pipeline on the model's own parameters: v = l2norm(fc(f)),
    e = l2norm((h_fwd + h_bwd) / 2) with <start>/<end>, stacked cross attention, and
    SCAN's ContrastiveLoss with --max_violation (hardest negatives, summed)."""
    v = l2norm(model.image_projection(regions), dim=-1)
    batch = model.text_encoder.tokenize(captions)
    e = l2norm(model.text_encoder(batch).tokens, dim=-1)
    p = model.pooler
    scores = xattn_score(v, e, batch.mask.sum(1), p.direction, p.lambda_softmax, p.agg_func, p.lambda_lse, p.raw_feature_norm)
    d = scores.diagonal()
    eye = torch.eye(len(captions), dtype=torch.bool)
    cost_s = (0.2 + scores - d[:, None]).clamp_min(0).masked_fill(eye, 0)
    cost_im = (0.2 + scores - d[None, :]).clamp_min(0).masked_fill(eye, 0)
    return scores, cost_s.amax(1).sum() + cost_im.amax(0).sum()


@pytest.mark.parametrize("name", ["scan-t2i-lse-coco", "scan-i2t-avg-f30k", "scan-i2t-lse-coco"])
def test_model_scores_and_loss_are_the_original_pipeline_before_and_after_training(name):
    torch.manual_seed(0)
    model = xmatch.build(name, **TINY).double()
    regions, boxes = inputs()
    batch = xmatch.PairBatch(xmatch.RegionInputs(regions, boxes), CAPTIONS[:4])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(2):
        # step 0: as built (no init_like_original needed); step 1: after an Adam step moved
        # every parameter, which a layer SCAN does not have would make visible
        with torch.no_grad():
            expected, expected_loss = original_scores_and_loss(model, regions, CAPTIONS[:4])
            scores = model.similarity(model.encode_images(xmatch.RegionInputs(regions, boxes)), model.encode_texts(CAPTIONS[:4]))
        # xmatch's final F.normalize divides by max(|x|, 1e-12), the original by |x| + 1e-8
        torch.testing.assert_close(scores, expected, rtol=1e-7, atol=1e-7)
        loss = model(batch).loss
        assert loss.item() == pytest.approx(expected_loss.item(), abs=1e-6)
        if step == 0:
            gru_before = model.text_encoder.rnn.weight_hh_l0.detach().clone()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    assert (model.text_encoder.rnn.weight_hh_l0 - gru_before).abs().max() > 1e-3


def test_only_scan_parameters_are_trained():
    model = xmatch.build("scan-t2i-avg-f30k", text_encoder={"vocab": WORDS})
    assert isinstance(model.text_projection, torch.nn.Identity)
    # the original's SCAN.params: img_enc.fc and txt_enc (embedding + GRU)
    names = {n.split(".")[0] for n, _ in model.named_parameters()}
    assert names == {"image_projection", "text_encoder"}
    assert {n for n, _ in model.image_projection.named_parameters()} == {"weight", "bias"}


def test_init_like_original_is_xavier_fc():
    model = init_like_original(xmatch.build("scan-t2i-avg-f30k", text_encoder={"vocab": WORDS}))
    w = model.image_projection.weight
    r = math.sqrt(6 / (2048 + 1024))
    assert w.abs().max() <= r and w.abs().max() > 0.99 * r and abs(w.std().item() - r / math.sqrt(3)) < 1e-3
    assert model.image_projection.bias.abs().max() == 0
    embed = model.text_encoder.embed.weight[2:]  # past <pad> (zero) and <unk>
    assert embed.abs().max() <= 0.1 and embed.abs().max() > 0.09


def test_init_like_original_refuses_models_that_are_not_scan():
    with pytest.raises(ValueError, match="build it with text_projection = false"):
        init_like_original(xmatch.build("scan-t2i-avg-f30k", text_projection=True, text_encoder={"vocab": WORDS}))
    with pytest.raises(ValueError, match="no SCAN fc to initialise"):
        init_like_original(xmatch.build("scan-t2i-avg-f30k", image_projection=False, **TINY | {"image_encoder": {"feature_dim": 16}}))
    with pytest.raises(TypeError, match="initialises SCAN models"):
        init_like_original(xmatch.build("scan-t2i-avg-f30k", text_encoder={"name": "bigru", "vocab": WORDS}))


def test_text_width_must_be_the_embedding_width():
    with pytest.raises(xmatch.SpecError, match="set embed_dim = 16 or keep the projection"):
        xmatch.build("scan-t2i-avg-f30k", embed_dim=32, text_encoder={"vocab": WORDS, "hidden_dim": 16})


def test_bundle_round_trip_gives_the_same_scores(tmp_path):
    torch.manual_seed(0)
    model = xmatch.build("scan-i2t-lse-coco", **TINY).eval()
    regions, boxes = (t.float() for t in inputs(seed=1))
    before = model.similarity(model.encode_images(xmatch.RegionInputs(regions, boxes)), model.encode_texts(CAPTIONS))
    xmatch.save_pretrained(model, tmp_path / "bundle")
    again = xmatch.build(f"local-dir:{tmp_path / 'bundle'}", pretrained=True).eval()
    assert again.spec == model.spec | {"text_encoder": again.spec["text_encoder"]}
    assert again.text_encoder.vocabulary == model.text_encoder.vocabulary
    after = again.similarity(again.encode_images(xmatch.RegionInputs(regions, boxes)), again.encode_texts(CAPTIONS))
    torch.testing.assert_close(after, before, rtol=0, atol=0)


class TinyRetrievalSet:
    """Five images with one caption each, in xmatch's RetrievalSet shape."""

    captions = CAPTIONS
    captions_per_image = 1

    def __init__(self):
        self.regions, self.boxes = (t.float() for t in inputs(n=5, seed=2))

    def image_batches(self, batch_size):
        for i in range(0, 5, batch_size):
            yield xmatch.ImageBatch(xmatch.RegionInputs(self.regions[i : i + batch_size], self.boxes[i : i + batch_size]))


def test_t2i_plus_i2t_ensemble_averages_the_two_models_scores():
    torch.manual_seed(0)
    t2i = xmatch.build("scan-t2i-lse-coco", **TINY).eval()
    i2t = xmatch.build("scan-i2t-avg-coco", **TINY).eval()
    data = TinyRetrievalSet()

    def scores(m):
        with torch.no_grad():
            return m.similarity(m.encode_images(xmatch.RegionInputs(data.regions, data.boxes)), m.encode_texts(CAPTIONS)).numpy()

    result = evaluate([t2i, i2t], data, "full", image_batch_size=2, progress=False)
    expected = evaluate_scores((scores(t2i) + scores(i2t)) / 2, "full", captions_per_image=1)
    assert result.i2t == expected.i2t and result.t2i == expected.t2i
    assert not np.allclose(scores(t2i), scores(i2t))


def test_image_encoder_inputs():
    enc = ScanPrecompImageEncoder(feature_dim=6)
    regions = torch.rand(2, 3, 6)
    out = enc(regions)
    assert torch.equal(out.tokens, regions) and out.mask.all() and not out.global_slot
    with pytest.raises(ValueError, match="regions have 5 features but the image encoder expects 6"):
        enc(torch.rand(2, 3, 5))
    with pytest.raises(ValueError, match=r"regions must be \[batch, regions, features\]"):
        enc(torch.rand(3, 6))
    with pytest.raises(ValueError, match=r"images \[1\] have zero regions"):
        enc(regions, mask=torch.tensor([[True, False, False], [False, False, False]]))
    with pytest.raises(ValueError, match="boxes must be normalised to \\[0, 1\\]"):
        enc(regions, boxes=torch.full((2, 3, 4), 20.0))
    nan = regions.clone()
    nan[1, 2, 0] = float("nan")
    with pytest.raises(ValueError, match=r"images \[1\] contain NaN"):
        enc(nan)
    assert enc(nan, mask=torch.tensor([[True] * 3, [True, True, False]])).tokens[1, 2].abs().sum() == 0
