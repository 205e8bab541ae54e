"""TERAN on region features from ``xmatch extract``: proposers x resolution x region mode, on
three generated worlds: the scenes (and their small-object variant), the tabletop and the signs.

A world's pictures (``--world scenes``: the ``small`` preset's PNGs, as ``layout=images``
renders them, ``--objects small``: the variant whose objects are 16-40 px; ``--world
tabletop``: household objects of 20-70 px on a grained table top, docs/tabletop.md;
``--world signs``: letters, words and icons of 12-60 px in eleven fonts on scikit-image's
photos, with clutter, docs/signs.md; ``--backdrop plain``: the same boards on a flat grey canvas) go through ``xmatch extract`` with different proposers
and RoI settings; every feature set then trains TERAN-MrSw with the shipped recipe
(``teran-mrsw-scenes`` + ``scenes-teran``: 5 epochs, batch 64, Adam 2e-4, best validation rsum
kept; on the tabletop and the signs with ``--build-text-side``, the vocabulary from their
captions; ``--seeds`` sets the training seed) and is evaluated on the test split: R@1/5/10
both ways, rsum, and twin accuracy (the ``t2i`` figure of the world's hard-negative twins:
how often a caption scores its own picture above its twin, chance 50 %).

Rows (EfficientNet-Lite0, ImageNet weights of the package; ``roi`` pooling as the shipped
features: RoI-align, 2 x 2 bins of 2 x 2 samples, averaged):

- ``shipped`` (scenes only): the scenes' own features (the drawn objects' boxes, 3 jittered
  copies of each, the whole image, random background boxes; 36);
- ``boxes``: the drawn objects' boxes (from the world's metadata, as a COCO-style file), padded
  to 36 with the whole image and 2 x 2, 3 x 3... grid cells; ``boxes-crop``: the same boxes, each
  cropped from the picture at 600 px and encoded alone at 96 px on the stride-16 map (per-object
  features, the reference row);
- ``windows``: 36 multi-scale sliding windows, picture at 224 (stride-32 map; the settings
  before the defaults changed); ``windows-600``: at 600 px on a stride-16 map (``xmatch
  extract``'s defaults); ``windows-224-s8``: at 224 px on a stride-8 map; ``windows-crop``: each
  window cropped (on the stride-16 map; ``windows-crop-s32``: on the backbone's own stride-32 map);
- ``ss-224``, ``ss-224-s16``, ``ss-600``, ``ss-crop``: ``selective-search`` boxes, on the
  224 px stride-32 / 224 px stride-16 / 600 px stride-16 map, or cropped;
- ``ss-mixed8``: ``selective-search`` boxes (segmented at 160 px), its first 8 cropped at 96 px
  and the rest pooled from the 224-px stride-16 map (``--mode mixed``); ``ss-mixed16``: its first
  16 cropped; ``ss-mixed16-64``: its first 16 cropped at 64 px; ``boxes-mixed8``: the same as
  ``ss-mixed8`` with the drawn objects' boxes first; ``ss256-mixed16``, ``ss256-crop``: segmented at 256 px (a 256-px picture's
  own size: tighter boxes of small objects); ``ss12-crop``: ``selective-search``'s first 12
  boxes, padded as ``boxes`` is (the whole image and grid cells) to 36, all cropped at 96 px;
- ``grid6``, ``grid7``: 6 x 6 / 7 x 7 cells of the whole image; ``grid7-crop``: 7 x 7 cells of
  the central 87.5% (what ``timm-grid`` sees), as a boxes file.

Each step is skipped when its output exists, so an interrupted table resumes; the features
of a row are extracted once for all its seeds.

Usage:
    python benchmarks/extract_scenes_table.py --out runs/extract-table
    python benchmarks/extract_scenes_table.py --out runs/extract-table --objects small --rows windows,ss-crop --seeds 0,1,2
    python benchmarks/extract_scenes_table.py --out runs/extract-table --world signs --rows boxes-crop,windows,windows-600
    python benchmarks/extract_scenes_table.py --out runs/extract-table --world signs --backdrop plain --rows boxes-crop,windows-600,ss-mixed8
    python benchmarks/extract_scenes_table.py --out runs/extract-table --world signs --backdrop plain --rows boxes-crop --seeds 1 --epochs 15
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
from typing import Any


#: the settings before the defaults changed (RoIConfig's): the picture at 224 px, stride 32
AT_224 = ["--image-size", "224", "--output-stride", "32", "--mode", "roi"]
#: the bottom-up convention (xmatch extract's defaults): shorter side 600 px, a stride-16 map
AT_600 = ["--image-size", "600", "--output-stride", "16", "--mode", "roi"]
#: the picture at 224 px on a stride-16 map (the last stage dilated)
AT_224_S16 = ["--image-size", "224", "--output-stride", "16", "--mode", "roi"]
#: the picture at its own size (the scenes' 224-px canvas, never upscaled) on a stride-8 map
AT_224_S8 = ["--image-size", "224", "--output-stride", "8", "--mode", "roi"]
#: each box cut out of the picture at 600 px and encoded alone at 96 px on the dilated stride-16
#: map (a 6 x 6 map of each crop): how the tables' crop rows were made (xmatch extract's defaults then)
CROPPED = ["--image-size", "600", "--output-stride", "16", "--mode", "crop", "--crop-size", "96"]
#: the same crops on the backbone's own stride-32 map (a 3 x 3 map of each crop)
CROPPED_S32 = ["--image-size", "600", "--output-stride", "32", "--mode", "crop", "--crop-size", "96"]
#: the proposer's first 8 boxes cut out of the picture at 224 px and encoded alone at 96 px, the
#: others pooled from the 224-px map, all on the stride-16 map (``--mode mixed``)
MIXED8 = ["--image-size", "224", "--output-stride", "16", "--mode", "mixed", "--crop-size", "96", "--crop-regions", "8"]
#: the same with the first 16 boxes cropped (selective search's first 16 hold nearly every sign of a plain board)
MIXED16 = ["--image-size", "224", "--output-stride", "16", "--mode", "mixed", "--crop-size", "96", "--crop-regions", "16"]
#: 16 crops of 64 px (less than half the backbone work of 96-px crops)
MIXED16_64 = ["--image-size", "224", "--output-stride", "16", "--mode", "mixed", "--crop-size", "64", "--crop-regions", "16"]


@dataclass(frozen=True)
class Row:
    key: str
    label: str
    proposer: str = ""
    options: list[str] = field(default_factory=list)
    regions: int = 36
    roi: list[str] = field(default_factory=lambda: list(AT_224))


WORLDS = ("scenes", "tabletop", "signs")

ROWS = [
    Row("shipped", "shipped scenes features (objects + jitter + background)"),
    Row("boxes", "boxes: the drawn objects, padded; 224, stride 32", "boxes", ["source={objects}"]),
    Row("boxes-crop", "boxes: the drawn objects, padded; crops of 96 px", "boxes", ["source={objects}"], roi=CROPPED),
    Row("windows", "windows; 224, stride 32", "windows"),
    Row("windows-600", "windows; 600, stride 16", "windows", roi=AT_600),
    Row("windows-224-s8", "windows; 224 (no upscaling), stride 8", "windows", roi=AT_224_S8),
    Row("windows-crop", "windows; crops of 96 px", "windows", roi=CROPPED),
    Row("windows-crop-s32", "windows; crops of 96 px on the stride-32 map", "windows", roi=CROPPED_S32),
    Row("ss-224", "selective-search; 224, stride 32", "selective-search", ["segment_side=224"]),
    Row("ss-224-s16", "selective-search; 224, stride 16", "selective-search", ["segment_side=224"], roi=AT_224_S16),
    Row("ss-600", "selective-search; 600, stride 16", "selective-search", ["segment_side=224"], roi=AT_600),
    Row("ss-crop", "selective-search; crops of 96 px", "selective-search", ["segment_side=224"], roi=CROPPED),
    Row("ss-mixed8", "selective-search (segmented at 160 px); the first 8 cropped at 96 px, the rest pooled at 224, stride 16",
        "selective-search", ["segment_side=160"], roi=MIXED8),
    Row("ss-mixed16", "selective-search (segmented at 160 px); the first 16 cropped at 96 px, the rest pooled at 224, stride 16",
        "selective-search", ["segment_side=160"], roi=MIXED16),
    Row("ss-mixed16-64", "selective-search (segmented at 160 px); the first 16 cropped at 64 px, the rest pooled at 224, stride 16",
        "selective-search", ["segment_side=160"], roi=MIXED16_64),
    Row("ss256-mixed16", "selective-search (segmented at 256 px); the first 16 cropped at 96 px, the rest pooled at 224, stride 16",
        "selective-search", ["segment_side=256"], roi=MIXED16),
    Row("ss256-crop", "selective-search (segmented at 256 px); crops of 96 px", "selective-search", ["segment_side=256"], roi=CROPPED),
    Row("ss12-crop", "selective-search (segmented at 160 px), its first 12 boxes, padded with the whole image and grid cells to 36; crops of 96 px",
        "selective-search", ["segment_side=160", "proposals=12"], roi=CROPPED),
    Row("boxes-mixed8", "boxes: the drawn objects first; the first 8 cropped at 96 px, the rest pooled at 224, stride 16",
        "boxes", ["source={objects}"], roi=MIXED8),
    Row("grid6", "grid 6x6, whole image; 224, stride 32", "grid"),
    Row("grid7", "grid 7x7, whole image; 224, stride 32", "grid", regions=49),
    Row("grid7-crop", "grid 7x7 of the central 87.5% (timm-grid's view)", "boxes", ["source={crop}"], regions=49),
]


@dataclass(frozen=True)
class World:
    """A generated world as the table needs it: its pictures, captions, objects and twins."""

    name: str
    #: how it opens: ``open_dataset(dataset, data, **options)``
    dataset: str
    data: Path | None
    options: dict[str, str]
    root: Path
    captions: Path
    canvas: int
    #: per picture: (id, file name relative to ``root``, the drawn objects' [x1, y1, x2, y2] boxes)
    objects: list[tuple[int, str, list[list[float]]]]
    #: its test split in the images layout (the twins' groups are read over it)
    test: Any
    #: train with a vocabulary from the world's captions (the scenes recipe's is the scenes')
    build_text_side: bool


def open_world(world: str, data: Path | None, objects: str, backdrop: str = "photos") -> World:
    """The test split of ``world`` in the images layout (generated if missing), its objects and files."""
    from xmatch.data import open_dataset

    options = {"objects": objects} if world == "scenes" else {}
    if world == "signs" and backdrop != "photos":
        options = {"backdrop": backdrop}
    test = open_dataset(world, data, split="test", layout="images", progress=False, **options)
    root = Path(test.captions_file).parent
    if world == "scenes":
        from xmatch.scenes.dataset import read_scenes

        records = [(r["id"], r["objects"]) for r in read_scenes(root)]
        canvas = 224
    elif world == "tabletop":
        from xmatch.tabletop.dataset import read_tables

        records = [(r["id"], r["things"]) for r in read_tables(root)]
        canvas = int(json.loads((root / "tabletop.json").read_text())["params"]["canvas"])
    else:
        from xmatch.signs.dataset import read_signs

        records = [(r["id"], r["items"]) for r in read_signs(root)]
        canvas = int(json.loads((root / "signs.json").read_text())["params"]["canvas"])
    return World(
        name=f"scenes-{objects}" if world == "scenes" else "-".join([world, *options.values()]), dataset=world, data=data, options=options, root=root,
        captions=root / f"dataset_{world}.json",
        canvas=canvas, objects=[(i, f"images/{i}.png", [o["box"] for o in things]) for i, things in records],
        test=test, build_text_side=world != "scenes",
    )


def world_groups(world: World) -> Any:
    """The twins of the world's test split (:class:`xmatch.eval.groups.GroupSet`)."""
    if world.name.startswith("scenes"):
        from xmatch.scenes.dataset import scene_groups

        return scene_groups(world.test)
    from xmatch.eval.groups import GroupSet

    return GroupSet.from_json(world.root / "groups_test.json", world.test)


