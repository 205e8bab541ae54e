"""Box recall of the detector-free proposers on generated worlds: does a drawn object get its own box?

For each proposer, the boxes of each picture (36, 49 for the 7 x 7 grid) are matched against the drawn
objects' boxes (``scenes.json``): recall at IoU 0.5 and 0.7 (the fraction of objects with a
proposal at least that close), the mean over objects of the best IoU, and the proposer's
milliseconds per picture, wall-clock and CPU time of the process (one thread; the load average
is printed: wall-clock figures are only comparable on an otherwise idle machine).

Two sets:
- ``standard``: the scenes small test split as generated (objects 34-85 px on 224 px), read
  from the cache (``open_scenes(split="test", layout="images")`` makes it on first use).
- ``small``: the same generator with objects 16-40 px (``objects="small"`` of
  :func:`xmatch.scenes.render.sample_group`), rendered in memory from the groups of the test
  split on (groups 450 and up of seed 0), ``--small-images`` pictures.
- ``clutter``: the ``small`` set's objects pasted onto random crops of scikit-image's bundled
  photos and textures (astronaut, coffee, brick, grass...): many background segments, so the
  ranking decides which 36 boxes are kept.
- ``tabletop``, ``signs``: the test splits of those worlds (docs/tabletop.md: objects of 20-70
  px on a table top; docs/signs.md: letters, words and icons of 12-60 px on photographs, with
  clutter), the drawn objects' boxes from their metadata; ``--standard-images`` of them;
  ``signs-plain``: the same boards on a flat grey canvas without clutter.

Usage:
    OMP_NUM_THREADS=1 python benchmarks/proposer_recall.py
    OMP_NUM_THREADS=1 python benchmarks/proposer_recall.py --rows selective-search --option segment_side=160
    OMP_NUM_THREADS=1 python benchmarks/proposer_recall.py --sets small clutter --resize 600
    OMP_NUM_THREADS=1 python benchmarks/proposer_recall.py --sets tabletop signs
    OMP_NUM_THREADS=1 python benchmarks/proposer_recall.py --sets signs signs-plain --rows windows selective-search-160 --option regions=8
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import replace
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

#: name -> proposer spec table (build_proposer reads it)
ROWS: dict[str, dict[str, Any]] = {
    "windows": {"name": "windows", "regions": 36},
    "grid-6x6": {"name": "grid", "regions": 36},
    "grid-7x7": {"name": "grid", "regions": 49},  # 49 boxes: all are counted
    "selective-search": {"name": "selective-search", "regions": 36, "segment_side": 224},  # its default, pinned
    "selective-search-hierarchy": {"name": "selective-search", "regions": 36, "ranking": "hierarchy", "segment_side": 224},
    "selective-search-160": {"name": "selective-search", "regions": 36, "segment_side": 160},
}
IOUS = (0.5, 0.7)


def standard_set(limit: int | None) -> list[tuple[Any, np.ndarray]]:
    """The scenes small test split: (picture, object boxes) per image."""
    from PIL import Image

    from xmatch.scenes.dataset import open_scenes, read_scenes

    root = open_scenes(split="test", layout="images").root
    records = [r for r in read_scenes(root) if r["split"] == "test"][:limit]
    return [(Image.open(root / "images" / f"{r['id']}.png").convert("RGB"),
             np.array([o["box"] for o in r["objects"]], dtype=np.float64)) for r in records]


def world_set(world: str, limit: int | None, **options: str) -> list[tuple[Any, np.ndarray]]:
    """The test split of the ``tabletop`` or ``signs`` world (small preset, from the cache;
    ``options`` as ``open_dataset`` takes them): (picture, drawn object boxes) per image."""
    from PIL import Image

    from xmatch.data import open_dataset

    root = open_dataset(world, None, split="test", layout="images", progress=False, **options).root
    if world == "tabletop":
        from xmatch.tabletop.dataset import read_tables

        records = [(r["id"], r["things"]) for r in read_tables(root) if r["split"] == "test"]
    else:
        from xmatch.signs.dataset import read_signs

        records = [(r["id"], r["items"]) for r in read_signs(root) if r["split"] == "test"]
    return [(Image.open(root / "images" / f"{i}.png").convert("RGB"), np.array([o["box"] for o in things], dtype=np.float64))
            for i, things in records[:limit]]


def small_scenes(count: int, canvas: int = 224, first_group: int = 450) -> list[Any]:
    """Scenes with objects 16-40 px, drawn with the dataset's random streams (seed 0)."""
    from xmatch.scenes import render

    out: list[Any] = []
    group = first_group
    while len(out) < count:
        out += render.sample_group(np.random.default_rng([0, group, 0]), canvas, objects="small")
        group += 1
    return out[:count]


def small_set(count: int, canvas: int = 224) -> list[tuple[Any, np.ndarray]]:
    """The small-object scenes rendered in memory."""
    from PIL import Image

    from xmatch.scenes import render

    out = []
    for scene in small_scenes(count, canvas):
        image, boxes = render.render(scene, canvas)
        out.append((Image.fromarray(image), boxes.astype(np.float64)))
    return out


#: scikit-image's bundled photos and textures, the backgrounds of the ``clutter`` set
BACKGROUNDS = ("astronaut", "coffee", "chelsea", "rocket", "hubble_deep_field", "immunohistochemistry", "retina",
               "brick", "grass", "gravel", "coins")


