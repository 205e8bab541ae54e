"""The embedded Qdrant engine against the real Qdrant Edge: exact MaxSim, crash safety, a safe index folder."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap

import pytest
import torch

import xmatch
import xmatch.index
from xmatch.index import DamagedIndexError, SearchIndexError
from xmatch.index.qdrant import QdrantGenerator
from xmatch.index.synthetic import scoring_model
from xmatch.model.embeddings import Embeddings

pytest.importorskip("qdrant_edge")

DIM = 16


def ragged(n: int, seed: int, longest: int = 7, pooled: bool = True) -> Embeddings:
    """``n`` token sets of 1 to ``longest`` unit tokens (padding past each length is garbage),
    with pooled vectors (the scoring model's images have them, its captions not)."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.nn.functional.normalize(torch.randn(n, longest, DIM, generator=g), dim=-1)
    mask = torch.arange(longest)[None] < torch.randint(1, longest + 1, (n,), generator=g)[:, None]
    tokens[~mask] = 5.0  # would win every maximum if padding were read
    vectors = torch.nn.functional.normalize(torch.randn(n, DIM, generator=g), dim=-1)
    return Embeddings(tokens, mask, vectors if pooled else None)


def edge_index(path, pooler: str = "MrSw", side: str = "images", n: int = 30, seed: int = 0, dtype: str = "float32"):
    index = xmatch.index.create(path, scoring_model(pooler, DIM), side=side, engine="qdrant", dtype=dtype)
    index.add(ragged(n, seed, pooled=side == "images"), ids=[f"item{i}" for i in range(n)])
    return index


def pooler_scores(index, queries: Embeddings) -> torch.Tensor:
    """``[Q, N]`` the pooler's scores of every stored item (stage 2's exact scores)."""
    from xmatch.index import rerank

    rows = torch.arange(len(index))
    return torch.stack([rerank.score_rows(index.model, index.side, index.store, rows, queries[q])
                        for q in range(len(queries))])


@pytest.mark.parametrize(("pooler", "side", "dtype"), [("MrSw", "images", "float32"), ("MwSr", "texts", "float32"),
                                                    ("MrSw", "images", "float16")],
                         ids=["captions-query-images-MrSw", "images-query-captions-MwSr", "float16-index"])
def test_edge_maxsim_is_the_poolers_score_exactly(tmp_path, pooler, side, dtype):
    """Qdrant's MaxSim sums over the query's tokens: MrSw for captions over images, MwSr for
    images over captions; ragged items and queries, every item compared. A float16 index too:
    a float16 Edge shard would round the query and miss by ~1e-4, so the shard keeps float32."""
    with edge_index(tmp_path / "idx", pooler, side, dtype=dtype) as index:
        queries = ragged(5, seed=1)
        generator = index.generator("maxsim")
        assert isinstance(generator, QdrantGenerator) and index.store.exhaustive
        proposed = generator.propose(queries, len(index))
        expected = pooler_scores(index, queries)
        for q in range(len(queries)):
            assert sorted(proposed.rows[q].tolist()) == list(range(len(index)))
            assert proposed.bounds[q] == pytest.approx(expected[q, proposed.rows[q]], abs=1e-5)
            assert proposed.bounds[q].tolist() == sorted(proposed.bounds[q].tolist(), reverse=True)
        for result, scores in zip(index.search(queries, 5), expected):
            assert result.exact and result.stage1 == "maxsim"
            assert [h.score for h in result.hits] == pytest.approx(scores.topk(5).values.tolist(), abs=1e-5)


def test_edge_never_builds_a_graph_and_pooled_stage1_works(tmp_path):
    with edge_index(tmp_path / "idx") as index:
        shard = index.store.engine.shard
        assert shard.info().indexed_vectors_count == 0  # plain segments: the MaxSim search is a scan
        queries = ragged(3, seed=2)
        by_pooled = index.search(queries, 4, stage1="pooled")
        exact = index.search(queries, 4, exact=True)
        assert all(a.stage1 == "pooled" for a in by_pooled)
        assert [a.ids for a in by_pooled if a.exact] == [b.ids for a, b in zip(by_pooled, exact) if a.exact]


def test_edge_index_reopens_after_close(tmp_path):
    index = edge_index(tmp_path / "idx")
    queries = ragged(3, seed=3)
    before = [r.ids for r in index.search(queries, 5)]
    index.close()
    with pytest.raises(SearchIndexError, match="was closed.*open the index again"):
        index.search(queries, 5)
    with xmatch.index.open(tmp_path / "idx", index.model) as again:
        assert len(again) == 30 and again.ids == [f"item{i}" for i in range(30)]
        assert [r.ids for r in again.search(queries, 5)] == before
        again.verify()
        assert json.loads((tmp_path / "idx" / "index.json").read_text())["engine"]["location"] == "qdrant"


def test_a_second_opener_is_told_the_shard_is_in_use(tmp_path):
    with edge_index(tmp_path / "idx") as index:
        with pytest.raises(SearchIndexError, match="open in another process.*close"):
            xmatch.index.open(tmp_path / "idx", index.model)


def test_a_copied_index_folder_is_independent(tmp_path):
    index = edge_index(tmp_path / "a")
    index.close()
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    with xmatch.index.open(tmp_path / "b", index.model) as copy:
        copy.add(ragged(4, seed=9), ids=[f"new{i}" for i in range(4)])
        assert len(copy) == 34
    with xmatch.index.open(tmp_path / "a", index.model) as original:
        assert len(original) == 30 and original.store.engine.count(10**6) == 30
        original.verify()
    shutil.rmtree(tmp_path / "a")
    with xmatch.index.open(tmp_path / "b", index.model) as copy:
        copy.verify()
        assert copy.search(ragged(4, seed=9)[:1], 1)[0].ids == ["new0"]


KILLED_APPEND = textwrap.dedent("""
    import os, signal, sys
    import xmatch.index, xmatch.index.qdrant as q
    sys.path.insert(0, sys.argv[2])
    from test_qdrant_edge import ragged
    from xmatch.index.synthetic import scoring_model
    q.UPSERT_BATCH = 4
    upsert, calls = q.EdgeShard.upsert, []
    def upsert_then_die(self, points):
        upsert(self, points)
        calls.append(len(points))
        if len(calls) == 3:  # 12 of the 20 points are in the shard's log, nothing committed
            os.kill(os.getpid(), signal.SIGKILL)
    q.EdgeShard.upsert = upsert_then_die
    index = xmatch.index.open(sys.argv[1], scoring_model("MrSw", 16))
    index.add(ragged(20, seed=5), ids=[f"doomed{i}" for i in range(20)])
""")


def test_kill_9_during_upserts_leaves_only_complete_appends(tmp_path):
    index = edge_index(tmp_path / "idx")
    index.close()
    child = subprocess.run([sys.executable, "-c", KILLED_APPEND, str(tmp_path / "idx"), os.path.dirname(__file__)],
                           capture_output=True, text=True, timeout=120)
    assert child.returncode == -signal.SIGKILL, child.stderr
    with xmatch.index.open(tmp_path / "idx", index.model) as again:
        assert len(again) == 30
        assert again.store.engine.count(10**6) == 42  # the killed append's points, invisible
        again.verify()
        queries = ragged(20, seed=5)[:4]  # the doomed items' own tokens would win if they were visible
        for result, exact in zip(again.search(queries, 5), again.search(queries, 5, exact=True)):
            assert result.ids == exact.ids and not any(i.startswith("doomed") for i in result.ids)
        again.add(ragged(6, seed=6), ids=[f"after{i}" for i in range(6)])
        assert len(again) == 36 and again.store.engine.count(10**6) == 36  # the leftovers are gone
        assert again.ids[30:] == [f"after{i}" for i in range(6)]
        again.verify()


class _Sentinel:
    """Unpickling this creates ``path``: proof that something in the index folder ran."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return open, (self.path, "w")


def plant_local_mode_folder(folder, sentinel) -> None:
    """A folder as qdrant-client's local mode writes it (meta.json, a SQLite table of pickled
    points), whose one point runs code when unpickled."""
    (folder / "collection" / "xmatch-old").mkdir(parents=True)
    (folder / "meta.json").write_text(json.dumps({"collections": {"xmatch-old": {"vectors": {}}}, "aliases": {}}))
    db = sqlite3.connect(folder / "collection" / "xmatch-old" / "storage.sqlite")
    db.execute("CREATE TABLE points (id TEXT PRIMARY KEY, point BLOB)")
    db.execute("INSERT INTO points VALUES (?, ?)", ("0", pickle.dumps(_Sentinel(str(sentinel)))))
    db.commit()
    db.close()


_UNPICKLED: list[str] = []
_WATCHING: list[bool] = []


def _audit(event: str, args: tuple) -> None:
    if _WATCHING and event == "pickle.find_class":
        _UNPICKLED.append(f"{args[0]}.{args[1]}")


@pytest.fixture()
def no_unpickling():
    """Records every class looked up by an unpickler while the test runs (an audit hook stays
    for the process: it only records while a test watches)."""
    if not getattr(sys, "_xmatch_pickle_audit", False):
        sys.addaudithook(_audit)
        sys._xmatch_pickle_audit = True
    _UNPICKLED.clear()
    _WATCHING.append(True)
    yield _UNPICKLED
    _WATCHING.clear()


def test_a_planted_pickle_in_the_index_folder_is_never_loaded(tmp_path, no_unpickling):
    index = edge_index(tmp_path / "idx")
    index.close()
    sentinel = tmp_path / "ran"
    plant_local_mode_folder(tmp_path / "idx" / "qdrant", sentinel)  # beside the Edge shard's own files
    with xmatch.index.open(tmp_path / "idx", index.model) as again:
        again.search(ragged(2, seed=1), 3)
        again.add(ragged(2, seed=2), ids=["x", "y"])
        again.verify()
    assert not sentinel.exists() and no_unpickling == []


def test_an_old_manifest_of_qdrant_client_local_mode_is_refused_unread(tmp_path, no_unpickling):
    index = edge_index(tmp_path / "idx")
    index.close()
    old = tmp_path / "old-storage"
    sentinel = tmp_path / "ran"
    plant_local_mode_folder(old, sentinel)
    manifest = json.loads((tmp_path / "idx" / "index.json").read_text())
    manifest["engine"] = {"name": "qdrant", "location": str(old), "collection": "xmatch-old", "pooled": True}
    (tmp_path / "idx" / "index.json").write_text(json.dumps(manifest))
    with pytest.raises(SearchIndexError, match=r"index.json.*absolute path.*pickle.*--from-index.*rebuild") as caught:
        xmatch.index.open(tmp_path / "idx", index.model)
    assert "the index manifest is damaged" not in str(caught.value)  # it is an old index, not a damaged one
    assert not sentinel.exists() and no_unpickling == []


@pytest.mark.parametrize("location", ["../elsewhere", "a/b", "shards", ".hidden"])
def test_a_manifest_location_outside_the_index_is_refused(tmp_path, location):
    index = edge_index(tmp_path / "idx")
    index.close()
    manifest = json.loads((tmp_path / "idx" / "index.json").read_text())
    manifest["engine"]["location"] = location
    (tmp_path / "idx" / "index.json").write_text(json.dumps(manifest))
    with pytest.raises(DamagedIndexError, match="not a folder name inside the index"):
        xmatch.index.open(tmp_path / "idx", index.model)


def test_a_shard_folder_linked_out_of_the_index_is_refused(tmp_path):
    index = edge_index(tmp_path / "idx")
    index.close()
    shutil.move(tmp_path / "idx" / "qdrant", tmp_path / "outside")
    (tmp_path / "idx" / "qdrant").symlink_to(tmp_path / "outside")
    with pytest.raises(DamagedIndexError, match="link out of the index"):
        xmatch.index.open(tmp_path / "idx", index.model)
    (tmp_path / "idx" / "qdrant").unlink()
    shutil.move(tmp_path / "outside", tmp_path / "idx" / "qdrant")
    segments = next((tmp_path / "idx" / "qdrant" / "segments").iterdir())
    (segments / "planted").symlink_to(tmp_path)
    with pytest.raises(DamagedIndexError, match="symbolic link inside the index's Qdrant shard"):
        xmatch.index.open(tmp_path / "idx", index.model)


def test_create_keeps_the_embedded_shard_inside_the_index(tmp_path):
    model = scoring_model("MrSw", DIM)
    for outside in (str(tmp_path / "elsewhere"), "../elsewhere"):
        with pytest.raises(ValueError, match="not a folder name inside the index|absolute path"):
            xmatch.index.create(tmp_path / f"idx{len(outside)}", model, engine="qdrant", qdrant=outside)
    with pytest.raises(ValueError, match="collection name .* applies to a Qdrant server"):
        xmatch.index.create(tmp_path / "idx-c", model, engine="qdrant", collection="mine")
    index = xmatch.index.create(tmp_path / "idx", model, engine="qdrant", qdrant=str(tmp_path / "idx" / "points"))
    assert index.manifest["engine"]["location"] == "points"
    index.close()


def test_a_dead_qdrant_url_names_the_url_and_the_fix(tmp_path):
    pytest.importorskip("qdrant_client")
    url = "http://127.0.0.1:9"  # the discard port: nothing listens
    index = xmatch.index.create(tmp_path / "idx", scoring_model("MrSw", DIM), engine="qdrant", qdrant=url)
    with pytest.raises(SearchIndexError, match=r"Qdrant server at http://127.0.0.1:9 .*start it"):
        index.add(ragged(2, seed=0), ids=["a", "b"])
    index.close()
    manifest = json.loads((tmp_path / "idx" / "index.json").read_text())
    manifest["items"] = 2  # as if the server had gone away after the index was filled
    (tmp_path / "idx" / "index.json").write_text(json.dumps(manifest))
    with pytest.raises(SearchIndexError, match=r"Qdrant server at http://127.0.0.1:9 does not answer"):
        xmatch.index.open(tmp_path / "idx", index.model)


class _Recorded:
    """A qdrant-client in-memory instance standing in for a server: it records each request
    (method, arguments) and outlives the index's close (which would drop its points)."""

    def __init__(self, client) -> None:
        self._client, self.requests = client, []

    def __getattr__(self, name: str):
        method = getattr(self._client, name)

        def recorded(*args, **kwargs):
            self.requests.append((name, args, kwargs))
            return method(*args, **kwargs)

        return recorded

    def close(self) -> None:
        pass


