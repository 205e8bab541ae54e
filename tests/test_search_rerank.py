"""The verifier as a third search stage: ``index.search(..., rerank=K)`` and ``xmatch search --rerank K``."""

from __future__ import annotations

import json

import pytest
import torch

import xmatch
import xmatch.index
from xmatch.index import Cascade, NoVerifierError, SearchIndexError
from xmatch.index.synthetic import PlantedCorpus, scoring_model
from test_search import DIM, TEXTS, regions

pytest.importorskip("faiss")

@pytest.fixture(scope="module", params=["cross-attention", "grounded"])
def model(request) -> xmatch.MatchingModel:
    """A random model with a verifier head (its logits order the pairs unlike the pooler), each
    built-in head in turn."""
    return scoring_model("MrSw", DIM, verifier=request.param)


@pytest.fixture()
def index(tmp_path, model) -> xmatch.index.SearchIndex:
    """40 images with their boxes, in two shards, stored in float32 (scores equal the model's)."""
    idx = xmatch.index.create(tmp_path / "idx", model, dtype="float32")
    feats, boxes, mask = regions(40)
    idx.add(xmatch.RegionInputs(feats[:25], boxes[:25], mask[:25]), ids=[f"img{i}" for i in range(25)])
    idx.add(xmatch.RegionInputs(feats[25:], boxes[25:], mask[25:]), ids=[f"img{i}" for i in range(25, 40)])
    return idx


def encoded(model: xmatch.MatchingModel) -> tuple[xmatch.Embeddings, xmatch.Embeddings]:
    """The index's 40 images (with boxes) and the queries, encoded in memory."""
    feats, boxes, mask = regions(40)
    with torch.inference_mode():
        return model.encode_images(xmatch.RegionInputs(feats, boxes, mask)), model.encode_texts(TEXTS)


def brute_force(model, img: xmatch.Embeddings, txt: xmatch.Embeddings, k: int, top: int, direction: str = "t2i"):
    """Each query's answer computed the long way: every item scored by the pooler, the best
    ``top`` verified pair by pair, sorted by the logit, then the pooler's order: ``(rows, logits)``."""
    with torch.inference_mode():
        scores = model.similarity(img, txt)
    queries, items = (txt, img) if direction == "t2i" else (img, txt)
    scores = scores.T if direction == "t2i" else scores
    rows, logits = [], []
    for q in range(len(queries)):
        ranked = scores[q].argsort(descending=True)
        best = ranked[:top]
        pair = (items[best], queries[torch.full((len(best),), q)])
        with torch.inference_mode():
            logit = model.verify(*(pair if direction == "t2i" else pair[::-1])).float()
        order = logit.argsort(descending=True)
        rows.append(torch.cat([best[order], ranked[top:]])[:k].tolist())
        logits.append(logit[order][:k].tolist())
    return rows, logits


# --- the order ---------------------------------------------------------------------------------


def test_verifier_order_within_the_top_k_and_the_pooler_order_below(index, model):
    plain = index.search_texts(TEXTS, k=10)
    verified = index.search_texts(TEXTS, k=10, rerank=4)
    img, txt = encoded(model)
    expected_rows, expected_logits = brute_force(model, img, txt, k=10, top=4)
    for q, (p, v) in enumerate(zip(plain, verified)):
        assert v.reranked == 4 and v.exact and set(v.ids[:4]) == set(p.ids[:4])
        assert v.ids[4:] == p.ids[4:]  # the rest keeps the pooler's order
        assert [h.row for h in v.hits] == expected_rows[q]
        logits = [h.verifier for h in v.hits[:4]]
        assert logits == sorted(logits, reverse=True)
        assert logits == pytest.approx(expected_logits[q][:4], abs=1e-4)
        assert [h.stage for h in v.hits] == ["verifier"] * 4 + ["pooler"] * 6
        assert all(h.verifier is None for h in v.hits[4:])
        score_of = {h.id: h.score for h in p.hits}  # every hit keeps the pooler's own score
        assert [h.score for h in v.hits] == pytest.approx([score_of[i] for i in v.ids], abs=1e-6)
    assert all(h.stage == "pooler" and h.verifier is None for r in plain for h in r.hits) and plain[0].reranked == 0


