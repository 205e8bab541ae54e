"""CLIP and SigLIP towers as xmatch encoders: the pooled embeddings are transformers' own
get_image_features / get_text_features bit for bit; upstream weights come through the hub code
with their sha256; patch tokens carry their boxes in the picture's frame; late interaction
scores every image against every caption; the trainer fine-tunes with the contrastive and the
sigmoid loss. Tiny random towers, all offline."""

from __future__ import annotations

import hashlib
import math
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from transformers import AutoTokenizer, CLIPConfig, CLIPModel, SiglipConfig, SiglipModel

import xmatch
from xmatch.components.image.clip import ClipImageEncoder, SiglipImageEncoder
from xmatch.components.losses import InfoNCELoss, SigmoidLoss
from xmatch.core.registry import models
from xmatch.data import open_dataset
from xmatch.io import hub
from xmatch.io.bundle import BundleError
from xmatch.model.inputs import PixelInputs
from xmatch.testing import one_torch_thread  # noqa: F401  (a fixture: one torch thread per test)
from xmatch.train import TrainConfig, Trainer

from clip_assets import tiny_tower_overrides, tokenizer_dirs

CAPTIONS = ["a dog on the bench", "a red car", "the man riding a red car", "cat"]
ENTRY = {"clip": "clip-vit-b-32", "siglip": "siglip-base-patch16-224"}


def tiny_model(kind: str, seed: int = 0, **overrides) -> xmatch.MatchingModel:
    torch.manual_seed(seed)
    return xmatch.build(ENTRY[kind], **{**tiny_tower_overrides(kind), **overrides}).eval()


def reference(model: xmatch.MatchingModel, kind: str) -> torch.nn.Module:
    """transformers' own two-tower model with the same configs and weights."""
    configs = {"text_config": model.text_encoder.text_model.config.to_dict(),
               "vision_config": model.image_encoder.vision_model.config.to_dict()}
    if kind == "clip":
        ref = CLIPModel(CLIPConfig(**configs, projection_dim=model.embed_dim))
    else:
        ref = SiglipModel(SiglipConfig(**configs))
    state = {**model.image_encoder.state_dict(), **model.text_encoder.state_dict()}
    missing, unexpected = ref.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"logit_scale", "logit_bias"}
    return ref.eval()


def pictures(n: int = 3) -> list[Image.Image]:
    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 256, (40 + 8 * k, 56, 3), dtype=np.uint8)) for k in range(n)]


def hub_inputs(kind: str, texts: list[str]) -> dict:
    """The inputs the hub's processor gives get_text_features."""
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dirs()[kind])
    if kind == "clip":
        return dict(tokenizer(texts, padding=True, return_tensors="pt"))
    return {"input_ids": tokenizer(texts, padding="max_length", max_length=12, return_tensors="pt")["input_ids"]}


# --- parity -----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["clip", "siglip"])
def test_pooled_embeddings_are_transformers_features_bit_for_bit(kind):
    model = tiny_model(kind)
    ref = reference(model, kind)
    pixels = model.image_encoder.preprocess(pictures())
    with torch.no_grad():
        img = model.encode_images(PixelInputs(pixels))
        txt = model.encode_texts(CAPTIONS)
        want_img = ref.get_image_features(pixel_values=pixels).pooler_output
        want_txt = ref.get_text_features(**hub_inputs(kind, CAPTIONS)).pooler_output
        # the encoders' global slot is the tower's embedding itself, before any normalisation
        assert torch.equal(model.image_encoder(pixels).tokens[:, 0], want_img)
        assert torch.equal(model.text_encoder(model.tokenize(CAPTIONS)).tokens[:, 0], want_txt)
    # no projection, no reasoning: pooled is that embedding L2-normalised, bit for bit
    assert torch.equal(img.pooled, F.normalize(want_img, dim=-1))
    assert torch.equal(txt.pooled, F.normalize(want_txt, dim=-1))
    assert isinstance(model.image_projection, torch.nn.Identity) and isinstance(model.text_projection, torch.nn.Identity)


