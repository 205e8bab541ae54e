"""Registry-driven contract tests: every registered component, xmatch's and the installed
plugins', builds, runs forward and backward, gives every parameter a gradient, keeps padding
out of its results, and moves to another dtype."""

from __future__ import annotations

import inspect
import tomllib
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

import xmatch
from xmatch import Embeddings
from xmatch.core.registry import get_registry
from xmatch.model.inputs import PairBatch, PixelInputs, RegionInputs, input_type_of

from clip_assets import tiny_text, tiny_tower_overrides
from conftest import random_regions

WORDS = ["a", "dog", "on", "the", "bench", "cat", "red", "car", "man", "riding"]
CAPTIONS = ["a dog on the bench", "a red car", "the man riding a red car", "cat"]
KINDS = ("image_encoders", "text_encoders", "reasoners", "poolers", "losses")

# Small values for the arguments components commonly take, so that a component a plugin adds
# is built and checked with no change here; COMPONENT_KWARGS adds what one component needs.
TINY_ARGUMENTS = {
    "feature_dim": 12, "layers": 1, "ff_dim": 32, "dim": 16, "heads": 4,
    "vocab": WORDS, "min_count": 1, "word_dim": 8, "hidden_dim": 6, "channels": 8, "kernel_sizes": [1, 2],
}
COMPONENT_KWARGS = {
    "bert": lambda fixture_bert: {"backbone": fixture_bert, "pretrained": False},
    "timm-grid": {"backbone": "test_efficientnet", "image_size": 64, "finetune": True},
    "pixel-regions": {"roi": {"backbone": "test_efficientnet", "weights": "random", "image_size": 64},
                      "proposer": {"name": "windows", "regions": 5}, "encoder": {"name": "bottomup", "layers": 1, "ff_dim": 32}},
    "vsepp-cnn": {"backbone": "test_efficientnet", "finetune": True},
    "uncertainty": {"terms": ["main", "alignment"]},
    # the CLIP-family text towers tokenise with a test tokenizer written offline (tests/clip_assets.py)
    "clip-text": lambda _: tiny_text("clip"),
    "siglip-text": lambda _: tiny_text("siglip"),
}
#: image encoder -> the family of CLIP-family zoo entries, built with tiny towers in their own layout
TOWER_FAMILIES = {"clip-vision": "clip", "siglip-vision": "siglip"}


def registered(kind):
    """(name, origin) of every component of ``kind``: xmatch's and the installed plugins'."""
    reg = get_registry(kind)
    return [pytest.param(n, id=f"{reg.origin(n)}:{n}") for n in reg.names()]


def tiny_kwargs(kind, name, fixture_bert=None):
    """The arguments the contract builds component ``name`` of ``kind`` with."""
    accepted = inspect.signature(get_registry(kind).get(name)).parameters
    kwargs = {k: v for k, v in TINY_ARGUMENTS.items() if k in accepted}
    extra = COMPONENT_KWARGS.get(name, {})
    kwargs.update(extra(fixture_bert) if callable(extra) else extra)
    return kwargs


def build_tiny(kind, name, fixture_bert=None):
    return get_registry(kind).get(name)(**tiny_kwargs(kind, name, fixture_bert))


def assert_all_grads(module):
    missing = [n for n, p in module.named_parameters() if p.requires_grad and (p.grad is None or not torch.isfinite(p.grad).all())]
    assert not missing, f"parameters without gradient: {missing}"


def plugin_distributions():
    return sorted(tomllib.loads(p.read_text(encoding="utf-8"))["project"]["name"]
                  for p in Path(__file__).resolve().parents[1].glob("plugins/*/pyproject.toml"))


@pytest.mark.parametrize("dist", plugin_distributions())
def test_contracts_cover_every_plugin_in_the_repository(dist):
    origins = {get_registry(kind).origin(n) for kind in KINDS for n in get_registry(kind).names()}
    assert dist in origins, f"no component of {dist} is registered: install it (pip install -e plugins/...)"


