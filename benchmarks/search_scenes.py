"""Two-stage search with the shipped scenes models on the built-in scenes benchmark (docs/search.md).

For each model and split: index the split's images (build time, bytes per image), query with
the test captions (held out: never indexed, never trained on), and compare the two-stage top-10
with the exhaustive top-10 (recall@10, the work of stages 1 and 2 as a share of scoring every
item, the share of items scored exactly, the share of queries proven exact), with the
text-query latency p50 / p95 (encoding included; each query's minimum over ``--repeats`` runs)
and the batched queries per second. Also: the TERAN index searched with the other TERAN
poolers, the TERN -> TERAN cascade, and (``--float16``) how often the float16 storage reorders
a query's exhaustive top-10 against float32 (``model.similarity``). The machine load is printed.

    python benchmarks/search_scenes.py                 # test (100 images) and train (800 images) splits
    python benchmarks/search_scenes.py --splits test --float16 --repeats 1
    python benchmarks/search_scenes.py --size large --splits train --queries 500   # 20,000 images (generates the preset)

The scenes data are generated into the cache on first use (as `xmatch demo` does).
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from pathlib import Path

import torch

import xmatch
import xmatch.index
from xmatch.demo.run import prepare_scenes
from xmatch.index.build import index_dataset


def load() -> str:
    return "load average %.2f %.2f %.2f on %d CPUs" % (*os.getloadavg(), os.cpu_count())


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and "model" not in p.parts)


def built(name: str, split: str, root: Path, size: str = "small", dtype: str = "float16") -> tuple[Path, float]:
    out = root / f"{name}-{size}-{split}-{dtype}"
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    model = xmatch.build(name, pretrained=True)
    index = xmatch.index.create(out, model, model_ref=name, dtype=dtype)
    index_dataset(index, prepare_scenes(split, size, progress=False), progress=False)
    index.prepare()
    return out, time.perf_counter() - start


def float16_reorders(split: str, root: Path, texts: list[str], size: str) -> None:
    """The exhaustive top-10 of each caption from the default float16 index against a float32
    one (whose scores are ``model.similarity``'s): queries whose order or set changes, and the
    largest score difference."""
    name = "teran-mrsw-scenes"
    tops = {}
    for dtype in ("float16", "float32"):
        path, _ = built(name, split, root, size, dtype)
        tops[dtype] = xmatch.index.open(path, in_memory=True).search_texts(texts, k=10, exact=True)
    pairs = list(zip(tops["float16"], tops["float32"]))
    order = sum(a.ids != b.ids for a, b in pairs)
    members = sum(set(a.ids) != set(b.ids) for a, b in pairs)
    diff = max(abs(x.score - y.score) for a, b in pairs for x, y in zip(a.hits, b.hits))
    print(f"float16 against float32 storage, {name}, {split} split, {len(texts)} captions: top-10 order differs "
          f"for {order} ({100 * order / len(pairs):.1f} %), top-10 set for {members} ({100 * members / len(pairs):.1f} %); "
          f"largest score difference among the top-10 {diff:.2e}; {load()}")


def measure(searcher, texts: list[str], reference: list[list[str]], repeats: int, **options) -> dict:
    batched, single = float("inf"), [float("inf")] * len(texts)
    for _ in range(repeats):
        start = time.perf_counter()
        results = searcher.search_texts(texts, k=10, **options)
        batched = min(batched, time.perf_counter() - start)
        for q, text in enumerate(texts[:100]):  # latency over the first 100 captions
            start = time.perf_counter()
            searcher.search_texts([text], k=10, **options)
            single[q] = min(single[q], time.perf_counter() - start)
    lat = sorted(single[:100])
    return {
        "recall": sum(len(set(r.ids) & set(e)) for r, e in zip(results, reference)) / (10 * len(texts)),
        "work": None if any(r.work is None for r in results) else sum(r.work_share for r in results) / len(results),
        "scored": sum(r.scored / r.total for r in results) / len(results),
        "proven": sum(r.exact for r in results) / len(results),
        "p50": 1000 * lat[len(lat) // 2], "p95": 1000 * lat[int(0.95 * len(lat))], "qps": len(texts) / batched,
    }


def row(label: str, m: dict) -> str:
    work = "-" if m["work"] is None else f"{100 * m['work']:.1f} %"
    return (f"| {label} | {m['recall']:.3f} | {work} | {100 * m['scored']:.1f} % | {100 * m['proven']:.0f} % | "
            f"{m['p50']:.1f} | {m['p95']:.1f} | {m['qps']:.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--splits", nargs="+", default=["test", "train"])
    parser.add_argument("--size", default="small", help="scenes preset: small (1,000 images) or large (22,000)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--queries", type=int, help="N test captions, evenly spaced over the split (default: all)")
    parser.add_argument("--float16", action="store_true", help="also compare float16 with float32 storage")
    parser.add_argument("--out", type=Path, default=Path("/tmp/xmatch-search-bench"))
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    texts = list(prepare_scenes("test", args.size, progress=False).captions)
    if args.queries is not None and args.queries < len(texts):  # spread over the images, not the first few
        texts = [texts[k * len(texts) // args.queries] for k in range(args.queries)]
    print(f"# scenes {args.size} preset; queries: the {len(texts)} test captions; {load()}")
    if args.float16:
        for split in args.splits:
            float16_reorders(split, args.out, texts, args.size)
    print("| index / search | recall@10 | work | scored | proven exact | p50 ms | p95 ms | queries/s |")
    print("|---|---|---|---|---|---|---|---|")
    for split in args.splits:
        paths = {}
        for name in ("teran-mrsw-scenes", "tern-scenes"):
            paths[name], seconds = built(name, split, args.out, args.size)
            index = xmatch.index.open(paths[name], in_memory=True)
            n = len(index)
            print(f"| **{name}, {split} split: {n} images; built in {seconds:.1f} s; "
                  f"{folder_bytes(paths[name]) / n:.0f} B per image on disk** | | | | | | | |")
            exact = [r.ids for r in index.search_texts(texts, k=10, exact=True)]
            print(row("exhaustive", measure(index, texts, exact, args.repeats, exact=True)))
            print(row("two-stage, default", measure(index, texts, exact, args.repeats)))
            print(row("two-stage, 10 candidates", measure(index, texts, exact, args.repeats, candidates=10)))
            if name == "teran-mrsw-scenes":
                for pooler in ("MwSr", "Symm", "MrAvgw"):
                    other = xmatch.index.open(paths[name], xmatch.build(name, pretrained=True, pooler={"name": pooler}),
                                              in_memory=True)
                    exact_p = [r.ids for r in other.search_texts(texts, k=10, exact=True)]
                    print(row(f"{pooler} pooler, 10 candidates", measure(other, texts, exact_p, args.repeats,
                                                                           candidates=10)))
        teran = xmatch.index.open(paths["teran-mrsw-scenes"], in_memory=True)
        cascade = xmatch.index.Cascade(xmatch.index.open(paths["tern-scenes"], in_memory=True), teran, shortlist=20)
        exact = [r.ids for r in teran.search_texts(texts, k=10, exact=True)]
        print(row(f"cascade tern -> teran ({split}), shortlist 20", measure(cascade, texts, exact, args.repeats)))
    print(f"# {load()}")


if __name__ == "__main__":
    main()
