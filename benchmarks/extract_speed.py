"""Throughput of ``xmatch extract`` (images per second) on this machine.

A folder of real photos (scikit-image's ``astronaut``, ``coffee``, ``chelsea``, ``rocket``,
``hubble_deep_field``, ``immunohistochemistry``: 300 x 451 to 872 x 1000 pixels, JPEG) is
copied ``--copies`` times; every configuration extracts it into a fresh folder with the
pipeline built beforehand, so the time is decoding, resizing, proposing, the backbone, RoI
pooling and writing -- what grows with the number of images. The load average is printed
with each row: the figures are only comparable on an otherwise idle machine.

``--compare`` times variants of each row in one process, interleaved (one extraction of each
variant per round, the order rotated every round; the best round of each is kept), so a
loaded machine slows them alike: ``today`` (the extractor of before 2026-11-27: the backbone
as loaded, batch norms unfolded, float32, its files at zlib's default level 6),
``float32`` (the extractor as it is) and
``bfloat16`` (``compute_dtype="bfloat16"``); ``NAME@W`` runs a variant with ``W`` decoding
workers. ``--differences`` prints how far the bfloat16 (and the folded float32) features of
the photos' boxes are from today's float32 ones. ``--index-clip`` times ``xmatch index
--images`` on the same photos with a CLIP ViT-B/32 image tower of random weights (the
``clip-vit-b-32`` zoo layout; a one-layer text tower with a byte tokenizer written offline)
with ``--compute-dtype float32`` and ``bfloat16``, interleaved. ``--across-rows`` times the
rows against each other in the same way and gives each row's CPU time per picture as a
multiple of the first row's; ``--images DIR`` times the first ``--limit`` pictures of a folder
(a generated world's, say) instead of the photos.

Usage:
    OMP_NUM_THREADS=1 python benchmarks/extract_speed.py --threads 1
    OMP_NUM_THREADS=2 python benchmarks/extract_speed.py --threads 2 --rows windows-lite0
    OMP_NUM_THREADS=1 python benchmarks/extract_speed.py --threads 1 --copies 4 --rounds 3 --compare \\
        --rows windows-lite0,windows-lite0-600-s16 --variants today,float32,bfloat16
    OMP_NUM_THREADS=1 python benchmarks/extract_speed.py --threads 1 --differences --rows windows-lite0-600-s16
    OMP_NUM_THREADS=1 python benchmarks/extract_speed.py --threads 1 --copies 4 --rounds 3 --index-clip
    OMP_NUM_THREADS=1 python benchmarks/extract_speed.py --threads 1 --workers 0 --rounds 3 --across-rows \\
        --images ~/.cache/xmatch/datasets/signs/signs-small-256px-seed0-v1/images \\
        --rows windows-lite0,windows-lite0-600-s16,windows-lite0-crop-s16
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
AT_224 = {"image_size": 224, "output_stride": 32, "mode": "roi"}
#: xmatch extract's defaults, pinned (rows keep their meaning if the defaults change): 600 px, stride 16, pooled
AT_600 = {"image_size": 600, "output_stride": 16, "mode": "roi"}
#: selective search as its rows were first measured (segmented at 224 px, its default)
SS_224 = {"name": "selective-search", "segment_side": 224}


def mixed_row(crops: int, crop_size: int, stride: int, segment_side: int = 160) -> tuple[dict, str]:
    """A ``--mode mixed`` row: selective-search boxes (segmented at ``segment_side`` px), the first
    ``crops`` cropped at ``crop_size`` px, the rest pooled from the 224-px map of the given stride."""
    roi = {"image_size": 224, "output_stride": stride, "mode": "mixed", "crop_regions": crops, "crop_size": crop_size}
    return ({"proposer": {"name": "selective-search", "segment_side": segment_side}, "roi": roi},
            f"selective-search 36 (segmented at {segment_side} px), the first {crops} cropped at {crop_size} px, the rest pooled "
            f"at 224, stride {stride}")


#: name -> (pipeline table, as RegionPipeline.from_table reads it; what the row is)
ROWS = {
    "grid-lite0": ({"proposer": "grid", "roi": AT_224}, "grid 6x6, EfficientNet-Lite0, shorter side 224, stride 32"),
    "windows-lite0": ({"proposer": "windows", "roi": AT_224}, "windows 36, EfficientNet-Lite0, shorter side 224, stride 32"),
    "windows-lite0-448": (
        {"proposer": "windows", "roi": {"image_size": 448, "output_stride": 32, "mode": "roi"}},
        "windows 36, EfficientNet-Lite0, shorter side 448, stride 32",
    ),
    "windows-lite0-600-s16": (
        {"proposer": "windows", "roi": AT_600},
        "windows 36, EfficientNet-Lite0, shorter side 600, stride 16 (the defaults)",
    ),
    "windows-lite0-crop-s16": (
        {"proposer": "windows", "roi": {"image_size": 600, "output_stride": 16, "mode": "crop"}},
        "windows 36, EfficientNet-Lite0, crops of 96 px from the picture at 600, stride 16",
    ),
    "windows-lite0-crop-s32": (
        {"proposer": "windows", "roi": {"image_size": 600, "output_stride": 32, "mode": "crop"}},
        "windows 36, EfficientNet-Lite0, crops of 96 px from the picture at 600, stride 32",
    ),
    "selective-search-224": (
        {"proposer": SS_224, "roi": AT_224},
        "selective-search 36, EfficientNet-Lite0, shorter side 224, stride 32",
    ),
    "selective-search-224-s16": (
        {"proposer": SS_224, "roi": {"image_size": 224, "output_stride": 16, "mode": "roi"}},
        "selective-search 36, EfficientNet-Lite0, shorter side 224, stride 16",
    ),
    "windows-lite0-224-s16": (
        {"proposer": "windows", "roi": {"image_size": 224, "output_stride": 16, "mode": "roi"}},
        "windows 36, EfficientNet-Lite0, shorter side 224, stride 16",
    ),
    "selective-search-crop-s16": (
        {"proposer": SS_224, "roi": {"image_size": 600, "output_stride": 16, "mode": "crop"}},
        "selective-search 36, EfficientNet-Lite0, crops of 96 px from the picture at 600, stride 16",
    ),
    "selective-search-crop": (
        {"proposer": SS_224, "roi": {"image_size": 600, "output_stride": 32, "mode": "crop"}},
        "selective-search 36, EfficientNet-Lite0, crops of 96 px from the picture at 600",
    ),
    "selective-search-160-224-s16": (
        {"proposer": {"name": "selective-search", "segment_side": 160}, "roi": {"image_size": 224, "output_stride": 16, "mode": "roi"}},
        "selective-search 36 (segmented at 160 px), EfficientNet-Lite0, shorter side 224, stride 16",
    ),
    **{f"selective-search-160-mixed{n}{'' if size == 96 else f'-{size}'}-s{stride}": mixed_row(n, size, stride)
       for n, size, stride in ((8, 96, 16), (8, 96, 32), (12, 96, 16), (12, 64, 16), (16, 96, 16), (16, 64, 16))},
    "selective-search-256-mixed16-s16": mixed_row(16, 96, 16, segment_side=256),
    "selective-search-256-crop-s16": (
        {"proposer": {"name": "selective-search", "segment_side": 256}, "roi": {"image_size": 600, "output_stride": 16, "mode": "crop"}},
        "selective-search 36 (segmented at 256 px), EfficientNet-Lite0, crops of 96 px from the picture at 600, stride 16",
    ),
    "windows-lite2": (
        {"proposer": "windows", "roi": {"backbone": "efficientnet_lite2", "image_size": None, "output_stride": 32, "mode": "roi"}},
        "windows 36, EfficientNet-Lite2, shorter side 260 (256), stride 32",
    ),
    # random weights (nothing is downloaded here): the network runs in full, but hardly any box
    # passes the 0.2 threshold, so the per-class NMS of a trained detector's boxes is not timed
    "detector-mobilenet": (
        {"proposer": {"name": "torchvision-detector", "backbone": "fasterrcnn_mobilenet_v3_large_fpn", "weights": None},
         "roi": AT_600},
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


def variant_pipeline(key: str, variant: str):  # -> RegionPipeline
    """Row ``key``'s pipeline as ``variant`` (``today``, ``float32``, ``bfloat16``) computes it."""
    import torch

    from xmatch.regions import RegionPipeline
    from xmatch.regions.features import load_backbone

    table = ROWS[key][0]
    if variant == "bfloat16":
        table = {**table, "roi": {**table.get("roi", {}), "compute_dtype": "bfloat16"}}
    elif variant not in ("today", "float32"):
        raise SystemExit(f"unknown variant {variant!r}: today, float32, bfloat16 (optionally @WORKERS)")
    pipeline = RegionPipeline.from_table(table)
    if variant == "today":  # the extractor before the folding: the backbone as loaded, float32
        extractor = pipeline.extractor
        extractor.backbone = load_backbone(extractor.roi).eval().requires_grad_(False).to(memory_format=torch.channels_last)
    return pipeline


