"""TERAN on region features from ``xmatch extract`` vs the shipped scenes features.

The scenes benchmark's pictures (the ``small`` preset's PNGs, as ``layout=images`` renders
them) go through ``xmatch extract`` with different proposers; every feature set then trains
TERAN-MrSw with the shipped recipe (``teran-mrsw-scenes`` + ``scenes-teran``: 5 epochs, batch
64, Adam 2e-4, best validation rsum kept, seed 0) and is evaluated on the test split (100
images, 500 captions): R@1/5/10 both ways, rsum, and twin accuracy (docs/scenes.md).

Rows (EfficientNet-Lite0, ImageNet weights of the package, pooling as the shipped features:
RoI-align, 2 x 2 bins of 2 x 2 samples, averaged; images fed whole at 224 x 224):

- ``shipped``: the scenes' own features (the drawn objects' boxes, 3 jittered copies of each,
  the whole image, random background boxes; 36);
- ``boxes``: the drawn objects' boxes (from scenes.json, as a COCO-style file), padded to 36
  with the whole image and 2 x 2, 3 x 3... grid cells;
- ``windows``: 36 multi-scale sliding windows; ``grid6``: 6 x 6 cells of the whole image;
- ``grid7``: 7 x 7 cells of the whole image (the layout of ``timm-grid``'s cells);
- ``grid7-crop``: 7 x 7 cells of the central 87.5% (what ``timm-grid`` with its default
  ``crop_pct`` 0.875 sees), as a boxes file: the crop's effect alone, everything else equal.

Each step is skipped when its output exists, so an interrupted table resumes.

Usage:
    python benchmarks/extract_scenes_table.py --out runs/extract-table
    python benchmarks/extract_scenes_table.py --out runs/extract-table --rows boxes,windows
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Row:
    key: str
    label: str
    proposer: str = ""
    options: list[str] = field(default_factory=list)
    regions: int = 36


ROWS = [
    Row("shipped", "shipped scenes features (objects + jitter + background)"),
    Row("boxes", "boxes: the drawn objects, padded", "boxes", ["source={objects}"]),
    Row("windows", "windows", "windows"),
    Row("grid6", "grid 6x6, whole image", "grid"),
    Row("grid7", "grid 7x7, whole image", "grid", regions=49),
    Row("grid7-crop", "grid 7x7 of the central 87.5% (timm-grid's view)", "boxes", ["source={crop}"], regions=49),
]


def scenes_root(data: Path | None) -> Path:
    """The folder of the rendered small preset (generated if missing)."""
    from xmatch.data import open_dataset

    ds = open_dataset("scenes", data, split="test", layout="images")
    return Path(ds.captions_file).parent


def write_boxes_files(root: Path, out: Path) -> dict[str, Path]:
    """COCO-style boxes files: the drawn objects' boxes, and the central-crop 7 x 7 cells."""
    from xmatch.scenes.dataset import read_scenes

    records = read_scenes(root)
    images = [{"id": r["id"], "file_name": f"images/{r['id']}.png"} for r in records]
    objects = [
        {"image_id": r["id"], "bbox": [o["box"][0], o["box"][1], o["box"][2] - o["box"][0], o["box"][3] - o["box"][1]]}
        for r in records for o in r["objects"]
    ]
    canvas = 224
    crop = 0.875 * canvas
    start = (canvas - crop) / 2
    cell = crop / 7
    cells = [[start + j * cell, start + i * cell, cell, cell] for i in range(7) for j in range(7)]
    crop_anns = [{"image_id": r["id"], "bbox": b} for r in records for b in cells]
    files = {"objects": out / "objects.json", "crop": out / "crop-cells.json"}
    out.mkdir(parents=True, exist_ok=True)
    files["objects"].write_text(json.dumps({"images": images, "annotations": objects}))
    files["crop"].write_text(json.dumps({"images": images, "annotations": crop_anns}))
    return files


