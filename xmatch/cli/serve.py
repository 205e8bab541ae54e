"""``xmatch serve``: an index behind an HTTP API and a web page (:mod:`xmatch.serve`)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

#: where ``--token`` is read from when not given on the command line (a command line is visible to other users)
TOKEN_VARIABLE = "XMATCH_SERVE_TOKEN"
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``serve`` to ``xmatch``'s subcommands."""
    parser = subparsers.add_parser(
        "serve", help="serve an index: an HTTP API and a web page",
        description="Open the index once and answer HTTP requests with it: text search, search by a picture (a caption "
        "index), thumbnails, region-word alignments, the index's card; a web page at /, the API's schema at /docs. "
        "Needs the extra: pip install 'xmatch-zoo[serve]'.",
    )
    parser.add_argument("index", type=Path, help="index folder made by xmatch index")
    parser.add_argument("--images", type=Path, metavar="DIR", help="the folder the pictures were indexed from (xmatch "
                        "index --images DIR, or a dataset's folder with images/ID.png): thumbnails and alignment "
                        "pictures are read from it, nothing outside it (default: the folder the index records)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, this machine only)")
    parser.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    parser.add_argument("--token", help=f"ask every API request for 'Authorization: Bearer TOKEN' (default: the "
                        f"{TOKEN_VARIABLE} environment variable, else no token)")
    parser.add_argument("--max-k", type=int, default=100, help="most results per query (default: 100)")
    parser.add_argument("--max-rerank", type=int, default=100, help="most hits the verifier re-scores (default: 100)")
    parser.add_argument("--max-query-chars", type=int, default=1000, help="longest text query (default: 1000)")
    parser.add_argument("--max-upload-bytes", type=int, default=10_000_000, help="largest request body, e.g. an "
                        "uploaded picture (default: 10,000,000)")
    parser.add_argument("--max-pixels", type=int, default=50_000_000, help="largest picture decoded, width x height "
                        "from its header (default: 50,000,000)")
    parser.add_argument("--wait", type=float, default=30.0, metavar="SECONDS", help="longest a request waits for the "
                        "index while others use it; then 503 (default: 30)")
    parser.add_argument("--model", help="query with this model (its encoders must be the index's)")
    parser.add_argument("--tokenizer", type=Path, metavar="DIR", help="the text tower's tokenizer from this folder")
    parser.add_argument("--device", help="cpu, cuda, mps (default: cpu)")
    return parser


def run(args: argparse.Namespace) -> int:
    """Open the index and serve it until interrupted."""
    from xmatch.cli.options import indexed_model
    from xmatch.core.optional import require
    from xmatch.serve.app import create_app
    from xmatch.serve.limits import Limits
    from xmatch.serve.service import open_service

    uvicorn = require("uvicorn", "xmatch-zoo[serve]", "xmatch serve")
    require("fastapi", "xmatch-zoo[serve]", "xmatch serve")
    for name in ("max_k", "max_rerank", "max_query_chars", "max_upload_bytes", "max_pixels", "port"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be a whole number >= 1, got {getattr(args, name)}.")
    token = args.token or os.environ.get(TOKEN_VARIABLE) or None
    limits = Limits(args.max_query_chars, args.max_k, args.max_rerank, args.max_upload_bytes, args.max_pixels, args.wait)
    model = indexed_model(args.index, args.model, args.tokenizer, args.device)
    service = open_service(args.index, args.images, limits, model=model, device=args.device)
    if args.host not in LOOPBACK and token is None:
        print(f"xmatch serve: warning: listening on {args.host} without a token: anyone who reaches this address can "
              f"search the index and read its pictures; set --token or {TOKEN_VARIABLE}.", file=sys.stderr)
    recorded = service.index.pictures
    if args.images is None and service.index.side == "images":
        if service.pictures.root is not None:
            print(f"xmatch serve: pictures from {service.pictures.root}, the folder the index records (--images DIR "
                  "reads them from another).", file=sys.stderr)
        elif recorded is not None:
            print(f"xmatch serve: warning: the index records its pictures in {recorded}, which is not a folder (moved "
                  "or removed?): results show ids without pictures; give their folder with --images DIR.", file=sys.stderr)
        else:
            print("xmatch serve: no --images DIR, and the index records no picture folder: results show ids without "
                  "pictures.", file=sys.stderr)
    print(f"xmatch serve: {service.index!r} at http://{args.host}:{args.port}/ (API schema at /docs)", file=sys.stderr)
    try:
        uvicorn.run(create_app(service, token=token), host=args.host, port=args.port, timeout_keep_alive=5,
                    limit_concurrency=256, log_level="warning")
    finally:
        service.close()
    return 0
