"""xmatch.index: the corpus store, two-stage search, its engines, and `xmatch index` / `xmatch search`."""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import xmatch
import xmatch.index
from xmatch.index import (
    Cascade,
    DamagedIndexError,
    EmptyIndexError,
    ModelMismatchError,
    SearchIndexError,
    WrongSideError,
)
from xmatch.index.synthetic import PlantedCorpus, scoring_model

pytest.importorskip("faiss")

DIM = 32
TEXTS = ["a large red circle left of a small blue seven", "a green square", "a tiny purple number one above a star",
         "two shapes"]


def regions(n: int, seed: int = 0, r: int = 6) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(n, r, DIM, generator=g)
    xy = torch.rand(n, r, 2, generator=g) * 0.5
    boxes = torch.cat([xy, xy + 0.3], dim=-1)
    mask = torch.arange(r)[None] < torch.randint(2, r + 1, (n,), generator=g)[:, None]
    return feats, boxes, mask


@pytest.fixture(scope="module")
def model() -> xmatch.MatchingModel:
    return scoring_model("MrSw", DIM)


@pytest.fixture()
def index(tmp_path, model) -> xmatch.index.SearchIndex:
    """40 images appended in two batches, stored in float32 (scores equal model.similarity's)."""
    idx = xmatch.index.create(tmp_path / "idx", model, dtype="float32")
    feats, boxes, mask = regions(40)
    idx.add(xmatch.RegionInputs(feats[:25], boxes[:25], mask[:25]), ids=[f"img{i}" for i in range(25)])
    idx.add(xmatch.RegionInputs(feats[25:], boxes[25:], mask[25:]), ids=[f"img{i}" for i in range(25, 40)])
    return idx


def with_pooler(model: xmatch.MatchingModel, pooler: str) -> xmatch.MatchingModel:
    """The same weights scored by another pooler (the encoders, hence the fingerprint, are shared)."""
    other = scoring_model(pooler, DIM)
    other.load_state_dict(model.state_dict())
    return other.eval()


def reference_ranking(model, texts: list[str]) -> torch.Tensor:
    feats, boxes, mask = regions(40)
    with torch.no_grad():
        scores = model.similarity(model.encode_images(xmatch.RegionInputs(feats, boxes, mask)), model.encode_texts(texts))
    return scores.T.argsort(dim=1, descending=True)


# --- exactness -------------------------------------------------------------------------------


@pytest.mark.parametrize("pooler", ["MrSw", "MwSr", "Symm", "MrAvgw"])
def test_exact_and_proven_two_stage_equal_model_similarity(index, model, pooler):
    scorer = with_pooler(model, pooler)
    opened = xmatch.index.open(index.root, scorer)
    expected = reference_ranking(scorer, TEXTS)[:, :10]
    exhaustive = opened.search_texts(TEXTS, k=10, exact=True)
    two_stage = opened.search_texts(TEXTS, k=10, candidates=10)  # flat token index: the bound proves it
    for q, (a, b) in enumerate(zip(exhaustive, two_stage)):
        assert [h.row for h in a.hits] == expected[q].tolist()
        assert a.ids == b.ids and a.exact and b.exact
        assert [h.score for h in a.hits] == pytest.approx([h.score for h in b.hits], abs=1e-5)
    assert exhaustive[0].scored == 40 and exhaustive[0].query == TEXTS[0]


@pytest.mark.parametrize("pooler", ["MrSw", "MwSr", "Symm", "MrAvgw"])
def test_the_exact_token_scan_bounds_are_the_exact_scores(index, model, pooler):
    """Small corpora: stage 1 reaches every stored token, so its estimate is the pooler's score
    itself (in float32, to rounding), which is what proves a two-stage top-k exact."""
    opened = xmatch.index.open(index.root, with_pooler(model, pooler))
    with torch.no_grad():
        queries = opened.model.encode_texts(TEXTS)
    proposed = opened.generator(None).propose(queries, 5)
    every = opened.search(queries, k=40, exact=True)
    for rows, bounds, full in zip(proposed.rows, proposed.bounds, every):
        score_of = {h.row: h.score for h in full.hits}
        assert bounds.tolist() == pytest.approx([score_of[r] for r in rows.tolist()], abs=1e-5)


