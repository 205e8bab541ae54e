"""``xmatch convert``: an original TERN/TERAN checkpoint turned into an xmatch bundle, with proof."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``convert`` to ``xmatch``'s subcommands."""
    parser = subparsers.add_parser("convert", help="convert an original TERN/TERAN checkpoint into an xmatch bundle")
    parser.add_argument("checkpoint", type=Path, help="original .pth checkpoint (e.g. model_best.pth)")
    parser.add_argument("output", type=Path, help="bundle directory to write")
    parser.add_argument("--bert", help="BERT tokenizer/config location (default: the checkpoint config's)")
    parser.add_argument(
        "--check", type=Path, metavar="IO_NPZ",
        help="inputs and original outputs (io.npz layout of tests/fixtures/teran-original) to prove the conversion",
    )
    return parser


def run(args: argparse.Namespace) -> int:
    """Convert, save the bundle and, with ``--check``, compare it with the original outputs (1 if they differ)."""
    from xmatch.io.bundle import save_pretrained
    from xmatch.model.factory import build, convert_original

    print(f"reading {args.checkpoint}")
    model = convert_original(args.checkpoint, bert_source=args.bert).eval()
    out = save_pretrained(model, args.output)
    print(f"wrote {out}/ (load with xmatch.build('local-dir:{out}', pretrained=True))")
    if args.check:
        from xmatch.model.convert_check import compare_with_original_outputs

        report = compare_with_original_outputs(build(f"local-dir:{out}", pretrained=True).eval(), args.check)
        print(report.table())
        if not report.ok:
            print("the converted model does NOT reproduce the original outputs", file=sys.stderr)
            return 1
        print("the converted model reproduces the original outputs")
    return 0
