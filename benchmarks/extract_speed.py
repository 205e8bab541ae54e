"""Throughput of ``xmatch extract`` (images per second) on this machine.

A folder of real photos (scikit-image's ``astronaut``, ``coffee``, ``chelsea``, ``rocket``,
``hubble_deep_field``, ``immunohistochemistry``: 300 x 451 to 872 x 1000 pixels, JPEG) is
copied ``--copies`` times; every configuration extracts it into a fresh folder with the
pipeline built beforehand, so the time is decoding, resizing, proposing, the backbone, RoI
pooling and writing -- what grows with the number of images. The load average is printed
with each row: the figures are only comparable on an otherwise idle machine.

Usage:
    OMP_NUM_THREADS=1 python benchmarks/extract_speed.py --threads 1
    OMP_NUM_THREADS=2 python benchmarks/extract_speed.py --threads 2 --rows windows-lite0
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "hubble_deep_field", "immunohistochemistry")
#: the settings before the bottom-up defaults: the pretrained input size, the backbone's own stride
AT_224 = {"image_size": 224, "output_stride": 32}
#: name -> (pipeline table, as RegionPipeline.from_table reads it; what the row is)
ROWS = {
    "grid-lite0": ({"proposer": "grid", "roi": AT_224}, "grid 6x6, EfficientNet-Lite0, shorter side 224, stride 32"),
    "windows-lite0": ({"proposer": "windows", "roi": AT_224}, "windows 36, EfficientNet-Lite0, shorter side 224, stride 32"),
    "windows-lite0-448": (
        {"proposer": "windows", "roi": {"image_size": 448, "output_stride": 32}},
        "windows 36, EfficientNet-Lite0, shorter side 448, stride 32",
    ),
    "windows-lite0-600-s16": ({"proposer": "windows"}, "windows 36, EfficientNet-Lite0, shorter side 600, stride 16 (the defaults)"),
    "selective-search-crop": (
        {"proposer": "selective-search", "roi": {"output_stride": 32, "mode": "crop"}},
        "selective-search 36, EfficientNet-Lite0, crops of 96 px from the picture at 600",
    ),
    "windows-lite2": (
        {"proposer": "windows", "roi": {"backbone": "efficientnet_lite2", "image_size": None, "output_stride": 32}},
        "windows 36, EfficientNet-Lite2, shorter side 260 (256), stride 32",
    ),
    # random weights (nothing is downloaded here): the network runs in full, but hardly any box
    # passes the 0.2 threshold, so the per-class NMS of a trained detector's boxes is not timed
    "detector-mobilenet": (
        {"proposer": {"name": "torchvision-detector", "backbone": "fasterrcnn_mobilenet_v3_large_fpn", "weights": None}},
        "Faster R-CNN MobileNetV3-FPN (800 px, random weights) + EfficientNet-Lite0",
    ),
}


def photo_folder(root: Path, copies: int) -> Path:
    from PIL import Image
    from skimage import data

    folder = root / "photos"
    folder.mkdir(parents=True)
    for name in PHOTOS:
        picture = Image.fromarray(getattr(data, name)()).convert("RGB")
        for k in range(copies):
            picture.save(folder / f"{name}-{k:03d}.jpg", quality=90)
    return folder


def measure(key: str, folder: Path, out: Path, workers: int, batch_size: int) -> tuple[float, int]:
    from xmatch.extract import extract
    from xmatch.regions import RegionPipeline

    pipeline = RegionPipeline.from_table(ROWS[key][0])
    extract(folder, out / "warm-up", pipeline, workers=0, batch_size=batch_size, progress=False)  # first-call costs
    shutil.rmtree(out / "warm-up")
    start = time.perf_counter()
    result = extract(folder, out / key, pipeline, workers=workers, batch_size=batch_size, progress=False)
    return time.perf_counter() - start, result.images


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--copies", type=int, default=8, help="copies of each of the 6 photos (default 8: 48 images)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (set OMP_NUM_THREADS to match)")
    parser.add_argument("--workers", type=int, default=1, help="DataLoader workers decoding images")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--rows", help="comma-separated rows (default: all): " + ", ".join(ROWS))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    keys = args.rows.split(",") if args.rows else list(ROWS)
    print(f"{os.cpu_count()} CPU cores, {args.threads} torch thread(s), {args.workers} loader worker(s), no GPU used")
    print("| configuration | images/s | ms / image | load avg (1 min) before / after |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        folder = photo_folder(Path(tmp), args.copies)
        for key in keys:
            before = os.getloadavg()[0]
            seconds, n = measure(key, folder, Path(tmp) / "out", args.workers, args.batch_size)
            after = os.getloadavg()[0]
            print(f"| {ROWS[key][1]} | {n / seconds:.1f} | {1000 * seconds / n:.0f} | {before:.1f} / {after:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