def test_float16_store_ranks_like_the_rounded_embeddings(tmp_path, model):
    idx = xmatch.index.create(tmp_path / "idx16", model)  # float16 by default
    feats, boxes, mask = regions(40)
    idx.add(xmatch.RegionInputs(feats, boxes, mask))
    with torch.no_grad():
        img = model.encode_images(xmatch.RegionInputs(feats, boxes, mask)).trimmed()
        img = xmatch.Embeddings(img.tokens.half().float(), img.mask)
        expected = model.similarity(img, model.encode_texts(TEXTS)).T.topk(5, dim=1)
    for q, result in enumerate(idx.search_texts(TEXTS, k=5)):
        assert [h.row for h in result.hits] == expected.indices[q].tolist()
        assert [h.score for h in result.hits] == pytest.approx(expected.values[q].tolist(), abs=1e-5)
    shard = idx.store.shards[0]
    assert shard.tokens.dtype == shard.boxes.dtype == torch.float16 and shard.tokens.shape == (40, 6, DIM)


def test_caption_index_answers_image_queries(tmp_path, model):
    captions = [f"a {c} {s}" for c in ("red", "blue", "green", "purple") for s in ("circle", "square", "star")]
    idx = xmatch.index.create(tmp_path / "caps", model, side="texts", dtype="float32")
    idx.add(captions, ids=[f"c{i}" for i in range(len(captions))])
    feats, boxes, mask = regions(3, seed=5)
    with torch.no_grad():
        expected = model.similarity(model.encode_images(xmatch.RegionInputs(feats, boxes, mask)), model.encode_texts(captions))
    results = idx.search_images(xmatch.RegionInputs(feats, boxes, mask), k=4, candidates=4)
    for q, result in enumerate(results):
        assert [h.row for h in result.hits] == expected[q].topk(4).indices.tolist()
        assert result.hits[0].text == captions[result.hits[0].row] and result.exact
    with pytest.raises(WrongSideError, match="holds captions: search it with images"):
        idx.search_texts(["a red circle"])


def test_two_stage_recall_on_a_planted_corpus(tmp_path, monkeypatch):
    """The approximate path (PLAID-style centroid lists): recall@10 against the exhaustive top-10."""
    import xmatch.index.ann as ann

    monkeypatch.setattr(ann, "FLAT_LIMIT", 1000)  # force the centroid lists on a small corpus
    corpus = PlantedCorpus(images=3000, regions=12, dim=DIM, concepts=256, groups=30, words=6, swapped=1)
    idx = xmatch.index.create(tmp_path / "planted", scoring_model("MrSw", DIM))
    for ids, e in corpus.batches(1000):
        idx.add(e, ids)
    queries, planted = corpus.queries()
    exact = idx.search(queries, 10, exact=True)
    approx = idx.search(queries, 10, candidates=90)
    assert idx.generator(None).lists is not None and (idx.root / "ann" / "tokens.lists.npz").is_file()
    recall = sum(len(set(a.ids) & set(e.ids)) for a, e in zip(approx, exact)) / (10 * len(queries))
    assert recall >= 0.95
    assert max(r.scored for r in approx) <= 90 and not any(r.exact for r in approx)
    # the planted near-duplicates are the exhaustive answer, as designed
    found = sum(len(set(e.ids) & {str(i) for i in p.tolist()}) for e, p in zip(exact, planted)) / (10 * len(queries))
    assert found >= 0.9


@pytest.mark.parametrize("stage1", ["pooled", "fde"])
def test_other_generators_rerank_exactly(index, stage1):
    results = index.search_texts(TEXTS, k=3, stage1=stage1, candidates=20)
    every = index.search_texts(TEXTS, k=40, exact=True)
    for r, full in zip(results, every):
        assert r.stage1 == stage1 and r.scored <= 20 and not r.exact
        score_of = {h.row: h.score for h in full.hits}
        assert [h.score for h in r.hits] == pytest.approx([score_of[h.row] for h in r.hits], abs=1e-5)
    assert (index.root / "ann" / ("fde.faiss" if stage1 == "fde" else "mean.faiss")).is_file()


def test_cascade_shortlists_then_reranks(index, model):
    second = xmatch.index.open(index.root, with_pooler(model, "Symm"))
    cascade = Cascade(index, second, shortlist=40)
    expected = second.search_texts(TEXTS, k=5, exact=True)
    for got, want in zip(cascade.search_texts(TEXTS, k=5), expected):
        assert got.ids == want.ids and got.stage1 == "cascade" and got.scored == 40


# --- the store: append, kill, reopen ------------------------------------------------------------


