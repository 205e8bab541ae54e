"""``xmatch demo``: TERAN end to end on the built-in scenes benchmark, offline (:mod:`xmatch.demo`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``demo`` to ``xmatch``'s subcommands."""
    parser = subparsers.add_parser(
        "demo", help="TERAN end to end on the built-in scenes benchmark, offline",
        description="Prepare the scenes data (cached), load the demo model, evaluate it, print ranked "
        "queries, and draw a region-word alignment and a retrieval grid into --out.",
    )
    parser.add_argument("--model", default="teran-mrsw-scenes",
                        help="a model with weights: zoo entry (xmatch models --pretrained), local-dir:DIR or hf-hub:ORG/NAME; "
                        "with --train any buildable model, a spec .toml included (default: teran-mrsw-scenes)")
    parser.add_argument("--size", default="small", help="scenes preset: tiny, small (default), large")
    parser.add_argument("--train", action="store_true", help="train the model from scratch with the shipped recipe instead (offline for "
                        "the scenes entries' specs; a text encoder that starts from a hub backbone needs the network)")
    parser.add_argument("--out", type=Path, default=Path("demo-out"),
                        help="output folder (default: demo-out); outputs move in only when finished, so a failed demo "
                        "leaves it as it was")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    return parser


def run(args: argparse.Namespace) -> int:
    """Run the demo, printing its report as it goes."""
    from xmatch.demo import run_demo

    run_demo(args.model, size=args.size, out=args.out, train=args.train, progress=not args.no_progress,
             report=_say)
    return 0


def _say(line: str) -> None:
    print(line, flush=True)  # flushed: the report interleaves with the progress bars on stderr