@pytest.mark.parametrize("name", registered("image_encoders"))
def test_image_encoder_contract(name):
    torch.manual_seed(0)
    enc = build_tiny("image_encoders", name)
    if enc.input_type is PixelInputs:
        pixels = [Image.fromarray(np.random.default_rng(k).integers(0, 256, (48, 40, 3), dtype=np.uint8)) for k in range(3)]
        run = lambda module: module(images=pixels)  # noqa: E731
    else:
        regions, boxes, mask = random_regions(3, 5, 12)
        regions.requires_grad_()
        run = lambda module: module(regions, boxes, mask)  # noqa: E731
    out = run(enc)
    assert out.tokens.shape[0] == 3 and out.tokens.shape[2] == enc.output_dim
    assert out.mask.dtype == out.content.dtype == torch.bool
    assert out.mask.shape == out.content.shape == out.tokens.shape[:2]
    assert not (out.content & ~out.mask).any()
    assert out.mask.any(dim=1).all(), "an image with no real slot"
    out.tokens[out.mask].square().sum().backward()
    assert_all_grads(enc)
    if enc.input_type is PixelInputs:
        return
    assert regions.grad[mask].abs().sum() > 0, "no gradient reaches the region features"
    # what padded regions hold never changes the output
    enc.eval()
    padded = regions.detach().clone()
    padded[~mask] = 100.0
    clean = enc(regions.detach(), boxes, mask)
    torch.testing.assert_close(enc(padded, boxes, mask).tokens[clean.mask], clean.tokens[clean.mask])
    out64 = enc.double()(regions.detach().double(), boxes.double(), mask)
    assert out64.tokens.dtype == torch.float64


@pytest.mark.parametrize("name", registered("text_encoders"))
def test_text_encoder_contract(name, fixture_bert):
    enc = build_tiny("text_encoders", name, fixture_bert)
    batch = enc.tokenize(CAPTIONS)
    assert batch.mask.dtype == batch.content.dtype == torch.bool
    assert batch.mask.shape == batch.content.shape and len(batch) == 4
    assert batch.content.any(dim=1).all()
    out = enc(batch)
    assert out.tokens.shape[0] == 4 and out.tokens.shape[2] == enc.output_dim
    assert out.mask.shape == out.content.shape == out.tokens.shape[:2]
    if out.global_slot and out.tokens.shape[1] == 1:  # one global vector per caption (VSE++)
        assert out.mask.all() and not out.content.any()
    else:
        assert out.tokens.shape[:2] == batch.mask.shape
        assert not (out.content & ~out.mask).any()
    out.tokens[out.mask].square().sum().backward()
    assert_all_grads(enc)
    enc = enc.double()
    assert enc(enc.tokenize(CAPTIONS)).tokens.dtype == torch.float64


@pytest.mark.parametrize("name", registered("reasoners"))
def test_reasoner_contract(name):
    torch.manual_seed(0)
    reasoner = build_tiny("reasoners", name)
    x = torch.randn(3, 6, 16, requires_grad=True)
    mask = torch.arange(6)[None] < torch.tensor([[6], [3], [1]])
    y = reasoner(x, mask)
    assert y.shape == x.shape
    y[mask].sum().backward()
    assert_all_grads(reasoner)
    assert x.grad is not None
    # padded positions never change real outputs
    x2 = x.detach().clone()
    x2[~mask] = 100.0
    reasoner.eval()
    torch.testing.assert_close(reasoner(x2, mask)[mask], reasoner(x.detach(), mask)[mask])
    assert reasoner.double()(x.detach().double(), mask).dtype == torch.float64


def random_embeddings(n, t, g):
    tokens = F.normalize(torch.randn(n, t, 8, generator=g), dim=-1).requires_grad_()
    pooled = F.normalize(torch.randn(n, 8, generator=g), dim=-1).requires_grad_()
    return Embeddings(tokens, torch.arange(t)[None] < torch.randint(1, t + 1, (n, 1), generator=g), pooled)


