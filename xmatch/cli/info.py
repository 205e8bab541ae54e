"""``xmatch info``: a zoo entry's card, or its spec as TOML."""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``info`` to ``xmatch``'s subcommands."""
    parser = subparsers.add_parser("info", help="show a zoo entry's card")
    parser.add_argument("name")
    parser.add_argument("--spec", action="store_true",
                        help="print the entry's spec as TOML instead of its card (xmatch info NAME --spec > my.toml)")
    return parser


def run(args: argparse.Namespace) -> int:
    """Print the entry's card (or, with ``--spec``, its spec as a TOML document)."""
    import tomli_w

    from xmatch.core.zoo import info

    entry = info(args.name)
    # --spec alone: a TOML document to redirect into a spec file, nothing else
    print(tomli_w.dumps(entry.spec) if args.spec else entry.card(), end="" if args.spec else "\n")
    return 0
