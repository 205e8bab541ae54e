"""``xmatch download``: a zoo entry's weights fetched into the cache, for offline machines."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``download`` to ``xmatch``'s subcommands."""
    parser = subparsers.add_parser("download", help="prefetch a zoo entry's weights into the cache (for offline machines)")
    parser.add_argument("name")
    parser.add_argument("--cache-dir", type=Path, help="cache directory (default: $XMATCH_HOME or ~/.cache/xmatch)")
    return parser


def run(args: argparse.Namespace) -> int:
    """Download and verify the entry's weights; print where they are."""
    from xmatch.io import hub

    print(hub.download_entry(args.name, cache_dir=args.cache_dir))
    return 0
