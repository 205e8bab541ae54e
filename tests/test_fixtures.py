"""The test suite is self-contained: the files it reads live in tests/fixtures, pinned by
tests/fixtures/SHA256SUMS, and no test reaches for data outside the clone."""

from __future__ import annotations

import ast
import hashlib
import re
from pathlib import Path

from conftest import FIXTURES

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = FIXTURES / "SHA256SUMS"
# places a test could take data from that a fresh clone does not have
OUTSIDE = re.compile(r"/work/|\.\./shared|shared/fixtures|\.cache/xmatch|XMATCH_FIXTURES")


def suite_sources() -> list[Path]:
    files = [*ROOT.glob("tests/*.py"), *ROOT.glob("plugins/*/tests/*.py"), ROOT / "conftest.py"]
    return sorted(f for f in files if f.resolve() != Path(__file__).resolve())


def pinned() -> dict[str, str]:
    lines = MANIFEST.read_text(encoding="utf-8").splitlines()
    return {name: digest for digest, name in (line.split(maxsplit=1) for line in lines)}


def test_fixture_folder_is_inside_the_clone():
    assert FIXTURES.resolve().is_relative_to(ROOT.resolve()) and FIXTURES.is_dir()


def test_fixture_files_match_their_pinned_checksums():
    present = {p.relative_to(FIXTURES).as_posix() for p in FIXTURES.rglob("*")
               if p.is_file() and p != MANIFEST and "__pycache__" not in p.parts}
    expected = pinned()
    assert present == set(expected), (
        f"tests/fixtures and SHA256SUMS differ: unlisted {sorted(present - set(expected))}, "
        f"missing {sorted(set(expected) - present)}"
    )
    changed = [n for n, digest in expected.items() if hashlib.sha256((FIXTURES / n).read_bytes()).hexdigest() != digest]
    assert not changed, f"fixture files changed since they were pinned: {changed}"


def test_no_test_reads_data_from_outside_the_clone():
    found = []
    for path in suite_sources():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and OUTSIDE.search(node.value):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value[:80]!r}")
    assert not found, "tests that name files outside the repository:\n" + "\n".join(found)


def test_every_fixture_folder_the_tests_name_exists():
    named = set()
    for path in suite_sources():
        text = path.read_text(encoding="utf-8")
        named |= {"/".join(parts) for parts in re.findall(r'FIXTURES\s*/\s*"([\w.-]+)"\s*/\s*"([\w.-]+)"', text)}
        named |= set(re.findall(r"tests/fixtures/([\w.-]+/[\w.-]+)", text))
    assert named, "no fixture reference found: the pattern above is out of date"
    missing = sorted(n for n in named if not (FIXTURES / n).exists())
    assert not missing, f"fixtures the tests name but the repository lacks: {missing}"
