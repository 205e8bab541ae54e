"""``xmatch extract``: region features of a folder of images, one :func:`xmatch.extract.extract` run."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from xmatch.regions.config import RoIConfig

#: default of the RoI flags: left out, a setting takes RoIConfig's default (None is a value: "none")
_UNSET: Any = object()
ROI_FLAGS = ("backbone", "weights", "image_size", "max_size", "output_stride", "mode", "crop_size", "crop_regions", "compute_dtype")


def _int_or_none(text: str) -> int | None:
    """``--image-size`` / ``--output-stride``: an integer, or ``none`` (the backbone's own)."""
    if text.strip().lower() == "none":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or 'none', got {text!r}") from None


def _seconds(text: str) -> float:
    """``--progress-every``: a number of seconds, 0 or more."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:
        raise argparse.ArgumentTypeError(f"expected 0 seconds or more, got {text!r}")
    return seconds


def proposer_names() -> list[str]:
    """The proposers ``--proposer`` takes, as the ``proposers`` registry lists them without
    importing any (xmatch's own and the installed plugins' entry points): parsing the
    command line must not import torch.

    Example:
        >>> "selective-search" in proposer_names()
        True
    """
    from xmatch.core.registry import proposers

    return proposers.declared_names()


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``extract`` to ``xmatch``'s subcommands."""
    from xmatch.io.pictures import MAX_BATCH_PIXELS, MAX_PIXELS
    from xmatch.regions.config import RoIConfig

    parser = subparsers.add_parser(
        "extract", help="region features of a folder of images (proposer + timm backbone + RoI-align), for region models",
        description="Writes the TERAN bottom-up layout (bu_att/, bu_box/, dataset_xmatch.json) or the SCAN precomp "
        "layout, plus extract.json; read it back with --data OUT. See docs/extract.md.",
    )
    parser.add_argument("images", type=Path, help="the image folder (searched recursively)")
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument("--layout", default="teran", choices=["teran", "precomp"], help="teran (default) or precomp")
    parser.add_argument("--captions", type=Path,
                        help="Karpathy / COCO JSON, CSV or JSONL captions (default: dataset_*.json, <split>.csv or "
                        "captions.csv in the image folder; none: features only)")
    parser.add_argument("--split", default="test", help="split of images whose captions name none (default: test)")
    parser.add_argument("--allow-outside-root", action="store_true",
                        help="read images the captions file places outside the image folder (absolute paths, '..', "
                        "symbolic links out of it); only for a captions file you trust")
    parser.add_argument("--max-pixels", type=int, default=MAX_PIXELS,
                        help=f"largest picture decoded, width x height from its header (default: {MAX_PIXELS:,}); "
                        "a larger one is left out and listed")
    parser.add_argument("--max-batch-pixels", type=int, default=MAX_BATCH_PIXELS,
                        help=f"decoded pixels a batch keeps at once for a proposer that looks at pixels (default: "
                        f"{MAX_BATCH_PIXELS:,}); a batch over it runs in parts")
    proposers = ", ".join(f"{name} (default)" if name == "windows" else name for name in proposer_names())
    parser.add_argument("--proposer", default="windows",
                        help=f"{proposers}; a plugin adds its own (entry-point group xmatch_proposers)")
    parser.add_argument("--proposer-option", action="append", metavar="KEY=VALUE",
                        help="proposer argument, e.g. source=boxes.json (boxes), backbone=fasterrcnn_resnet50_fpn_v2 or weights=none (torchvision-detector) (repeatable)")
    parser.add_argument("--regions", type=int, help="boxes per image (default: the proposer's, 36)")
    parser.add_argument("--min-regions", type=int, help="boxes, detector: pad to at least this many (default: --regions)")
    # no defaults here: a flag left out takes RoIConfig's, the one place they are written
    parser.add_argument("--backbone", help=f"timm model (default: {RoIConfig.backbone})")
    parser.add_argument("--weights",
                        help="auto (packaged offline weights: EfficientNet-Lite0/1/2), a .safetensors / .pth file, or random")
    parser.add_argument("--pretrained", action="store_true", help="timm's hub weights instead (needs the network or its cache)")
    parser.add_argument("--image-size", type=_int_or_none,
                        help=f"shorter side fed to the backbone (default: {RoIConfig.image_size}; none: the backbone's pretrained input "
                        "size, which a ViT needs)")
    parser.add_argument("--max-size", type=int, help="longest side fed to the backbone (default: 2 x --image-size)")
    parser.add_argument("--output-stride", type=_int_or_none, choices=[8, 16, 32, None], metavar="{8,16,32,none}",
                        help=f"stride of the feature map (default: {RoIConfig.output_stride}, the last stages dilated; none: the backbone's own, "
                        "which a ViT needs)")
    parser.add_argument("--mode", choices=["roi", "crop", "mixed"],
                        help="roi (default): pool the picture's map over each box; crop: encode each box cut out and resized; "
                        "mixed: crop the proposer's first --crop-regions boxes, pool the others")
    parser.add_argument("--crop-size", type=int, help=f"side of a crop in --mode crop / mixed (default: {RoIConfig.crop_size})")
    parser.add_argument("--crop-regions", type=int,
                        help=f"boxes cropped per picture in --mode mixed, the proposer's first (default: {RoIConfig.crop_regions})")
    parser.add_argument("--compute-dtype", choices=["float32", "bfloat16"],
                        help=f"the backbone's arithmetic (default: {RoIConfig.compute_dtype}); bfloat16 runs 1.5-2x faster on a CPU "
                        "with AVX512-BF16 / AMX, with features that differ slightly (see docs/extract.md)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16"], help="features on disk")
    parser.add_argument("--batch-size", type=int, default=8, help="images per backbone run and per resumable chunk (default: 8)")
    parser.add_argument("--workers", type=int,
                        help="DataLoader processes decoding images (default: none on a machine of 2 cores or fewer, "
                        "where they only compete with the backbone, else 2)")
    parser.set_defaults(**dict.fromkeys(ROI_FLAGS, _UNSET))
    parser.add_argument("--device", help="cpu, cuda, mps (default: CUDA when available; torchrun: one GPU per process)")
    parser.add_argument("--ray", nargs="?", const="local", metavar="ADDRESS",
                        help="compute the chunks on a Ray cluster's workers, each holding the pipeline once "
                        "(pip install 'xmatch-zoo[ray]'): without ADDRESS a local one is started (or the one RAY_ADDRESS "
                        "names joined), else the one at ADDRESS (auto, HOST:6379); the same files as one process. See "
                        "docs/scale.md")
    parser.add_argument("--ray-workers", type=int, metavar="N",
                        help="with --ray: Ray workers (default: one per CPU of the cluster); the CPUs are divided among "
                        "them as torch threads")
    parser.add_argument("--resume", action="store_true", help="continue the extraction in --out (finished images are skipped)")
    parser.add_argument("--overwrite", action="store_true", help="remove the extraction in --out first")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (nor progress lines)")
    parser.add_argument("--progress-every", type=_seconds, metavar="SECONDS",
                        help="where stderr is not a terminal (a log), a progress line every SECONDS: images done / "
                        "total, images/s, time left (default: $XMATCH_PROGRESS_EVERY, else 60)")
    return parser