@pytest.mark.parametrize("kind", ["clip", "siglip"])
def test_tokenisation_is_the_hubs_and_only_words_are_content(kind):
    model = tiny_model(kind)
    batch = model.tokenize(CAPTIONS)
    # CLIP's global slot takes the start token's place; SigLIP's is a column before the hub's ids
    hub_ids = batch.inputs["input_ids"] if kind == "clip" else batch.inputs["input_ids"][:, 1:]
    assert torch.equal(hub_ids, hub_inputs(kind, CAPTIONS)["input_ids"])
    ids, tokenizer = batch.inputs["input_ids"], model.text_encoder.tokenizer
    assert not batch.content[ids == tokenizer.eos_token_id].any()  # the end token and the padding
    if kind == "clip":
        assert not batch.content[:, 0].any() and torch.equal(batch.mask, hub_inputs(kind, CAPTIONS)["attention_mask"].bool())
    else:  # SigLIP attends to its padding, as trained
        assert batch.mask.all() and batch.content.sum(1).tolist() == [5, 3, 6, 1]


def test_siglip_patch_tokens_are_its_head_applied_to_each_patch_alone():
    enc = tiny_model("siglip").image_encoder
    states = torch.randn(2, 5, 32)
    with torch.no_grad():
        per_patch = torch.stack([enc.vision_model.head(states[:, k : k + 1]) for k in range(5)], dim=1)
        from xmatch.components.image.clip import head_per_token

        torch.testing.assert_close(head_per_token(enc.vision_model.head, states), per_patch, rtol=1e-5, atol=1e-6)


# --- pictures and boxes -----------------------------------------------------------------------


def test_pil_pictures_give_patch_tokens_with_boxes_in_the_pictures_frame():
    model = tiny_model("clip")
    wide, tall = Image.new("RGB", (64, 32)), Image.new("RGB", (30, 60))
    img = model.encode_images(images=[wide, tall])
    assert img.tokens.shape == (2, 4, 24) and img.mask.all() and img.boxes.shape == (2, 4, 4)
    # a 2:1 picture: resized to 64 x 32, its middle 32 x 32 cropped, so the patches cover x in [1/4, 3/4]
    torch.testing.assert_close(img.boxes[0], torch.tensor([
        [0.25, 0.0, 0.5, 0.5], [0.5, 0.0, 0.75, 0.5], [0.25, 0.5, 0.5, 1.0], [0.5, 0.5, 0.75, 1.0]]))
    # 30 x 60: resized to 32 x 64 (int(32 * 60 / 30)), the crop starts 16 rows down
    torch.testing.assert_close(img.boxes[1][:, 1::2].unique(), torch.tensor([0.25, 0.5, 0.75]))
    # the pixels are transformers' CLIP processor's for the same pictures
    from transformers import CLIPImageProcessor

    processor = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    assert torch.equal(model.image_encoder.preprocess([wide, tall]), processor(images=[wide, tall], return_tensors="pt")["pixel_values"])


def test_paths_and_arrays_give_the_same_tokens_and_boxes_as_the_pictures(tmp_path):
    model = tiny_model("clip")
    wide = pictures(1)[0].resize((64, 32))
    wide.save(tmp_path / "wide.png")
    with torch.no_grad():
        ways = [model.encode_images(images=[x]) for x in (wide, str(tmp_path / "wide.png"), np.asarray(wide))]
    for other in ways[1:]:
        assert torch.equal(other.tokens, ways[0].tokens) and torch.equal(other.boxes, ways[0].boxes)


def test_siglip_squashes_the_picture_so_its_boxes_are_the_grid():
    enc = SiglipImageEncoder(width=32, layers=1, heads=4, ff_dim=64, patch_size=16, image_size=32)
    out = enc(images=[Image.new("RGB", (64, 32)), np.zeros((20, 10, 3), dtype=np.uint8)])
    assert out.boxes[:, 0].abs().sum() == 0  # the global slot has no box
    torch.testing.assert_close(out.boxes[0, 1:], out.boxes[1, 1:])
    assert out.boxes[0, 1:].tolist()[-1] == [0.5, 0.5, 1.0, 1.0]


