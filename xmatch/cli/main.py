"""The ``xmatch`` command line, assembled from one module per command (``xmatch.cli.<command>``:
its ``add_parser(subparsers)`` and its ``run(args)``)."""

from __future__ import annotations

import argparse
import logging
import sys
from types import ModuleType

from xmatch.cli import convert, demo, download, extract, index, info, models, search, serve, train, vocab
from xmatch.cli import eval as evaluate
from xmatch.core.version import __version__

#: the name pip installs (``xmatch`` on PyPI is an unrelated project)
DISTRIBUTION = "xmatch-zoo"
#: the subcommands, in the order ``xmatch --help`` lists them
COMMANDS: dict[str, ModuleType] = {
    "models": models,
    "info": info,
    "convert": convert,
    "eval": evaluate,
    "train": train,
    "vocab": vocab,
    "extract": extract,
    "download": download,
    "demo": demo,
    "index": index,
    "search": search,
    "serve": serve,
}


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``xmatch`` and its subcommands; a parsed command's ``args.run(args)`` runs it.

    Example:
        >>> build_parser().parse_args(["models", "teran-*"]).run.__module__
        'xmatch.cli.models'
    """
    parser = argparse.ArgumentParser(prog="xmatch", description="Fine-grained image-text matching model zoo.")
    parser.add_argument("--version", action="version", version=f"{DISTRIBUTION} {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for module in COMMANDS.values():
        module.add_parser(subparsers).set_defaults(run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``xmatch ARGS``: the exit status (2 for an error the message explains in one line).

    Example:
        >>> main(["models", "tern-coco"])
        name       weights  description
        tern-coco  -        TERN: ...
        0
    """
    args = build_parser().parse_args(argv)
    args.argv = list(argv) if argv is not None else sys.argv[1:]  # e.g. recorded in eval reports
    # the library logs what it does (resuming a run, retrying a download); a terminal user sees it
    logging.basicConfig(format="%(message)s")
    logging.getLogger("xmatch").setLevel(logging.INFO)
    try:
        return args.run(args)
    except (ValueError, FileNotFoundError, KeyError, OSError, ImportError) as exc:  # ImportError: a missing extra
        print(f"xmatch {args.command}: {exc}{_tokenizer_option(args, exc)}", file=sys.stderr)
        return 2


def _tokenizer_option(args: argparse.Namespace, exc: BaseException) -> str:
    """Where a text tower's tokenizer could not be loaded, the option of this command that
    gives a folder for it; else nothing."""
    # a tokenizer error comes from that module, already imported: it is not imported here
    clip = sys.modules.get("xmatch.components.text.clip")
    if clip is None or not isinstance(exc, clip.TokenizerLoadError) or not hasattr(args, "tokenizer"):
        return ""
    return (f" On the command line: xmatch {args.command} ... --tokenizer DIR, a folder with the tokenizer's files "
            "(what its save_pretrained writes).")


if __name__ == "__main__":
    sys.exit(main())