def proposer_spec(args: argparse.Namespace) -> dict[str, Any]:
    """The proposer table from ``--proposer``, ``--proposer-option``, ``--regions``, ``--min-regions``."""
    from xmatch.cli.options import toml_value

    table: dict[str, Any] = {"name": args.proposer}
    for item in args.proposer_option or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--proposer-option {item!r} is not KEY=VALUE.")
        table[key.strip()] = toml_value(value)
    if args.regions is not None:
        table["regions"] = args.regions
    if args.min_regions is not None:
        table["min_regions"] = args.min_regions
    return table


def roi_config(args: argparse.Namespace) -> RoIConfig:
    """The RoI settings from ``--backbone``, ``--weights``, ``--pretrained``, ``--image-size``,
    ``--max-size``, ``--output-stride``, ``--mode``, ``--crop-size``, ``--crop-regions``, ``--compute-dtype``; a flag left out takes
    :class:`~xmatch.regions.config.RoIConfig`'s default (``none`` given to ``--image-size`` or
    ``--output-stride`` is kept: the backbone's own)."""
    from xmatch.regions.config import RoIConfig

    given = {name: getattr(args, name) for name in ROI_FLAGS}
    return RoIConfig(pretrained=args.pretrained, **{k: v for k, v in given.items() if v is not _UNSET})


def run(args: argparse.Namespace) -> int:
    """Run the extraction the arguments describe and print what to do next."""
    from xmatch.core.memory import keep_freed_memory
    from xmatch.extract.run import extract
    from xmatch.regions.pipeline import RegionPipeline

    # the backbone's large blocks reused picture after picture, not mapped and zeroed anew by the kernel
    keep_freed_memory()
    pipeline = RegionPipeline(proposer_spec(args), roi_config(args))
    result = extract(
        args.images, args.out, pipeline, layout=args.layout, captions=args.captions, split=args.split,
        dtype=args.dtype, batch_size=args.batch_size, workers=args.workers, device=args.device,
        resume=args.resume, overwrite=args.overwrite, progress=not args.no_progress, progress_every=args.progress_every,
        allow_outside_root=args.allow_outside_root, max_pixels=args.max_pixels, max_batch_pixels=args.max_batch_pixels,
        ray=args.ray, ray_workers=args.ray_workers,
    )
    print(result.summary())
    for name, reason in result.unreadable:
        print(f"  left out: {reason}")
    dataset = "teran" if result.layout == "teran" else "scan-precomp"
    print(
        f"read it with the {dataset} dataset (--data {result.out}); a region model needs "
        f"image_encoder.feature_dim = {result.feature_dim}, e.g.\n"
        f"  xmatch train SPEC --data {result.out} --model-set image_encoder.feature_dim={result.feature_dim}"
    )
    counts = set(result.captions_per_image)
    if 0 in counts:
        print("  some images have no captions: xmatch eval / train need captions for every image (--captions FILE); "
              f"xmatch index MODEL --data {args.out} --out INDEX indexes the images for text search without them")
    elif counts and counts != {5}:
        option = f"captions_per_image={counts.pop()}" if len(counts) == 1 else "captions_per_image=none"
        print(f"  (not 5 captions per image: add --data-option {option})")
    return 0
