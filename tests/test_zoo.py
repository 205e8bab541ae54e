"""Zoo entries: schema, the paper's metrics, and that every spec validates."""

from __future__ import annotations

import pytest

import xmatch
from xmatch.spec import check_model_spec

BENCHMARKS = {"coco-1k", "coco-5k", "f30k-1k"}
METRIC_KEYS = {f"{d}_{m}" for d in ("i2t", "t2i") for m in ("r1", "r5", "r10", "ndcg_rougel", "ndcg_spice")}


def test_all_paper_variants_are_listed():
    names = set(xmatch.list_models())
    for ds in ("coco", "f30k"):
        for variant in ("mrsw", "mwsr", "symm", "mravgw", "mrsw-sharedw", "mrsw-stopwords", "bigru", "bilstm"):
            assert f"teran-{variant}-{ds}" in names
    assert {"tern-coco", "tern-align-coco"} <= names
    assert xmatch.list_models("teran-mrsw-*") == ["teran-mrsw-coco", "teran-mrsw-f30k", "teran-mrsw-sharedw-coco",
                                                  "teran-mrsw-sharedw-f30k", "teran-mrsw-stopwords-coco", "teran-mrsw-stopwords-f30k"]


@pytest.mark.parametrize("name", xmatch.list_models())
def test_entry_schema(name):
    entry = xmatch.info(name)
    assert entry.description and entry.paper and entry.dataset in {"coco", "f30k"}
    assert entry.origin, "every entry says where its weights come from"
    check_model_spec(entry.spec)
    for bench, figures in entry.metrics.items():
        assert bench in BENCHMARKS and bench.startswith(entry.dataset)
        assert figures["source"]
        values = {k: v for k, v in figures.items() if k != "source"}
        assert values and set(values) <= METRIC_KEYS
        for key, value in values.items():
            assert (0 < value <= 1) if "ndcg" in key else (0 < value <= 100)
        for d in ("i2t", "t2i"):
            rs = [values.get(f"{d}_r{k}") for k in (1, 5, 10) if values.get(f"{d}_r{k}") is not None]
            assert rs == sorted(rs)
    for source in entry.weights:
        assert source.get("sha256") and source.get("size"), "a URL always comes with sha256 and size"


def test_paper_figures_are_the_papers():
    assert xmatch.info("teran-mrsw-coco").metrics["coco-1k"]["t2i_r1"] == 65.0
    assert xmatch.info("teran-symm-f30k").metrics["f30k-1k"]["i2t_r10"] == 94.7
    assert xmatch.info("tern-coco").metrics["coco-5k"]["t2i_r1"] == 28.7
    assert xmatch.info("teran-bigru-coco").metrics["coco-1k"] == {
        "source": "TERAN paper, ablation study on MS-COCO 1K (R@1 only)", "i2t_r1": 69.1, "t2i_r1": 56.3}


def test_variants_differ_from_the_base_where_the_paper_says():
    base = xmatch.info("teran-mrsw-coco").spec
    assert xmatch.info("teran-symm-coco").spec["pooler"]["name"] == "Symm"
    assert xmatch.info("teran-mrsw-sharedw-coco").spec["shared_reasoner"] is True
    assert xmatch.info("teran-mrsw-stopwords-coco").spec["text_encoder"]["exclude_stopwords"] is True
    assert xmatch.info("teran-bilstm-f30k").spec["text_encoder"]["name"] == "bilstm"
    assert xmatch.info("tern-coco").spec["pooler"]["name"] == "global-cosine"
    assert base["image_encoder"]["layers"] == 4 and base["text_encoder"]["layers"] == 6
    assert base["embed_dim"] == 1024 and base["loss"]["margin"] == 0.2


def test_card_mentions_paper_and_metrics():
    card = xmatch.info("teran-mrsw-coco").card()
    assert "TOMM 2021" in card and "coco-1k" in card and "t2i_r1 65.0" in card


def test_docs_zoo_page_is_up_to_date():
    from pathlib import Path

    from xmatch.docs_zoo import render

    page = Path(__file__).resolve().parents[1] / "docs" / "zoo.md"
    assert page.read_text() == render(), "regenerate it: python -m xmatch.docs_zoo > docs/zoo.md"


def test_weight_sources_are_validated_when_an_entry_is_made():
    spec = xmatch.info("teran-mrsw-coco").spec
    with pytest.raises(ValueError, match="zoo entry 'bad'.*sha256 and size"):
        xmatch.ZooEntry(name="bad", spec=spec, weights=[{"source": "https://example.org/m.safetensors"}])
    ok = xmatch.ZooEntry(name="ok", spec=spec, weights=[{"source": "hf-hub:org/name@v1"}])
    assert ok.weights[0]["source"] == "hf-hub:org/name@v1"
