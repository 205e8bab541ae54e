"""Qdrant Edge's multi-vector stage 1 against the FAISS centroid lists, on the synthetic corpus (docs/search.md).

Builds (or reuses) two indexes of the same ``--images`` synthetic images (36 regions of 256-d,
:class:`xmatch.index.synthetic.PlantedCorpus`, float16): one on the FAISS engine, one on the
embedded Qdrant engine (a Qdrant Edge shard, searched by an exact MaxSim scan). A copy of the
Edge shard is then optimized by Edge itself (``EdgeShard.optimize()``: Qdrant's HNSW graph over
the multi-vectors, which xmatch never builds) and queried directly at several ``hnsw_ef``.

Two query sets of ``--queries`` each: *planted* (word sets drawn from a planted group's image,
so the exact top-10 stands far above the rest) and *hard* (word sets of random concepts, which
no group answers: tiny score gaps around rank 10). The reference is the exhaustive MrSw top-10.
For each stage 1: recall@10 of the final top-10 (stage 2 scores the candidates exactly, so for
Edge that is the share of the exact top-10 among its ``--candidates`` candidates), single-query
latency p50 (each query's minimum over ``--repeats`` runs; stage 1 and 2, encoding excluded),
build time and size on disk (allocated blocks, and the files' apparent size where it differs:
Edge preallocates a sparse 32 MB write-ahead log file). The machine load is printed.

    OMP_NUM_THREADS=1 python benchmarks/search_qdrant_edge.py --images 10000
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import time
from pathlib import Path

import torch

import xmatch.index
from xmatch.index.synthetic import PlantedCorpus, scoring_model
from xmatch.model.embeddings import Embeddings


def load() -> str:
    return "load average %.2f %.2f %.2f on %d CPUs" % (*os.getloadavg(), os.cpu_count())


def disk(path: Path) -> tuple[int, int]:
    """(allocated, apparent) bytes of every file under ``path``."""
    files = [p.stat() for p in path.rglob("*") if p.is_file() and not p.is_symlink()]
    return sum(s.st_blocks * 512 for s in files), sum(s.st_size for s in files)



def build(corpus: PlantedCorpus, root: Path, engine: str) -> float:
    """The index of ``corpus`` on ``engine`` (reused when complete); returns its build time (s)."""
    done = root / "built.txt"
    if done.is_file() and done.read_text().startswith(repr(corpus)):
        return float(done.read_text().split("\n")[1])
    shutil.rmtree(root, ignore_errors=True)
    start = time.perf_counter()
    with xmatch.index.create(root, scoring_model("MrSw"), engine=engine) as index:
        for ids, e in corpus.batches(1024):
            index.add(e, ids)
        index.prepare()
    seconds = time.perf_counter() - start
    done.write_text(f"{repr(corpus)}\n{seconds}")
    return seconds


def recall(found: list[list[str]], exact: list[list[str]]) -> float:
    return sum(len(set(f[:10]) & set(e)) for f, e in zip(found, exact)) / (10 * len(exact))


def timed(run, n: int, repeats: int) -> tuple[list, float]:
    """``run(q)`` for every query, each timed as its minimum over ``repeats``; (answers, p50 ms)."""
    answers, best = [None] * n, [float("inf")] * n
    for _ in range(repeats):
        for q in range(n):
            start = time.perf_counter()
            answers[q] = run(q)
            best[q] = min(best[q], time.perf_counter() - start)
    return answers, 1000 * statistics.median(best)


def searched(index, queries: Embeddings, repeats: int, **options) -> tuple[list[list[str]], float, float]:
    """Single-query searches: (top-10 ids, p50 ms of the whole search, p50 ms of stage 1 alone)."""
    results, p50 = timed(lambda q: index.search(queries[q : q + 1], 10, **options)[0], len(queries), repeats)
    return [r.ids for r in results], p50, statistics.median(r.timings["stage1"] for r in results)


def hnsw_copy(edge_folder: Path, scratch: Path) -> tuple[object, float]:
    """A copy of the Edge shard with Edge's HNSW graph built over its multi-vectors; (shard, seconds)."""
    import qdrant_edge as qe

    shutil.rmtree(scratch, ignore_errors=True)
    shutil.copytree(edge_folder, scratch)
    shard = qe.EdgeShard.load(str(scratch))
    start = time.perf_counter()
    shard.optimize()
    return shard, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=10_000)
    parser.add_argument("--queries", type=int, default=50)
    parser.add_argument("--candidates", type=int, default=100)
    parser.add_argument("--ef", type=int, nargs="+", default=[100, 400])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("/tmp/xmatch-qdrant-bench"))
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    import qdrant_edge as qe

    corpus = PlantedCorpus(images=args.images, groups=min(200, args.images // 20))
    print(f"# {args.images} synthetic images x 36 regions x 256-d (float16), {args.queries} queries per set, "
          f"{args.candidates} candidates; torch threads {torch.get_num_threads()}; {load()}")
    roots = {"faiss": args.out / f"faiss-{args.images}", "qdrant": args.out / f"edge-{args.images}"}
    built = {engine: build(corpus, root, engine) for engine, root in roots.items()}
    model = scoring_model("MrSw")
    faiss, edge = (xmatch.index.open(roots[e], model) for e in ("faiss", "qdrant"))
    sets = {"planted": corpus.queries(args.queries)[0], "hard": corpus.random_queries(args.queries)}
    exact = {name: [r.ids for r in faiss.search(q, 10, exact=True)] for name, q in sets.items()}
    print("| queries | stage 1 | recall@10 | p50 ms, search | p50 ms, stage 1 |")
    print("|---|---|---|---|---|", flush=True)

    def row(name: str, label: str, r: float, p50: float | None, stage1_p50: float) -> None:
        print(f"| {name} | {label} | {r:.3f} | {'-' if p50 is None else f'{p50:.1f}'} | {stage1_p50:.1f} |", flush=True)

    for name, queries in sets.items():
        for label, index, options in (
            ("FAISS centroid lists, defaults", faiss, {}),
            (f"FAISS centroid lists, {args.candidates} candidates, nprobe 8", faiss,
             {"candidates": args.candidates, "nprobe": 8}),
            ("Qdrant Edge exact MaxSim scan (xmatch)", edge, {"candidates": args.candidates}),
        ):
            found, p50, stage1_p50 = searched(index, queries, args.repeats, **options)
            row(name, label, recall(found, exact[name]), p50, stage1_p50)
    info = edge.store.engine.shard.info()
    print(f"xmatch's Edge shard: {info.segments_count} segment(s), {info.points_count} points, "
          f"{info.indexed_vectors_count} vectors in an HNSW graph", flush=True)
    edge.close()  # releases the shard's lock; the HNSW copy is another folder
    shard, optimize_s = hnsw_copy(roots["qdrant"] / "qdrant", args.out / f"edge-hnsw-{args.images}")
    for ef in args.ef:
        params = qe.SearchParams(hnsw_ef=ef)
        for name, queries in sets.items():
            def stage1(q: int, queries: Embeddings = queries) -> list[str]:
                found = shard.query(qe.QueryRequest(limit=args.candidates, params=params, query=qe.Query.Nearest(
                    queries.tokens[q].tolist(), using="tokens")))
                return [str(p.id) for p in found]  # MaxSim is MrSw: the candidates' exact order is the HNSW order

            found, p50 = timed(stage1, len(queries), args.repeats)
            row(name, f"Qdrant Edge HNSW (optimize()), hnsw_ef {ef}", recall(found, exact[name]), None, p50)
    sizes = {"FAISS (shards + ann)": disk(roots["faiss"] / "shards")[0] + disk(roots["faiss"] / "ann")[0],
             "Qdrant Edge, plain segments": disk(roots["qdrant"] / "qdrant"),
             "Qdrant Edge, HNSW": disk(args.out / f"edge-hnsw-{args.images}")}
    shard.close()
    print(f"build: FAISS {built['faiss']:.0f} s (shards + centroid lists), Qdrant Edge {built['qdrant']:.0f} s "
          f"(upserts), Edge optimize() (HNSW) {optimize_s:.0f} s more")
    for label, size in sizes.items():
        allocated, apparent = size if isinstance(size, tuple) else (size, size)
        print(f"disk, {label}: {allocated / args.images:.0f} B per image allocated"
              + (f" ({apparent / args.images:.0f} B apparent)" if apparent != allocated else ""))
    print(f"# {load()}")


if __name__ == "__main__":
    main()
