"""``xmatch models``: the zoo entries, and which have weights."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``models`` to ``xmatch``'s subcommands."""
    parser = subparsers.add_parser("models", help="list zoo entries and which have weights")
    parser.add_argument("pattern", nargs="?", help="glob filter, e.g. 'teran-*'")
    parser.add_argument("--pretrained", action="store_true",
                        help="only entries with published xmatch weights (build(name, pretrained=True) loads them)")
    return parser


def run(args: argparse.Namespace) -> int:
    """Print the entries matching the pattern: name, whether it has weights, description."""
    from xmatch.core.zoo import info, list_models

    names = list_models(args.pattern, pretrained=args.pretrained)
    if not names:
        what = "zoo entries with weights" if args.pretrained else "zoo entries"
        print(f"no {what} match '{args.pattern}'" if args.pattern else f"no {what}", file=sys.stderr)
        return 0
    width = max(len(name) for name in names)
    print(f"{'name':{width}s}  weights  description")
    for name in names:
        entry = info(name)
        print(f"{name:{width}s}  {'yes' if entry.weights else '-':7s}  {entry.description}")
    return 0