def compare(keys: list[str], variants: list[str], folder: Path, out: Path, workers: int, batch_size: int, rounds: int) -> None:
    """Extract each row with each variant once per round, the order rotated; print the best round of each."""
    from xmatch.extract import extract, writers

    level = writers.NPZ_LEVEL
    for key in keys:
        pipelines, workers_of = {}, {}
        for variant in variants:
            name, _, w = variant.partition("@")
            pipelines[variant] = variant_pipeline(key, name)
            workers_of[variant] = int(w) if w else workers
            extract(folder, out / "warm-up", pipelines[variant], workers=0, batch_size=batch_size, progress=False)
            shutil.rmtree(out / "warm-up")
        best = dict.fromkeys(variants, float("inf"))
        loads = []
        for r in range(rounds):
            order = variants[r % len(variants):] + variants[: r % len(variants)]
            for variant in order:
                loads.append(os.getloadavg()[0])
                writers.NPZ_LEVEL = 6 if variant.partition("@")[0] == "today" else level
                start = time.perf_counter()
                result = extract(folder, out / "x", pipelines[variant], workers=workers_of[variant], batch_size=batch_size,
                                 progress=False)
                best[variant] = min(best[variant], (time.perf_counter() - start) / result.images)
                shutil.rmtree(out / "x")
        writers.NPZ_LEVEL = level
        for variant in variants:
            speedup = f"{best[variants[0]] / best[variant]:.2f}x"
            print(f"| {ROWS[key][1]} | {variant} (workers {workers_of[variant]}) | {1 / best[variant]:.2f} | "
                  f"{1000 * best[variant]:.0f} | {speedup} | {min(loads):.1f}-{max(loads):.1f} |", flush=True)


