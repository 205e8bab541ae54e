"""``docs/tutorial-plugin.md``, executed: the plugin it writes installs, registers through
entry points, builds, scores, trains and passes its own tests.

Conventions of the page (stated there too): a fenced block with ``title="PATH"`` is a file
written to PATH; ``bash`` blocks run in order (``pip`` and ``pytest`` through this interpreter,
``pip install`` offline); consecutive ``python`` blocks form one session run in a fresh
process (entry points are read once per process); an ``output`` block is what the block before
it prints, ``...`` standing for any text.

The plugin is installed into this interpreter's environment, so the slow test uninstalls it
before it starts (a leftover of an interrupted run) and in a ``finally``: other tests check the
exact lists of built-in components.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from xmatch.core.registry import KINDS

TUTORIAL = Path(__file__).resolve().parents[1] / "docs" / "tutorial-plugin.md"
DISTRIBUTION = "xmatch-maxsim-demo"
FOLDER = "xmatch-maxsim-demo"
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<info>.*)$")
ATTRIBUTE = re.compile(r'(\w+)="([^"]*)"')
MARK = "=== tutorial block at line {} ==="
ENV = {
    **os.environ,
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    "PIP_NO_INPUT": "1",
}
# Runs the blocks of one session in one namespace; each block is compiled at its own line of
# the page, so a traceback points into docs/tutorial-plugin.md.
RUNNER = """
import json, sys
session = json.load(open(sys.argv[1], encoding="utf-8"))
namespace = {"__name__": "__main__"}
for block in session["blocks"]:
    print(session["mark"].format(block["line"]), flush=True)
    exec(compile("\\n" * block["line"] + block["code"], session["path"], "exec"), namespace)