def test_the_verifier_reads_the_stored_boxes(index, model):
    """An image index keeps the region boxes; the verifier gets them with the stored tokens, so
    its logits are those of the in-memory embeddings, boxes included (this head embeds them)."""
    img, txt = encoded(model)
    result = index.search_texts(TEXTS[:1], k=5, rerank=5)[0]
    rows = torch.tensor([h.row for h in result.hits])
    one = txt[torch.zeros(5, dtype=torch.long)]
    with torch.inference_mode():
        with_boxes = model.verify(img[rows], one)
        without = model.verify(xmatch.Embeddings(img.tokens[rows], img.mask[rows]), one)
    assert [h.verifier for h in result.hits] == pytest.approx(with_boxes.tolist(), abs=1e-4)
    assert not torch.allclose(with_boxes, without, atol=1e-3)


def test_a_deeper_rerank_than_k_returns_the_verifier_best_of_the_deeper_list(index, model):
    img, txt = encoded(model)
    expected, _ = brute_force(model, img, txt, k=3, top=12)
    for q, result in enumerate(index.search_texts(TEXTS, k=3, rerank=12)):
        assert [h.row for h in result.hits] == expected[q]
        assert result.reranked == 12 and len(result.hits) == 3 and all(h.stage == "verifier" for h in result.hits)


@pytest.mark.parametrize("exact", [False, True])
def test_rerank_larger_than_the_corpus_verifies_every_item(index, model, exact):
    img, txt = encoded(model)
    expected, _ = brute_force(model, img, txt, k=10, top=40)
    for q, result in enumerate(index.search_texts(TEXTS, k=10, rerank=1000, exact=exact)):
        assert result.reranked == 40 and [h.row for h in result.hits] == expected[q]


def test_exact_against_brute_force_on_the_synthetic_index(tmp_path, model):
    """A planted corpus appended as embeddings (no boxes: the verifier gets img.boxes=None), both
    directions; the two-stage top K is proven exact, so the re-ranked answer is the brute-force one,
    and model.similarity(..., rerank=K) orders the same items the same way."""
    corpus = PlantedCorpus(images=300, regions=8, dim=DIM, concepts=64, groups=10, words=5, swapped=1)
    idx = xmatch.index.create(tmp_path / "planted", model, dtype="float32")
    parts = []
    for ids, e in corpus.batches(128):
        idx.add(e, ids)
        parts.append(e)
    assert idx.store.boxes(torch.arange(3)) is None
    items = xmatch.Embeddings.cat(parts)
    queries, _ = corpus.queries()
    results = idx.search(queries, k=8, rerank=20)
    rows, logits = brute_force(model, items, queries, k=8, top=20)
    with torch.inference_mode():
        reranked = model.similarity(items, queries, rerank=20, direction="t2i")
    for q, result in enumerate(results):
        assert result.exact and result.scored < len(idx)  # the proof held without scoring everything
        assert [h.row for h in result.hits] == rows[q] == reranked[:, q].argsort(descending=True)[:8].tolist()
        assert [h.verifier for h in result.hits] == pytest.approx(logits[q], abs=1e-4)

    # image queries against a caption index: the other direction
    captions = [f"a {c} {s}" for c in ("red", "blue", "green", "purple", "big") for s in ("circle", "square", "star")]
    caps = xmatch.index.create(tmp_path / "caps", model, side="texts", dtype="float32")
    caps.add(captions)
    feats, boxes, mask = regions(3, seed=5)
    images = xmatch.RegionInputs(feats, boxes, mask)
    with torch.inference_mode():
        img, txt = model.encode_images(images), model.encode_texts(captions)
    rows, _ = brute_force(model, img, txt, k=5, top=6, direction="i2t")
    for q, result in enumerate(caps.search_images(images, k=5, rerank=6)):
        assert [h.row for h in result.hits] == rows[q] and result.hits[0].text == captions[rows[q][0]]