def write_boxes_files(world: World, out: Path) -> dict[str, Path]:
    """COCO-style boxes files: the drawn objects' boxes, and the central-crop 7 x 7 cells."""
    images = [{"id": i, "file_name": name} for i, name, _ in world.objects]
    objects = [
        {"image_id": i, "bbox": [b[0], b[1], b[2] - b[0], b[3] - b[1]]} for i, _, boxes in world.objects for b in boxes
    ]
    crop = 0.875 * world.canvas
    start = (world.canvas - crop) / 2
    cell = crop / 7
    cells = [[start + j * cell, start + i * cell, cell, cell] for i in range(7) for j in range(7)]
    crop_anns = [{"image_id": i, "bbox": b} for i, _, _ in world.objects for b in cells]
    files = {"objects": out / "objects.json", "crop": out / "crop-cells.json"}
    out.mkdir(parents=True, exist_ok=True)
    files["objects"].write_text(json.dumps({"images": images, "annotations": objects}))
    files["crop"].write_text(json.dumps({"images": images, "annotations": crop_anns}))
    return files


def extraction_complete(feats: Path) -> bool:
    """Whether ``xmatch extract`` finished into ``feats`` (its manifest says so; an interrupted
    extraction leaves a manifest without ``complete``, and is resumed)."""
    manifest = feats / "extract.json"
    return manifest.is_file() and json.loads(manifest.read_text()).get("complete") is True


