"""``docs/new-dataset.md``, executed: a captioned set xmatch has never seen, in the TERAN
layout, trained with a text side built from its captions and evaluated, by the page's own
commands. Plus the layout's reading of image sizes from the dataset JSON.

Conventions of the page (stated there too): ``bash`` lines run in order from an empty folder
(``xmatch`` through this interpreter; a trailing backslash continues a line; ``status="N"`` on
the fence: the exit status expected instead of 0); each ``python`` block runs in a fresh
process; an ``output`` block is what the block before it prints (stdout and stderr), ``...``
standing for any text.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import xmatch
from xmatch.cli.main import build_parser
from xmatch.data import DataError, TeranDataset
from xmatch.train import recipe_names

from test_tutorial_plugin import Block, output_matches, parse

PAGE = Path(__file__).resolve().parents[1] / "docs" / "new-dataset.md"
# unbuffered, with stderr into stdout: what the page shows is the terminal's interleaving
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def blocks() -> list[Block]:
    return parse(PAGE.read_text(encoding="utf-8"))


def commands(block: Block) -> list[str]:
    """The command lines of a bash block, continuation lines joined, comments left out."""
    lines, current = [], ""
    for text in block.code.splitlines():
        if text.rstrip().endswith("\\"):
            current += text.rstrip()[:-1] + " "
            continue
        current += text
        if current.strip() and not current.lstrip().startswith("#"):
            lines.append(current.strip())
        current = ""
    return lines


def argv(line: str) -> list[str]:
    words = shlex.split(line)
    assert words[0] == "xmatch", f"{PAGE.name}: the page runs `{line}`; only xmatch commands run here."
    return words[1:]


def test_the_page_follows_its_conventions():
    page = blocks()
    runnable = [b for b in page if b.lang in ("bash", "python")]
    assert runnable and all(b.expected is not None for b in runnable), [b.line for b in runnable if b.expected is None]
    parser = build_parser()
    for block in (b for b in page if b.lang == "bash"):
        for line in commands(block):
            args = parser.parse_args(argv(line))  # every option of the page exists
            for name in [getattr(args, "model", None), *getattr(args, "models", [])]:
                if name and not name.startswith("local-dir:"):
                    xmatch.info(name)  # every zoo entry exists
            assert getattr(args, "recipe", None) in (None, *recipe_names())
    for block in (b for b in page if b.lang == "python"):
        compile(block.code, str(PAGE), "exec")


def run_bash(block: Block, workdir: Path) -> None:
    expected_status = int(block.attrs.get("status", 0))
    printed = []
    for line in commands(block):
        result = subprocess.run(
            [sys.executable, "-m", "xmatch", *argv(line)], cwd=workdir, env=ENV, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, timeout=600, check=False,
        )
        assert result.returncode == expected_status, (
            f"{PAGE.name}:{block.line}: `{line}` exited with {result.returncode}, expected {expected_status}:\n"
            f"{result.stdout[-6000:]}"
        )
        printed.append(result.stdout)
    actual = "".join(printed)
    assert output_matches(block.expected, actual), f"{PAGE.name}:{block.line}: expected\n{block.expected}\ngot\n{actual}"


def run_python(block: Block, workdir: Path) -> None:
    # padded so that a traceback's line numbers are the page's
    script = workdir / f"block-{block.line}.py"
    script.write_text("\n" * block.line + block.code, encoding="utf-8")
    result = subprocess.run(
        [sys.executable, str(script)], cwd=workdir, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, timeout=600, check=False,
    )
    assert result.returncode == 0, f"{PAGE.name}:{block.line} failed:\n{result.stdout[-6000:]}"
    actual = result.stdout
    assert output_matches(block.expected, actual), f"{PAGE.name}:{block.line}: expected\n{block.expected}\ngot\n{actual}"


@pytest.mark.slow
def test_the_page_runs_end_to_end(tmp_path):
    for block in blocks():
        if block.lang == "bash":
            run_bash(block, tmp_path)
        elif block.lang == "python":
            run_python(block, tmp_path)
    # what the page promises about the run folder and the bundles
    assert (tmp_path / "runs/mine/text_side/vocab.json").is_file()
    assert (tmp_path / "runs/mine/best/vocab.json").read_bytes() == (tmp_path / "runs/mine/text_side/vocab.json").read_bytes()
    assert not (tmp_path / "runs/as-is").exists() or not any((tmp_path / "runs/as-is").iterdir())


# --- image sizes in the dataset JSON ----------------------------------------------------------

def karpathy_set(root: Path, sizes: dict[int, tuple[int, int] | None]) -> Path:
    """Two train images with 2 regions each; ``sizes[imgid]`` goes into the JSON (None: left out)."""
    (root / "bu_att").mkdir(parents=True)
    (root / "bu_box").mkdir(parents=True)
    images = []
    for imgid, size in sizes.items():
        np.savez(root / "bu_att" / f"{imgid}.npz", feat=np.ones((2, 4), np.float32))
        np.save(root / "bu_box" / f"{imgid}.npy", np.array([[0, 0, 100, 50], [10, 10, 200, 100]], np.float32))
        entry = {"imgid": imgid, "split": "train", "filename": f"{imgid}.jpg",
                 "sentences": [{"raw": f"image {imgid} caption {k}"} for k in range(5)]}
        if size is not None:
            entry["width"], entry["height"] = size
        images.append(entry)
    (root / "dataset.json").write_text(json.dumps({"images": images}))
    return root / "dataset.json"


def test_teran_reads_image_sizes_from_the_dataset_json(tmp_path):
    captions = karpathy_set(tmp_path / "d", {0: (200, 100), 1: (400, 200)})
    ds = TeranDataset(tmp_path / "d", "train", captions=captions)
    assert ds.size_source == f"width / height of the images in {captions}"
    assert ds.image_size(1) == (400.0, 200.0)
    np.testing.assert_allclose(ds.image(0).boxes, [[0, 0, 0.5, 0.5], [0.05, 0.1, 1, 1]])
    # the same file given as sizes= (what the user tried) reads the same sizes
    assert TeranDataset(tmp_path / "d", "train", captions=captions, sizes=captions).image_size(1) == (400.0, 200.0)


def test_teran_names_the_images_whose_size_is_missing_from_the_json(tmp_path):
    captions = karpathy_set(tmp_path / "some", {0: (200, 100), 1: None})
    with pytest.raises(DataError, match=r"1 of the 2 images of the split have no numeric 'width' and 'height' \(ids 1\)"):
        TeranDataset(tmp_path / "some", "train", captions=captions)
    captions = karpathy_set(tmp_path / "none", {0: None, 1: None})
    with pytest.raises(DataError, match=r"have no 'width' / 'height': add them .* sizes=.*images="):
        TeranDataset(tmp_path / "none", "train", captions=captions)