def test_a_preprocessed_tensor_keeps_the_squares_frame_and_a_wrong_size_is_refused():
    enc = ClipImageEncoder(width=32, layers=1, heads=4, ff_dim=64, patch_size=16, image_size=32, projection_dim=8)
    out = enc(torch.zeros(1, 3, 32, 32))
    assert out.boxes[0, 1].tolist() == [0.0, 0.0, 0.5, 0.5]
    with pytest.raises(ValueError, match=r"\[B, 3, 32, 32\] made by encoder.preprocess"):
        enc(torch.zeros(1, 3, 64, 64))


# --- scoring: cosine and late interaction ------------------------------------------------------


def test_one_model_gives_the_clip_cosine_and_filip_late_interaction():
    cosine = tiny_model("clip")
    late = tiny_model("clip", pooler={"name": "MrAvgw"})
    late.load_state_dict(cosine.state_dict())
    shots = pictures(3)
    with torch.no_grad():
        img, txt = cosine.encode_images(images=shots), cosine.encode_texts(CAPTIONS)
        scores = cosine.similarity(img, txt)
        filip = late.similarity(late.encode_images(images=shots), late.encode_texts(CAPTIONS))
    torch.testing.assert_close(scores, img.pooled @ txt.pooled.T)
    assert filip.shape == (3, 4)
    # FILIP's text-to-image similarity: mean over the caption's words of the best patch
    for i in range(3):
        for j in range(4):
            words = txt.tokens[j][txt.mask[j]]
            best = (words @ img.tokens[i][img.mask[i]].T).amax(dim=1)
            torch.testing.assert_close(filip[i, j], best.mean(), rtol=1e-5, atol=1e-6)
    assert txt.mask.sum(1).tolist() == [len(cosine.text_encoder.tokenizer(c, add_special_tokens=False)["input_ids"]) for c in CAPTIONS]


# --- weights through the hub -------------------------------------------------------------------


@pytest.fixture
def upstream(tmp_path):
    """A tiny random CLIPModel saved by transformers (model.safetensors) and served on 127.0.0.1."""
    model = tiny_model("clip", seed=3)
    ref = reference(model, "clip")
    with torch.no_grad():
        ref.logit_scale.fill_(math.log(50.0))
    ref.save_pretrained(tmp_path / "upstream")
    weights = tmp_path / "upstream" / "model.safetensors"
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(QuietHandler, directory=str(tmp_path / "upstream")))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield ref, weights, f"http://127.0.0.1:{server.server_address[1]}/model.safetensors"
    server.shutdown()
    server.server_close()


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def online_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XMATCH_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("XMATCH_OFFLINE", raising=False)
    monkeypatch.setattr(hub, "_DIGESTS", {})
    return tmp_path / "cache"


def test_the_upstream_weights_file_comes_through_the_hub_with_its_sha256_and_loads(upstream, online_home):
    ref, weights, url = upstream
    body = weights.read_bytes()
    table = {"source": url, "sha256": hashlib.sha256(body).hexdigest(), "size": len(body)}
    spec = xmatch.info("clip-vit-b-32").spec
    with models.restored():
        models.register("clip-tiny-test", xmatch.ZooEntry(
            name="clip-tiny-test", spec=spec, description="tiny CLIP", weights=[table], origin="127.0.0.1"))
        model = xmatch.build("clip-tiny-test", pretrained=True, **tiny_tower_overrides("clip")).eval()
        assert (online_home / "weights" / table["sha256"] / "model.safetensors").is_file()
        shots = pictures(2)
        pixels = model.image_encoder.preprocess(shots)
        with torch.no_grad():
            img, txt = model.encode_images(images=shots), model.encode_texts(CAPTIONS)
            want_img = ref.get_image_features(pixel_values=pixels).pooler_output
            want_txt = ref.get_text_features(**hub_inputs("clip", CAPTIONS)).pooler_output
        assert torch.equal(img.pooled, F.normalize(want_img, dim=-1))
        assert torch.equal(txt.pooled, F.normalize(want_txt, dim=-1))
        # the checkpoint's learned temperature starts the contrastive loss
        assert model.loss.logit_scale.item() == pytest.approx(math.log(50.0))
        # a file that is not the published one is refused before anything is loaded
        models.register("clip-tiny-bad", xmatch.ZooEntry(
            name="clip-tiny-bad", spec=spec, description="tiny CLIP", weights=[{**table, "sha256": "0" * 64}], origin="x"))
        with pytest.raises(hub.ChecksumError, match="sha256 mismatch"):
            xmatch.build("clip-tiny-bad", pretrained=True, **tiny_tower_overrides("clip"))