def commands(row: Row, root: Path, out: Path, files: dict[str, Path], data: Path | None) -> list[list[str]]:
    run = out / row.key
    if row.key == "shipped":
        source = ["--dataset", "scenes"] + (["--data", str(data)] if data else [])
        return [
            ["xmatch", "train", "teran-mrsw-scenes", *source, "--recipe", "scenes-teran", "--out", str(run / "run"), "--no-progress"],
            ["xmatch", "eval", f"local-dir:{run / 'run' / 'best'}", *source, "--split", "test", "--json", str(run / "test.json")],
        ]
    options = [o.format(**files) for o in row.options]
    feats = run / "feats"
    extract = ["xmatch", "extract", str(root), "--captions", str(root / "dataset_scenes.json"), "--out", str(feats),
               "--proposer", row.proposer, "--regions", str(row.regions), "--workers", "0", "--no-progress"]
    extract += [a for o in options for a in ("--proposer-option", o)]
    return [
        extract,
        ["xmatch", "train", "teran-mrsw-scenes", "--data", str(feats), "--recipe", "scenes-teran", "--out", str(run / "run"), "--no-progress"],
        ["xmatch", "eval", f"local-dir:{run / 'run' / 'best'}", "--data", str(feats), "--split", "test", "--json", str(run / "test.json")],
    ]


def twin_figure(row: Row, out: Path, data: Path | None) -> tuple[float, int]:
    """Twin accuracy of the row's best model on the test split (twins from the scenes' metadata)."""
    import torch

    import xmatch
    from xmatch.data import open_dataset
    from xmatch.scenes.dataset import twin_accuracy
    from xmatch.eval import encode_dataset, fold_layout, score_blocks

    scenes = open_dataset("scenes", data, split="test", progress=False)
    test = scenes if row.key == "shipped" else open_dataset("teran", out / row.key / "feats", split="test")
    if list(test.image_names) != list(scenes.image_names):
        raise RuntimeError(f"{row.key}: the extracted test split is not in the scenes' order.")
    model = xmatch.build(f"local-dir:{out / row.key / 'run' / 'best'}", pretrained=True).eval()
    with torch.no_grad():
        encoded = encode_dataset(model, test, image_batch_size=64, text_batch_size=256, progress=False)
        scores = score_blocks(model, encoded, fold_layout(test.num_images, "full"), test.captions_per_image, progress=False)[0]
    return twin_accuracy(scores, scenes)


def run_row(row: Row, root: Path, out: Path, files: dict[str, Path], data: Path | None) -> dict:
    folder = out / row.key
    result_file = folder / "result.json"
    if result_file.is_file():
        return json.loads(result_file.read_text())
    folder.mkdir(parents=True, exist_ok=True)
    times = {}
    for cmd in commands(row, root, out, files, data):
        step = cmd[1]
        start = time.perf_counter()
        with (folder / f"{step}.log").open("w") as log:
            print("  $ " + shlex.join(cmd), flush=True)
            subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT, env=os.environ)
        times[step] = time.perf_counter() - start
    twin, n = twin_figure(row, out, data)
    result = {"row": row.key, "seconds": times, "figures": json.loads((folder / "test.json").read_text()),
              "twin": twin, "twin_captions": n}
    result_file.write_text(json.dumps(result, indent=1))
    return result


def table(results: dict[str, dict]) -> str:
    lines = ["| features | regions | i→t R@1 / 5 / 10 | t→i R@1 / 5 / 10 | rsum | twin acc. | extract min | train min |",
             "|---|---|---|---|---|---|---|---|"]
    for row in ROWS:
        if row.key not in results:
            continue
        r, f = results[row.key], results[row.key]["figures"]
        i2t = " / ".join(f"{float(f['i2t'][k]):.1f}" for k in ("r1", "r5", "r10"))
        t2i = " / ".join(f"{float(f['t2i'][k]):.1f}" for k in ("r1", "r5", "r10"))
        rsum = sum(float(f[d][k]) for d in ("i2t", "t2i") for k in ("r1", "r5", "r10"))
        ext = r["seconds"].get("extract")
        lines.append(f"| {row.label} | {row.regions} | {i2t} | {t2i} | {rsum:.1f} | {100 * r['twin']:.1f}% "
                     f"| {'' if ext is None else f'{ext / 60:.1f}'} | {r['seconds']['train'] / 60:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/extract-table"))
    parser.add_argument("--data", type=Path, help="scenes cache folder (default: $XMATCH_HOME/datasets/scenes)")
    parser.add_argument("--rows", help="comma-separated row keys (default: all): " + ", ".join(r.key for r in ROWS))
    args = parser.parse_args(argv)
    keys = args.rows.split(",") if args.rows else [r.key for r in ROWS]
    by_key = {r.key: r for r in ROWS}
    unknown = sorted(set(keys) - set(by_key))
    if unknown:
        parser.error(f"unknown rows {unknown}; rows: {', '.join(by_key)}")
    root = scenes_root(args.data)
    files = write_boxes_files(root, args.out)
    results = {}
    for key in keys:
        print(f"{key}:", flush=True)
        results[key] = run_row(by_key[key], root, args.out, files, args.data)
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
