"""Two-stage search on a synthetic corpus with planted near-duplicates (docs/search.md).

Builds (or reuses) an index of ``--images`` synthetic images (36 regions of 256-d each,
:class:`xmatch.index.synthetic.PlantedCorpus`) and three query sets: **planted** (word sets made
from a planted group's base image: the group is the exact top-10, far ahead of rank 11),
**hard** (word sets of random concepts, drawn with the corpus's popularity, that no group
answers: the exact ranks 10 and 11 differ by a fraction of a percent) and **rare** (concepts
drawn uniformly, mostly rare ones: the ranking is decided by unrelated regions that happen to
lie near a word). For each set it computes
the exhaustive top-10 (the reference), then measures for each ``effort`` and each expert
setting (``candidates`` x ``nprobe``): recall@1 and recall@10 against the exhaustive ranking,
the work of stages 1 and 2 as a share of scoring every item (``SearchResult.work``: one unit per
similarity a stage computes or looks up), the share of items scored exactly, and single-query
latency p50 / p95 (each query's minimum over ``--repeats`` runs) without encoding, and with
the time teran-mrsw-scenes takes to encode a scenes caption added per query (the synthetic
queries are token sets; that model's tokens are 256-d too). Also the build time and bytes per
image on disk and in memory. The machine load is printed.

    python benchmarks/search_synthetic.py --images 100000              # the docs' main tables
    python benchmarks/search_synthetic.py --images 20000 --compare      # poolers x generators
    python benchmarks/search_synthetic.py --stage1-at 1000000 --nprobe 8 16   # stage-1 time at 1M images

Run with OMP_NUM_THREADS set to the cores you mean to use.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

import torch

import xmatch.index
from xmatch.index.synthetic import PlantedCorpus, scoring_model

RESIDENT = """
import sys, xmatch.index
from xmatch.index.synthetic import PlantedCorpus, scoring_model
def rss():
    status = open("/proc/self/status").read().splitlines()
    return [next(int(l.split()[1]) * 1024 for l in status if l.startswith(key)) for key in ("RssAnon:", "RssFile:")]
