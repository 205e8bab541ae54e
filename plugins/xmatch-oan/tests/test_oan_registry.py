"""The plugin's registry contract: components and zoo entries appear once the distribution is
installed, every entry builds, trains one step (every trainable parameter gets a gradient)
and states its real parameter count."""

from __future__ import annotations

import os

import pytest
import torch

import xmatch
from xmatch.core.registry import get_registry
from xmatch.model.parameter_counts import count_parameters
from xmatch.testing import one_torch_thread  # noqa: F401  (autouse: one torch thread)

WORDS = ["a", "dog", "on", "the", "bench", "cat", "red", "car"]
CAPTIONS = ["a dog on the bench", "a red car", "the cat", "cat"]
TINY = {
    "embed_dim": 16,
    "image_encoder": {"feature_dim": 12},
    "text_encoder": {"vocab": WORDS, "word_dim": 8, "channels": 4},
    "image_reasoner": {"heads": 2},
    "text_reasoner": {"heads": 2},
}
COMPONENTS = [("image_encoders", "oan-regions"), ("text_encoders", "oan-textcnn"), ("reasoners", "oan-context"),
              ("poolers", "oan"), ("poolers", "oan-intra-image"), ("poolers", "oan-intra-text"), ("losses", "oan")]


def test_components_and_entries_come_from_the_plugin():
    for kind, name in COMPONENTS:
        assert name in xmatch.list_components(kind)
        assert get_registry(kind).origin(name) == "xmatch-oan"
    assert xmatch.list_models("oan-*") == ["oan-coco", "oan-f30k"]
    assert {get_registry("models").origin(n) for n in xmatch.list_models("oan-*")} == {"xmatch-oan"}


def test_entries_carry_the_papers_configuration_and_figures():
    coco, f30k = xmatch.info("oan-coco"), xmatch.info("oan-f30k")
    spec = coco.spec
    assert spec["embed_dim"] == 512 and spec["text_encoder"]["kernel_sizes"] == [1, 2, 3, 5, 7]
    assert (spec["text_encoder"]["word_dim"], spec["text_encoder"]["min_count"]) == (300, 4)
    assert (spec["pooler"]["lambda_vt"], spec["pooler"]["lambda_tv"]) == (0.5, 0.9)
    assert spec["image_reasoner"]["heads"] == spec["text_reasoner"]["heads"] == 6
    assert spec["image_reasoner"]["lambda_softmax"] == 1.0
    loss = spec["loss"]
    assert (loss["margin_inter"], loss["margin_intra"], loss["beta"], loss["gamma"]) == (0.2, 0.1, 0.5, 0.3)
    assert spec["text_encoder"]["max_length"] == 60 and f30k.spec["text_encoder"]["max_length"] == 80
    assert coco.metrics["coco-1k"]["t2i_r1"] == 60.2 and coco.metrics["coco-5k"]["i2t_r10"] == 90.4
    assert [f30k.metrics["f30k-1k"][f"t2i_r{k}"] for k in (1, 5, 10)] == [53.3, 80.1, 87.1]
    assert [f30k.metrics["f30k-1k"][f"i2t_r{k}"] for k in (1, 5, 10)] == [68.6, 93.0, 96.0]
    for entry in (coco, f30k):
        assert "No weights exist" in entry.origin and not entry.weights
        assert "5e-4" in entry.notes and "weight decay 1e-6" in entry.notes and "24 epochs" in entry.notes


@pytest.mark.parametrize("name", ["oan-coco", "oan-f30k"])
@pytest.mark.parametrize("sampling", ["hardest", "all"])
def test_every_entry_trains_in_miniature(name, sampling):
    torch.manual_seed(0)
    model = xmatch.build(name, loss={"intra_sampling": sampling}, **TINY)
    g = torch.Generator().manual_seed(0)
    mask = torch.arange(5)[None] < torch.tensor([[5], [3], [4], [1]])
    images = xmatch.RegionInputs(torch.rand(4, 5, 12, generator=g), torch.zeros(4, 5, 4), mask)
    out = model(xmatch.PairBatch(images, CAPTIONS))
    assert out.loss.dim() == 0 and torch.isfinite(out.loss) and out.loss > 0
    assert {"inter_sum", "intra_image_sum", "intra_text_sum"} <= set(out.logs)
    out.loss.backward()
    missing = [n for n, p in model.named_parameters() if p.requires_grad and (p.grad is None or not torch.isfinite(p.grad).all())]
    assert not missing, f"parameters without gradient: {missing}"


def test_params_by_hand():
    def linear(i, o, bias=True):
        return i * o + (o if bias else 0)

    convs = sum(300 * 512 * k + 512 for k in (1, 2, 3, 5, 7))
    projections = linear(2048, 512) + linear(5 * 512, 512)
    context = 2 * 6 * linear(512, 512, bias=False)  # query and key maps of 6 full-width heads
    assert convs + projections + 2 * context == 11_419_136 == xmatch.info("oan-coco").params
    for name in ("oan-coco", "oan-f30k"):
        assert count_parameters(name, os.devnull) == xmatch.info(name).params


def test_build_without_vocabulary_says_what_to_give():
    with pytest.raises(xmatch.SpecError, match="needs a vocabulary"):
        xmatch.build("oan-coco")


def test_loss_without_the_intra_poolers_names_the_fix():
    spec = xmatch.info("oan-coco").spec
    spec.pop("extra_poolers")
    model = xmatch.build(spec, **TINY)
    with pytest.raises(KeyError, match="oan-intra-image"):
        model(xmatch.PairBatch(xmatch.RegionInputs(torch.rand(2, 3, 12), torch.zeros(2, 3, 4)), ["a dog", "cat"]))