@pytest.mark.parametrize("layout", ["corpus", "batch"])
@pytest.mark.parametrize("name", registered("poolers"))
def test_pooler_contract(name, layout):
    """Any images against any captions (``corpus``), and a training batch whose row k of both
    sides is pair k (``batch_layout=True``, as the loss sees it)."""
    pooler = build_tiny("poolers", name)
    g = torch.Generator().manual_seed(0)
    n_img, n_txt = (4, 6) if layout == "corpus" else (5, 5)
    img, txt = random_embeddings(n_img, 5, g), random_embeddings(n_txt, 7, g)
    options = {"batch_layout": True} if layout == "batch" else {}
    try:
        scores = pooler(img, txt, **options)
    except ValueError as exc:  # a pooler made for training batches only says so
        if layout == "corpus" and "batch_layout" in str(exc):
            pytest.skip(f"'{name}' scores training batches only: {exc}")
        raise
    assert scores.shape == (n_img, n_txt) and torch.isfinite(scores).all()
    scores.sum().backward()
    # a pooler comparing one modality with itself (OAN's intra poolers) names it in `modality`
    one_side = {"image": img, "text": txt}.get(getattr(pooler, "modality", None))
    for side in (img, txt):  # the gradient reaches each compared side, and never a padded slot
        grads = [t.grad for t in (side.tokens, side.pooled) if t.grad is not None]
        if one_side is not None and side is not one_side:
            assert not any(bool(g.abs().sum() > 0) for g in grads), "a one-modality pooler used the other side"
            continue
        assert grads and any(bool(g.abs().sum() > 0) for g in grads), "no gradient reaches one side"
        if side.tokens.grad is not None:
            assert not side.tokens.grad[~side.mask].any(), "padded token slots receive a gradient"
    s64 = pooler.double()(img.detach().to(torch.float64), txt.detach().to(torch.float64), **options)
    assert s64.dtype == torch.float64
    torch.testing.assert_close(s64.float(), scores.detach(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", registered("losses"))
def test_loss_contract(name):
    loss = build_tiny("losses", name)
    # the score matrices a loss reads are named in its `terms` (the model's pooler is "main")
    terms = list(getattr(loss, "terms", ["main"]))
    g = torch.Generator().manual_seed(0)
    scores = {t: torch.randn(5, 5, generator=g).requires_grad_() for t in terms}
    out = loss(scores)
    assert out.loss.dim() == 0 and torch.isfinite(out.loss)
    hinge = get_registry("losses").get("hinge")()({"main": scores[terms[0]]}).loss
    assert hinge.item() > 0  # these scores violate the margin, so every loss must push on them
    if name == "uncertainty":  # sum_k exp(-s_k) L_k + s_k, with s_k moved off its zero init
        with torch.no_grad():
            loss.log_variances.fill_(0.5)
        out = loss(scores)
        hinges = sum(get_registry("losses").get("hinge")()({"main": scores[t]}).loss for t in terms)
        torch.testing.assert_close(out.loss, torch.exp(torch.tensor(-0.5)) * hinges + 0.5 * len(terms))
    else:
        assert out.loss.item() >= 0
    out.loss.backward()
    for t in terms:
        assert scores[t].grad is not None and scores[t].grad.abs().sum() > 0, f"no gradient reaches scores '{t}'"
    assert_all_grads(loss)


TINY = {
    "embed_dim": 16,
    "image_encoder": {"feature_dim": 12, "layers": 1, "ff_dim": 32},
    "image_reasoner": {"layers": 1, "ff_dim": 32},
    "text_reasoner": {"layers": 1, "ff_dim": 32},
}


# xmatch's own entries; each plugin in plugins/ tests its entries with its own components
BUILTIN_ENTRIES = [n for n in xmatch.list_models() if xmatch.core.registry.models.origin(n) == "xmatch"]


@pytest.mark.parametrize("entry", BUILTIN_ENTRIES)
def test_every_zoo_entry_trains_in_miniature(entry, fixture_bert):
    spec = xmatch.info(entry).spec
    text = spec["text_encoder"]["name"]
    overrides = dict(TINY, text_encoder=tiny_kwargs("text_encoders", text, fixture_bert))
    if spec.get("shared_reasoner"):
        overrides.pop("text_reasoner")
        if "text_reasoner" in spec:
            overrides["text_reasoner"] = TINY["image_reasoner"]
    family = TOWER_FAMILIES.get(spec["image_encoder"]["name"])
    if family is not None:  # no projection and identity reasoners: the TINY sizes do not apply
        model = xmatch.build(entry, **tiny_tower_overrides(family))
        pictures = list(np.random.default_rng(0).integers(0, 256, size=(4, 48, 40, 3), dtype=np.uint8))
        batch = PairBatch(PixelInputs(pictures), CAPTIONS)
    elif input_type_of(get_registry("image_encoders").get(spec["image_encoder"]["name"])) is PixelInputs:
        # raw-image entries: timm's tiny test network, random and stored, instead of their backbone
        overrides["image_encoder"] = {"backbone": "test_efficientnet", "weights": None, "store_backbone": True,
                                      "image_size": 64, "layers": 1, "ff_dim": 32}
        model = xmatch.build(entry, **overrides)
        pictures = list(np.random.default_rng(0).integers(0, 256, size=(4, 48, 40, 3), dtype=np.uint8))
        batch = PairBatch(PixelInputs(pictures), CAPTIONS)
    else:
        model = xmatch.build(entry, **overrides)
        regions, boxes, mask = random_regions(4, 5, 12)
        batch = PairBatch(RegionInputs(regions, boxes, mask), CAPTIONS)
    out = model(batch)
    assert out.loss.dim() == 0 and torch.isfinite(out.loss)
    loss = out.loss
    if model.verifier is not None:  # the trainer adds the verifier's loss on the same batch (TrainStep)
        img, txt = model.encode_batch(batch)
        checked = model.verifier.training_loss(img, txt, model.batch_scores(img, txt)["main"].detach())
        assert torch.isfinite(checked.loss)
        loss = loss + checked.loss
    loss.backward()
    assert_all_grads(model)
