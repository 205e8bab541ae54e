"""``xmatch eval``: evaluate and compare models on a dataset, the papers' protocol and beyond
(:mod:`xmatch.eval`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``eval`` to ``xmatch``'s subcommands."""
    parser = subparsers.add_parser(
        "eval", help="evaluate and compare models on a dataset: the papers' protocol and beyond",
        description="Recall@K, medr, meanr, rsum in both directions and NDCG@25; with --protocol also ECCV "
        "Caption, CxC, hard-negative groups and perturbation probes. Several models are compared side by side "
        "(one table, --report for plots and an HTML page); --ensemble averages their scores into one model "
        "instead. See docs/evaluation.md.",
    )
    parser.add_argument(
        "models", nargs="+", metavar="MODEL",
        help="a zoo name (pretrained weights), local-dir:DIR, NAME_OR_SPEC=WEIGHTS (.safetensors or original "
        ".pth), or a result file (.json from --json or a report's results.json) to compare as it is",
    )
    parser.add_argument("--ensemble", action="store_true",
                        help="average the models' scores into one ensemble (TERAN's) instead of comparing them")
    parser.add_argument("--data", type=Path, help="dataset root folder (optional for --dataset scenes: the cache)")
    parser.add_argument("--dataset", help="registered dataset layout: teran, scan-precomp, image-captions, scenes "
                        "(default: the one layout --data looks like)")
    parser.add_argument("--split", default="test")
    parser.add_argument("--data-option", action="append", metavar="KEY=VALUE", help="extra dataset option (repeatable)")
    parser.add_argument("--protocol", default="full",
                        help="coco-1k, coco-5k, f30k-1k or full (default), and, comma-separated beside it, eccv-caption, "
                        "cxc (COCO 5K test; default base coco-5k), groups, probes; e.g. full,groups,probes")
    parser.add_argument("--fold-images", type=int, help="images per fold (default: the protocol's)")
    parser.add_argument(
        "--relevance", action="append", metavar="NAME[=FILE]",
        help="NDCG relevance: rougel, rouge-score or spice computed from the captions (cached), "
        "or NAME=FILE to read the authors' raw float32 file (repeatable)",
    )
    parser.add_argument("--relevance-cache", type=Path, help="folder caching computed relevance matrices")
    parser.add_argument("--spice-jar", help="spice-1.0.jar (default: $XMATCH_SPICE_JAR)")
    parser.add_argument("--batch-size", type=int, default=64, help="images encoded at once (captions: 4x)")
    parser.add_argument("--device", help="cpu, cuda, cuda:1, mps (default: cpu)")
    parser.add_argument("--tokenizer", type=Path, metavar="DIR", help="the text towers' tokenizer from this folder (what "
                        "a tokenizer's save_pretrained writes) instead of each model's own source, e.g. the Hub's")
    parser.add_argument("--json", type=Path, help="write every figure, the ground-truth ranks and the provenance to this "
                        "JSON file (several models: {\"runs\": [...]}); it can be passed as a MODEL later")
    parser.add_argument("--queries", type=Path, help="also write per-query ranks, top-50 and NDCG (JSON)")
    parser.add_argument("--allow-unknown-words", action="store_true",
                        help="evaluate even when over 20%% of the caption tokens are unknown to a model's text side")
    parser.add_argument("--report", type=Path, metavar="DIR",
                        help="write the comparison's plots (PNG), results.json and index.html into DIR (never over "
                        "files of those names that a report did not write, unless --overwrite)")
    parser.add_argument("--overwrite", action="store_true",
                        help="with --report: write over files of the report's names in DIR that a report did not "
                        "write (files of other names are left as they are)")
    parser.add_argument("--groups", type=Path, metavar="FILE",
                        help="groups protocol: a JSON file listing hard-negative groups (default: the dataset's own, "
                        "e.g. the scenes twins)")
    parser.add_argument("--caption-ids", type=Path, metavar="FILE",
                        help="eccv-caption / cxc: the COCO annotation id of every caption in dataset order "
                        "(coco_test_ids.npy, testall_ids.txt)")
    parser.add_argument("--pmrp", type=Path, metavar="DIR",
                        help="eccv-caption: folder with pm_image_to_caption.json and pm_caption_to_image.json for PMRP")
    parser.add_argument("--word-classes", metavar="SOURCE",
                        help="probes: word classes from 'scenes', 'spacy', 'nltk' or a JSON file of word lists "
                        "(default: the dataset's own, e.g. the scenes grammar)")
    parser.add_argument("--probe", action="append", metavar="NAME",
                        help="probes: shuffle, drop-CLASS or swap-CLASS (repeatable; default: shuffle, drop each of "
                        "noun/adjective/relation, swap each attribute class)")
    parser.add_argument("--probe-seed", type=int, default=0, help="probes: seed of the perturbations (default 0)")
    parser.add_argument("--rerank", type=int, metavar="K",
                        help="also report the figures with the model's verifier re-ranking each query's top K "
                        "(a model with a [verifier]; reported apart from the pooler's own figures, with the time it takes, "
                        "and as a row 'MODEL + verifier@K' in tables and reports; in a comparison, models without a "
                        "verifier keep their pooler's figures)")
    parser.add_argument("--rerank-neighbours", type=int, default=0, metavar="M",
                        help="with --rerank K: each caption's list also holds the M images nearest to each of its top K "
                        "(the pooler scoring the images against each other; the top K drawn by each image's score plus half "
                        "its nearest image's), and each direction reads every verified pair, so a picture and its "
                        "near-duplicate twin are re-ranked together (default 0; docs/evaluation.md, \"Relations over the "
                        "whole split\")")
    return parser


