"""``xmatch index``: a dataset's images (or captions) encoded once into a search index (:mod:`xmatch.index`).

Only ``argparse`` is imported at start-up; the index machinery (torch, FAISS, Qdrant) loads
when the command runs, so ``xmatch --help`` stays fast.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``index`` to ``xmatch``'s subcommands."""
    parser = subparsers.add_parser(
        "index", help="encode a dataset's images (or captions) once into a search index",
        description="Encode a split of a dataset with MODEL and keep the token sets on disk (float16 "
        "safetensors shards, one committed per --shard-size items), with the stage-1 search structure. "
        "A killed run keeps every committed shard: run again with --append to continue.",
    )
    parser.add_argument("model", nargs="?", help="zoo name with weights, local-dir:DIR, hf-hub:ORG/NAME or NAME=WEIGHTS "
                        "(with --append: default the index's model)")
    parser.add_argument("--out", required=True, type=Path, help="index folder")
    parser.add_argument("--images", type=Path, metavar="DIR", help="a folder of pictures, no captions needed (models that "
                        "read pixels: timm-grid, pixel-regions, CLIP family); each hit names its file")
    parser.add_argument("--data", type=Path, help="dataset root folder (scenes: default the XMATCH_HOME cache)")
    parser.add_argument("--dataset", help="registered dataset layout (default: the one layout --data looks like; "
                        "scenes without --data)")
    parser.add_argument("--split", default="test", help="split to index (default: test)")
    parser.add_argument("--data-option", action="append", metavar="KEY=VALUE", help="dataset option (repeatable), e.g. size=tiny")
    parser.add_argument("--side", choices=("images", "texts"), default="images",
                        help="index the images (text->image search, default) or the captions (image->text search)")
    parser.add_argument("--append", action="store_true", help="add to an existing index, skipping the ids it already holds")
    parser.add_argument("--overwrite", action="store_true", help="delete the index already at --out (its manifest, shards, "
                        "stage-1 files, saved model and Qdrant Edge storage; other files stay) and build it anew")
    parser.add_argument("--from-index", type=Path, metavar="INDEX", help="copy the token sets of another index instead of encoding "
                        "(e.g. to move an embedded index into Qdrant)")
    parser.add_argument("--copy", type=Path, metavar="INDEX", help="copy the index INDEX to --out at its real size (a "
                        "Qdrant Edge shard's files are sparse: shutil.copytree, tar or scp write hundreds of MB), under "
                        "its locks")
    parser.add_argument("--dtype", choices=("float16", "float32"), default="float16", help="stored precision (default: float16)")
    parser.add_argument("--engine", choices=("faiss", "qdrant"), default="faiss", help="faiss (embedded, default) or qdrant")
    parser.add_argument("--qdrant", metavar="URL_OR_NAME", help="Qdrant server URL, or the name of the Qdrant Edge shard's "
                        "folder inside the index (default: qdrant)")
    parser.add_argument("--collection", help="Qdrant collection name, server only (default: xmatch-<index folder name>)")
    parser.add_argument("--stage1", help="stage-1 structure to build now: tokens, pooled, fde (default: the pooler's)")
    parser.add_argument("--max-pixels", type=int, metavar="N", help="with --images: pictures whose header declares more "
                        "pixels (width x height) are skipped, not decoded (default: 50,000,000)")
    parser.add_argument("--batch-size", type=int, default=64, help="images encoded at once (captions: 4x)")
    parser.add_argument("--compute-dtype", choices=("float32", "bfloat16"), default="float32",
                        help="bfloat16: encode under bfloat16 autocast, about 1.8x faster on a CPU with AVX512-BF16 or "
                        "AMX and on GPUs, embeddings within bfloat16's resolution of float32's (default: float32)")
    parser.add_argument("--shard-size", type=int, default=1024, help="items per committed shard (default: 1024)")
    parser.add_argument("--tokenizer", type=Path, metavar="DIR", help="the text tower's tokenizer from this folder (what "
                        "a tokenizer's save_pretrained writes) instead of the model's own source, e.g. the Hub's; "
                        "pictures are indexed without one, captions and text searches need it (xmatch search --tokenizer)")
    parser.add_argument("--device", help="cpu, cuda, mps (default: cpu)")
    parser.add_argument("--ray", nargs="?", const="local", metavar="ADDRESS",
                        help="encode on a Ray cluster's workers, each holding the model once, and commit every shard "
                        "at once at the end (pip install 'xmatch-zoo[ray]'; embedded engine): without ADDRESS a local "
                        "one is started (or the one RAY_ADDRESS names joined), else the one at ADDRESS (auto, "
                        "HOST:6379); a killed run continues with --append. See docs/scale.md")
    parser.add_argument("--ray-workers", type=int, metavar="N",
                        help="with --ray: Ray workers (default: one per CPU of the cluster)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    return parser


def run(args: argparse.Namespace) -> int:
    """Create (or, with ``--append``, continue) the index and prepare its stage-1 structure.

    A run that fails before its first committed shard removes the index and the folders it
    created (a folder that was there before stays), so the corrected command runs as it was
    typed; one that fails later keeps its committed shards (continue with ``--append``).
    """
    from xmatch.index.store import MANIFEST, foreign_files, remove_index

    if args.append and args.overwrite:
        print("xmatch index: --append adds to the index, --overwrite replaces it: give one of them.", file=sys.stderr)
        return 2
    if args.copy is not None:
        return _copy(args)
    if args.ray_workers is not None and args.ray is None:
        print("xmatch index: --ray-workers is the number of workers of --ray; add --ray [ADDRESS].", file=sys.stderr)
        return 2
    if args.ray is not None and (args.engine != "faiss" or args.from_index):
        print("xmatch index: --ray encodes into an embedded index (--engine faiss); to fill Qdrant, build one with "
              "--ray, then copy it: xmatch index --from-index INDEX --engine qdrant --out QDRANT_INDEX.", file=sys.stderr)
        return 2
    exists = (args.out / MANIFEST).is_file()
    if exists and args.overwrite:
        others = foreign_files(args.out)
        if others:
            print(f"xmatch index: {args.out} holds files that are not the index's ({', '.join(others[:5])}); move them "
                  "out before --overwrite, or choose another --out.", file=sys.stderr)
            return 2
        remove_index(args.out)
        exists = False
    if exists and not args.append:
        print(f"xmatch index: {args.out} already holds an index; add --append to add to it, --overwrite to replace it, "
              "or choose another --out.", file=sys.stderr)
        return 2
    if not exists and not args.from_index and not args.model:
        print("xmatch index: name the MODEL to encode with (e.g. teran-mrsw-scenes).", file=sys.stderr)
        return 2
    if args.images is not None and (args.data is not None or args.dataset or args.from_index or args.side != "images"):
        print("xmatch index: --images DIR indexes a folder of pictures; it goes without --data, --dataset, --from-index "
              "and --side texts.", file=sys.stderr)
        return 2
    if args.max_pixels is not None and args.images is None:
        print("xmatch index: --max-pixels is the picture budget of --images DIR; a dataset's pictures have their own "
              "(--data-option max_pixels=N where its layout reads pictures).", file=sys.stderr)
        return 2
    if args.dataset is None and args.data is None:
        args.dataset = "scenes"
    if not exists and args.data is None and not args.from_index and args.images is None and args.dataset.lower() != "scenes":
        print(f"xmatch index: --data DIR is required for the {args.dataset} dataset.", file=sys.stderr)
        return 2
    made: list[Any] = []
    # the folders this run makes (--out and any missing parent), removed again if it fails
    created = [p for p in (args.out, *args.out.parents) if not p.exists()]
    fresh = not exists and not (args.out.is_dir() and any(args.out.iterdir()))
    try:
        index, added = _fill(args, exists, made)
    except BaseException:
        staged = len(list((args.out / "staging").glob("chunk-*.json"))) if args.ray is not None else 0
        if staged:  # a Ray run commits at its end: what its workers encoded waits there for --append
            print(f"xmatch index: stopped with {staged} chunks encoded and staged in {args.out / 'staging'}, none "
                  "committed; continue with --append.", file=sys.stderr)
        elif made and len(made[0]) == 0 or not made and fresh:
            if made:
                made[0].close()
            if args.out.is_dir():
                remove_index(args.out)  # nothing committed: leave no index behind to block the rerun
            _remove_made_folders(args.out, created)
        elif made:
            print(f"xmatch index: stopped with {len(made[0])} items committed in {args.out}; continue with --append.",
                  file=sys.stderr)
        raise
    index.close()
    what = index.side
    if isinstance(added, tuple):  # a picture folder: (added, skipped pictures)
        added, skipped = added
        for name, why in skipped[:20]:
            print(f"skipped {_shown_name(name)}: {why}", file=sys.stderr)
        if len(skipped) > 20:
            print(f"... and {len(skipped) - 20} more.", file=sys.stderr)
        if skipped:
            print(f"xmatch index: {len(skipped)} pictures were skipped and are not in the index.", file=sys.stderr)
    if args.images is not None and index.pictures != args.images.expanduser().resolve():
        if index.pictures is not None:
            print(f"xmatch index: {args.out} keeps {index.pictures} as its picture folder (its earlier items are "
                  f"pictures there); to show the pictures of {args.images} too, serve it with a folder that holds "
                  f"them all: xmatch serve {args.out} --images DIR.", file=sys.stderr)
        else:
            print(f"xmatch index: {args.out} records no picture folder: {args.images} does not hold the picture of "
                  f"every item it holds; serve it with a folder that does: xmatch serve {args.out} --images DIR.",
                  file=sys.stderr)
    tokenizer = f" --tokenizer {args.tokenizer}" if args.tokenizer is not None else ""
    print(f"indexed {added} {what} into {args.out} ({len(index)} in all, engine {index.engine}); "
          f"search it with: xmatch search {args.out}{tokenizer} --{'text' if what == 'images' else 'image'} ...")
    return 0


def _remove_made_folders(out: Path, created: list[Path]) -> None:
    """Remove the folders of ``created`` (``out`` and the parents this run made) that are left
    empty, deepest first; put back ``out`` where it was there before (an empty folder the user
    made, which removing the index took with it)."""
    for folder in created:
        if not folder.exists():
            continue  # removed with the index
        if not folder.is_dir() or folder.is_symlink() or any(folder.iterdir()):
            break
        folder.rmdir()
    if out not in created and not out.exists():
        out.mkdir()


def _shown_name(name: str) -> str:
    """A skipped picture's name as printed: as it is, or quoted and escaped when it holds a
    newline or another control character (it would split or garble the line), cut when long."""
    from xmatch.data._io import shown, unsafe_characters

    return shown(name) if unsafe_characters(name) or len(name) > 200 else name


def _copy(args: argparse.Namespace) -> int:
    """``--copy INDEX --out DST``: the index copied whole, sparse files kept sparse."""
    from xmatch.index.qdrant import copy_index_folder

    if args.model or args.append or args.overwrite or args.from_index or args.images:
        print("xmatch index: --copy INDEX --out DST copies an index as it is; it goes without a MODEL, --append, "
              "--overwrite, --from-index and --images.", file=sys.stderr)
        return 2
    allocated = copy_index_folder(args.copy, args.out)
    print(f"copied the index {args.copy} to {args.out} ({allocated / 2**20:.1f} MiB on disk)")
    return 0


def _fill(args: argparse.Namespace, exists: bool, made: list[Any]) -> tuple[Any, int]:
    """Open or create the index and add the dataset (or the source index) to it; an index
    created here is put in ``made`` as soon as it exists."""
    from xmatch.model.factory import build_reference
    from xmatch.cli.options import indexed_model, model_ref, tokenizer_overrides
    from xmatch.index import create
    from xmatch.index import open as open_index
    from xmatch.index.build import copy_index, index_dataset
    from xmatch.model.inputs import PixelInputs, input_type_of

    progress = not args.no_progress
    if args.from_index:
        source = open_index(args.from_index, device=args.device)
        target = create(args.out, source.model, side=source.side, model_ref=source.manifest["model"]["ref"],
                        dtype=args.dtype, engine=args.engine, qdrant=args.qdrant, collection=args.collection)
        made.append(target)
        added = copy_index(source, target, progress=progress)
        if source.pictures is not None:  # the same ids: their pictures are where the source's are
            target.record_pictures(source.pictures)
        index = target
    else:
        if exists:
            index = open_index(args.out, indexed_model(args.out, args.model, args.tokenizer, args.device), device=args.device)
            model = index.model
        else:
            model = build_reference(args.model, args.device, **tokenizer_overrides(args.tokenizer))
        dataset = None
        if args.images is None:
            # the dataset opens before an index is made: a wrong path or option leaves nothing behind
            dataset = _open_dataset(args, model, progress)
        elif input_type_of(model.image_encoder) is not PixelInputs:
            raise ValueError(
                f"{args.model or 'the index model'} reads precomputed region features, not pictures: extract them first "
                f"(xmatch extract {args.images} --out FEATURES), then index that folder "
                "(xmatch index MODEL --data FEATURES --out INDEX) with a region model of the extraction's feature width; "
                "or index with a model that reads pixels."
            )
        if not exists:
            index = create(args.out, model, side=args.side, model_ref=model_ref(args.model), dtype=args.dtype,
                           engine=args.engine, qdrant=args.qdrant, collection=args.collection)
            made.append(index)
        fill = {"batch_size": args.batch_size, "shard_size": args.shard_size, "resume": args.append,
                "progress": progress, "compute_dtype": args.compute_dtype}
        if args.ray is not None:
            fill |= {"ray": args.ray, "ray_workers": args.ray_workers}
        if dataset is None:
            if args.ray is not None:
                from xmatch.index.ray_build import index_images_on_ray as index_images
            else:
                from xmatch.index.photos import index_images

            budget = {} if args.max_pixels is None else {"max_pixels": args.max_pixels}
            added = index_images(index, args.images, **fill, **budget)
        elif args.ray is not None:
            from xmatch.index.ray_build import index_dataset_on_ray

            added = index_dataset_on_ray(index, dataset, **fill)
        else:
            added = index_dataset(index, dataset, **fill)
    index.progress = progress
    index.prepare(args.stage1)
    return index, added


def _open_dataset(args: argparse.Namespace, model: Any, progress: bool) -> Any:
    """The split to index: ``--dataset`` (or the layout ``--data`` looks like) with its options;
    scenes pictures for a model that reads pixels; the images alone (hits named by their picture
    files) where a teran folder's images have no captions, as ``xmatch extract`` makes them from
    pictures without a captions file: text->image search needs none."""
    from xmatch.cli.options import open_data
    from xmatch.data import NoCaptionsError
    from xmatch.model.inputs import PixelInputs, input_type_of

    options = list(args.data_option or [])
    if (args.dataset or "").lower() == "scenes":
        given = {kv.split("=", 1)[0] for kv in options}
        if "progress" not in given:
            options.append(f"progress={progress}")
        if "layout" not in given and input_type_of(model.image_encoder) is PixelInputs:
            options.append("layout=images")
    try:
        return open_data(args, args.split, options)
    except NoCaptionsError as exc:
        if args.side == "texts":
            raise ValueError(
                f"--side texts indexes captions, and {exc.missing} of the {exc.total} {args.split} images of {args.data} "
                "have none. Index the images instead (leave out --side texts: searching them by text needs no "
                f"captions), or give the pictures captions (xmatch extract PICTURES --out {args.data} --captions FILE)."
            ) from None
        if any(kv.split("=", 1)[0] == "captions_per_image" for kv in options):
            raise  # the user chose how many captions to read
        print(f"{exc.missing} of the {exc.total} {args.split} images of {args.data} have no captions; searching them by "
              "text needs none: indexing the images alone")
    return open_data(args, args.split, [*options, "captions_per_image=0"])