"""


@dataclass
class Block:
    """A fenced block of the page: language, ``key="value"`` attributes, its text, the line of
    its opening fence (1-based), and the ``output`` block that follows it, if any."""

    lang: str
    attrs: dict[str, str]
    code: str
    line: int
    expected: str | None = None


def parse(text: str) -> list[Block]:
    """The fenced blocks of a markdown page, ``output`` blocks attached to the block before."""
    lines = text.splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        indent = len(opening["indent"])
        lang, _, rest = opening["info"].strip().partition(" ")
        end = i + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        if end == len(lines):
            raise ValueError(f"{TUTORIAL.name}:{i + 1}: the fenced block is never closed.")
        code = "".join(line[indent:] + "\n" for line in lines[i + 1 : end])
        if lang == "output":
            previous = blocks[-1] if blocks else None
            if previous is None or previous.lang not in ("python", "bash") or "title" in previous.attrs:
                raise ValueError(f"{TUTORIAL.name}:{i + 1}: an output block must follow a python or bash block.")
            if previous.expected is not None:
                raise ValueError(f"{TUTORIAL.name}:{i + 1}: two output blocks after one block.")
            previous.expected = code
        else:
            blocks.append(Block(lang, dict(ATTRIBUTE.findall(rest)), code, i + 1))
        i = end + 1
    return blocks


def output_matches(expected: str, actual: str) -> bool:
    """``actual`` is ``expected`` where each ``...`` stands for any text (trailing spaces ignored)."""
    def clean(s: str) -> str:
        return "\n".join(line.rstrip() for line in s.strip().splitlines())

    pattern = ".*?".join(re.escape(part) for part in clean(expected).split("..."))
    return re.fullmatch(pattern, clean(actual), flags=re.DOTALL) is not None


def tutorial_blocks() -> list[Block]:
    return parse(TUTORIAL.read_text(encoding="utf-8"))


def titled(blocks: list[Block]) -> dict[str, Block]:
    return {b.attrs["title"]: b for b in blocks if "title" in b.attrs}


def plugin_installed() -> bool:
    importlib.invalidate_caches()  # importlib.metadata caches directory listings
    try:
        importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def uninstall_plugin() -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "uninstall", "-y", DISTRIBUTION],
        capture_output=True, text=True, env=ENV, timeout=300, check=False,
    )


def offline_command(words: list[str]) -> list[str]:
    """The command a bash line of the page runs as, through this interpreter and offline."""
    if words[:2] == ["pip", "install"]:
        return [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index", *words[2:]]
    if words[:2] == ["pip", "uninstall"]:
        return [sys.executable, "-m", "pip", *words[1:]]
    if words[:1] == ["pytest"]:
        return [sys.executable, "-m", "pytest", *words[1:], "-p", "no:cacheprovider"]
    raise AssertionError(f"the tutorial runs `{shlex.join(words)}`, which this test cannot run offline.")


def run_bash(block: Block, workdir: Path) -> None:
    stdout = []
    for text in block.code.splitlines():
        if not text.strip() or text.lstrip().startswith("#"):
            continue
        result = subprocess.run(
            offline_command(shlex.split(text)), cwd=workdir, env=ENV, capture_output=True, text=True, timeout=600
        )
        assert result.returncode == 0, (
            f"{TUTORIAL.name}:{block.line}: `{text}` failed ({result.returncode}):\n"
            f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
        )
        stdout.append(result.stdout)
    if block.expected is not None:
        actual = "".join(stdout)
        assert output_matches(block.expected, actual), (
            f"{TUTORIAL.name}:{block.line}: expected\n{block.expected}\ngot\n{actual}"
        )


def run_session(blocks: list[Block], workdir: Path) -> None:
    session = workdir / f"session-{blocks[0].line}.json"
    session.write_text(json.dumps({
        "mark": MARK,
        "path": str(TUTORIAL),
        "blocks": [{"line": b.line, "code": b.code} for b in blocks],
    }), encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-c", RUNNER, str(session)], cwd=workdir, env=ENV, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, (
        f"the python session starting at {TUTORIAL.name}:{blocks[0].line} failed:\n"
        f"{result.stdout[-4000:]}\n{result.stderr[-6000:]}"
    )
    parts = re.split(r"^=== tutorial block at line (\d+) ===\n", result.stdout, flags=re.MULTILINE)
    printed = {int(line): out for line, out in zip(parts[1::2], parts[2::2])}
    for b in blocks:
        if b.expected is not None:
            assert output_matches(b.expected, printed[b.line]), (
                f"{TUTORIAL.name}:{b.line}: expected\n{b.expected}\ngot\n{printed[b.line]}"
            )


def run_tutorial(blocks: list[Block], workdir: Path) -> None:
    """Walk the page top to bottom: write files, run bash blocks, run python sessions."""
    session: list[Block] = []

    def flush() -> None:
        if session:
            run_session(session, workdir)
            session.clear()

    for block in blocks:
        if "title" in block.attrs:
            flush()
            path = workdir / block.attrs["title"]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(block.code, encoding="utf-8")
        elif block.lang == "python":
            session.append(block)
        elif block.lang == "bash":
            flush()
            run_bash(block, workdir)
    flush()


def test_output_matching_treats_ellipsis_as_any_text():
    assert output_matches("a ... c\n", "a bb\nb c  \n")
    assert output_matches("True\n[]", "True\n[]\n")
    assert not output_matches("True", "True\nFalse")
    assert not output_matches("x (y)", "x y")


def test_the_tutorial_follows_its_conventions():
    blocks = tutorial_blocks()
    files = titled(blocks)
    assert all(path.startswith(f"{FOLDER}/") and ".." not in path for path in files), sorted(files)
    project = tomllib.loads(files[f"{FOLDER}/pyproject.toml"].code)
    assert project["project"]["name"] == DISTRIBUTION, "the test uninstalls the distribution by this name"
    entry_points = project["project"]["entry-points"]
    assert set(entry_points) <= {f"xmatch_{kind}" for kind in KINDS}
    for group, names in entry_points.items():
        for name, target in names.items():
            module, _, attribute = target.partition(":")
            source = f"{FOLDER}/src/{module.replace('.', '/')}.py"
            assert source in files, f"{group} {name} = {target}: no block writes {source}"
            assert re.search(rf"^(class|def) {attribute}\b", files[source].code, re.MULTILINE), target
    commands = [line.strip() for b in blocks if b.lang == "bash" for line in b.code.splitlines() if line.strip()]
    assert f"pip install ./{FOLDER}" in commands and f"pip uninstall -y {DISTRIBUTION}" in commands
    python = [b for b in blocks if b.lang == "python" and "title" not in b.attrs]
    silent = [b.line for b in python if b.expected is None]
    assert python and not silent, f"python blocks without an output block to check: lines {silent}"


@pytest.mark.slow
def test_the_tutorial_runs_end_to_end(tmp_path):
    blocks = tutorial_blocks()
    uninstall_plugin()  # a leftover of an interrupted run would change the first session
    assert not plugin_installed(), f"{DISTRIBUTION} is installed and could not be uninstalled"
    try:
        run_tutorial(blocks, tmp_path)
    finally:
        uninstall_plugin()
    assert not plugin_installed(), f"{DISTRIBUTION} is still installed after the test"