def across_rows(keys: list[str], folder: Path, out: Path, workers: int, batch_size: int, rounds: int) -> None:
    """Extract with each row once per round, the order rotated; print the best round of each and
    its CPU time against the first row's (both measured in the same rounds)."""
    from xmatch.extract import extract
    from xmatch.regions import RegionPipeline

    pipelines = {key: RegionPipeline.from_table(ROWS[key][0]) for key in keys}
    for key in keys:
        extract(folder, out / "warm-up", pipelines[key], workers=0, batch_size=batch_size, progress=False)
        shutil.rmtree(out / "warm-up")
    best, cpu, loads = dict.fromkeys(keys, float("inf")), dict.fromkeys(keys, float("inf")), []
    for r in range(rounds):
        for key in keys[r % len(keys):] + keys[: r % len(keys)]:
            loads.append(os.getloadavg()[0])
            start, start_cpu = time.perf_counter(), time.process_time()
            result = extract(folder, out / "x", pipelines[key], workers=workers, batch_size=batch_size, progress=False)
            best[key] = min(best[key], (time.perf_counter() - start) / result.images)
            cpu[key] = min(cpu[key], (time.process_time() - start_cpu) / result.images)
            shutil.rmtree(out / "x")
    for key in keys:
        print(f"| {ROWS[key][1]} | {1 / best[key]:.2f} | {1000 * best[key]:.0f} | {1000 * cpu[key]:.0f} | "
              f"{cpu[key] / cpu[keys[0]]:.2f}x | {min(loads):.1f}-{max(loads):.1f} |", flush=True)


