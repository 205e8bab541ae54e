"""The plugin's registry contract: components and zoo entries appear once the distribution is
installed, every entry builds, trains one step (every trainable parameter gets a gradient)
and states its real parameter count."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

import xmatch
from xmatch.core.registry import get_registry
from xmatch.model.parameter_counts import count_parameters
from xmatch.testing import one_torch_thread  # noqa: F401  (autouse: one torch thread)

WORDS = ["a", "dog", "on", "the", "bench", "cat", "red", "car"]
CAPTIONS = ["a dog on the bench", "a red car", "the cat", "cat"]
ENTRIES = xmatch.list_models("vsepp-*")


def tiny(entry: str) -> dict:
    """Small overrides: same components, narrow widths, a pixel backbone that builds fast."""
    spec = xmatch.info(entry).spec
    image = {"feature_dim": 12} if spec["image_encoder"]["name"] == "vsepp-precomp" else {"backbone": "efficientnet_lite0"}
    return {
        "embed_dim": 16,
        "image_encoder": image,
        "text_encoder": {"vocab": WORDS, "word_dim": 8, "hidden_dim": 16},  # = embed_dim: no text projection
    }


def batch_for(model: xmatch.MatchingModel) -> xmatch.PairBatch:
    g = torch.Generator().manual_seed(0)
    if model.image_encoder.input_type is xmatch.PixelInputs:
        return xmatch.PairBatch(xmatch.PixelInputs(torch.randn(4, 3, 32, 32, generator=g)), CAPTIONS)
    return xmatch.PairBatch(xmatch.RegionInputs(torch.rand(4, 1, 12, generator=g), torch.zeros(4, 1, 4)), CAPTIONS)


def test_components_come_from_the_plugin():
    for kind, name in [("image_encoders", "vsepp-cnn"), ("image_encoders", "vsepp-precomp"),
                       ("text_encoders", "vsepp-gru"), ("poolers", "vsepp-order")]:
        assert name in xmatch.list_components(kind)
        assert get_registry(kind).origin(name) == "xmatch-vsepp"


def test_zoo_entries_are_listed():
    assert set(ENTRIES) == {
        f"vsepp-{v}-{ds}" for ds in ("coco", "f30k")
        for v in ("precomp", "vse0-precomp", "order0-precomp", "orderpp-precomp", "vgg19", "resnet152")
    }
    for name in ENTRIES:
        assert get_registry("models").origin(name) == "xmatch-vsepp"


@pytest.mark.parametrize("name", ENTRIES)
def test_entry_schema(name):
    entry = xmatch.info(name)
    assert entry.paper.startswith("Faghri") and entry.dataset in {"coco", "f30k"} and name.endswith(entry.dataset)
    assert "No" in entry.origin and not entry.weights, "no weights exist: the entry says so and lists none"
    assert type(entry.params) is int
    assert entry.spec["loss"]["name"] == "hinge" and entry.spec["text_encoder"]["name"] == "vsepp-gru"
    # fc is the image projection; the GRU state goes straight to the l2norm
    assert entry.spec["image_projection"] is True and entry.spec["text_projection"] is False
    for bench, figures in entry.metrics.items():
        assert bench.startswith(entry.dataset) and figures["source"]


def test_configurations_are_the_readme_ones():
    spec = {n: xmatch.info(n).spec for n in ENTRIES}
    assert spec["vsepp-precomp-coco"]["loss"] == {"name": "hinge", "margin": 0.2, "max_violation": True}
    assert spec["vsepp-vse0-precomp-coco"]["loss"]["max_violation"] is False
    assert spec["vsepp-order0-precomp-coco"]["pooler"] == {"name": "vsepp-order", "use_abs": True}
    assert spec["vsepp-order0-precomp-coco"]["loss"] == {"name": "hinge", "margin": 0.05, "max_violation": False}
    assert spec["vsepp-orderpp-precomp-f30k"]["pooler"] == {"name": "vsepp-order", "use_abs": False}
    assert spec["vsepp-orderpp-precomp-f30k"]["loss"]["max_violation"] is True
    assert spec["vsepp-resnet152-coco"]["image_encoder"]["finetune"] is True
    assert spec["vsepp-vgg19-f30k"]["image_encoder"]["backbone"] == "vgg19"
    assert spec["vsepp-precomp-coco"]["image_encoder"]["feature_dim"] == 4096
    text = spec["vsepp-precomp-coco"]["text_encoder"]
    assert (text["word_dim"], text["hidden_dim"], text["layers"], text["min_count"]) == (300, 1024, 1, 4)
    metrics = xmatch.info("vsepp-resnet152-coco").metrics["coco-1k"]
    assert [metrics[f"i2t_r{k}"] for k in (1, 5, 10)] == [64.6, 90.0, 95.7]
    assert [metrics[f"t2i_r{k}"] for k in (1, 5, 10)] == [52.0, 84.3, 92.0]
    assert not xmatch.info("vsepp-resnet152-coco").metrics.get("coco-5k")


@pytest.mark.parametrize("name", ENTRIES)
def test_every_entry_trains_in_miniature(name):
    torch.manual_seed(0)
    model = xmatch.build(name, **tiny(name))
    out = model(batch_for(model))
    assert out.loss.dim() == 0 and torch.isfinite(out.loss) and out.loss >= 0
    out.loss.backward()
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    missing = [n for n, p in trainable if p.grad is None or not torch.isfinite(p.grad).all()]
    assert trainable and not missing, f"parameters without gradient: {missing}"
    frozen = {n.split(".")[1] for n, p in model.named_parameters() if not p.requires_grad}
    finetune = model.spec["image_encoder"].get("finetune", True)
    assert frozen == (set() if finetune else {"cnn"})


def test_params_are_the_built_models_by_hand():
    def linear(i, o):
        return i * o + o

    gru = 3 * (linear(300, 1024) + linear(1024, 1024))  # reset, update, new gates: W_i, W_h, b_i, b_h
    precomp = linear(4096, 1024) + gru  # fc and the GRU: the original's parameters, no others
    assert precomp == 8_268_800 == xmatch.info("vsepp-precomp-coco").params
    for name in ENTRIES:
        assert count_parameters(name, os.devnull) == xmatch.info(name).params, name
    resnet = xmatch.info("vsepp-resnet152-coco").params - gru - linear(2048, 1024)
    assert resnet == 60_192_808 - linear(2048, 1000)  # timm resnet152 without its classifier


def test_build_without_vocabulary_says_what_to_give():
    with pytest.raises(xmatch.SpecError, match="needs a vocabulary"):
        xmatch.build("vsepp-precomp-coco")


def test_pretrained_weights_are_refused_honestly():
    with pytest.raises(ValueError, match="no published xmatch weights.*No xmatch weights exist"):
        xmatch.build("vsepp-precomp-coco", pretrained=True, text_encoder={"vocab": WORDS})
