"""``xmatch index`` and ``xmatch search``: the command-line side of :mod:`xmatch.index`.

Only ``argparse`` is imported here at start-up; the index machinery (torch, FAISS, Qdrant)
loads when a command runs, so ``xmatch --help`` stays fast.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def add_parsers(sub: Any) -> None:
    """Register the ``index`` and ``search`` subcommands on ``xmatch``'s subparsers."""
    p = sub.add_parser(
        "index", help="encode a dataset's images (or captions) once into a search index",
        description="Encode a split of a dataset with MODEL and keep the token sets on disk (float16 "
        "safetensors shards, one committed per --shard-size items), with the stage-1 search structure. "
        "A killed run keeps every committed shard: run again with --append to continue.",
    )
    p.add_argument("model", nargs="?", help="zoo name with weights, local-dir:DIR, hf-hub:ORG/NAME or NAME=WEIGHTS "
                   "(with --append: default the index's model)")
    p.add_argument("--out", required=True, type=Path, help="index folder")
    p.add_argument("--data", type=Path, help="dataset root folder (scenes: default the XMATCH_HOME cache)")
    p.add_argument("--dataset", default="scenes", help="registered dataset layout (default: scenes)")
    p.add_argument("--split", default="test", help="split to index (default: test)")
    p.add_argument("--data-option", action="append", metavar="KEY=VALUE", help="dataset option (repeatable), e.g. size=tiny")
    p.add_argument("--side", choices=("images", "texts"), default="images",
                   help="index the images (text->image search, default) or the captions (image->text search)")
    p.add_argument("--append", action="store_true", help="add to an existing index, skipping the ids it already holds")
    p.add_argument("--from-index", type=Path, metavar="INDEX", help="copy the token sets of another index instead of encoding "
                   "(e.g. to move an embedded index into Qdrant)")
    p.add_argument("--dtype", choices=("float16", "float32"), default="float16", help="stored precision (default: float16)")
    p.add_argument("--engine", choices=("faiss", "qdrant"), default="faiss", help="faiss (embedded, default) or qdrant")
    p.add_argument("--qdrant", metavar="URL_OR_PATH", help="Qdrant server URL, or a folder for its local mode (default: INDEX/qdrant)")
    p.add_argument("--collection", help="Qdrant collection name (default: xmatch-<index folder name>)")
    p.add_argument("--stage1", help="stage-1 structure to build now: tokens, pooled, fde (default: the pooler's)")
    p.add_argument("--batch-size", type=int, default=64, help="images encoded at once (captions: 4x)")
    p.add_argument("--shard-size", type=int, default=1024, help="items per committed shard (default: 1024)")
    p.add_argument("--device", help="cpu, cuda, mps (default: cpu)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(run=run_index)

    p = sub.add_parser(
        "search", help="query a search index with captions or images",
        description="Two-stage search: stage 1 proposes candidates, stage 2 scores them exactly with the "
        "model's pooler. Prints the ranked ids and scores (or JSON).",
    )
    p.add_argument("index", type=Path, help="index folder made by xmatch index")
    p.add_argument("--text", action="append", metavar="CAPTION", help="a text query (repeatable)")
    p.add_argument("--image", action="append", type=Path, metavar="PATH", help="an image query, for models that read pixels (repeatable)")
    p.add_argument("-k", "--top-k", dest="k", type=int, default=10, help="results per query (default: 10)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--exact", action="store_true", help="score every item (no stage 1)")
    p.add_argument("--candidates", type=int,
                   help="items scored exactly per query (default: 100 or 10 k; a provable search starts at 2 k "
                   "and grows until proven)")
    p.add_argument("--stage1", help="candidate generator: tokens, pooled, fde (faiss); maxsim, pooled (qdrant)")
    p.add_argument("--nprobe", type=int, help="centroid lists visited per query token (token indexes past 65,536 tokens; default 8)")
    p.add_argument("--model", help="query with this model (its encoders must be the index's; e.g. another pooler's entry)")
    p.add_argument("--cascade", type=Path, metavar="INDEX", help="shortlist with this index's model (e.g. TERN), then "
                   "re-rank with INDEX's (e.g. TERAN)")
    p.add_argument("--shortlist", type=int, default=200, help="items the cascade hands on per query (default: 200)")
    p.add_argument("--verify", action="store_true", help="check every stored file's checksum first")
    p.add_argument("--device", help="cpu, cuda, mps (default: cpu)")
    p.set_defaults(run=run_search)


def _model_ref(text: str) -> str:
    """A model argument as the index records it: weight paths made absolute."""
    if "=" in text:
        name, weights = text.split("=", 1)
        return f"{name}={Path(weights).resolve()}"
    return text


def run_index(args: argparse.Namespace) -> int:
    from xmatch.data import open_dataset
    from xmatch.index import create
    from xmatch.index import open as open_index
    from xmatch.index.build import copy_index, index_dataset
    from xmatch.index.store import MANIFEST
    from xmatch.model.inputs import PixelInputs, input_type_of
    from xmatch.cli.model_arg import load_model_arg

    progress = not args.no_progress
    exists = (args.out / MANIFEST).is_file()
    if exists and not args.append:
        print(f"xmatch index: {args.out} already holds an index; add --append to add to it, or choose another --out.",
              file=sys.stderr)
        return 2
    if args.from_index:
        source = open_index(args.from_index, device=args.device)
        target = create(args.out, source.model, side=source.side, model_ref=source.manifest["model"]["ref"],
                        dtype=args.dtype, engine=args.engine, qdrant=args.qdrant, collection=args.collection)
        added = copy_index(source, target, progress=progress)
        index = target
    else:
        if exists:
            index = open_index(args.out, args.model and _model_ref(args.model), device=args.device)
        elif not args.model:
            print("xmatch index: name the MODEL to encode with (e.g. teran-mrsw-scenes).", file=sys.stderr)
            return 2
        else:
            model = load_model_arg(args.model, args.device)
            index = create(args.out, model, side=args.side, model_ref=_model_ref(args.model), dtype=args.dtype,
                           engine=args.engine, qdrant=args.qdrant, collection=args.collection)
        if args.data is None and args.dataset.lower() != "scenes":
            print(f"xmatch index: --data DIR is required for the {args.dataset} dataset.", file=sys.stderr)
            return 2
        options = dict(kv.split("=", 1) for kv in args.data_option or [])
        if args.dataset.lower() == "scenes":
            options.setdefault("progress", str(progress))
            if input_type_of(index.model.image_encoder) is PixelInputs:
                options.setdefault("layout", "images")
        dataset = open_dataset(args.dataset, args.data, split=args.split, **options)
        added = index_dataset(index, dataset, batch_size=args.batch_size, shard_size=args.shard_size,
                              resume=args.append, progress=progress)
    index.progress = progress
    index.prepare(args.stage1)
    index.close()
    what = index.side
    print(f"indexed {added} {what} into {args.out} ({len(index)} in all, engine {index.engine}); "
          f"search it with: xmatch search {args.out} --{'text' if what == 'images' else 'image'} ...")
    return 0


def run_search(args: argparse.Namespace) -> int:
    from xmatch.index import Cascade
    from xmatch.index import open as open_index

    if bool(args.text) == bool(args.image):
        print("xmatch search: give the queries as --text CAPTION or --image PATH (one kind).", file=sys.stderr)
        return 2
    index = open_index(args.index, args.model and _model_ref(args.model), device=args.device)
    try:
        if args.verify:
            index.verify()
        options = {key: getattr(args, key) for key in ("candidates", "stage1", "nprobe")
                   if getattr(args, key) is not None}
        options["exact"] = args.exact
        searcher: Any = index
        if args.cascade:
            searcher = Cascade(open_index(args.cascade, device=args.device), index, shortlist=args.shortlist)
        results = searcher.search_texts(args.text, k=args.k, **options) if args.text else \
            _search_image_files(searcher, index, args.image, args.k, options)
    finally:
        index.close()
    if args.json:
        print(json.dumps([r.as_dict() for r in results], indent=1))
    else:
        print("\n\n".join(r.text() for r in results))
    return 0


def _search_image_files(searcher: Any, index: Any, paths: list[Path], k: int, options: dict[str, Any]) -> list:
    from PIL import Image

    from xmatch.model.inputs import PixelInputs, input_type_of

    if input_type_of(index.model.image_encoder) is not PixelInputs:
        raise ValueError(
            f"the model of {index.root} reads precomputed region features, not image files; search from Python "
            "with index.search_images(regions=..., boxes=...)."
        )
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(f"image file {path} does not exist.")
    images = [Image.open(path).convert("RGB") for path in paths]
    if hasattr(searcher, "first"):  # a cascade
        results = searcher.search_images(k=k, images=images)
    else:
        results = searcher.search_images(images, k=k, labels=[str(p) for p in paths], **options)
    for result, path in zip(results, paths):
        result.query = str(path)
    return results
