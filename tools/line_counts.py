"""Lines of xmatch per package, split into code, docstring, comment and blank lines:
``python tools/line_counts.py [REV]`` (default: the working tree; a git revision reads that
commit's files). A developer tool of the repository, for size reports before and after a change.

A module at the package root counts under ``(root)``; ``xmatch/components/image/bottomup.py``
under ``components``.
"""

from __future__ import annotations

import argparse
import ast
import io
import subprocess
import tokenize
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("code", "docstring", "comment", "blank")


def classify(source: str) -> Counter:
    """Counts of code, docstring, comment and blank lines of one module.

    A line holding code and a trailing comment is code; a docstring is the first string
    statement of a module, class or function.
    """
    lines = source.splitlines()
    docstring: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                docstring.update(range(first.lineno, first.end_lineno + 1))
    comment: set[int] = set()
    code: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comment.add(token.start[0])
        elif token.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER):
            code.update(range(token.start[0], token.end[0] + 1))
    counts: Counter = Counter()
    for number, line in enumerate(lines, start=1):
        if number in docstring:
            counts["docstring"] += 1
        elif number in code:
            counts["code"] += 1
        elif number in comment:
            counts["comment"] += 1
        elif not line.strip():
            counts["blank"] += 1
        else:
            counts["code"] += 1
    return counts


def package_of(path: str) -> str:
    parts = Path(path).parts
    return parts[1] if len(parts) > 2 else "(root)"


def sources(revision: str | None) -> dict[str, str]:
    """``{path: text}`` of xmatch's modules in the working tree or at ``revision``."""
    if revision is None:
        return {p.relative_to(ROOT).as_posix(): p.read_text(encoding="utf-8") for p in sorted((ROOT / "xmatch").rglob("*.py"))}
    names = subprocess.run(["git", "ls-tree", "-r", "--name-only", revision, "xmatch/"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    return {name: subprocess.run(["git", "show", f"{revision}:{name}"], cwd=ROOT, capture_output=True, text=True,
                                 check=True).stdout for name in names if name.endswith(".py")}


def table(revision: str | None) -> dict[str, Counter]:
    """``{package: counts}``, plus ``"total"``."""
    packages: dict[str, Counter] = {}
    for path, text in sources(revision).items():
        packages.setdefault(package_of(path), Counter()).update(classify(text))
        packages[package_of(path)]["modules"] += 1
    packages["total"] = sum(packages.values(), Counter())
    return packages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("revision", nargs="?", help="a git revision (default: the working tree)")
    counts = table(parser.parse_args().revision)
    print(f"{'package':<12} {'modules':>7} " + " ".join(f"{k:>9}" for k in KINDS))
    for name in sorted(counts, key=lambda n: (n == "total", n)):
        c = counts[name]
        print(f"{name:<12} {c['modules']:>7} " + " ".join(f"{c[k]:>9}" for k in KINDS))


if __name__ == "__main__":
    main()