#: the recipe every row trains with unless ``--recipe`` names another
RECIPE = "scenes-teran"


def run_tag(seed: int, epochs: int | None = None, recipe: str = RECIPE) -> str:
    """How a run's files are named: ``seed0``; ``seed0-e15`` when trained for other than the
    recipe's epochs; ``seed0-small-teran`` with another recipe than ``scenes-teran``."""
    tag = f"seed{seed}" if epochs is None else f"seed{seed}-e{epochs}"
    return tag if recipe == RECIPE else f"{tag}-{recipe}"


def commands(row: Row, world: World, out: Path, files: dict[str, Path], seed: int, epochs: int | None = None,
             recipe: str = RECIPE) -> list[list[str]]:
    """The row's commands: extract (once for all seeds), train with ``recipe`` and ``seed`` (for
    ``epochs``, default the recipe's), evaluate."""
    folder = out / row.key
    tag = run_tag(seed, epochs, recipe)
    run, test = folder / f"run-{tag}", folder / f"test-{tag}.json"
    train_seed = ["--set", f"seed={seed}", *(["--set", f"epochs={epochs}"] if epochs is not None else [])]
    if row.key == "shipped":
        source = ["--dataset", world.dataset, *(a for k, v in world.options.items() for a in ("--data-option", f"{k}={v}"))]
        source += ["--data", str(world.data)] if world.data else []
        return [
            ["xmatch", "train", "teran-mrsw-scenes", *source, "--recipe", recipe, *train_seed, "--out", str(run),
             "--no-progress"],
            ["xmatch", "eval", f"local-dir:{run / 'best'}", *source, "--split", "test", "--json", str(test)],
        ]
    options = [o.format(**files) for o in row.options]
    feats = folder / "feats"
    steps = []
    if not extraction_complete(feats):
        extract = ["xmatch", "extract", str(world.root), "--captions", str(world.captions), "--out", str(feats),
                   "--proposer", row.proposer, "--regions", str(row.regions), *row.roi, "--workers", "0", "--no-progress",
                   "--resume"]
        steps.append(extract + [a for o in options for a in ("--proposer-option", o)])
    text_side = ["--build-text-side"] if world.build_text_side else []
    return steps + [
        ["xmatch", "train", "teran-mrsw-scenes", "--data", str(feats), "--recipe", recipe, *text_side, *train_seed,
         "--out", str(run), "--no-progress", "--overwrite"],
        ["xmatch", "eval", f"local-dir:{run / 'best'}", "--data", str(feats), "--split", "test", "--json", str(test)],
    ]


