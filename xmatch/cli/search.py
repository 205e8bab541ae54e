"""``xmatch search``: query a search index made by ``xmatch index`` with captions or images
(:mod:`xmatch.index`)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``search`` to ``xmatch``'s subcommands."""
    parser = subparsers.add_parser(
        "search", help="query a search index with captions or images",
        description="Two-stage search: stage 1 proposes candidates, stage 2 scores them exactly with the "
        "model's pooler; with --rerank K a third stage re-scores the top K with the model's verifier head. "
        "Prints the ranked ids and scores and the time per query of each stage (or JSON).",
    )
    parser.add_argument("index", type=Path, help="index folder made by xmatch index")
    parser.add_argument("--text", action="append", metavar="CAPTION", help="a text query (repeatable)")
    parser.add_argument("--image", action="append", type=Path, metavar="PATH", help="an image query, for models that read pixels (repeatable)")
    parser.add_argument("--max-pixels", type=int, metavar="N", help="largest --image query decoded, width x height from "
                        "its header (default: 50,000,000); a larger one is refused before it is decoded")
    parser.add_argument("-k", "--top-k", dest="k", type=int, default=10, help="results per query (default: 10; past the index's size: every item)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--exact", action="store_true", help="score every item (no stage 1)")
    parser.add_argument("--effort", type=float,
                        help="work spent for recall (default: 1; 2 spends about twice as much at most, 0.5 half): "
                        "large token indexes widen each query's search until its top-k is settled, up to a cap "
                        "that scales with it")
    parser.add_argument("--candidates", type=int,
                        help="expert setting in place of --effort: items scored exactly per query, no widening "
                        "(default: 100 or 10 k; a provable search starts at 2 k and grows until proven)")
    parser.add_argument("--stage1", help="candidate generator: tokens, pooled, fde (faiss); maxsim, pooled (qdrant)")
    parser.add_argument("--nprobe", type=int, help="expert setting in place of --effort: centroid lists visited per "
                        "query token (token indexes past 65,536 tokens), no widening (default 8)")
    parser.add_argument("--model", help="query with this model (its encoders must be the index's; e.g. another pooler's entry)")
    parser.add_argument("--cascade", type=Path, metavar="INDEX", help="shortlist with this index's model (e.g. TERN), then "
                        "re-rank with INDEX's (e.g. TERAN)")
    parser.add_argument("--shortlist", type=int, default=200, help="items the cascade hands on per query (default: 200)")
    parser.add_argument("--rerank", type=int, metavar="K", help="third stage: re-score the pooler's top K with the model's "
                        "verifier head and return them first, in its order (a model with a verifier)")
    parser.add_argument("--rerank-batch", type=int, default=256, metavar="N",
                        help="(query, item) pairs per verifier call (default: 256)")
    parser.add_argument("--verify", action="store_true", help="check every stored file's checksum first")
    parser.add_argument("--tokenizer", type=Path, metavar="DIR", help="the text tower's tokenizer from this folder (what a "
                        "tokenizer's save_pretrained writes) instead of the model's own source, e.g. the Hub's")
    parser.add_argument("--device", help="cpu, cuda, mps (default: cpu)")
    return parser


