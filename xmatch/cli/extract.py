"""``xmatch extract``: the command line's arguments turned into one :func:`xmatch.extract.extract` run."""

from __future__ import annotations

import argparse
import logging
import tomllib
from typing import Any


def option_value(text: str) -> Any:
    """A ``KEY=VALUE`` value read as TOML (numbers, booleans, lists, quoted strings), else the text."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def proposer_spec(args: argparse.Namespace) -> dict[str, Any]:
    """The proposer table from ``--proposer``, ``--proposer-option``, ``--regions``, ``--min-regions``."""
    table: dict[str, Any] = {"name": args.proposer}
    for item in args.proposer_option or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--proposer-option {item!r} is not KEY=VALUE.")
        table[key.strip()] = option_value(value)
    if args.regions is not None:
        table["regions"] = args.regions
    if args.min_regions is not None:
        table["min_regions"] = args.min_regions
    return table


def run_extract(args: argparse.Namespace) -> int:
    """Run the extraction the parsed arguments describe and print what to do next."""
    from xmatch.extract.run import extract

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    pipeline = {
        "proposer": proposer_spec(args),
        "backbone": args.backbone,
        "weights": args.weights,
        "pretrained": args.pretrained,
        "image_size": args.image_size,
        "max_size": args.max_size,
    }
    result = extract(
        args.images, args.out, pipeline, layout=args.layout, captions=args.captions, split=args.split,
        dtype=args.dtype, batch_size=args.batch_size, workers=args.workers, device=args.device,
        resume=args.resume, overwrite=args.overwrite, progress=not args.no_progress,
    )
    print(result.summary())
    for name, reason in result.unreadable:
        print(f"  unreadable, left out: {reason}")
    dataset = "teran" if result.layout == "teran" else "scan-precomp"
    print(
        f"read it with the {dataset} dataset (--data {result.out}); a region model needs "
        f"image_encoder.feature_dim = {result.feature_dim}, e.g.\n"
        f"  xmatch train SPEC --data {result.out} --model-set image_encoder.feature_dim={result.feature_dim}"
    )
    counts = set(result.captions_per_image)
    if 0 in counts:
        print("  some images have no captions: xmatch eval / train need captions for every image (--captions FILE)")
    elif counts and counts != {5}:
        option = f"captions_per_image={counts.pop()}" if len(counts) == 1 else "captions_per_image=none"
        print(f"  (not 5 captions per image: add --data-option {option})")
    return 0