def twin_figure(row: Row, world: World, out: Path, tag: str) -> tuple[float, int]:
    """Twin accuracy of the row's best model on the test split: the ``t2i`` figure of its twins."""
    import torch

    import xmatch
    from xmatch.data import open_dataset
    from xmatch.eval import encode_dataset, fold_layout, score_blocks
    from xmatch.eval.groups import score_groups

    if row.key == "shipped":
        test = open_dataset(world.dataset, world.data, split="test", progress=False, **world.options)
    else:
        test = open_dataset("teran", out / row.key / "feats", split="test")
    if [Path(n).stem for n in test.image_names] != [Path(n).stem for n in world.test.image_names]:
        raise RuntimeError(f"{row.key}: the extracted test split is not in the {world.name} test split's order.")
    model = xmatch.build(f"local-dir:{out / row.key / f'run-{tag}' / 'best'}", pretrained=True).eval()
    with torch.no_grad():
        encoded = encode_dataset(model, test, image_batch_size=64, text_batch_size=256, progress=False)
        scores = score_blocks(model, encoded, fold_layout(test.num_images, "full"), test.captions_per_image, progress=False)[0]
    overall = score_groups(scores, world_groups(world), resamples=0).overall
    return overall["t2i"] / 100.0, overall["queries"]


def run_row(row: Row, world: World, out: Path, files: dict[str, Path], seed: int, epochs: int | None = None,
            recipe: str = RECIPE) -> dict:
    """Run (or read back) one row at one training seed with ``recipe`` (and ``epochs``, default the recipe's)."""
    folder = out / row.key
    tag = run_tag(seed, epochs, recipe)
    result_file = folder / f"result-{tag}.json"
    if result_file.is_file():
        return json.loads(result_file.read_text())
    folder.mkdir(parents=True, exist_ok=True)
    times = {}
    for cmd in commands(row, world, out, files, seed, epochs, recipe):
        step = cmd[1]
        start = time.perf_counter()
        with (folder / f"{step}-{tag}.log").open("w") as log:
            print("  $ " + shlex.join(cmd), flush=True)
            subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT, env=os.environ)
        times[step] = time.perf_counter() - start
    twin, n = twin_figure(row, world, out, tag)
    result = {"row": row.key, "world": world.name, "seed": seed, "epochs": epochs, "recipe": recipe, "seconds": times,
              "figures": json.loads((folder / f"test-{tag}.json").read_text()),
              "twin": twin, "twin_captions": n, "load": os.getloadavg()}
    result_file.write_text(json.dumps(result, indent=1))
    return result