def test_appends_reopen_with_ids_texts_boxes_and_stage1_catch_up(index, model):
    index.search_texts(TEXTS[:1], k=3, stage1="pooled")  # writes ann/mean.faiss over 40 items
    feats, boxes, mask = regions(5, seed=9)
    reopened = xmatch.index.open(index.root, model)
    reopened.add(xmatch.RegionInputs(feats, boxes, mask), ids=["late0", "late1", "late2", "late3", "late4"])
    again = xmatch.index.open(index.root, model)
    assert len(again) == 45 and again.ids[:2] == ["img0", "img1"] and again.ids[-1] == "late4"
    stored = again.store.boxes(torch.tensor([40]))
    assert torch.allclose(stored[0][mask[0][: stored.shape[1]]], boxes[0][mask[0]])
    # the stage-1 file covered 40 items; the 5 new ones are found after the catch-up
    assert {"late0", "late4"} <= set(again.search_texts(TEXTS[:1], k=45, stage1="pooled", candidates=45)[0].ids)
    assert {"late0", "late4"} <= set(again.search_texts(TEXTS[:1], k=45)[0].ids)
    with pytest.raises(SearchIndexError, match="'img3' is already in the index"):
        again.add(xmatch.RegionInputs(feats[:1], boxes[:1]), ids=["img3"])


def test_a_failed_append_leaves_the_last_complete_state(index, model, monkeypatch):
    import xmatch.index.store as store

    def killed(*args, **kwargs):
        raise KeyboardInterrupt  # the process dies after the shard file, before the manifest
    monkeypatch.setattr(store, "write_manifest", killed)
    feats, boxes, _ = regions(3, seed=4)
    with pytest.raises(KeyboardInterrupt):
        index.add(xmatch.RegionInputs(feats, boxes), ids=["x", "y", "z"])
    monkeypatch.undo()
    (index.root / "shards" / "00000009.safetensors.partial").write_bytes(b"half a shard")
    reopened = xmatch.index.open(index.root, model)
    assert len(reopened) == 40 and "x" not in reopened.ids
    reopened.add(xmatch.RegionInputs(feats, boxes), ids=["x", "y", "z"])
    assert sorted(p.name for p in (index.root / "shards").iterdir()) == [f"0000000{i}.safetensors" for i in range(3)]
    assert len(xmatch.index.open(index.root, model)) == 43


KILL_SCRIPT = textwrap.dedent("""
    import sys, torch, xmatch.index
    from xmatch.index.synthetic import scoring_model
    index = xmatch.index.open(sys.argv[1], scoring_model("MrSw", 32))
    g = torch.Generator().manual_seed(0)
    batch = 0
    while True:
        tokens = torch.nn.functional.normalize(torch.randn(8, 6, 32, generator=g), dim=-1)
        e = xmatch.Embeddings(tokens, torch.ones(8, 6, dtype=torch.bool), torch.nn.functional.normalize(tokens.mean(1), dim=-1))
        index.add(e, [f"b{batch}-{i}" for i in range(8)])
        batch += 1
""")