def picture_folder(root: Path, source: Path, limit: int) -> Path:
    """The first ``limit`` pictures of ``source`` (by name), copied."""
    folder = root / "pictures"
    folder.mkdir(parents=True)
    pictures = sorted(p for p in source.iterdir() if p.suffix.lower() in (".png", ".jpg", ".jpeg"))[:limit]
    if not pictures:
        raise SystemExit(f"{source} holds no .png / .jpg pictures.")
    for p in pictures:
        shutil.copy(p, folder / p.name)
    return folder


def differences(keys: list[str], folder: Path) -> None:
    """How far the folded float32 and the bfloat16 features of the photos' boxes are from today's."""
    import torch

    files = sorted(folder.glob("*-000.jpg"))
    for key in keys:
        feats = {v: torch.cat([r.features for r in variant_pipeline(key, v).regions_of(files)])
                 for v in ("today", "float32", "bfloat16")}
        ref = feats["today"]
        for variant in ("float32", "bfloat16"):
            got = feats[variant]
            rel = (got - ref).norm(dim=1) / ref.norm(dim=1)
            cos = torch.nn.functional.cosine_similarity(got, ref)
            # a retrieval proxy: does every box keep its nearest neighbour among the other boxes?
            same = (nearest_other(got) == nearest_other(ref)).float().mean()
            print(f"| {ROWS[key][1]} | {variant} vs today | {len(ref)} | {rel.max():.2e} / {rel.mean():.2e} | "
                  f"{(got - ref).abs().max() / ref.abs().max():.2e} | {cos.min():.5f} / {cos.mean():.5f} | {100 * same:.1f} % |",
                  flush=True)


def nearest_other(features):  # -> torch.Tensor
    """For each row, the index of the row of highest cosine among the others."""
    import torch

    x = torch.nn.functional.normalize(features, dim=1)
    return (x @ x.T).fill_diagonal_(-2).argmax(dim=1)


def write_byte_tokenizer(directory: Path) -> Path:
    """A CLIP-style byte-level BPE tokenizer with no merges (every text spelt byte by byte), offline."""
    from tokenizers import pre_tokenizers
    from transformers import CLIPTokenizer

    symbols = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {s: i for i, s in enumerate(symbols + [s + "</w>" for s in symbols] + ["<|startoftext|>", "<|endoftext|>"])}
    CLIPTokenizer(vocab=vocab, merges=[]).save_pretrained(directory)
    return directory


