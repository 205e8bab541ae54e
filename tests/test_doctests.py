"""The docstring examples are tests: `pytest -q` runs them, and one that is skipped says why.

A skipped example carries its reason as a comment in its own source, before the directive
(``>>> fetch(entry)  # downloads 200 MB  # doctest: +SKIP``); the skipped examples that follow
it directly share that reason.
"""

from __future__ import annotations

import ast
import doctest
import io
import tokenize
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SKIP = doctest.OPTIONFLAGS_BY_NAME["SKIP"]
PARSER = doctest.DocTestParser()


def package_dirs() -> list[Path]:
    """xmatch and every plugin's import package (each plugin folder holds one)."""
    plugins = [p.parent for p in ROOT.glob("plugins/*/*/__init__.py")]
    plugins += [p.parent for p in ROOT.glob("plugins/*/src/*/__init__.py")]
    return [ROOT / "xmatch", *sorted(plugins)]


def source_files() -> list[Path]:
    return sorted(f for d in package_dirs() for f in d.rglob("*.py"))


def docstrings(path: Path) -> list[tuple[int, str]]:
    """(line of the opening quotes, raw text) of every docstring in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                found.append((body[0].value.lineno, body[0].value.value))
    return found


def has_reason(source: str) -> bool:
    """A comment other than the doctest directive in an example's source."""
    try:
        comments = [t.string for t in tokenize.generate_tokens(io.StringIO(source).readline)
                    if t.type == tokenize.COMMENT]
    except (tokenize.TokenError, SyntaxError):
        return False
    return any(c.lstrip("#").strip() and not c.lstrip("#").strip().startswith("doctest:") for c in comments)


def unexplained_skips(docstring: str) -> list[doctest.Example]:
    bad, explained_run_ends_at = [], None
    for ex in PARSER.get_examples(docstring):
        if not ex.options.get(SKIP):
            explained_run_ends_at = None
            continue
        if has_reason(ex.source) or ex.lineno == explained_run_ends_at:
            explained_run_ends_at = ex.lineno + ex.source.count("\n") + ex.want.count("\n")
        else:
            bad.append(ex)
            explained_run_ends_at = None
    return bad


def test_every_skipped_example_says_why():
    missing = [
        f"{path.relative_to(ROOT)}:{start + ex.lineno}: {ex.source.strip().splitlines()[0]}"
        for path in source_files()
        for start, text in docstrings(path)
        for ex in unexplained_skips(text)
    ]
    assert not missing, (
        "docstring examples skipped without a reason; write it as a comment before the directive "
        "(`>>> call()  # needs the COCO features  # doctest: +SKIP`):\n" + "\n".join(missing)
    )


@pytest.mark.parametrize(
    ("docstring", "unexplained"),
    [
        (">>> f()  # doctest: +SKIP\n", 1),
        (">>> f()  # downloads the weights  # doctest: +SKIP\n>>> g()  # doctest: +SKIP\n", 0),
        (">>> f()  # downloads  # doctest: +SKIP\n\nprose\n\n>>> g()  # doctest: +SKIP\n", 1),
        (">>> f()  # downloads  # doctest: +SKIP\n>>> h()\n>>> g()  # doctest: +SKIP\n", 1),
        (">>> f('# not a comment')  # doctest: +SKIP\n", 1),
        (">>> f()  # doctest: +SKIP\nout\n>>> g()  # doctest: +SKIP\n", 2),
        (">>> f()\n", 0),
    ],
)
def test_skip_reason_rule(docstring, unexplained):
    assert len(unexplained_skips(docstring)) == unexplained


def test_pytest_runs_the_docstring_examples_of_every_package():
    options = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["pytest"]["ini_options"]
    assert "--doctest-modules" in options["addopts"].split()
    testpaths = [ROOT / p for p in options["testpaths"]]
    uncovered = [d for d in package_dirs() if not any(d == t or t in d.parents for t in testpaths)]
    assert not uncovered, f"packages whose docstring examples `pytest -q` does not collect: {uncovered}"