@pytest.mark.filterwarnings("ignore:Payload indexes have no effect")  # the stand-in's, not a server's
def test_the_server_path_makes_the_same_collection_and_gives_no_bounds(tmp_path, monkeypatch):
    """The requests of the server path, answered by qdrant-client's in-memory engine: the
    collection's settings, the committed-rows filter, candidates without bounds (a server
    searches an HNSW graph), stage 2 exact."""
    qdrant_client = pytest.importorskip("qdrant_client")
    server = _Recorded(qdrant_client.QdrantClient(location=":memory:"))
    asked = []
    monkeypatch.setattr(qdrant_client, "QdrantClient", lambda url, **options: asked.append(url) or server)
    url = "http://qdrant.test:6333"
    model = scoring_model("MrSw", DIM)
    with xmatch.index.create(tmp_path / "idx", model, engine="qdrant", qdrant=url, dtype="float32") as index:
        index.add(ragged(30, seed=0), ids=[f"item{i}" for i in range(30)])
    assert set(asked) == {url} and sorted(p.name for p in (tmp_path / "idx").iterdir()) == [".lock", "index.json", "model"]
    made = {name: (args, kwargs) for name, args, kwargs in server.requests}
    vectors = made["create_collection"][1]["vectors_config"]
    assert made["create_collection"][0] == ("xmatch-idx",) and set(vectors) == {"tokens", "pooled"}
    assert vectors["tokens"].multivector_config.comparator.value == "max_sim" and vectors["tokens"].distance.value == "Dot"
    assert made["create_payload_index"][0][1] == "row"
    with xmatch.index.open(tmp_path / "idx", model) as index:
        queries = ragged(3, seed=1)
        server.requests.clear()
        for result, exact in zip(index.search(queries, 5, candidates=30), index.search(queries, 5, exact=True)):
            assert not result.exact and result.stage1 == "maxsim" and result.ids == exact.ids
        batch = next(kwargs["requests"] for name, _, kwargs in server.requests if name == "query_batch_points")
        assert len(batch) == 3 and all(r.filter.must[0].key == "row" and r.filter.must[0].range.lt == 30 for r in batch)
        index.verify()


def test_edge_searches_report_their_work_like_the_faiss_scan(tmp_path):
    """The embedded engine scans every stored token: its work is counted as the FAISS engine's
    exact token scan is (query tokens x stored tokens, plus the items stage 2 scored)."""
    edge = edge_index(tmp_path / "edge")
    faiss_index = xmatch.index.create(tmp_path / "faiss", edge.model, dtype="float32")
    faiss_index.add(ragged(30, 0, pooled=True), ids=[f"item{i}" for i in range(30)])
    assert edge.store.lengths().tolist() == faiss_index.store.lengths().tolist()
    stored = int(edge.store.lengths().sum())
    queries = ragged(3, 7, pooled=False)
    for q, (e, f) in enumerate(zip(edge.search(queries, k=5), faiss_index.search(queries, k=5))):
        assert e.work_exhaustive == f.work_exhaustive == int(queries.lengths[q]) * stored
        assert e.ids == f.ids and (e.scored, e.work) == (f.scored, f.work) and e.work > e.work_exhaustive
    edge.close()
    reopened = xmatch.index.open(tmp_path / "edge", edge.model)
    assert reopened.store.lengths().tolist() == faiss_index.store.lengths().tolist()  # read back from the payload
    reopened.close()