def test_a_downloaded_upstream_file_loads_as_checkpoint_and_another_architecture_is_a_clear_error(upstream):
    ref, weights, _ = upstream
    tiny = tiny_tower_overrides("clip")
    model = xmatch.build("clip-vit-b-32", checkpoint=weights, **tiny).eval()  # what `xmatch index NAME=FILE` builds
    with torch.no_grad():
        want = ref.get_text_features(**hub_inputs("clip", CAPTIONS)).pooler_output
        assert torch.equal(model.encode_texts(CAPTIONS).pooled, F.normalize(want, dim=-1))
    deeper = {**tiny, "image_encoder": {**tiny["image_encoder"], "layers": 3}}
    with pytest.raises(BundleError, match=r"not fit this model: the model's \['image_encoder.vision_model.encoder.layers.2"):
        xmatch.build("clip-vit-b-32", checkpoint=weights, **deeper)
    wider = {**tiny, "text_encoder": {**tiny["text_encoder"], "ff_dim": 128}}
    with pytest.raises(BundleError, match="(?s)does not fit this model.*size mismatch"):
        xmatch.build("clip-vit-b-32", checkpoint=weights, **wider)
    with pytest.raises(BundleError, match="image_reasoner.*are not in it"):  # a reasoner no CLIP checkpoint has
        xmatch.build("clip-vit-b-32", checkpoint=weights, **tiny,
                     image_reasoner={"name": "transformer", "layers": 1, "heads": 4, "ff_dim": 32})


def test_a_fine_tuned_model_saves_and_reloads_with_its_tokenizer(tmp_path):
    model = tiny_model("siglip", seed=4)
    bundle = xmatch.save_pretrained(model, tmp_path / "bundle")
    assert (bundle / "text_encoder" / "tokenizer.json").is_file()
    again = xmatch.build(f"local-dir:{bundle}", pretrained=True).eval()
    with torch.no_grad():
        assert torch.equal(again.encode_texts(CAPTIONS).pooled, model.encode_texts(CAPTIONS).pooled)


# --- zoo entries ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", xmatch.list_models("clip-*") + xmatch.list_models("siglip*"))
def test_entries_keep_the_towers_embeddings_and_pin_their_tokenizer(name):
    spec = xmatch.info(name).spec
    assert spec["image_projection"] is False and spec["text_projection"] is False
    assert spec["image_reasoner"]["name"] == "identity" and spec["shared_reasoner"] is True
    repo, _, revision = spec["text_encoder"]["tokenizer"].removeprefix("hf-hub:").partition("@")
    assert len(revision) == 40 and repo in {"openai/clip-vit-base-patch32"} | {
        w["source"].removeprefix("hf-hub:").partition("@")[0] for w in xmatch.info(name).weights}
    for source in xmatch.info(name).weights:  # a commit; sha256 and size are the Hub's, checked on download
        assert len(source["source"].partition("@")[2].partition("/")[0]) == 40


def test_building_an_entry_needs_no_network_and_no_tokenizer_until_it_tokenises(monkeypatch):
    monkeypatch.setenv("XMATCH_OFFLINE", "1")
    with torch.device("meta"):
        model = xmatch.build("clip-vit-b-32")
    assert model.embed_dim == 512 and model.text_encoder._tokenizer is None
    small = xmatch.build("clip-vit-b-32", **{**tiny_tower_overrides("clip"), "text_encoder": {
        **tiny_tower_overrides("clip")["text_encoder"], "tokenizer": "hf-hub:openai/clip-vit-base-patch32@" + "0" * 40}})
    with pytest.raises(xmatch.core.errors.XmatchError, match="offline, and the tokenizer"):
        small.encode_texts(["a cat"])


