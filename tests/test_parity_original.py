"""Parity with the original TERAN and TERN code on the stored fixtures (REFERENCE.md, compat 'original')."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import xmatch
from xmatch.components.losses import hinge_triplet
from xmatch.model.masks import lengths_to_mask
from xmatch.model.inputs import PairBatch, RegionInputs

pytestmark = pytest.mark.cpu_kernels  # floats from the CPU's kernels against stored ones (docs/testing.md)

ORIGINAL_NAMES = {"MrSw": "MrSw", "MwSr": "MwSr", "Symm": "symm", "MrAvgw": "MrAVGw"}
TOL = dict(rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def converted(mrsw_small):
    model = xmatch.convert_original(mrsw_small / "checkpoint.pth")
    return model.eval()


@pytest.fixture(scope="module")
def encoded(converted, mrsw_io):
    regions = torch.from_numpy(mrsw_io["region_features"])
    boxes = torch.from_numpy(mrsw_io["boxes_norm"])
    mask = lengths_to_mask(torch.from_numpy(mrsw_io["n_regions"]), regions.shape[1])
    with torch.no_grad():
        img = converted.encode_images(RegionInputs(regions, boxes, mask))
        txt = converted.encode_texts([str(c) for c in mrsw_io["captions"]])
    return img, txt


def test_converted_spec_is_original_mode(converted):
    spec = converted.spec
    assert spec["pooler"] == {"name": "MrSw", "compat": "original", "region_slots": 36, "word_slots": 85}
    assert spec["text_encoder"]["drop_last_wordpiece"] is True
    assert spec["text_encoder"]["layers"] == 2
    assert spec["image_encoder"]["feature_dim"] == 48 and spec["embed_dim"] == 32


def test_tokenizer_reproduces_original_ids(converted, mrsw_io):
    batch = converted.tokenize([str(c) for c in mrsw_io["captions"]])
    np.testing.assert_array_equal(batch.inputs["input_ids"].numpy(), mrsw_io["token_ids"])
    np.testing.assert_array_equal(batch.mask.sum(1).numpy(), mrsw_io["cap_lengths"])


def test_region_embeddings_match(encoded, mrsw_io):
    img, _ = encoded
    ref, lengths = mrsw_io["eval_img_set"], mrsw_io["eval_img_lengths"]
    for i in range(len(ref)):
        ours = img.tokens[i][img.mask[i]].numpy()
        np.testing.assert_allclose(ours, ref[i, 1 : lengths[i]], **TOL)
    np.testing.assert_allclose(img.pooled.numpy(), mrsw_io["img_emb_aggr"], **TOL)


def test_word_embeddings_match(encoded, mrsw_io):
    _, txt = encoded
    ref, lengths = mrsw_io["eval_cap_seq"], mrsw_io["eval_cap_lengths"]
    for k in range(len(ref)):
        # the original keeps positions 1 .. len-3: no [CLS], [SEP] or last word-piece
        np.testing.assert_allclose(txt.tokens[k][txt.mask[k]].numpy(), ref[k, 1 : lengths[k] - 2], **TOL)
    np.testing.assert_allclose(txt.pooled.numpy(), mrsw_io["cap_emb_aggr"], **TOL)


@pytest.mark.parametrize("pooler", sorted(ORIGINAL_NAMES))
def test_evaluation_similarities_match(encoded, mrsw_io, pooler):
    img, txt = encoded
    scores = xmatch.core.registry.poolers.get(pooler)(compat="original")(img, txt)
    np.testing.assert_allclose(scores.numpy(), mrsw_io[f"sim_{ORIGINAL_NAMES[pooler]}"], **TOL)


def test_model_similarity_uses_its_pooler(converted, encoded, mrsw_io):
    img, txt = encoded
    np.testing.assert_allclose(converted.similarity(img, txt).numpy(), mrsw_io["sim_MrSw"], **TOL)


@pytest.mark.parametrize("pooler", sorted(ORIGINAL_NAMES))
def test_training_layout_similarities_and_losses_match(encoded, mrsw_io, pooler):
    img, txt = encoded
    pairs = txt[torch.arange(0, 20, 5)]  # caption 5i with image i, as the fixture's batch
    scores = xmatch.core.registry.poolers.get(pooler)(compat="original")(img, pairs, batch_layout=True)
    name = ORIGINAL_NAMES[pooler]
    np.testing.assert_allclose(scores.numpy(), mrsw_io[f"train_sim_{name}"], **TOL)
    loss, _ = hinge_triplet(scores, margin=0.2, max_violation=True)
    assert float(loss) == pytest.approx(float(mrsw_io[f"train_loss_{name}"]), rel=1e-5)
    if pooler == "MrSw":
        all_violations, _ = hinge_triplet(scores, margin=0.2, max_violation=False)
        assert float(all_violations) == pytest.approx(float(mrsw_io["train_loss_sum_all_violations"]), rel=1e-5)


def test_clean_mode_differs_where_original_zero_fills(encoded, mrsw_io):
    img, txt = encoded
    clean = xmatch.core.registry.poolers.get("MrSw")()(img, txt).numpy()
    original = mrsw_io["sim_MrSw"]
    # image 2 has 28 of 36 regions: only its row may differ, and only upwards (max(x, 0) >= x)
    changed = ~np.isclose(clean, original, atol=1e-5)
    assert changed.any() and not changed[[0, 1, 3]].any()
    assert (original[changed] > clean[changed]).all()


def _training_batch(mrsw_io):
    idx = list(range(0, 20, 5))
    images = RegionInputs(
        torch.from_numpy(mrsw_io["region_features"]),
        torch.from_numpy(mrsw_io["boxes_norm"]),
        lengths_to_mask(torch.from_numpy(mrsw_io["n_regions"]), 36),
    )
    return PairBatch(images, [str(mrsw_io["captions"][k]) for k in idx])


def test_forward_loss_and_gradient_norm_match(converted, mrsw_io):
    converted.zero_grad()
    out = converted(_training_batch(mrsw_io))
    assert out.loss.item() == pytest.approx(float(mrsw_io["train_loss_model_forward"]), rel=1e-5)
    assert out.logs["main_sum"] == pytest.approx(out.loss.item())
    out.loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(converted.parameters(), max_norm=float("inf"))
    assert float(norm) == pytest.approx(float(mrsw_io["step_grad_norm_preclip"]), rel=1e-4)
    converted.zero_grad()


def test_intermediates_match(converted, mrsw_io):
    batch = _training_batch(mrsw_io)
    seen = {}
    hooks = [
        converted.image_encoder.box_conditioning.register_forward_hook(lambda m, i, o: seen.__setitem__("box", o)),
        converted.image_encoder.transformer.register_forward_hook(lambda m, i, o: seen.__setitem__("vis", o)),
        converted.text_encoder.model.register_forward_hook(lambda m, i, o: seen.__setitem__("bert", o.last_hidden_state)),
    ]
    try:
        with torch.no_grad():
            converted(batch)
    finally:
        for h in hooks:
            h.remove()
    box_ref = mrsw_io["inter_box_mlp_out_seqfirst"].transpose(1, 0, 2)
    valid = lengths_to_mask(torch.from_numpy(mrsw_io["model_in_img_lengths"]), 37).numpy()
    np.testing.assert_allclose(seen["box"].numpy()[valid], box_ref[valid], **TOL)
    np.testing.assert_allclose(seen["vis"].numpy()[valid], mrsw_io["inter_visual_te_out"][valid], **TOL)
    lengths = mrsw_io["train_cap_lengths"]
    for k, n in enumerate(lengths):
        np.testing.assert_allclose(seen["bert"][k, :n].numpy(), mrsw_io["inter_bert_layer_out"][k, :n], **TOL)


def test_pretrained_path_converts_on_the_fly(mrsw_small, mrsw_io, encoded):
    model = xmatch.build("teran-mrsw-coco", checkpoint=mrsw_small / "checkpoint.pth").eval()
    regions = torch.from_numpy(mrsw_io["region_features"])
    boxes = torch.from_numpy(mrsw_io["boxes_norm"])
    mask = lengths_to_mask(torch.from_numpy(mrsw_io["n_regions"]), 36)
    with torch.no_grad():
        scores = model.similarity(model.encode_images(RegionInputs(regions, boxes, mask)), encoded[1])
    np.testing.assert_allclose(scores.numpy(), mrsw_io["sim_MrSw"], **TOL)


def test_original_to_bundle_round_trip_is_bit_exact(converted, mrsw_io, encoded, tmp_path):
    xmatch.save_pretrained(converted, tmp_path / "bundle")
    again = xmatch.build(f"local-dir:{tmp_path / 'bundle'}", pretrained=True).eval()
    # the bundle keeps its own copy of the tokenizer / config: only the text source moves
    moved = {**again.spec, "text_encoder": {**again.spec["text_encoder"], "backbone": converted.spec["text_encoder"]["backbone"]}}
    assert moved == converted.spec
    theirs = again.state_dict()
    for key, value in converted.state_dict().items():
        assert torch.equal(theirs[key], value), key
    regions = torch.from_numpy(mrsw_io["region_features"])
    boxes = torch.from_numpy(mrsw_io["boxes_norm"])
    mask = lengths_to_mask(torch.from_numpy(mrsw_io["n_regions"]), regions.shape[1])
    with torch.no_grad():
        scores = again.similarity(again.encode_images(RegionInputs(regions, boxes, mask)),
                                  again.encode_texts([str(c) for c in mrsw_io["captions"]]))
        reference = converted.similarity(*encoded)
    assert torch.equal(scores, reference)


# --- TERN -------------------------------------------------------------------------------------
# tests/fixtures/tern-original/tern-small: a checkpoint written like mesnico/TERN's train.py,
# whose config (configs/tern.yaml) has neither training.loss-type nor alignment-mode; its
# outputs come from make_fixture.py, a line-by-line port of the original TERN code.

TERN_SMALL = Path(__file__).resolve().parent / "fixtures" / "tern-original" / "tern-small"


@pytest.fixture(scope="module")
def tern_io():
    return dict(np.load(TERN_SMALL / "io.npz"))


@pytest.fixture(scope="module")
def tern():
    return xmatch.convert_original(TERN_SMALL / "checkpoint.pth").eval()


def _tern_images(io):
    regions = torch.from_numpy(io["region_features"])
    boxes = torch.from_numpy(io["boxes_norm"])
    return regions, boxes, lengths_to_mask(torch.from_numpy(io["n_regions"]), regions.shape[1])


@pytest.fixture(scope="module")
def tern_encoded(tern, tern_io):
    with torch.no_grad():
        return tern.encode_images(RegionInputs(*_tern_images(tern_io))), tern.encode_texts([str(c) for c in tern_io["captions"]])


def _unit(x):
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)  # padded slots are zeros


def test_tern_config_converts_to_shared_cls_cosine(tern):
    spec = tern.spec
    assert spec["pooler"] == {"name": "global-cosine"}
    assert spec["shared_reasoner"] is True and "text_reasoner" not in xmatch.info("tern-coco").spec
    assert tern.text_reasoner is tern.image_reasoner
    # TERN has no alignment, so none of TERAN's [:, 1:-2] slicing
    assert spec["text_encoder"]["drop_last_wordpiece"] is False
    assert (spec["embed_dim"], spec["image_encoder"]["feature_dim"], spec["image_encoder"]["layers"]) == (12, 20, 2)
    assert spec["text_encoder"]["layers"] == 2 and spec["image_reasoner"]["layers"] == 2
    assert spec["loss"]["name"] == "hinge" and spec["loss"]["margin"] == 0.2 and spec["loss"]["max_violation"] is True


def test_tern_tokenizer_reproduces_original_ids(tern, tern_io):
    batch = tern.tokenize([str(c) for c in tern_io["captions"]])
    np.testing.assert_array_equal(batch.inputs["input_ids"].numpy(), tern_io["token_ids"])
    np.testing.assert_array_equal(batch.mask.sum(1).numpy(), tern_io["cap_lengths"])


def test_tern_cls_embeddings_and_scores_match(tern, tern_encoded, tern_io):
    img, txt = tern_encoded
    np.testing.assert_allclose(img.pooled.numpy(), tern_io["img_emb_aggr"], **TOL)
    np.testing.assert_allclose(txt.pooled.numpy(), tern_io["cap_emb_aggr"], **TOL)
    # what evaluation.py:t2i ranks, and the same ranking for every caption
    scores = tern.similarity(img, txt).numpy()
    np.testing.assert_allclose(scores, tern_io["sim_dot"], **TOL)
    np.testing.assert_array_equal(scores.argsort(0), tern_io["sim_dot"].argsort(0))


def test_tern_sets_match_up_to_normalisation(tern_encoded, tern_io):
    # TERN returns its sets unnormalised and never scores them; xmatch keeps unit tokens
    img, txt = tern_encoded
    ref, lengths = _unit(tern_io["eval_img_set_raw"]), tern_io["eval_img_lengths"]
    for i in range(len(ref)):
        np.testing.assert_allclose(img.tokens[i][img.mask[i]].numpy(), ref[i, 1 : lengths[i]], **TOL)
    ref, lengths = _unit(tern_io["eval_cap_set_raw"]), tern_io["eval_cap_lengths"]
    for k in range(len(ref)):  # every word-piece between [CLS] and [SEP]
        np.testing.assert_allclose(txt.tokens[k][txt.mask[k]].numpy(), ref[k, 1 : lengths[k] - 1], **TOL)


def _tern_training_batch(io):
    regions, boxes, mask = _tern_images(io)
    return PairBatch(RegionInputs(regions, boxes, mask), [str(io["captions"][k]) for k in range(0, 20, 5)])


def test_tern_training_scores_loss_and_gradient_norm_match(tern, tern_io):
    tern.zero_grad()
    img, txt = tern.encode_batch(_tern_training_batch(tern_io))
    scores = tern.pooler(img, txt, batch_layout=True)
    np.testing.assert_allclose(scores.detach().numpy(), tern_io["train_sim_dot"], **TOL)
    out = tern.batch_loss(img, txt)
    assert out.loss.item() == pytest.approx(float(tern_io["train_loss_model_forward"]), rel=1e-5)
    all_violations, _ = hinge_triplet(scores.detach(), margin=0.2, max_violation=False)
    assert float(all_violations) == pytest.approx(float(tern_io["train_loss_sum_all_violations"]), rel=1e-5)
    out.loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(tern.parameters(), max_norm=float("inf"))
    assert float(norm) == pytest.approx(float(tern_io["step_grad_norm_preclip"]), rel=1e-4)
    tern.zero_grad()


def test_tern_intermediates_match_and_the_final_te_is_shared(tern, tern_io):
    seen, reasoned = {}, []
    hooks = [
        tern.image_encoder.box_conditioning.register_forward_hook(lambda m, i, o: seen.__setitem__("box", o)),
        tern.image_encoder.transformer.register_forward_hook(lambda m, i, o: seen.__setitem__("vis", o)),
        tern.text_encoder.model.register_forward_hook(lambda m, i, o: seen.__setitem__("bert", o.last_hidden_state)),
        tern.image_reasoner.register_forward_hook(lambda m, i, o: reasoned.append(o)),
    ]
    try:
        with torch.no_grad():
            tern.encode_batch(_tern_training_batch(tern_io))
    finally:
        for h in hooks:
            h.remove()
    valid = lengths_to_mask(torch.from_numpy(tern_io["train_img_lengths"]), 37).numpy()
    np.testing.assert_allclose(seen["box"].numpy()[valid], tern_io["inter_box_mlp_out_seqfirst"].transpose(1, 0, 2)[valid], **TOL)
    np.testing.assert_allclose(seen["vis"].numpy()[valid], tern_io["inter_visual_te_out"][valid], **TOL)
    image_te, text_te = reasoned  # one module, called for the images and then for the captions
    np.testing.assert_allclose(image_te.numpy()[valid], tern_io["inter_img_te_out_seqfirst"].transpose(1, 0, 2)[valid], **TOL)
    caption_te = tern_io["inter_cap_te_out_seqfirst"].transpose(1, 0, 2)
    for k, n in enumerate(tern_io["train_cap_lengths"]):
        np.testing.assert_allclose(seen["bert"][k, :n].numpy(), tern_io["inter_bert_layer_out"][k, :n], **TOL)
        np.testing.assert_allclose(text_te[k, :n].numpy(), caption_te[k, :n], **TOL)


def test_tern_pretrained_path_converts_on_the_fly(tern_io):
    model = xmatch.build("tern-coco", checkpoint=TERN_SMALL / "checkpoint.pth").eval()
    with torch.no_grad():
        scores = model.similarity(model.encode_images(RegionInputs(*_tern_images(tern_io))),
                                  model.encode_texts([str(c) for c in tern_io["captions"]]))
    np.testing.assert_allclose(scores.numpy(), tern_io["sim_dot"], **TOL)