def _warn_unknown_words(index: Any, texts: list[str]) -> None:
    """Tell on stderr which words of each query the model's text side does not know (it reads
    them all as one unknown token, so they cannot steer the ranking): the check `train` and
    `eval` make on captions, per query."""
    from xmatch.data.vocab import token_coverage

    for text in texts:
        coverage = token_coverage(index.model, [text])
        if coverage is None or not coverage.unknown:
            continue
        words = ", ".join(repr(w) for w, _ in coverage.unknown_words) or "some word pieces"
        if coverage.all_unknown:
            print(f"xmatch search: no word of {text!r} is known to the model's text side ({words}): its ranking "
                  "says nothing about the query. Use a model trained on such words (xmatch models).", file=sys.stderr)
        else:
            print(f"xmatch search: {coverage.unknown} of the {coverage.tokens} words of {text!r} are unknown to the "
                  f"model's text side ({words}) and do not steer the ranking.", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    """Search the index (or the cascade) and print the ranked ids and scores, or JSON."""
    from xmatch.cli.options import indexed_model
    from xmatch.index import Cascade
    from xmatch.index import open as open_index

    if bool(args.text) == bool(args.image):
        print("xmatch search: give the queries as --text CAPTION or --image PATH (one kind).", file=sys.stderr)
        return 2
    index = open_index(args.index, indexed_model(args.index, args.model, args.tokenizer, args.device), device=args.device)
    try:
        if args.verify:
            index.verify()
        options = {key: getattr(args, key) for key in ("effort", "candidates", "stage1", "nprobe")
                   if getattr(args, key) is not None}
        options["exact"] = args.exact
        searcher: Any = index
        if args.cascade:
            searcher = Cascade(open_index(args.cascade, device=args.device), index, shortlist=args.shortlist)
        verifier = {"rerank": args.rerank, "rerank_batch": args.rerank_batch} if args.rerank is not None else {}
        if args.rerank is not None and getattr(index.model, "verifier", None) is not None:
            _warn_unvalidated_head(args.index, args.model, args.rerank)
        if args.text:
            _warn_unknown_words(index, args.text)
        results = searcher.search_texts(args.text, k=args.k, **verifier, **options) if args.text else \
            _search_image_files(searcher, index, args.image, args.k, options, verifier, args.max_pixels)
    finally:
        index.close()
    if args.json:
        print(json.dumps([r.as_dict() for r in results], indent=1))
    else:
        print("\n\n".join(r.text() for r in results))
    return 0


def _warn_unvalidated_head(root: Path, model: str | None, k: int) -> None:
    """Say on stderr when the verifier that re-ranks has no recorded validation or one near
    chance (:func:`xmatch.eval.rerank.validation_warning`): a head that learned nothing lowers
    the pooler's ranking."""
    from xmatch.cli.options import model_ref
    from xmatch.eval.rerank import recorded_validation, validation_warning
    from xmatch.index.search import MODEL_FOLDER
    from xmatch.index.store import read_manifest

    reference = model_ref(model) if model else read_manifest(root)["model"].get("ref") or f"local-dir:{root / MODEL_FOLDER}"
    try:
        keeps_record, record = recorded_validation(reference)
    except (OSError, ValueError):  # the indexed model's own files moved: the index's copy has no record to read
        return
    warning = validation_warning(record, reference, k) if keeps_record else None
    if warning:
        print(f"warning: {warning}", file=sys.stderr)


def _search_image_files(searcher: Any, index: Any, paths: list[Path], k: int, options: dict[str, Any],
                        verifier: dict[str, Any], max_pixels: int | None = None) -> list:
    """Search with the pictures ``paths``, read as ``xmatch index --images`` reads the indexed
    ones (upright, RGB), each within the pixel budget from its header before it is decoded."""
    from xmatch.index.photos import load_picture
    from xmatch.io.pictures import MAX_PIXELS
    from xmatch.model.inputs import PixelInputs, input_type_of

    if input_type_of(index.model.image_encoder) is not PixelInputs:
        raise ValueError(
            f"the model of {index.root} reads precomputed region features, not image files; search from Python "
            "with index.search_images(xmatch.RegionInputs(regions, boxes, mask))."
        )
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(f"image file {path} does not exist.")
    budget = MAX_PIXELS if max_pixels is None else max_pixels
    images = PixelInputs([load_picture(path, budget, option="xmatch search --max-pixels {}") for path in paths])
    if hasattr(searcher, "first"):  # a cascade
        results = searcher.search_images(images, k=k, **verifier)
    else:
        results = searcher.search_images(images, k=k, labels=[str(p) for p in paths], **verifier, **options)
    for result, path in zip(results, paths):
        result.query = str(path)
    return results