def test_verifier_calls_are_batched(index, model, monkeypatch):
    calls = []
    verify = type(model).verify

    def counted(self, img, txt, **kwargs):
        calls.append(len(img))
        return verify(self, img, txt, **kwargs)

    expected = [r.ids for r in index.search_texts(TEXTS, k=6, rerank=5)]
    monkeypatch.setattr(type(model), "verify", counted)
    got = index.search_texts(TEXTS, k=6, rerank=5, rerank_batch=7)
    assert [r.ids for r in got] == expected
    assert calls == [7, 7, 6]  # 4 queries x 5 pairs, 7 at a time


def test_each_stage_time_is_recorded_and_printed(index):
    result = index.search_texts(TEXTS, k=3, rerank=5)[0]
    assert list(result.timings) == ["encode", "stage1", "stage2", "verifier"]
    assert all(ms >= 0 for ms in result.timings.values())
    exhaustive = index.search_texts(TEXTS, k=3, rerank=5, exact=True)[0]
    assert list(exhaustive.timings) == ["encode", "stage2", "verifier"]
    printed = result.text()
    assert "the verifier re-ranked the pooler's top 5" in printed and "verifier " in printed.splitlines()[-1]
    assert printed.splitlines()[-1].startswith("  [time per query: encode ")
    first = printed.splitlines()[1].split()
    assert first[1:4] == [f"{result.hits[0].score:.4f}", f"{result.hits[0].verifier:.4f}", result.hits[0].id]
    record = json.loads(json.dumps(result.as_dict()))
    assert record["reranked"] == 5 and set(record["timings"]) == {"encode", "stage1", "stage2", "verifier"}
    assert record["hits"][0]["stage"] == "verifier" and "verifier" in record["hits"][0]


def test_a_plain_search_keeps_its_fields(index):
    """Without rerank the result is what it was, plus the stage, the timings and the work."""
    record = index.search_texts(TEXTS[:1], k=2)[0].as_dict()
    assert set(record) == {"hits", "query", "scored", "total", "exact", "exactness", "stage1", "reranked", "timings",
                           "work", "work_exhaustive"}
    assert set(record["hits"][0]) == {"id", "score", "row", "stage"} and record["reranked"] == 0


