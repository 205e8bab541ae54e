"""Every ```python block of README.md and docs/*.md, executed as written.

A page's blocks run in order in one namespace, in a fresh process (a block may register a
component) whose working directory is an empty temporary folder, offline
(``HF_HUB_OFFLINE=1``), with ``XMATCH_HOME`` the session's when it is set, else a temporary
folder shared by the pages (the scenes data are generated once). Each block is compiled at its
own line of the page, so a traceback points into the page.

The line right before a block's fence may hold a marker with its reason:

- ``<!-- skip: REASON -->``: the block cannot run here (the COCO features, the authors'
  checkpoints, the network); it is only compiled.
- ``<!-- slow: REASON -->``: it runs with ``--runslow`` or ``CI=true`` only (conftest.py), e.g.
  because it generates the scenes data. A later block of the page must not need it, or be
  slow too.

The files a page reads as the user's own (a spec file, a trained bundle, photos, an index)
are written into the working directory by the page's entry in ``SETUP`` before its blocks run.

Two pages are executed by their own tests, with the shell commands between their blocks, and
are left out here: docs/tutorial-plugin.md (tests/test_tutorial_plugin.py) and
docs/new-dataset.md (tests/test_new_dataset.py).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: pages whose blocks another test executes: page -> that test
EXECUTED_ELSEWHERE = {
    "docs/tutorial-plugin.md": "tests/test_tutorial_plugin.py",
    "docs/new-dataset.md": "tests/test_new_dataset.py",
}
PAGES = [p for p in ["README.md", *sorted(f"docs/{f.name}" for f in (ROOT / "docs").glob("*.md"))]
         if p not in EXECUTED_ELSEWHERE]
FENCE = re.compile(r"^```python\s*$")
MARKER = re.compile(r"^<!--\s*(?P<kind>skip|slow)\s*:(?P<reason>.*?)-->\s*$")
ANY_MARKER = re.compile(r"<!--\s*(skip|slow)\b")
# Runs one page's blocks in one namespace; a marker line before each block tells which block failed.
RUNNER = """
import json, sys
page = json.load(open(sys.argv[1], encoding="utf-8"))
namespace = {"__name__": "__main__"}
for block in page["blocks"]:
    print(f"=== {page['path']}:{block['line']} ===", flush=True)
    exec(compile("\\n" * block["line"] + block["code"], page["path"], "exec"), namespace)
