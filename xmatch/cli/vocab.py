"""``xmatch vocab``: a model's unknown words on a caption split, and its text side built from the split
(:mod:`xmatch.data.vocab`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``vocab`` to ``xmatch``'s subcommands."""
    parser = subparsers.add_parser(
        "vocab", help="measure a model's unknown words on a caption split; build its text side from the split",
        description="Prints the unknown-token rate of the split's captions under the model's text side; with "
        "--out, builds the word vocabulary (bigru, bilstm, the plugins' word-level encoders) or the word-level "
        "BERT tokenizer and config (bert with pretrained = false) from the split into DIR.",
    )
    parser.add_argument("model", help="zoo name, spec .toml or local-dir:DIR (the architecture whose text side is built)")
    parser.add_argument("--data", type=Path, help="dataset root folder")
    parser.add_argument("--dataset", help="registered dataset layout (default: the one layout --data looks like)")
    parser.add_argument("--split", default="train", help="the captions to measure and build from (default: train)")
    parser.add_argument("--data-option", action="append", metavar="KEY=VALUE", help="dataset option (repeatable)")
    parser.add_argument("--model-set", action="append", metavar="PATH=VALUE", help="spec override (repeatable)")
    parser.add_argument("--out", type=Path, help="build the text side into this folder")
    parser.add_argument("--min-count", type=int, help="keep words seen this often (default: the encoder's min_count)")
    parser.add_argument("--max-length", type=int,
                        help="longest caption in tokens (BERT: position embeddings; default: measured from the split)")
    return parser


def run(args: argparse.Namespace) -> int:
    """Print the split's unknown-token rate; with ``--out``, build the text side and print how to use it."""
    from xmatch.cli.options import model_overrides, open_data
    from xmatch.core.spec import merge
    from xmatch.data import vocab

    data = open_data(args, args.split, args.data_option)
    overrides = model_overrides(args.model_set or [])
    table = vocab.text_encoder_table(args.model, overrides)
    print(f"{args.model}: text encoder '{table['name']}'; {args.split} split: {len(data.captions):,} captions")
    try:
        coverage = vocab.token_coverage(vocab.build_text_encoder(table), data.captions)
        shown = coverage.summary() if coverage else "no unknown token, not measured"
    except (ValueError, OSError) as exc:  # e.g. a zoo entry that ships no vocabulary
        coverage, shown = None, f"not measurable ({exc})"
    print(f"  under the model's text side: {shown}")
    if args.out is None:
        if coverage is None or coverage.unknown:
            print("build a text side from these captions with --out DIR (or: xmatch train ... --build-text-side)")
        return 0
    side = vocab.build_text_side(
        args.model, data.captions, args.out, min_count=args.min_count, max_length=args.max_length, overrides=overrides
    )
    print(f"built a {side.summary()}")
    built = merge(table, side.spec_overrides["text_encoder"])
    print(f"  under the new text side: {vocab.token_coverage(vocab.build_text_encoder(built), data.captions).summary()}")
    settings = (f"--model-set text_encoder.{k}={str(v).lower() if isinstance(v, bool) else v}"
                for k, v in side.spec_overrides["text_encoder"].items())
    print("use it: " + " ".join(settings))
    return 0