def test_cascade_with_the_verifier(index, model):
    cascade = Cascade(index, index, shortlist=40)
    expected = index.search_texts(TEXTS, k=5, rerank=8, exact=True)
    for got, want in zip(cascade.search_texts(TEXTS, k=5, rerank=8), expected):
        assert got.ids == want.ids and got.stage1 == "cascade" and got.reranked == 8
        assert list(got.timings) == ["shortlist", "cascade", "verifier"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (torch sees none)")
def test_a_model_on_the_gpu_searches_and_reranks_as_on_the_cpu(index, model):
    """Stage 1 stays beside the stored tokens on the CPU; stages 2 and 3 run on the model's device
    (stage 1 was handed the GPU queries: a device mismatch in the token scan)."""
    on_gpu = xmatch.index.open(index.root, scoring_model("MrSw", DIM, verifier="cross-attention"), device="cuda")
    for cpu, gpu in zip(index.search_texts(TEXTS, k=10, rerank=6), on_gpu.search_texts(TEXTS, k=10, rerank=6)):
        assert cpu.ids == gpu.ids and gpu.exact
        assert [h.verifier for h in gpu.hits[:6]] == pytest.approx([h.verifier for h in cpu.hits[:6]], abs=1e-3)


# --- errors --------------------------------------------------------------------------------------


def test_a_model_without_a_verifier_and_a_bad_k_are_refused_before_searching(tmp_path, index, monkeypatch):
    plain = scoring_model("MrSw", DIM)
    idx = xmatch.index.create(tmp_path / "plain", plain)
    feats, boxes, mask = regions(5)
    idx.add(xmatch.RegionInputs(feats, boxes, mask))
    monkeypatch.setattr(type(idx), "_ranked", lambda *a, **k: pytest.fail("a stage ran"))
    with pytest.raises(NoVerifierError, match=r"rerank needs a model with a verifier head, and the model of the "
                                              r"index .*plain has none: index the corpus with a model that has one"):
        idx.search_texts(TEXTS, k=2, rerank=3)
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match=rf"rerank must be at least 1 \(the pooler's top hits re-scored by the "
                                             rf"verifier per query\), got {bad!r}"):
            index.search_texts(TEXTS, k=2, rerank=bad)
    with pytest.raises(ValueError, match=r"rerank batch must be at least 1 \(\(query, item\) pairs per verifier call\)"):
        index.search_texts(TEXTS, k=2, rerank=3, rerank_batch=0)
    with pytest.raises(NoVerifierError):
        Cascade(idx, idx, shortlist=5).search_texts(TEXTS, k=2, rerank=3)
    assert issubclass(NoVerifierError, SearchIndexError)


def test_an_index_with_boxes_for_some_items_only_gives_none(tmp_path, model):
    """Items appended as embeddings without boxes beside items with boxes: the store has no
    boxes for the corpus (was an AttributeError on the shard without them)."""
    idx = xmatch.index.create(tmp_path / "mixed", model, dtype="float32")
    feats, boxes, mask = regions(6)
    idx.add(xmatch.RegionInputs(feats, boxes, mask))
    with torch.inference_mode():
        e = model.encode_images(xmatch.RegionInputs(feats[:2], boxes[:2], mask[:2]))
    idx.add(xmatch.Embeddings(e.tokens, e.mask, e.pooled), ids=["bare0", "bare1"])
    assert idx.store.boxes(torch.tensor([0, 7])) is None
    assert len(idx.search_texts(TEXTS[:1], k=3, rerank=8)[0].hits) == 3


# --- command line --------------------------------------------------------------------------------


def test_cli_rerank(tmp_path, capsys, index):
    from xmatch.cli.main import main

    root = str(index.root)  # created without a model reference: the model (with its verifier) is saved inside
    assert main(["search", root, "--text", TEXTS[0], "--text", TEXTS[1], "-k", "4", "--rerank", "3", "--json"]) == 0
    results = json.loads(capsys.readouterr().out)
    expected = index.search_texts(TEXTS[:2], k=4, rerank=3)
    assert [[h["id"] for h in r["hits"]] for r in results] == [r.ids for r in expected]
    assert [h["stage"] for h in results[0]["hits"]] == ["verifier"] * 3 + ["pooler"]
    assert results[0]["reranked"] == 3 and "verifier" in results[0]["timings"]
    assert main(["search", root, "--text", TEXTS[0], "-k", "2", "--rerank", "5", "--rerank-batch", "2"]) == 0
    printed = capsys.readouterr().out
    assert "the verifier re-ranked the pooler's top 5" in printed and "verifier" in printed.splitlines()[-1]
    assert main(["search", root, "--text", TEXTS[0], "--rerank", "0"]) == 2
    assert "xmatch search: rerank must be at least 1" in capsys.readouterr().err

    plain = xmatch.index.create(tmp_path / "plain", scoring_model("MrSw", DIM))
    feats, boxes, mask = regions(3)
    plain.add(xmatch.RegionInputs(feats, boxes, mask))
    assert main(["search", str(plain.root), "--text", TEXTS[0], "-k", "2", "--rerank", "2"]) == 2
    assert "has none" in capsys.readouterr().err