def test_kill_during_appends_keeps_every_complete_batch(tmp_path, model):
    root = tmp_path / "killed"
    xmatch.index.create(root, model)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-c", KILL_SCRIPT, str(root)], env=env, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if json.loads((root / "index.json").read_text())["items"] >= 24:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()[-2000:]
    reopened = xmatch.index.open(root, model)
    n = len(reopened)
    assert n >= 24 and n % 8 == 0
    assert reopened.ids == [f"b{b}-{i}" for b in range(n // 8) for i in range(8)]
    reopened.verify()
    reopened.add(xmatch.Embeddings(torch.ones(1, 6, 32) / 32**0.5, torch.ones(1, 6, dtype=torch.bool),
                                   torch.ones(1, 32) / 32**0.5), ["after"])
    assert len(xmatch.index.open(root, model)) == n + 1


# --- clear errors ---------------------------------------------------------------------------------


def test_a_query_model_with_other_weights_is_refused(index, model):
    other = scoring_model("MrSw", DIM)
    with torch.no_grad():
        other.image_projection.weight.add_(0.01)
    with pytest.raises(ModelMismatchError, match="not the model the index .* was built with"):
        xmatch.index.open(index.root, other)
    halved = copy.deepcopy(model).half()
    assert xmatch.index.model_fingerprint(halved) == xmatch.index.model_fingerprint(halved.float())
    assert len(xmatch.index.open(index.root, with_pooler(model, "Symm"))) == 40  # a pooler does not embed


def test_add_takes_what_the_index_holds_and_names_the_fix_for_anything_else(tmp_path, index, model):
    feats, boxes, mask = regions(2, seed=3)
    with torch.no_grad():
        encoded = model.encode_images(xmatch.RegionInputs(feats, boxes, mask))
    assert encoded.boxes is not None
    index.add(encoded, ["enc0", "enc1"])  # already encoded: the boxes come with the embeddings
    stored = index.store.boxes(torch.tensor([40]))
    assert torch.equal(stored[0][mask[0][: stored.shape[1]]], boxes[0][mask[0]])
    with pytest.raises(WrongSideError, match=r"holds images: add xmatch.RegionInputs, xmatch.PixelInputs \(image files"):
        index.add(["a red circle"])
    with pytest.raises(TypeError, match=r"add takes typed images, got Tensor: wrap region features as "
                                        r"xmatch.RegionInputs\(regions, boxes, mask\)"):
        index.add(feats)
    with pytest.raises(TypeError, match="wrap a single one in a list"):
        index.add("a red circle")
    captions = xmatch.index.create(tmp_path / "caps", model, side="texts")
    with pytest.raises(WrongSideError, match=r"holds captions: add captions \(a list of strings\) or their "
                                             r"xmatch.Embeddings, not RegionInputs"):
        captions.add(xmatch.RegionInputs(feats, boxes))
    captions.add(["a red circle", "a blue seven"])
    with pytest.raises(TypeError, match=r"search_images takes typed images, got Tensor: wrap region features"):
        captions.search_images(feats, k=1)
    assert len(index) == 42 and len(captions) == 2


def test_index_dataset_stores_each_caption_with_its_text(tmp_path, model):
    from types import SimpleNamespace

    from xmatch.index.build import index_dataset

    texts = [f"a {c} {s}" for c in ("red", "blue", "green") for s in ("circle", "star")]
    data = SimpleNamespace(captions=texts, caption_image=[0, 0, 1, 1, 2, 2], image_names=["p", "q", "r"])
    idx = xmatch.index.create(tmp_path / "caps", model, side="texts", dtype="float32")
    assert index_dataset(idx, data, batch_size=1, shard_size=4, progress=False) == 6
    assert idx.ids == ["p#0", "p#1", "q#0", "q#1", "r#0", "r#1"] and len(idx.store.shards) == 2
    feats, boxes, mask = regions(2, seed=5)
    with torch.no_grad():
        expected = model.similarity(model.encode_images(xmatch.RegionInputs(feats, boxes, mask)), model.encode_texts(texts))
    for q, result in enumerate(idx.search_images(xmatch.RegionInputs(feats, boxes, mask), k=3, exact=True)):
        assert [h.row for h in result.hits] == expected[q].topk(3).indices.tolist()
        assert [h.text for h in result.hits] == [texts[h.row] for h in result.hits]


def test_empty_index_and_k_out_of_range(tmp_path, index, model):
    empty = xmatch.index.create(tmp_path / "empty", model)
    with pytest.raises(EmptyIndexError, match="is empty; add items first"):
        empty.search_texts(TEXTS, k=1)
    assert len(index.search_texts(TEXTS, k=41)[0].hits) == 40  # past the corpus: all of it
    with pytest.raises(SearchIndexError, match="already holds an index"):
        xmatch.index.create(index.root, model)
    with pytest.raises(FileNotFoundError, match="no search index at"):
        xmatch.index.open(tmp_path / "nowhere", model)


def test_damaged_files_are_named(index, model):
    shard = index.root / "shards" / "00000001.safetensors"
    data = bytearray(shard.read_bytes())
    data[-10] ^= 0xFF  # same size, altered content: found by the checksum
    shard.write_bytes(bytes(data))
    with pytest.raises(DamagedIndexError, match="00000001.safetensors has another sha256"):
        xmatch.index.open(index.root, model).verify()
    shard.write_bytes(bytes(data[:-100]))  # truncated: found on opening
    with pytest.raises(DamagedIndexError, match=r"00000001.safetensors has \d+ bytes where the manifest records"):
        xmatch.index.open(index.root, model)
    shard.unlink()
    with pytest.raises(DamagedIndexError, match="00000001.safetensors is missing"):
        xmatch.index.open(index.root, model)
    (index.root / "index.json").write_text("{not json")
    with pytest.raises(DamagedIndexError, match="index.json is unreadable"):
        xmatch.index.open(index.root, model)


def test_a_damaged_stage1_file_is_named(index, model):
    index.search_texts(TEXTS[:1], k=2, stage1="pooled")  # writes ann/mean.faiss
    (index.root / "ann" / "mean.faiss").write_bytes(b"garbage")
    with pytest.raises(DamagedIndexError, match="mean.faiss is unreadable .* rebuilt from the shards"):
        xmatch.index.open(index.root, model).search_texts(TEXTS[:1], k=2, stage1="pooled")


# --- Qdrant ---------------------------------------------------------------------------------------


def test_qdrant_edge_returns_the_same_exact_top_k(tmp_path, index, model):
    """The embedded Qdrant engine (a Qdrant Edge shard inside the index, exact MaxSim scan)
    proves the same top-k as the FAISS engine's exhaustive search; more in test_qdrant_edge.py."""
    pytest.importorskip("qdrant_edge")
    from xmatch.index.build import copy_index

    target = xmatch.index.create(tmp_path / "q", model, engine="qdrant", dtype="float32")
    assert copy_index(index, target, progress=False) == 40
    target.close()
    with xmatch.index.open(tmp_path / "q", model) as q:
        assert q.engine == "qdrant" and len(q) == 40 and q.ids == index.ids
        for a, b in zip(q.search_texts(TEXTS, k=5, candidates=8), index.search_texts(TEXTS, k=5, exact=True)):
            assert a.ids == b.ids and a.exact and a.stage1 == "maxsim" and a.scored == 8
            assert [h.score for h in a.hits] == pytest.approx([h.score for h in b.hits], abs=1e-5)
        q.verify()


# --- command line ---------------------------------------------------------------------------------


def test_cli_index_search_and_append(tmp_path, capsys, model):
    pytest.importorskip("sklearn")
    from xmatch.cli.main import main

    bundle = tmp_path / "tiny-model"
    spec = scoring_model("MrSw", 256)
    xmatch.save_pretrained(spec, bundle)
    data = ["--dataset", "scenes", "--data", str(tmp_path / "scenes"), "--data-option", "size=tiny",
            "--data-option", "backbone=test_efficientnet", "--data-option", "weights=random",
            "--data-option", "generate=true"]
    out = tmp_path / "idx"
    assert main(["index", f"local-dir:{bundle}", *data, "--out", str(out), "--no-progress", "--shard-size", "1"]) == 0
    assert "indexed 2 images" in capsys.readouterr().out
    assert main(["search", str(out), "--text", "a red circle", "--text", "a blue seven", "-k", "2", "--json"]) == 0
    results = json.loads(capsys.readouterr().out)
    assert [r["query"] for r in results] == ["a red circle", "a blue seven"]
    assert all(len(r["hits"]) == 2 and r["exact"] for r in results)
    assert main(["index", *data, "--out", str(out), "--append", "--no-progress"]) == 0  # resumes: nothing new
    assert "indexed 0 images" in capsys.readouterr().out
    assert main(["index", f"local-dir:{bundle}", *data, "--out", str(out)]) == 2
    assert "already holds an index; add --append" in capsys.readouterr().err
    assert main(["search", str(out), "--text", "a red circle", "-k", "3", "--json"]) == 0  # past the index: all of it
    assert len(json.loads(capsys.readouterr().out)[0]["hits"]) == 2
    assert main(["search", str(out), "--image", str(tmp_path / "x.png")]) == 2
    assert "reads precomputed region features" in capsys.readouterr().err


@pytest.mark.slow
def test_the_readme_commands_on_the_scenes_test_split(tmp_path, capsys):
    """What a newcomer runs after `xmatch demo` (generates the small scenes set if needed); the
    shipped model's proven two-stage top-10 of every test caption is the exhaustive one."""
    from xmatch.cli.main import main
    from xmatch.demo.run import prepare_scenes

    out = tmp_path / "idx"
    assert main(["index", "teran-mrsw-scenes", "--dataset", "scenes", "--split", "test", "--out", str(out),
                 "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["search", str(out), "--text", "a large red circle left of a small blue seven", "-k", "5"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("\n") >= 6 and "items scored exactly" in printed
    index = xmatch.index.open(out)
    texts = list(prepare_scenes("test", progress=False).captions)
    exhaustive = index.search_texts(texts, k=10, exact=True)
    two_stage = index.search_texts(texts, k=10, candidates=10)
    assert [r.ids for r in two_stage] == [r.ids for r in exhaustive] and all(r.exact for r in two_stage)
    assert sum(r.scored for r in two_stage) < 0.5 * len(texts) * len(index)
