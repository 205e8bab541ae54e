"""The ``xmatch`` command line: ``models``, ``info``, ``convert``."""

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
