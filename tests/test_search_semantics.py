"""What a search answer means: with ``rerank`` each hit carries the pooler's score and the
verifier's beside it, ordered by the verifier; ``get()`` gives the stored token sets with their
boxes (re-scoring them gives the index's own re-ranked order); ``k`` past the corpus gives all of
it; an answer settled by an estimate says so."""

from __future__ import annotations

import json

import pytest
import torch

import xmatch
import xmatch.index
from xmatch.index.synthetic import PlantedCorpus, scoring_model

from test_search import DIM, TEXTS, index, regions  # noqa: F401  (index: 40 images in two shards, of this model)

pytest.importorskip("faiss")


@pytest.fixture(scope="module")
def model() -> xmatch.MatchingModel:
    return scoring_model("MrSw", DIM, verifier="grounded")


def test_a_reranked_hit_carries_both_scores_and_json_shows_them(index, capsys):
    from xmatch.cli.main import main

    plain = {h.id: h.score for h in index.search_texts(TEXTS[:1], k=40)[0].hits}
    result = index.search_texts(TEXTS[:1], k=10, rerank=10)[0]
    assert [h.score for h in result.hits] == pytest.approx([plain[i] for i in result.ids], abs=1e-6)  # the pooler's
    logits = [h.verifier for h in result.hits]
    assert logits == sorted(logits, reverse=True)  # the order is the verifier's
    assert main(["search", str(index.root), "--text", TEXTS[0], "-k", "10", "--rerank", "10", "--json"]) == 0
    hits = json.loads(capsys.readouterr().out)[0]["hits"]
    assert [h["id"] for h in hits] == result.ids
    assert [(h["score"], h["verifier"]) for h in hits] == [(h.score, h.verifier) for h in result.hits]


def test_get_returns_the_stored_boxes_and_rescoring_gives_the_rerank_order(index, model):
    feats, boxes, mask = regions(40)
    got = index.get(["img3", "img30"])
    assert got.boxes is not None
    with torch.inference_mode():
        encoded = model.encode_images(xmatch.RegionInputs(feats[[3, 30]], boxes[[3, 30]], mask[[3, 30]]))
    width = encoded.boxes.shape[1]
    assert torch.allclose(got.boxes[:, :width], encoded.boxes)
    with torch.inference_mode():
        queries = model.encode_texts(TEXTS)
    for q, result in enumerate(index.search_texts(TEXTS, k=12, rerank=12)):
        items = index.get(result.ids)
        with torch.inference_mode():
            logits = model.verify(items, queries[torch.full((len(items),), q)])
        assert [result.ids[i] for i in logits.argsort(descending=True).tolist()] == result.ids
        assert logits.tolist() == pytest.approx([h.verifier for h in result.hits], abs=1e-4)


@pytest.mark.parametrize("options", [{}, {"exact": True}, {"rerank": 50}, {"stage1": "pooled"}, {"candidates": 3}])
def test_k_beyond_the_index_gives_every_item(index, options):
    for result in index.search_texts(TEXTS, k=1000, **options):
        assert sorted(result.ids) == sorted(index.ids) and len(result.hits) == 40


def test_k_beyond_the_index_from_the_command_line(index, capsys):
    from xmatch.cli.main import main

    assert main(["search", str(index.root), "--text", TEXTS[0], "-k", "100", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)[0]["hits"]) == 40


def widened_index(tmp_path, monkeypatch) -> tuple[xmatch.index.SearchIndex, PlantedCorpus]:
    import xmatch.index.ann as ann

    monkeypatch.setattr(ann, "FLAT_LIMIT", 1000)  # centroid lists on a small corpus
    corpus = PlantedCorpus(images=3000, regions=12, dim=DIM, concepts=256, groups=30, words=6, swapped=1)
    idx = xmatch.index.create(tmp_path / "planted", scoring_model("MrSw", DIM))
    for ids, e in corpus.batches(1000):
        idx.add(e, ids)
    return idx, corpus


def test_an_answer_settled_by_an_estimate_says_so(tmp_path, monkeypatch):
    idx, corpus = widened_index(tmp_path, monkeypatch)
    results = idx.search(corpus.queries(10)[0], k=10)
    settled = [r for r in results if r.extra["settled"] and not r.exact]
    assert settled, "no query settled by the stop test"
    for r in settled:
        assert r.exactness == "estimated" and r.as_dict()["exactness"] == "estimated"
        assert "exact: estimated" in r.text() and "not proven" in r.text()
    proven = idx.search(corpus.queries(2)[0], k=10, exact=True)[0]
    assert proven.exactness == "exhaustive" and "exact (every item scored)" in proven.text()
    fixed = idx.search(corpus.queries(2)[0], k=10, candidates=20)[0]
    notes = next(line for line in fixed.text().splitlines() if line.startswith("  ["))
    assert fixed.exactness == "unchecked" and notes.startswith("  [two-stage;")


def test_the_command_line_prints_an_estimated_answer_as_such(tmp_path, monkeypatch, capsys):
    from xmatch.cli.main import main
    from xmatch.index.results import SearchResult

    idx, corpus = widened_index(tmp_path, monkeypatch)
    queries = corpus.queries(10)[0]
    estimated = [r for r in idx.search(queries, k=10) if r.exactness == "estimated"][:1]
    assert estimated
    monkeypatch.setattr(xmatch.index.SearchIndex, "search_texts", lambda self, texts, k=10, **o: estimated)
    assert main(["search", str(idx.root), "--text", "a query", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["exactness"] == "estimated"
    assert main(["search", str(idx.root), "--text", "a query"]) == 0
    assert "exact: estimated" in capsys.readouterr().out
    assert SearchResult([], exact=True, scored=3, total=3).exactness == "exhaustive"