model = scoring_model("MrSw")
queries, _ = PlantedCorpus(images=int(sys.argv[2]), groups=min(200, int(sys.argv[2]) // 20)).queries(20)
before = rss()
index = xmatch.index.open(sys.argv[1], model, in_memory=sys.argv[3] == "1")
for q in range(len(queries)):  # one query at a time, as a search service answers them
    index.search(queries[q : q + 1], 10)
print(*(after - start for after, start in zip(rss(), before)))
"""


def resident_bytes(root: Path, images: int, in_memory: bool) -> tuple[int, int]:
    """Memory an opened index adds to a fresh process after 20 single queries: (anonymous,
    file pages mapped)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", RESIDENT, str(root), str(images), "1" if in_memory else "0"],
                         check=True, capture_output=True, text=True).stdout
    anonymous, mapped = out.split()[-2:]
    return int(anonymous), int(mapped)


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def load() -> str:
    return "load average %.2f %.2f %.2f on %d CPUs" % (*os.getloadavg(), os.cpu_count())


def build(corpus: PlantedCorpus, root: Path, pooler: str) -> dict:
    """Write the shards, then the stage-1 structure; returns the timings (reuses a complete index)."""
    record = root / "bench.json"
    if record.is_file() and json.loads(record.read_text())["corpus"] == repr(corpus):
        return json.loads(record.read_text())
    shutil.rmtree(root, ignore_errors=True)
    index = xmatch.index.create(root, scoring_model(pooler))
    start = time.perf_counter()
    for ids, e in corpus.batches(1024):
        index.add(e, ids)
    shards_s = time.perf_counter() - start
    start = time.perf_counter()
    index.progress = True
    index.prepare()
    info = {"corpus": repr(corpus), "shards_s": shards_s, "stage1_s": time.perf_counter() - start}
    record.write_text(json.dumps(info))
    return info



def reference(index, queries, root: Path, name: str) -> tuple[list[list[str]], float, float]:
    """The exhaustive top-10 of every query (cached), its time per query, and the mean relative
    gap between the exact scores of ranks 10 and 11."""
    path = root / f"exact-{name}.json"
    if path.is_file() and "gap" in (doc := json.loads(path.read_text())):
        return doc["ids"], doc["seconds_per_query"], doc["gap"]
    start = time.perf_counter()
    results = index.search(queries, 11, exact=True)
    seconds = (time.perf_counter() - start) / len(queries)
    gap = sum((r.hits[9].score - r.hits[10].score) / abs(r.hits[9].score) for r in results) / len(results)
    doc = {"ids": [r.ids[:10] for r in results], "seconds_per_query": seconds, "gap": gap}
    path.write_text(json.dumps(doc))
    return doc["ids"], doc["seconds_per_query"], doc["gap"]


def encode_times(n: int, repeats: int) -> list[float]:
    """Seconds teran-mrsw-scenes takes to encode each of ``n`` scenes test captions, one at a
    time (each caption's minimum over ``repeats`` runs)."""
    from xmatch.demo.run import prepare_scenes

    model = xmatch.build("teran-mrsw-scenes", pretrained=True).eval()
    captions = list(prepare_scenes("test", progress=False).captions)[:n]
    captions = (captions * (n // len(captions) + 1))[:n]
    best = [float("inf")] * n
    with torch.inference_mode():
        for _ in range(repeats):
            for q, caption in enumerate(captions):
                start = time.perf_counter()
                model.encode_texts([caption])
                best[q] = min(best[q], time.perf_counter() - start)
    return best


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def measure(index, queries, exact: list[list[str]], repeats: int, encode: list[float], **options) -> dict:
    single = [float("inf")] * len(queries)
    for _ in range(repeats):
        for q in range(len(queries)):
            start = time.perf_counter()
            index.search(queries[q : q + 1], 10, **options)
            single[q] = min(single[q], time.perf_counter() - start)
    results = index.search(queries, 10, **options)
    recall = sum(len(set(r.ids) & set(e)) for r, e in zip(results, exact)) / (10 * len(queries))
    with_encoding = [s + e for s, e in zip(single, encode)]
    return {
        "recall@1": sum(r.ids[0] == e[0] for r, e in zip(results, exact)) / len(queries),
        "recall@10": recall,
        "work": sum(r.work_share for r in results) / len(results),
        "scored": sum(r.scored for r in results) / len(results) / len(index),
        "p50_ms": 1000 * percentile(single, 0.5),
        "p95_ms": 1000 * percentile(single, 0.95),
        "p50_enc_ms": 1000 * percentile(with_encoding, 0.5),
        "p95_enc_ms": 1000 * percentile(with_encoding, 0.95),
    }


def settings(args: argparse.Namespace) -> list[tuple[str, dict]]:
    """The searches measured: each effort, then each expert (candidates, nprobe) pair."""
    rows = [(f"effort {e:g}" + (" (default)" if e == 1 else ""), {} if e == 1 else {"effort": e}) for e in args.effort]
    return rows + [(f"candidates {c}, nprobe {p}", {"candidates": c, "nprobe": p})
                   for c in args.candidates for p in args.nprobe]


def main_table(args: argparse.Namespace) -> None:
    corpus = PlantedCorpus(images=args.images, groups=min(200, args.images // 20))
    root = args.out / f"synthetic-{args.images}"
    print(f"# {args.images} synthetic images x 36 regions x 256-d; {load()}")
    timings = build(corpus, root, "MrSw")
    disk = {part: folder_bytes(root / part) for part in ("shards", "ann")}
    resident = {mode: resident_bytes(root, args.images, mode) for mode in (True, False)}
    index = xmatch.index.open(root, scoring_model("MrSw"), in_memory=args.in_memory)
    planted_queries, planted = corpus.queries(args.queries)
    sets = {"planted": planted_queries, "hard": corpus.random_queries(args.queries),
            "rare": corpus.random_queries(args.queries, seed=13, popular=False)}
    index.search(planted_queries[:2], 10)  # loads the stage-1 structure
    encode = encode_times(args.queries, args.repeats)
    print(f"build: shards {timings['shards_s']:.1f} s, stage-1 {timings['stage1_s']:.1f} s; "
          f"disk per image: shards {disk['shards'] / args.images:.0f} B, stage-1 {disk['ann'] / args.images:.0f} B; "
          f"memory after opening and 20 single queries: {resident[True][0] / args.images:.0f} B per image with the "
          f"shards read in; memory-mapped: {resident[False][0] / args.images:.0f} B per image in the process "
          f"+ {resident[False][1] / args.images:.0f} B of mapped file pages")
    print(f"encoding a scenes caption (teran-mrsw-scenes): p50 {1000 * percentile(encode, 0.5):.1f} ms, "
          f"p95 {1000 * percentile(encode, 0.95):.1f} ms")
    for kind, queries in sets.items():
        exact, exact_s, gap = reference(index, queries, root, "MrSw" if kind == "planted" else f"MrSw-{kind}")
        print(f"\n## {kind} queries ({len(queries)}): exhaustive MrSw {1000 * exact_s:.0f} ms per query (batched); "
              f"exact score gap between ranks 10 and 11: {100 * gap:.2f} % on average", end="")
        if kind == "planted":
            found = sum(len(set(e) & {str(i) for i in p.tolist()}) for e, p in zip(exact, planted)) / (10 * len(exact))
            print(f"; planted near-duplicates in the exact top-10: {found:.3f}", end="")
        print(f"; {load()}\n")
        print("| search | recall@1 | recall@10 | work | scored | p50 ms | p95 ms | p50 ms with encoding | p95 ms with encoding |")
        print("|---|---|---|---|---|---|---|---|---|")
        for name, options in settings(args):
            m = measure(index, queries, exact, args.repeats, encode, **options)
            print(f"| {name} | {m['recall@1']:.2f} | {m['recall@10']:.3f} | {100 * m['work']:.2f} % | "
                  f"{100 * m['scored']:.2f} % | {m['p50_ms']:.1f} | {m['p95_ms']:.1f} | {m['p50_enc_ms']:.1f} | "
                  f"{m['p95_enc_ms']:.1f} |", flush=True)
    print(f"\n# {load()}")


def compare(args: argparse.Namespace) -> None:
    """Every TERAN pooler with every stage-1 generator at the defaults (effort 1: the token
    generator widens, the others score 100 candidates), on the planted and the hard queries of
    one corpus (an exhaustive reference per pooler)."""
    corpus = PlantedCorpus(images=args.images, groups=min(200, args.images // 20))
    root = args.out / f"synthetic-{args.images}"
    print(f"# {args.images} synthetic images; {load()}")
    build(corpus, root, "MrSw")
    sets = {"planted": corpus.queries(args.queries)[0], "hard": corpus.random_queries(args.queries)}
    no_encoding = [0.0] * args.queries
    print("| pooler | stage 1 | queries | recall@10 | work | scored | p50 ms |")
    print("|---|---|---|---|---|---|---|")
    for pooler in ("MrSw", "MwSr", "Symm", "MrAvgw"):
        model = scoring_model(pooler)  # the same weights: the index serves every pooler
        index = xmatch.index.open(root, model, in_memory=args.in_memory)
        for kind, queries in sets.items():
            exact, _, _ = reference(index, queries, root, pooler if kind == "planted" else f"{pooler}-{kind}")
            for stage1 in ("tokens", "fde", "pooled"):
                m = measure(index, queries, exact, args.repeats, no_encoding, stage1=stage1)
                print(f"| {pooler} | {stage1} | {kind} | {m['recall@10']:.3f} | {100 * m['work']:.2f} % | "
                      f"{100 * m['scored']:.2f} % | {m['p50_ms']:.1f} |", flush=True)
    print(f"# {load()}")


class _CorpusShape:
    """What the token generator reads of a store: its size and the tokens per item."""

    def __init__(self, images: int, regions: int) -> None:
        self.images, self.regions = images, regions

    def __len__(self) -> int:
        return self.images

    def lengths(self) -> torch.Tensor:
        return torch.full((self.images,), self.regions)


def stage1_at(args: argparse.Namespace) -> None:
    """Stage-1 cost at a corpus size past what is indexed here: centroid lists of the size a
    corpus of ``--stage1-at`` images would have (random list assignment, so recall is not
    measured, only time and memory); stage 2 does not depend on the corpus size."""
    from xmatch.index.candidates import TokenGenerator
    from xmatch.index.centroids import CentroidLists, list_count
    from xmatch.index.interaction import Interaction

    n, regions, dim = args.stage1_at, 36, 256
    tokens = n * regions
    count = list_count(tokens)
    g = torch.Generator().manual_seed(0)
    centroids = torch.nn.functional.normalize(torch.randn(count, dim, generator=g), dim=-1).numpy()
    codes = torch.randint(0, count, (tokens,), generator=g, dtype=torch.int32).numpy()
    owners = torch.arange(n).repeat_interleave(regions).numpy()
    generator = TokenGenerator(_CorpusShape(n, regions), args.out, Interaction(True, False), "images", writable=False)
    generator.lists, generator.covered = CentroidLists(centroids, codes, owners), n
    queries, _ = PlantedCorpus(images=1000, groups=50).queries(args.queries)
    generator.propose(queries[:1], 100)  # builds the list offsets
    order, offsets, sorted_owners = generator.lists.csr()
    held = sum(t.numel() * t.element_size() for t in (order, offsets, sorted_owners)) + codes.nbytes + owners.nbytes
    for nprobe in args.nprobe:
        generator.nprobe = nprobe
        single = []
        for q in range(len(queries)):
            start = time.perf_counter()
            generator.propose(queries[q : q + 1], 100)
            single.append(time.perf_counter() - start)
        single.sort()
        print(f"stage 1 at {n} images ({tokens} tokens, {count} centroid lists, nprobe {nprobe}): "
              f"p50 {1000 * single[len(single) // 2]:.1f} ms, p95 {1000 * single[int(0.95 * len(single))]:.1f} ms per "
              f"query; lists in memory {held / n:.0f} B per image; {load()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--effort", type=float, nargs="+", default=[0.5, 1.0, 2.0], help="efforts measured")
    parser.add_argument("--candidates", type=int, nargs="+", default=[100, 500],
                        help="expert settings measured: candidates x nprobe")
    parser.add_argument("--nprobe", type=int, nargs="+", default=[8, 16, 32])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--in-memory", action=argparse.BooleanOptionalAction, default=True,
                        help="read the shards into memory (default) or map them")
    parser.add_argument("--compare", action="store_true", help="poolers x stage-1 generators instead")
    parser.add_argument("--stage1-at", type=int, metavar="IMAGES", help="time stage 1 alone at this corpus size")
    parser.add_argument("--out", type=Path, default=Path("/tmp/xmatch-search-bench"))
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    (stage1_at if args.stage1_at else compare if args.compare else main_table)(args)


if __name__ == "__main__":
    main()
