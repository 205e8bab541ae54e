"""Finite by construction: an item whose stored values are NaN or infinite (written by an older
xmatch, or damaged on disk with a consistent manifest) never ranks, in any stage-2 path or the
exact scan; the search reports it, and ``verify()`` names it with the fix."""

from __future__ import annotations

import pytest
import torch

import xmatch
import xmatch.index
from xmatch.index import DamagedIndexError, SearchIndexError
from xmatch.index.synthetic import PlantedCorpus, scoring_model

from test_search import DIM, TEXTS, regions

pytest.importorskip("faiss")


@pytest.fixture(scope="module")
def model() -> xmatch.MatchingModel:
    return scoring_model("MrSw", DIM)


def planted(root, model, value: float, engine: str = "faiss") -> xmatch.index.SearchIndex:
    """20 sound images, then a shard (manifest consistent) holding ``bad`` with ``value`` in a
    real token: as an index written before the check at ``add``, or damaged and re-hashed."""
    idx = xmatch.index.create(root, model, dtype="float32", engine=engine)
    feats, boxes, mask = regions(22)
    idx.add(xmatch.RegionInputs(feats[:20], boxes[:20], mask[:20]))
    with torch.no_grad():
        e = model.encode_images(xmatch.RegionInputs(feats[20:], boxes[20:], mask[20:])).trimmed()
    e.tokens[0, 0] = value
    idx.store.add(e, ["bad", "fine"])  # below the check of SearchIndex.add
    return idx


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("how", [{"exact": True}, {}, {"candidates": 5}, {"stage1": "pooled"}])
def test_a_non_finite_item_never_ranks_and_is_reported(tmp_path, model, value, how):
    idx = planted(tmp_path / "idx", model, value)
    for result in idx.search_texts(TEXTS, k=22, **how):
        assert "bad" not in result.ids and len(result.hits) == 21 and result.hits[0].score == result.hits[0].score
        assert result.extra["non_finite"] == 1 and all(torch.isfinite(torch.tensor([h.score for h in result.hits])))
        assert "1 stored item scored NaN or infinity and was left out" in result.text()
        assert result.as_dict()["extra"]["non_finite"] == 1
    clean = idx.search_texts(TEXTS, k=3, exact=True)
    assert all("bad" not in r.ids and len(r.hits) == 3 for r in clean)


def test_a_non_finite_item_never_ranks_in_a_widened_search(tmp_path, model, monkeypatch):
    import xmatch.index.ann as ann

    monkeypatch.setattr(ann, "FLAT_LIMIT", 200)  # centroid lists on a small corpus
    corpus = PlantedCorpus(images=400, regions=6, dim=DIM, concepts=64, groups=8, words=4, swapped=1)
    idx = xmatch.index.create(tmp_path / "idx", model, dtype="float32")
    ((ids, items),) = corpus.batches(400)
    items.tokens[3, 0] = float("nan")
    idx.store.add(items, ids)
    for result in idx.search(corpus.queries(8)[0], k=10):
        assert "3" not in result.ids and len(result.hits) == 10 and result.stage1 == "tokens"
        assert all(torch.isfinite(torch.tensor([h.score for h in result.hits])))


def test_non_finite_queries_are_refused(tmp_path, model):
    idx = planted(tmp_path / "idx", model, 0.0)
    with torch.no_grad():
        queries = model.encode_texts(TEXTS[:2]).trimmed()
    queries.tokens[1, 0, 0] = float("nan")
    with pytest.raises(SearchIndexError, match=r"query 1 has NaN or infinite values .*nothing was searched"):
        idx.search(queries, k=3)


def test_verify_names_the_shard_and_the_fix(tmp_path, model):
    idx = planted(tmp_path / "idx", model, float("nan"))
    with pytest.raises(DamagedIndexError, match=r"shards/00000001.safetensors holds NaN or infinite values in 1 items "
                                                r"\(the first: 'bad'\).*rebuild the index"):
        idx.verify()


def test_verify_reads_the_values_of_every_engine(tmp_path, model):
    """The values check of ``SearchIndex.verify`` walks the stored token sets through the store,
    whatever the engine: the Qdrant Edge engine's too."""
    pytest.importorskip("qdrant_edge")
    idx = planted(tmp_path / "idx", model, float("nan"), engine="qdrant")
    with pytest.raises(DamagedIndexError, match=r"NaN or infinite values .*'bad'.*rebuild the index"):
        idx.verify()
    result = idx.search_texts(TEXTS[:1], k=5, exact=True)[0]
    assert "bad" not in result.ids and result.extra["non_finite"] == 1


@pytest.mark.parametrize("engine", ["faiss", "qdrant"])
def test_the_values_check_holds_for_a_store_that_checks_nothing_itself(tmp_path, model, monkeypatch, engine):
    """An engine whose own ``verify()`` checks only its files or counts still gets its values
    walked by ``SearchIndex.verify``."""
    if engine == "qdrant":
        pytest.importorskip("qdrant_edge")
    idx = planted(tmp_path / "idx", model, float("inf"), engine=engine)
    monkeypatch.setattr(type(idx.store), "verify", lambda self: None)
    monkeypatch.setattr(type(idx.store), "checks_values", False, raising=False)
    with pytest.raises(DamagedIndexError, match=r"item 'bad' of the index .*idx \(and 0 more\) holds NaN or infinite "
                                                r"values.*rebuild the index \(xmatch index ... --overwrite\)"):
        idx.verify()