# --- losses and training --------------------------------------------------------------------------


def test_infonce_is_symmetric_cross_entropy_and_leaves_other_captions_of_an_image_out():
    s = torch.tensor([[0.9, 0.1, 0.5], [0.2, 0.8, 0.3], [0.4, 0.6, 0.7]])
    loss = InfoNCELoss(temperature=0.1, learn_temperature=False)
    logits = s / 0.1
    target = torch.arange(3)
    want = (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target)) / 2
    torch.testing.assert_close(loss({"main": s}).loss, want)
    # images 0 and 2 are one picture: neither caption is a negative of the other
    out = loss({"main": s}, image_ids=torch.tensor([7, 8, 7]))
    masked = logits.clone()
    masked[0, 2] = masked[2, 0] = float("-inf")
    torch.testing.assert_close(out.loss, (F.cross_entropy(masked, target) + F.cross_entropy(masked.T, target)) / 2)
    assert "logit_scale" not in loss.state_dict()  # a fixed temperature is not saved
    learned = InfoNCELoss(temperature=0.001)  # the scale is capped at 100
    assert learned({"main": s}).logs["logit_scale"].item() == pytest.approx(100.0)


def test_sigmoid_loss_is_siglips_and_counts_captions_of_one_image_as_positives():
    s = torch.tensor([[0.9, 0.1], [0.2, 0.8]])
    loss = SigmoidLoss(scale=10.0, bias=-5.0)
    z = torch.tensor([[1.0, -1.0], [-1.0, 1.0]])
    torch.testing.assert_close(loss({"main": s}).loss, -F.logsigmoid(z * (10 * s - 5)).sum() / 2)
    same = loss({"main": s}, image_ids=torch.tensor([3, 3])).loss
    torch.testing.assert_close(same, -F.logsigmoid(10 * s - 5).sum() / 2)
    state = {"logit_scale": torch.tensor([math.log(117.0)]), "logit_bias": torch.tensor([-12.9])}  # SiglipModel's [1]
    loss.load_state_dict(state)
    assert loss.logit_scale.exp().item() == pytest.approx(117.0) and loss.logit_bias.item() == pytest.approx(-12.9)


@pytest.fixture(scope="module")
def photo_captions(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("photos")
    rows = ["image,caption"]
    colours = {"red": (220, 30, 30), "blue": (30, 30, 220)}
    for k, (colour, rgb) in enumerate(colours.items()):
        for shape in ("square", "car"):
            name = f"{colour}-{shape}-{k}.png"
            picture = np.full((36, 44, 3), 255, dtype=np.uint8)
            picture[6:30, 8 if shape == "square" else 20 : 32 if shape == "square" else 40] = rgb
            Image.fromarray(picture).save(root / name)
            rows += [f"{name},a {colour} {shape}", f"{name},the {colour} {shape} on a bench"]
    (root / "captions.csv").write_text("\n".join(rows) + "\n")
    return root / "captions.csv"


@pytest.mark.parametrize("kind, loss", [("clip", {"name": "infonce"}), ("siglip", {"name": "sigmoid"}),
                                        ("clip", {"name": "hinge", "margin": 0.2})])
def test_the_trainer_fine_tunes_the_towers_with_each_loss(kind, loss, photo_captions, tmp_path):
    model = tiny_model(kind, loss=loss).train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    data = open_dataset("image-captions", photo_captions)
    config = TrainConfig(epochs=1, batch_size=4, max_steps=2, lr=1e-3, tensorboard=False)
    result = Trainer(model, data, config, run_dir=tmp_path / "run", progress=False).fit()
    assert result.steps == 2 and math.isfinite(result.last_loss)
    after = model.state_dict()
    for key in ("image_encoder.vision_model.encoder.layers.0.mlp.fc1.weight", "text_encoder.text_model.encoder.layers.0.mlp.fc1.weight"):
        assert not torch.equal(before[key], after[key]), f"{key} did not train"
    if loss["name"] != "hinge":  # the learned temperature (and SigLIP's bias) move too
        assert not torch.equal(before["loss.logit_scale"], after["loss.logit_scale"])