def index_clip(folder: Path, out: Path, rounds: int) -> None:
    """``xmatch index local-dir:CLIP --images folder`` (the CLI in this process) with
    ``--compute-dtype float32`` and ``bfloat16``, interleaved; the best round of each, and the
    model loading alone (part of every CLI run)."""
    import torch

    import xmatch
    from xmatch.cli.main import main as cli

    torch.manual_seed(0)
    text = {"width": 64, "layers": 1, "heads": 2, "ff_dim": 128, "projection_dim": 512, "vocab_size": 514,
            "eos_token_id": 513, "tokenizer": str(write_byte_tokenizer(out / "tokenizer"))}
    model = xmatch.build("clip-vit-b-32", text_encoder=text).eval()  # the image tower at its full ViT-B/32 size
    xmatch.save_pretrained(model, out / "clip")
    n = len(list(folder.glob("*.jpg")))
    dtypes = ("float32", "bfloat16")
    best, loads, loading = dict.fromkeys(dtypes, float("inf")), [], float("inf")
    for r in range(rounds + 1):  # round 0 warms up
        for name in dtypes[r % 2:] + dtypes[: r % 2]:
            loads.append(os.getloadavg()[0])
            start = time.perf_counter()
            code = cli(["index", f"local-dir:{out / 'clip'}", "--images", str(folder), "--out", str(out / "idx"),
                        "--compute-dtype", name, "--no-progress"])
            seconds = time.perf_counter() - start
            if code != 0:
                raise SystemExit(f"xmatch index failed with code {code}")
            shutil.rmtree(out / "idx")
            best[name] = min(best[name], seconds) if r else best[name]
        start = time.perf_counter()
        xmatch.build(f"local-dir:{out / 'clip'}")
        loading = min(loading, time.perf_counter() - start)
    for name in dtypes:
        print(f"| xmatch index --images, CLIP ViT-B/32 image tower (random weights), 224 px, batch 64, --compute-dtype {name} | "
              f"{n / best[name]:.2f} | {1000 * best[name] / n:.0f} | {n / (best[name] - loading):.2f} | "
              f"{best['float32'] / best[name]:.2f}x | {min(loads):.1f}-{max(loads):.1f} |", flush=True)
    print(f"(loading the model alone: {loading:.2f} s of each run)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--copies", type=int, default=8, help="copies of each of the 6 photos (default 8: 48 images)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (set OMP_NUM_THREADS to match)")
    parser.add_argument("--workers", type=int, default=1, help="DataLoader workers decoding images")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--rows", help="comma-separated rows (default: all): " + ", ".join(ROWS))
    parser.add_argument("--compare", action="store_true", help="time --variants of each row, interleaved")
    parser.add_argument("--variants", default="today,float32,bfloat16",
                        help="with --compare: today, float32, bfloat16, each optionally @WORKERS (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=3, help="with --compare / --index-clip: rounds, the best kept")
    parser.add_argument("--differences", action="store_true", help="float32 (folded) and bfloat16 features against today's")
    parser.add_argument("--across-rows", action="store_true",
                        help="time the --rows against each other, interleaved; CPU time as a multiple of the first row's")
    parser.add_argument("--images", type=Path, help="time these pictures (a folder; its first --limit) instead of the photos")
    parser.add_argument("--limit", type=int, default=48, help="with --images: how many pictures (default 48)")
    parser.add_argument("--index-clip", action="store_true", help="time xmatch index --images with a CLIP ViT-B/32 tower")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    keys = args.rows.split(",") if args.rows else list(ROWS)
    print(f"{os.cpu_count()} CPU cores, {args.threads} torch thread(s), {args.workers} loader worker(s), no GPU used")
    with tempfile.TemporaryDirectory() as tmp:
        folder = picture_folder(Path(tmp), args.images, args.limit) if args.images else photo_folder(Path(tmp), args.copies)
        out = Path(tmp) / "out"
        out.mkdir()
        if args.differences:
            print("| configuration | features | boxes | relative L2 difference, max / mean | max abs difference / max abs | "
                  "cosine, min / mean | same nearest box |")
            print("|---|---|---|---|---|---|---|")
            differences(keys, folder)
        if args.compare:
            print(f"| configuration | variant | images/s (best of {args.rounds}) | ms / image | speed-up | load avg (1 min) |")
            print("|---|---|---|---|---|---|")
            compare(keys, args.variants.split(","), folder, out, args.workers, args.batch_size, args.rounds)
        if args.index_clip:
            print(f"| configuration | images/s (best of {args.rounds}) | ms / image | images/s without the model loading | "
                  "speed-up | load avg (1 min) |")
            print("|---|---|---|---|---|---|")
            index_clip(folder, out, args.rounds)
        if args.across_rows:
            print(f"| configuration | images/s (best of {args.rounds}) | ms / image | CPU ms / image | CPU vs the first row | "
                  "load avg (1 min) |")
            print("|---|---|---|---|---|---|")
            across_rows(keys, folder, out, args.workers, args.batch_size, args.rounds)
        if args.differences or args.compare or args.index_clip or args.across_rows:
            return 0
        print("| configuration | images/s | ms / image | load avg (1 min) before / after |")
        print("|---|---|---|---|")
        for key in keys:
            before = os.getloadavg()[0]
            seconds, n = measure(key, folder, out, args.workers, args.batch_size)
            after = os.getloadavg()[0]
            print(f"| {ROWS[key][1]} | {n / seconds:.1f} | {1000 * seconds / n:.0f} | {before:.1f} / {after:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