def clutter_set(count: int, canvas: int = 224) -> list[tuple[Any, np.ndarray]]:
    """The ``small`` scenes' objects pasted onto random crops of real photos and textures: the
    background breaks into many segments, so the ranking decides which boxes are kept."""
    from PIL import Image
    from skimage import data

    from xmatch.scenes import render

    photos = [Image.fromarray(getattr(data, name)()).convert("RGB") for name in BACKGROUNDS]
    rng = np.random.default_rng(0)
    out = []
    for scene in small_scenes(count, canvas):
        image, boxes = render.render(scene, canvas)
        # the scene's own grey background, drawn without objects, tells object pixels apart
        empty = render.render(replace(scene, objects=()), canvas)[0]
        mask = np.abs(image.astype(np.int16) - empty).max(-1) > 12
        photo = photos[int(rng.integers(len(photos)))]
        side = int(rng.uniform(0.5, 1.0) * min(photo.size))
        x0, y0 = (int(rng.integers(0, photo.size[k] - side + 1)) for k in (0, 1))
        crop = np.asarray(photo.crop((x0, y0, x0 + side, y0 + side)).resize((canvas, canvas), Image.Resampling.BILINEAR))
        composed = np.where(mask[..., None], image, crop).astype(np.uint8)
        out.append((Image.fromarray(composed), boxes.astype(np.float64)))
    return out


def resized(picture: Any, boxes: np.ndarray, side: int) -> tuple[Any, np.ndarray]:
    """A picture enlarged to ``side`` x ``side`` and its boxes scaled with it."""
    from PIL import Image

    factor = np.array([side / picture.width, side / picture.height] * 2)
    return picture.resize((side, side), Image.Resampling.BICUBIC), boxes * factor


def iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU matrix ``[len(a), len(b)]`` of x1, y1, x2, y2 boxes."""
    wh = (np.minimum(a[:, None, 2:], b[None, :, 2:]) - np.maximum(a[:, None, :2], b[None, :, :2])).clip(min=0)
    inter = wh[..., 0] * wh[..., 1]
    area = lambda x: (x[:, 2] - x[:, 0]) * (x[:, 3] - x[:, 1])  # noqa: E731
    return inter / (area(a)[:, None] + area(b)[None, :] - inter)


def measure(propose: Callable[[Any], np.ndarray], pictures: Sequence[tuple[Any, np.ndarray]]) -> dict[str, float]:
    best, seconds, cpu, count = [], 0.0, 0.0, 0
    for picture, objects in pictures:
        start, start_cpu = time.perf_counter(), time.process_time()
        boxes = propose(picture)
        seconds += time.perf_counter() - start
        cpu += time.process_time() - start_cpu
        best.append(iou(objects, boxes).max(1))
        count = max(count, len(boxes))
    best = np.concatenate(best)
    row = {f"recall IoU{t}": float((best >= t).mean()) for t in IOUS}
    row["boxes"] = count
    row["mean best IoU"] = float(best.mean())
    row["ms/image"] = 1000 * seconds / len(pictures)
    row["cpu ms/image"] = 1000 * cpu / len(pictures)
    row["objects"] = len(best)
    return row


def main(argv: Sequence[str] | None = None) -> None:
    from xmatch.regions import ImageInfo, build_proposer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    parser.add_argument("--sets", nargs="+", default=["standard", "small", "clutter"],
                        choices=["standard", "small", "clutter", "tabletop", "signs", "signs-plain"])
    parser.add_argument("--standard-images", type=int, default=None, help="test pictures used (default: all 100)")
    parser.add_argument("--small-images", type=int, default=300)
    parser.add_argument("--skip", type=int, default=0,
                        help="leave out the first N pictures of the small and clutter sets (e.g. those defaults were tuned on)")
    parser.add_argument("--resize", type=int, default=None, metavar="SIDE",
                        help="enlarge every picture (bicubic) and its boxes to SIDE x SIDE: the cost and frame of larger pictures")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="a selective-search argument for its rows (Python literal values)")
    args = parser.parse_args(argv)
    import ast

    options = {}
    for item in args.option:
        key, _, value = item.partition("=")
        try:
            options[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            options[key] = value
    torch.set_num_threads(1)
    sets = {"standard": lambda: standard_set(args.standard_images),
            "small": lambda: small_set(args.small_images)[args.skip:],
            "clutter": lambda: clutter_set(args.small_images)[args.skip:],
            "tabletop": lambda: world_set("tabletop", args.standard_images),
            "signs": lambda: world_set("signs", args.standard_images),
            "signs-plain": lambda: world_set("signs", args.standard_images, backdrop="plain")}
    print(f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')} options={options}")
    header = (f"{'set':9s} {'proposer':28s} {'boxes':>5s} {'objects':>7s} {'R@IoU0.5':>9s} {'R@IoU0.7':>9s} "
              f"{'mean IoU':>9s} {'ms/img':>7s} {'cpu ms':>7s} load")
    print(header)
    for set_name in args.sets:
        pictures = sets[set_name]()
        if args.resize:
            pictures = [resized(p, boxes, args.resize) for p, boxes in pictures]
        for name in args.rows:
            table = dict(ROWS[name])
            if table["name"] == "selective-search":
                table.update(options)
            proposer = build_proposer(table)

            def propose(picture: Any) -> np.ndarray:
                info = ImageInfo(picture.width, picture.height, image=picture)
                return proposer([info])[0].boxes.numpy().astype(np.float64)

            row = measure(propose, pictures)
            load = open("/proc/loadavg").read().split()[0]
            print(f"{set_name:9s} {name:28s} {row['boxes']:5d} {row['objects']:7d} {row['recall IoU0.5']:9.3f} "
                  f"{row['recall IoU0.7']:9.3f} {row['mean best IoU']:9.3f} {row['ms/image']:7.1f} {row['cpu ms/image']:7.1f} {load}", flush=True)


if __name__ == "__main__":
    main()
