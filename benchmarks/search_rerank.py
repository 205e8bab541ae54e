"""The verifier as a third search stage on the scenes benchmark (docs/search.md, "Third stage").

Indexes the scenes test split (100 images) with a TERAN model that has a verifier head and
queries it with the 500 test captions: for each ``--rerank K`` (and without), the median time
per query of each stage (encode, stage 1, stage 2, verifier; the stages' own ``timings``) over
single-caption searches of the first 100 captions, the p50 / p95 of their total latency (each
caption's minimum over ``--repeats`` runs), and queries per second with all 500 in one call.

Without ``--model`` the model is ``teran-mrsw-scenes`` with an untrained ``cross-attention``
verifier of the default size: times do not depend on the verifier's weights. An index already at
``--out`` is searched as it is (with the model saved in it), so an index and ``--captions`` made
on one machine can be timed on another without the scenes data. The machine load is printed.

    OMP_NUM_THREADS=1 python benchmarks/search_rerank.py --rerank 10 20 50
    python benchmarks/search_rerank.py --out idx --captions captions.txt --device cuda   # idx made by a first run
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import time
from pathlib import Path

import torch

import xmatch
import xmatch.index
from xmatch.index.build import index_dataset

STAGES = ("encode", "stage1", "stage2", "verifier")


def load() -> str:
    return "load average %.2f %.2f %.2f on %d CPUs" % (*os.getloadavg(), os.cpu_count())


def verifier_model(name: str | None, device: str) -> xmatch.MatchingModel:
    """The model to search with: ``name`` (it must have a verifier), or the shipped TERAN with an
    untrained default verifier head."""
    if name is not None:
        return xmatch.build(name, pretrained=True, device=device).eval()
    trained = xmatch.build("teran-mrsw-scenes", pretrained=True)
    model = xmatch.build("teran-mrsw-scenes", verifier={"name": "cross-attention"})
    missing, unexpected = model.load_state_dict(trained.state_dict(), strict=False)
    assert not unexpected and all(k.startswith("verifier.") for k in missing)
    return model.to(device).eval()


def measure(index: xmatch.index.SearchIndex, texts: list[str], repeats: int, **options) -> dict:
    stages: dict[str, list[float]] = {s: [] for s in STAGES}
    single = [float("inf")] * 100
    batched = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        index.search_texts(texts, k=10, **options)
        batched = min(batched, time.perf_counter() - start)
        for q, text in enumerate(texts[:100]):
            start = time.perf_counter()
            result = index.search_texts([text], k=10, **options)[0]
            single[q] = min(single[q], time.perf_counter() - start)
            for stage, ms in result.timings.items():
                stages[stage].append(ms)
    lat = sorted(single)
    return {"stages": {s: statistics.median(v) if v else None for s, v in stages.items()},
            "p50": 1000 * lat[len(lat) // 2], "p95": 1000 * lat[int(0.95 * len(lat))], "qps": len(texts) / batched}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rerank", type=int, nargs="+", default=[10, 20, 50])
    parser.add_argument("--model", help="a model with a trained verifier (default: see above)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=Path("/tmp/xmatch-search-rerank"), help="the index (reused if there)")
    parser.add_argument("--captions", type=Path, help="queries, one per line (default: the scenes test captions; written "
                        "to OUT.captions.txt)")
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    if args.captions is not None:
        texts = args.captions.read_text(encoding="utf-8").splitlines()
    else:
        from xmatch.scenes.dataset import open_scenes  # the scenes data, generated into the cache on first use

        texts = list(open_scenes(split="test").captions)
        args.out.with_suffix(".captions.txt").write_text("\n".join(texts), encoding="utf-8")
    if not (args.out / "index.json").is_file():
        from xmatch.scenes.dataset import open_scenes

        shutil.rmtree(args.out, ignore_errors=True)
        index = xmatch.index.create(args.out, verifier_model(args.model, "cpu"))  # the model is saved in the index
        index_dataset(index, open_scenes(split="test"), progress=False)
    index = xmatch.index.open(args.out, device=args.device, in_memory=True)
    model = index.model
    width = sum(p.numel() for p in model.verifier.parameters())
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU"
    print(f"# {len(index)} images; {len(texts)} caption queries; verifier "
          f"{type(model.verifier).__name__} ({width / 1e6:.2f} M parameters); {device}; {torch.get_num_threads()} "
          f"threads; {load()}")
    print("| search | encode ms | stage 1 ms | stage 2 ms | verifier ms | p50 ms | p95 ms | queries/s |")
    print("|---|---|---|---|---|---|---|---|")
    for k in [None, *args.rerank]:
        m = measure(index, texts, args.repeats, **({} if k is None else {"rerank": k}))
        cells = " | ".join("-" if m["stages"][s] is None else f"{m['stages'][s]:.2f}" for s in STAGES)
        label = "two-stage (no verifier)" if k is None else f"--rerank {k}"
        print(f"| {label} | {cells} | {m['p50']:.1f} | {m['p95']:.1f} | {m['qps']:.0f} |")
    print(f"# {load()}")


if __name__ == "__main__":
    main()
