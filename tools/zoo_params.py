"""Parameter counts of the built-in zoo entries (``zoo/*.toml``): print the stated and
recomputed counts, or write the recomputed ones into the TOML files. A developer tool of the
repository; the counting itself is :mod:`xmatch.model.parameter_counts`.

    python tools/zoo_params.py
    python tools/zoo_params.py --write
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path

from xmatch.core.zoo import builtin_entries  # the entries of xmatch's zoo folder, not the plugins'
from xmatch.core.sources import PLUGINS_FILE, zoo_folder
from xmatch.model.parameter_counts import BERT_BASE, count_parameters, write_bert_base_dir


def builtin_counts(bert_dir: str | os.PathLike) -> dict[str, tuple[int | None, int]]:
    """``{entry: (stated params, recomputed params)}`` for the entries shipped in xmatch's zoo folder."""
    return {e.name: (e.params, count_parameters(e, bert_dir)) for e in builtin_entries()}


_HEADER = re.compile(r"^\[([^\]]+)\]\s*$")
_PARAMS = re.compile(r"^params\s*=")


def zoo_files() -> list[Path]:
    """The TOML files of the entries shipped in xmatch's zoo folder (``zoo/*.toml`` in a checkout)."""
    return sorted(path for path in zoo_folder().glob("*.toml") if path.name != PLUGINS_FILE)


def write_counts(counts: Mapping[str, int], paths: Iterable[Path] | None = None) -> list[Path]:
    """Set ``params = N`` in the table of each entry of ``counts`` (replacing the line or adding
    it after the table's last key) in ``paths`` (default: :func:`zoo_files`), or drop the line
    where the entry's base has the same count, since the entry inherits it; returns the files
    that changed."""
    paths = zoo_files() if paths is None else list(paths)
    bases = {
        name: table["base"]
        for path in paths
        for name, table in tomllib.loads(path.read_text(encoding="utf-8")).items()
        if isinstance(table, dict) and "base" in table
    }
    stated = {name: count for name, count in counts.items() if name not in bases or counts.get(bases[name]) != count}
    changed = []
    for path in paths:
        lines = path.read_text(encoding="utf-8").splitlines()
        out: list[str] = []
        entry: str | None = None
        last_key = -1
        for line in [*lines, "[end]"]:
            header = _HEADER.match(line)
            if header:
                # An entry's own table is the header without a dot (entry names have none).
                if entry in stated:
                    out.insert(last_key + 1, f"params = {stated[entry]:_}")
                name = header.group(1)
                entry = name if "." not in name else None
                last_key = len(out)
            elif entry in counts and _PARAMS.match(line):
                continue
            elif entry is not None and line.strip() and not line.lstrip().startswith("#"):
                last_key = len(out)
            out.append(line)
        text = "\n".join(out[:-1]) + "\n"
        if text != path.read_text(encoding="utf-8"):
            path.write_text(text, encoding="utf-8")
            changed.append(path)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/zoo_params.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="write the recomputed counts into zoo/*.toml")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        counts = builtin_counts(write_bert_base_dir(Path(tmp) / BERT_BASE))
    if args.write:
        for path in write_counts({name: counted for name, (_, counted) in counts.items()}):
            print(f"updated {path}")
        return 0
    width = max(map(len, counts))
    wrong = 0
    for name, (stated, counted) in counts.items():
        status = "ok" if stated == counted else "MISMATCH"
        wrong += stated != counted
        print(f"{name:<{width}}  {'-' if stated is None else f'{stated:,}':>13}  {counted:>13,}  {status}")
    if wrong:
        print(f"{wrong} entries state another count; update them: python tools/zoo_params.py --write", file=sys.stderr)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
