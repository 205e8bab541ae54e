"""The plugin contract: entry points registered, zoo entries valid and buildable, every entry
trains in miniature, and the data file agrees with the README table of the original code."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

import pytest
import torch
import xmatch
from xmatch.core.spec import check_model_spec
from xmatch.model.parameter_counts import count_parameters

import xmatch_scan
from xmatch_scan import ScanBiGRUTextEncoder, ScanI2TPooler, ScanPrecompImageEncoder, ScanT2IPooler, SumMaxI2TPooler, SumMaxT2IPooler

DIST = "xmatch-scan"
ENTRIES = [f"scan-{d}-{a}-{ds}" for ds in ("f30k", "coco") for d in ("t2i", "i2t") for a in ("lse", "avg")]
WORDS = ["a", "dog", "on", "the", "bench", "cat", "red", "car", "man", "riding"]
CAPTIONS = ["a dog on the bench", "a red car", "the man riding a red car", "cat"]
TINY = {
    "embed_dim": 16,
    "image_encoder": {"feature_dim": 12},
    "text_encoder": {"vocab": WORDS, "word_dim": 8, "hidden_dim": 16},
}

# kuanghuei/SCAN README (REFERENCE.md C1, A6): agg_func, cross_attn, lambda_lse, lambda_softmax
README = {
    "scan-t2i-lse-f30k": ("LogSumExp", "scan-t2i", 6.0, 9.0),
    "scan-t2i-avg-f30k": ("Mean", "scan-t2i", None, 9.0),
    "scan-i2t-lse-f30k": ("LogSumExp", "scan-i2t", 5.0, 4.0),
    "scan-i2t-avg-f30k": ("Mean", "scan-i2t", None, 4.0),
    "scan-t2i-lse-coco": ("LogSumExp", "scan-t2i", 6.0, 9.0),
    "scan-t2i-avg-coco": ("Mean", "scan-t2i", None, 9.0),
    "scan-i2t-lse-coco": ("LogSumExp", "scan-i2t", 20.0, 4.0),
    "scan-i2t-avg-coco": ("Mean", "scan-i2t", None, 4.0),
}


def test_components_come_from_this_distribution():
    expected = {
        "image_encoders": {"scan-precomp": ScanPrecompImageEncoder},
        "text_encoders": {"scan-bigru": ScanBiGRUTextEncoder},
        "poolers": {"scan-t2i": ScanT2IPooler, "scan-i2t": ScanI2TPooler, "scan-sum-max-t2i": SumMaxT2IPooler, "scan-sum-max-i2t": SumMaxI2TPooler},
    }
    for kind, components in expected.items():
        registry = xmatch.core.registry.get_registry(kind)
        for name, cls in components.items():
            assert name in xmatch.list_components(kind)
            assert registry.get(name) is cls and registry.origin(name) == DIST


def test_zoo_entries_are_listed_and_match_the_entry_points():
    assert xmatch.list_models("scan-*") == sorted(ENTRIES)
    declared = {ep.name for ep in importlib.metadata.entry_points(group="xmatch_models") if ep.dist.name == DIST}
    assert declared == set(ENTRIES) == set(xmatch_scan.entry_names())
    assert all(xmatch.core.registry.models.origin(name) == DIST for name in ENTRIES)


def test_data_file_is_package_data():
    text = (Path(xmatch_scan.__file__).parent / "zoo.toml").read_text()
    assert set(tomllib.loads(text)) == set(ENTRIES)
    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    assert "*.toml" in pyproject["tool"]["setuptools"]["package-data"]["xmatch_scan"]


@pytest.mark.parametrize("name", ENTRIES)
def test_entry_card_and_spec_follow_the_readme(name):
    entry = xmatch.info(name)
    agg, pooler, lambda_lse, lambda_softmax = README[name]
    spec = entry.spec
    assert spec["pooler"]["name"] == pooler and spec["pooler"]["agg_func"] == agg
    assert spec["pooler"]["lambda_softmax"] == lambda_softmax
    if lambda_lse is not None:
        assert spec["pooler"]["lambda_lse"] == lambda_lse
    assert spec["pooler"].get("raw_feature_norm", "clipped_l2norm") == "clipped_l2norm"
    assert spec["embed_dim"] == 1024 and spec["image_encoder"] == {"name": "scan-precomp", "feature_dim": 2048}
    assert spec["text_encoder"]["word_dim"] == 300 and spec["text_encoder"]["hidden_dim"] == 1024
    # fc is the image projection; the Bi-GRU states go straight to the L2 norm
    assert spec["image_projection"] is True and spec["text_projection"] is False
    assert spec["image_reasoner"]["name"] == spec["text_reasoner"]["name"] == "identity"
    assert spec["loss"] == {"name": "hinge", "margin": 0.2, "max_violation": True, "reduction": "sum"}
    check_model_spec(spec)
    assert entry.dataset == name.rsplit("-", 1)[1] and "ECCV 2018" in entry.paper
    assert entry.weights == [] and "No weights" in entry.origin and entry.metrics == {}
    epochs = "20 epochs, Adam lr 5e-4 x0.1 every 10" if entry.dataset == "coco" else "30 epochs, Adam lr 2e-4 x0.1 every 15"
    assert epochs in entry.notes
    assert entry.input["regions"] == 36 and "<start>" in entry.input["tokenizer"]


@pytest.mark.parametrize("name", ENTRIES)
def test_stated_params_are_the_built_models(name, tmp_path):
    entry = xmatch.info(name)
    assert count_parameters(entry, tmp_path) == entry.params == 10_245_120
    # by hand: SCAN's fc and the bidirectional GRU (r, z, n gates), nothing else (SCAN.params
    # of the original: img_enc.fc + txt_enc less the word embeddings)
    fc = 2048 * 1024 + 1024
    gru = 2 * (3 * 1024 * 300 + 3 * 1024 * 1024 + 2 * 3 * 1024)
    assert entry.params == fc + gru


def test_paper_ensembles_name_plugin_entries_and_part_a_figures():
    ensembles = xmatch_scan.paper_ensembles()
    assert set(ensembles) == {"scan-ensemble-f30k", "scan-ensemble-coco"}
    for ens in ensembles.values():
        assert len(ens.members) == 2 and {m.split("-")[1] for m in ens.members} == {"t2i", "i2t"}
        assert all(m in ENTRIES and m.endswith(ens.dataset) for m in ens.members)
    coco = ensembles["scan-ensemble-coco"].metrics
    assert [coco["coco-1k"][k] for k in ("i2t_r1", "i2t_r5", "i2t_r10", "t2i_r1", "t2i_r5", "t2i_r10")] == [72.7, 94.8, 98.4, 58.8, 88.4, 94.8]
    assert [coco["coco-5k"][k] for k in ("i2t_r1", "t2i_r1", "t2i_r10")] == [50.4, 38.6, 80.4]
    f30k = ensembles["scan-ensemble-f30k"].metrics["f30k-1k"]
    assert (f30k["i2t_r1"], f30k["i2t_r10"], f30k["t2i_r1"], f30k["t2i_r10"]) == (67.4, 95.8, 48.6, 85.2)


def test_zoo_entry_builds_without_a_vocabulary_but_says_what_is_missing():
    model = xmatch.build("scan-t2i-avg-f30k")
    assert isinstance(model.pooler, ScanT2IPooler) and model.pooler.agg_func == "Mean"
    assert model.image_projection.in_features == 2048 and isinstance(model.text_projection, torch.nn.Identity)
    with pytest.raises(ValueError, match="text_encoder=\\{'vocab': ...\\}"):
        model.encode_texts(["a dog"])


@pytest.mark.parametrize("name", ENTRIES)
def test_every_entry_trains_in_miniature(name):
    torch.manual_seed(0)
    model = xmatch.build(name, **TINY)
    g = torch.Generator().manual_seed(1)
    regions = torch.randn(4, 5, 12, generator=g)
    mask = torch.arange(5)[None] < torch.tensor([[5], [3], [1], [4]])
    boxes = torch.tensor([0.0, 0.0, 1.0, 1.0]).expand(4, 5, 4)
    out = model(xmatch.PairBatch(xmatch.RegionInputs(regions, boxes, mask), CAPTIONS))
    assert out.loss.dim() == 0 and torch.isfinite(out.loss) and out.loss > 0
    assert set(out.logs) == {"main_sum", "main_mean"}
    out.loss.backward()
    missing = [n for n, p in model.named_parameters() if p.requires_grad and (p.grad is None or not torch.isfinite(p.grad).all() or not p.grad.any())]
    assert not missing, f"parameters without gradient: {missing}"
