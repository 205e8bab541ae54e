"""Registry-driven contract tests: every registered built-in component builds, runs forward
and backward, gives every parameter a gradient, and moves to another dtype."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import xmatch
from xmatch import Embeddings
from xmatch.registry import get_registry

from conftest import random_regions

WORDS = ["a", "dog", "on", "the", "bench", "cat", "red", "car", "man", "riding"]
CAPTIONS = ["a dog on the bench", "a red car", "the man riding a red car", "cat"]


def tiny_text_kwargs(name, fixture_bert):
    return {
        "bert": {"backbone": fixture_bert, "layers": 1, "pretrained": False},
        "bigru": {"vocab": WORDS, "word_dim": 8, "hidden_dim": 6},
        "bilstm": {"vocab": WORDS, "word_dim": 8, "hidden_dim": 6},
    }[name]


IMAGE_KWARGS = {
    "bottomup": {"feature_dim": 12, "layers": 1, "ff_dim": 32},
    "timm-grid": {"backbone": "test_efficientnet", "image_size": 64, "layers": 1, "ff_dim": 32, "finetune": True},
    "pixel-regions": {"backbone": "test_efficientnet", "weights": "random", "image_size": 64,
                      "proposer": {"name": "windows", "regions": 5}, "encoder": {"name": "bottomup", "layers": 1, "ff_dim": 32}},
}
REASONER_KWARGS = {"transformer": {"dim": 16, "layers": 2, "ff_dim": 32}, "identity": {"dim": 16}}
LOSS_KWARGS = {"hinge": {}, "uncertainty": {"terms": ["main"]}}


def builtin(kind):
    reg = get_registry(kind)
    return [n for n in reg.names() if reg.origin(n) == "xmatch"]


def assert_all_grads(module):
    missing = [n for n, p in module.named_parameters() if p.requires_grad and (p.grad is None or not torch.isfinite(p.grad).all())]
    assert not missing, f"parameters without gradient: {missing}"


def test_every_builtin_component_has_contract_arguments():
    assert set(builtin("image_encoders")) == set(IMAGE_KWARGS)
    assert set(builtin("text_encoders")) == {"bert", "bigru", "bilstm"}
    assert set(builtin("reasoners")) == set(REASONER_KWARGS)
    assert set(builtin("losses")) == set(LOSS_KWARGS)


@pytest.mark.parametrize("name", sorted(IMAGE_KWARGS))
def test_image_encoder_contract(name):
    torch.manual_seed(0)
    enc = get_registry("image_encoders").get(name)(**IMAGE_KWARGS[name])
    if enc.takes_pixels:
        pixels = [np.random.default_rng(k).integers(0, 256, (48, 40, 3), dtype=np.uint8) for k in range(3)]
        run = lambda module: module(images=pixels)  # noqa: E731
    else:
        regions, boxes, mask = random_regions(3, 5, 12)
        run = lambda module: module(regions, boxes, mask)  # noqa: E731
    out = run(enc)
    assert out.tokens.shape[0] == 3 and out.tokens.shape[2] == enc.output_dim
    assert out.mask.shape == out.content.shape == out.tokens.shape[:2]
    assert not (out.content & ~out.mask).any()
    out.tokens[out.mask].square().sum().backward()
    assert_all_grads(enc)
    if not enc.takes_pixels:
        out64 = enc.double()(regions.double(), boxes.double(), mask)
        assert out64.tokens.dtype == torch.float64


@pytest.mark.parametrize("name", ["bert", "bigru", "bilstm"])
def test_text_encoder_contract(name, fixture_bert):
    enc = get_registry("text_encoders").get(name)(**tiny_text_kwargs(name, fixture_bert))
    batch = enc.tokenize(CAPTIONS)
    assert batch.mask.shape == batch.content.shape and len(batch) == 4
    assert batch.content.any(dim=1).all()
    out = enc(batch)
    assert out.tokens.shape[:2] == batch.mask.shape and out.tokens.shape[2] == enc.output_dim
    out.tokens[out.content].square().sum().backward()
    assert_all_grads(enc)
    enc = enc.double()
    assert enc(enc.tokenize(CAPTIONS)).tokens.dtype == torch.float64


@pytest.mark.parametrize("name", sorted(REASONER_KWARGS))
def test_reasoner_contract(name):
    reasoner = get_registry("reasoners").get(name)(**REASONER_KWARGS[name])
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


@pytest.mark.parametrize("name", builtin("poolers"))
def test_pooler_contract(name):
    pooler = get_registry("poolers").get(name)()
    g = torch.Generator().manual_seed(0)
    def emb(n, t):
        tokens = F.normalize(torch.randn(n, t, 8, generator=g), dim=-1).requires_grad_()
        pooled = F.normalize(torch.randn(n, 8, generator=g), dim=-1).requires_grad_()
        return Embeddings(tokens, torch.arange(t)[None] < torch.randint(1, t + 1, (n, 1), generator=g), pooled)
    img, txt = emb(4, 5), emb(6, 7)
    scores = pooler(img, txt)
    assert scores.shape == (4, 6) and torch.isfinite(scores).all()
    scores.sum().backward()
    for side in (img, txt):  # the gradient reaches both sides, and never a padded slot
        grads = [t.grad for t in (side.tokens, side.pooled) if t.grad is not None]
        assert grads and any(bool(g.abs().sum() > 0) for g in grads), "no gradient reaches one side"
        if side.tokens.grad is not None:
            assert not side.tokens.grad[~side.mask].any(), "padded token slots receive a gradient"
    s64 = pooler.double()(img.detach().to(torch.float64), txt.detach().to(torch.float64))
    assert s64.dtype == torch.float64
    torch.testing.assert_close(s64.float(), scores.detach(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", sorted(LOSS_KWARGS))
def test_loss_contract(name):
    loss = get_registry("losses").get(name)(**LOSS_KWARGS[name])
    scores = torch.randn(5, 5, generator=torch.Generator().manual_seed(0), requires_grad=True)
    out = loss({"main": scores})
    assert out.loss.dim() == 0 and torch.isfinite(out.loss)
    hinge = get_registry("losses").get("hinge")()({"main": scores}).loss
    assert hinge.item() > 0  # these scores violate the margin, so every loss must push on them
    if name == "uncertainty":  # sum_k exp(-s_k) L_k + s_k, with s_k moved off its zero init
        with torch.no_grad():
            loss.log_variances.fill_(0.5)
        out = loss({"main": scores})
        torch.testing.assert_close(out.loss, torch.exp(torch.tensor(-0.5)) * hinge + 0.5)
    else:
        assert out.loss.item() >= 0
    out.loss.backward()
    assert scores.grad is not None and scores.grad.abs().sum() > 0
    assert_all_grads(loss)


TINY = {
    "embed_dim": 16,
    "image_encoder": {"feature_dim": 12, "layers": 1, "ff_dim": 32},
    "image_reasoner": {"layers": 1, "ff_dim": 32},
    "text_reasoner": {"layers": 1, "ff_dim": 32},
}


# xmatch's own entries; each plugin in plugins/ tests its entries with its own components
BUILTIN_ENTRIES = [n for n in xmatch.list_models() if xmatch.registry.models.origin(n) == "xmatch"]


@pytest.mark.parametrize("entry", BUILTIN_ENTRIES)
def test_every_zoo_entry_trains_in_miniature(entry, fixture_bert):
    spec = xmatch.info(entry).spec
    text = spec["text_encoder"]["name"]
    overrides = dict(TINY, text_encoder=tiny_text_kwargs(text, fixture_bert))
    if spec.get("shared_reasoner"):
        overrides.pop("text_reasoner")
        if "text_reasoner" in spec:
            overrides["text_reasoner"] = TINY["image_reasoner"]
    if get_registry("image_encoders").get(spec["image_encoder"]["name"]).takes_pixels:
        # raw-image entries: timm's tiny test network, random and stored, instead of their backbone
        overrides["image_encoder"] = {"backbone": "test_efficientnet", "weights": None, "store_backbone": True,
                                      "image_size": 64, "layers": 1, "ff_dim": 32}
        model = xmatch.build(entry, **overrides)
        pictures = list(np.random.default_rng(0).integers(0, 256, size=(4, 48, 40, 3), dtype=np.uint8))
        batch = {"images": pictures, "texts": CAPTIONS}
    else:
        model = xmatch.build(entry, **overrides)
        regions, boxes, mask = random_regions(4, 5, 12)
        batch = {"regions": regions, "boxes": boxes, "region_mask": mask, "texts": CAPTIONS}
    out = model(batch)
    assert out.loss.dim() == 0 and torch.isfinite(out.loss)
    out.loss.backward()
    assert_all_grads(model)
