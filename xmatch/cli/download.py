"""``xmatch download``: a zoo entry's weights fetched into the cache, for offline machines."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``download`` to ``xmatch``'s subcommands."""
    parser = subparsers.add_parser("download", help="prefetch a zoo entry's weights (and its hub tokenizer) into the cache (for offline machines)")
    parser.add_argument("name")
    parser.add_argument("--cache-dir", type=Path, help="cache directory (default: $XMATCH_HOME or ~/.cache/xmatch)")
    return parser


def run(args: argparse.Namespace) -> int:
    """Download and verify the entry's weights, and its tokenizer when the spec names one on the
    Hub (so that an air-gapped machine gets everything); print where each is."""
    from xmatch.core.sources import HF_HUB
    from xmatch.core.zoo import info
    from xmatch.io import hub

    entry = info(args.name)
    print(hub.download_entry(entry, cache_dir=args.cache_dir))
    tokenizer = (entry.spec.get("text_encoder") or {}).get("tokenizer")
    if isinstance(tokenizer, str) and tokenizer.startswith(HF_HUB):
        from xmatch.components.text.clip import TOKENIZER_FILES

        print(hub.fetch_hf_files(tokenizer, list(TOKENIZER_FILES), cache_dir=args.cache_dir))
    return 0