"""


@dataclass
class Block:
    """A ```python block: the line of its opening fence (1-based), its code, and its marker
    (``skip`` / ``slow`` and the reason) if the line before the fence holds one."""

    line: int
    code: str
    marker: str | None = None
    reason: str = ""


def python_blocks(page: str) -> list[Block]:
    lines = (ROOT / page).read_text(encoding="utf-8").splitlines()
    blocks = []
    for i, text in enumerate(lines):
        if not FENCE.match(text):
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
        assert end is not None, f"{page}:{i + 1}: the python block is never closed"
        marker = MARKER.match(lines[i - 1]) if i else None
        blocks.append(Block(i + 1, "".join(f"{line}\n" for line in lines[i + 1 : end]),
                            marker and marker["kind"], marker["reason"].strip() if marker else ""))
    return blocks


def run_slow(config: pytest.Config) -> bool:
    return bool(config.getoption("--runslow")) or os.environ.get("CI", "").lower() in ("1", "true")


# --- the user's own files, written before a page runs --------------------------------------


def write_spec_file(workdir: Path) -> None:
    """``my_model.toml``: the spec of the shipped scenes TERAN, as ``xmatch info NAME --spec`` writes it."""
    import tomli_w

    import xmatch

    (workdir / "my_model.toml").write_text(tomli_w.dumps(xmatch.info("teran-mrsw-scenes").spec))


def write_trained_bundle(workdir: Path) -> None:
    """``runs/mine/best``: a trained bundle, as ``xmatch train`` leaves it (the shipped scenes TERAN)."""
    import xmatch

    xmatch.save_pretrained(xmatch.build("teran-mrsw-scenes", pretrained=True), workdir / "runs" / "mine" / "best")


def write_photo(path: Path, seed: int = 0) -> None:
    """A small noise picture, as a JPEG."""
    import numpy as np
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (120, 160, 3), dtype=np.uint8)).save(path)


def write_photos(workdir: Path) -> None:
    """``my_photos/``: three pictures, ``beach.jpg`` and ``harbour.jpg`` among them."""
    for seed, name in enumerate(("beach", "harbour", "street")):
        write_photo(workdir / "my_photos" / f"{name}.jpg", seed)


def readme_setup(workdir: Path, slow: bool) -> None:
    write_spec_file(workdir)
    if slow:  # the index the README's `xmatch index ... --out idx` makes, for its search block
        from xmatch.cli.main import main

        assert main(["index", "teran-mrsw-scenes", "--dataset", "scenes", "--split", "test",
                     "--out", str(workdir / "idx"), "--no-progress"]) == 0


def extract_setup(workdir: Path, slow: bool) -> None:
    if slow:
        write_photos(workdir)
        write_trained_bundle(workdir)


SETUP: dict[str, Callable[[Path, bool], None]] = {
    "README.md": readme_setup,
    "docs/weights.md": lambda workdir, slow: write_trained_bundle(workdir),
    "docs/extract.md": extract_setup,
    "docs/scenes.md": lambda workdir, slow: write_photo(workdir / "photo.jpg"),
}


# --- the tests -----------------------------------------------------------------------------


def test_the_pages_run_elsewhere_exist_and_are_executed_there():
    for page, test in EXECUTED_ELSEWHERE.items():
        assert (ROOT / page).is_file() and f'"{Path(page).name}"' in (ROOT / test).read_text(encoding="utf-8"), test


def test_every_marker_gives_a_reason_and_sits_on_a_python_block():
    for page in PAGES:
        lines = (ROOT / page).read_text(encoding="utf-8").splitlines()
        for i, text in enumerate(lines):
            if not ANY_MARKER.search(text):
                continue
            marker = MARKER.match(text)
            assert marker and marker["reason"].strip(), (
                f"{page}:{i + 1}: write the marker as <!-- skip: REASON --> or <!-- slow: REASON -->, with its reason")
            assert i + 1 < len(lines) and FENCE.match(lines[i + 1]), (
                f"{page}:{i + 1}: a marker goes on the line right before a ```python fence")


@pytest.mark.parametrize("page", PAGES)
def test_every_block_compiles(page):
    for block in python_blocks(page):
        compile("\n" * block.line + block.code, page, "exec")


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    return Path(os.environ.get("XMATCH_HOME") or tmp_path_factory.mktemp("xmatch-home"))


@pytest.mark.parametrize("page", [p for p in PAGES if python_blocks(p)])
def test_page_runs_as_written(page, request, tmp_path, home, monkeypatch):
    slow = run_slow(request.config)
    blocks = python_blocks(page)
    runs = [b for b in blocks if b.marker is None or (b.marker == "slow" and slow)]
    if not runs:
        pytest.skip("; ".join(sorted({f"{b.marker}: {b.reason}" for b in blocks})))
    monkeypatch.setenv("XMATCH_HOME", str(home))
    monkeypatch.chdir(tmp_path)
    if page in SETUP:
        SETUP[page](tmp_path, slow)
    session = tmp_path.parent / f"{tmp_path.name}-blocks.json"
    session.write_text(json.dumps({"path": str(ROOT / page), "blocks": [
        {"line": b.line, "code": b.code} for b in runs]}), encoding="utf-8")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "XMATCH_HOME": str(home)}
    result = subprocess.run([sys.executable, "-c", RUNNER, str(session)], cwd=tmp_path, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=1800, check=False)
    assert result.returncode == 0, f"{page}: a block failed:\n{result.stdout[-6000:]}"