def rsum(figures: dict) -> float:
    return sum(float(figures[d][k]) for d in ("i2t", "t2i") for k in ("r1", "r5", "r10"))


def table(results: dict[str, list[dict]]) -> str:
    """One line per row: R@K of the first seed, rsum and twin accuracy as mean ± sd over seeds."""
    import statistics

    lines = ["| features | regions | seeds | i→t R@1 / 5 / 10 | t→i R@1 / 5 / 10 | rsum | twin acc. | extract min | train min |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in ROWS:
        runs = results.get(row.key)
        if not runs:
            continue
        f = runs[0]["figures"]
        i2t = " / ".join(f"{float(f['i2t'][k]):.1f}" for k in ("r1", "r5", "r10"))
        t2i = " / ".join(f"{float(f['t2i'][k]):.1f}" for k in ("r1", "r5", "r10"))
        sums = [rsum(r["figures"]) for r in runs]
        twins = [100 * r["twin"] for r in runs]
        spread = (lambda v: f" ± {statistics.stdev(v):.1f}") if len(runs) > 1 else (lambda v: "")
        ext = next((r["seconds"]["extract"] for r in runs if "extract" in r["seconds"]), None)
        lines.append(f"| {row.label} | {row.regions} | {len(runs)} | {i2t} | {t2i} | {statistics.mean(sums):.1f}{spread(sums)} "
                     f"| {statistics.mean(twins):.1f}{spread(twins)}% | {'' if ext is None else f'{ext / 60:.1f}'} "
                     f"| {statistics.mean(r['seconds']['train'] for r in runs) / 60:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/extract-table"))
    parser.add_argument("--world", default="scenes", choices=WORLDS, help="the generated world (default: scenes)")
    parser.add_argument("--data", type=Path, help="the world's cache folder (default: $XMATCH_HOME/datasets/WORLD)")
    parser.add_argument("--rows", help="comma-separated row keys (default: all): " + ", ".join(r.key for r in ROWS))
    parser.add_argument("--objects", default="standard", choices=["standard", "small"],
                        help="scenes only: the scenes (standard) or their small-object variant (objects 16-40 px)")
    parser.add_argument("--backdrop", default="photos", choices=["photos", "plain"],
                        help="signs only: scikit-image's photographs with clutter (photos) or a flat grey canvas (plain)")
    parser.add_argument("--seeds", default="0", help="comma-separated training seeds (default: 0)")
    parser.add_argument("--epochs", type=int, help="train for this many epochs instead of the recipe's 5 (runs named run-seedS-eN)")
    parser.add_argument("--recipe", default=RECIPE,
                        help=f"the training recipe of every row (default: {RECIPE}; another is named in the runs: run-seedS-RECIPE)")
    args = parser.parse_args(argv)
    if args.backdrop != "photos" and args.world != "signs":
        parser.error("--backdrop is a signs option (--world signs).")
    keys = args.rows.split(",") if args.rows else [r.key for r in ROWS if args.world == "scenes" or r.key != "shipped"]
    by_key = {r.key: r for r in ROWS}
    unknown = sorted(set(keys) - set(by_key))
    if unknown:
        parser.error(f"unknown rows {unknown}; rows: {', '.join(by_key)}")
    if args.world != "scenes" and "shipped" in keys:
        parser.error("the shipped row exists for the scenes only (--world scenes).")
    seeds = [int(s) for s in args.seeds.split(",")]
    world = open_world(args.world, args.data, args.objects, args.backdrop)
    # the scenes keep their folders of the first tables (runs/extract-table/standard, .../small)
    out = args.out / (args.objects if args.world == "scenes" else world.name)
    files = write_boxes_files(world, out)
    results: dict[str, list[dict]] = {}
    for key in keys:
        for seed in seeds:
            print(f"{key} (seed {seed}):", flush=True)
            results.setdefault(key, []).append(run_row(by_key[key], world, out, files, seed, args.epochs, args.recipe))
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