def run(args: argparse.Namespace) -> int:
    """Evaluate each MODEL (or their ensemble), print the tables, write what the options ask for."""
    import shlex

    from xmatch.model.factory import build_reference
    from xmatch.cli.options import check_captions_per_image, open_data, tokenizer_overrides
    from xmatch.data.vocab import EVAL_FIX, check_captions
    from xmatch.eval.report import check_plotting, check_report_folder, comparison_tables, shown_name, write_report
    from xmatch.eval.rerank import RERANK, check_rerank_request, recorded_validation, rerank_table, validation_warning
    from xmatch.eval.suite import load_records, parse_protocols, run_protocols, save_records, with_reranked

    overrides = tokenizer_overrides(args.tokenizer)  # a missing folder fails before anything is read
    if args.report:
        check_plotting()  # a missing matplotlib fails before the evaluation, not after it
        check_report_folder(args.report, args.overwrite)  # and so does a folder holding someone else's files

    # result files (from --json or a report's results.json) join the comparison as they are;
    # read first, so a bad file fails before any model is evaluated
    loaded = {m: load_records(m) for m in args.models if m.endswith(".json")}
    names = [m for m in args.models if m not in loaded]
    records = []
    if names:
        parse_protocols(args.protocol)  # a typo fails before any data or weights are read
        check_rerank_request(args.rerank, len(names) if args.ensemble else 1, args.rerank_neighbours)
        dataset = open_data(args, args.split, args.data_option)
        check_captions_per_image(dataset, args.data, "--data-option")
        relevance = _relevance(args, dataset)
        # several models are compared side by side; --ensemble averages their scores into one
        for entry in [names] if args.ensemble else [[m] for m in names]:
            models = [build_reference(m, args.device, **overrides) for m in entry]
            for model in models:
                check_captions(model, dataset.captions, f"{args.split} split", allow=args.allow_unknown_words,
                               fix=EVAL_FIX, allow_hint="--allow-unknown-words")
            rerank = args.rerank
            if rerank is not None and len(names) > 1 and not args.ensemble and models[0].verifier is None:
                # a comparison re-ranks the models that have a verifier; the others keep their pooler's figures
                print(f"--rerank {rerank}: {entry[0]} has no verifier; its figures are the pooler's only", file=sys.stderr)
                rerank = None
            if rerank is not None and len(models) == 1 and models[0].verifier is not None:
                # a head that learned nothing re-ranks anyway: say so before its figures are read
                keeps_record, record = recorded_validation(entry[0])
                warning = validation_warning(record, entry[0], rerank) if keeps_record else None
                if warning:
                    print(f"warning: {warning}", file=sys.stderr)
            records.append(run_protocols(
                models, dataset, args.protocol, name=" + ".join(entry), model_names=entry, dataset_name=args.dataset,
                relevance=relevance, fold_images=args.fold_images, groups=args.groups, caption_ids=args.caption_ids,
                pmrp_dir=args.pmrp, word_classes=word_classes_option(args.word_classes), probes=args.probe, probe_seed=args.probe_seed,
                rerank=rerank, rerank_neighbours=args.rerank_neighbours if rerank is not None else 0,
                image_batch_size=args.batch_size, text_batch_size=4 * args.batch_size,
            ))
            del models
    for runs in loaded.values():
        records += runs
    if len(records) == 1 and not records[0].extras:
        record = records[0]
        where = record.provenance.get("dataset", {}).get("name", args.dataset), record.provenance.get("split", args.split)
        print(f"\n{shown_name(record.name)} on {shown_name(str(where[0]))}:{shown_name(str(where[1]))}\n"
              f"{record.result.table()}")
    else:
        print("\n" + comparison_tables(with_reranked(records)))
    for record in records:
        if RERANK in record.extras:
            print("\n" + rerank_table(record.extras[RERANK], shown_name(record.name)))
    for record in records:
        if record.result.folds:
            print(f"({shown_name(record.name)}, COCO 1K: mean of {len(record.result.folds)} folds; the original evalrank would "
                  f"print rsum {record.result.printed_rsum:.2f})")
    if args.json:
        save_records(records, args.json)
        print(f"wrote {args.json}")
    if args.queries:
        save_records(records, args.queries, with_queries=True)
        print(f"wrote {args.queries} (per-query ranks, top-50, NDCG)")
    if args.report:
        argv = getattr(args, "argv", None)
        written = write_report(with_reranked(records), args.report, command=shlex.join(["xmatch", *argv]) if argv else None,
                               overwrite=args.overwrite)
        print(f"wrote {', '.join(p.name for p in written.values())} in {args.report}/ (open {written['html']})")
    return 0


def _relevance(args: argparse.Namespace, dataset: Any) -> dict[str, Any]:
    """The NDCG relevance matrices of ``--relevance``: computed from the captions, or read from a file."""
    from xmatch.eval import relevance as rel

    out = {}
    # a user's folder may give its pictures different numbers of captions (captions_per_image None)
    n_captions, n_images = len(dataset.captions), dataset.num_images
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


def word_classes_option(source: str | None) -> Any:
    """``--word-classes``: ``scenes`` is the scenes grammar's tagger; other values (``nltk``, a
    JSON file) are read by the evaluation."""
    if source == "scenes":
        from xmatch.scenes.tagger import scenes_tagger

        return scenes_tagger()
    return source
