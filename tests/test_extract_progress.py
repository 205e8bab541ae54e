"""``xmatch extract`` in a log (issue 42): a plain progress line every so often instead of a
bar, the dataset file written as each split finishes, and ``--help`` listing every proposer."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from xmatch.cli.main import main as cli
from xmatch.core import registry
from xmatch.core.progress import progress_bar
from xmatch.data import open_dataset
from xmatch.data.errors import DataError
from xmatch.extract import extract
from xmatch.regions import RegionPipeline

from test_extract import PIPE, make_photos
from test_registry import fake_distribution

#: a plain progress line: no carriage return, done / total, the rate and the time left
LINE = re.compile(r"^extract: (\d+)/6 img, [\d.]+ img/s, (\d+ s|\d+ min|[\d.]+ h) left$")
#: sha256 of the dataset_xmatch.json of make_photos' folder that xmatch extract wrote before
#: issue 42: the file a finished run writes must stay byte for byte what it was
DATASET_BEFORE = "c4d85e6afc8f900f010067c450aa0ac949c4189378022347ee13f6de89fb8e88"


@pytest.fixture()
def photos(tmp_path: Path) -> Path:
    return make_photos(tmp_path / "photos")


# -- progress a log can read ------------------------------------------------------------------


def test_a_log_gets_a_plain_line_at_each_interval():
    log = io.StringIO()  # a file, a pipe, a CI log: isatty() is False
    with progress_bar(total=6, desc="extract", unit="img", file=log, every=0) as bar:
        for _ in range(3):
            bar.update(2)
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue() and len(lines) == 3, lines
    assert [LINE.match(line).group(1) for line in lines] == ["2", "4", "6"]
    assert lines[-1].endswith(" 0 s left")
    assert list(progress_bar(range(3), desc="extract", file=log, every=0)) == [0, 1, 2]
    quiet = io.StringIO()  # the default interval: a short job leaves the log as it was
    with progress_bar(total=6, desc="extract", unit="img", file=quiet) as bar:
        bar.update(6)
    assert quiet.getvalue() == ""


def test_the_interval_is_checked_and_settable_for_every_command(monkeypatch):
    with pytest.raises(ValueError, match=r"progress interval must be 0 seconds or more, got -1"):
        progress_bar(total=1, file=io.StringIO(), every=-1)
    monkeypatch.setenv("XMATCH_PROGRESS_EVERY", "soon")
    with pytest.raises(ValueError, match=r"XMATCH_PROGRESS_EVERY='soon' is not a number of seconds"):
        progress_bar(total=1, file=io.StringIO())
    monkeypatch.setenv("XMATCH_PROGRESS_EVERY", "0")
    log = io.StringIO()
    with progress_bar(total=4, desc="train", unit="step", file=log) as bar:
        bar.update(1)
        bar.set_postfix(loss="0.5000")
        bar.update(1)
    assert log.getvalue().splitlines()[1].startswith("train: 2/4 step, ") and log.getvalue().endswith(", loss=0.5000\n")


def test_extract_prints_plain_lines_when_stderr_is_not_a_terminal(photos, tmp_path, capsys):
    tiny = ["--backbone", "test_efficientnet", "--weights", "random", "--image-size", "64", "--regions", "6", "--workers", "0"]
    assert cli(["extract", str(photos), "--out", str(tmp_path / "a"), "--batch-size", "2", "--progress-every", "0", *tiny]) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("extract:")]
    assert "\r" not in err and [LINE.match(line).group(1) for line in lines] == ["2", "4", "6"], err
    assert cli(["extract", str(photos), "--out", str(tmp_path / "b"), "--no-progress", "--progress-every", "0", *tiny]) == 0
    assert "extract:" not in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli(["extract", str(photos), "--out", str(tmp_path / "c"), "--progress-every", "-5", *tiny])
    assert "--progress-every: expected 0 seconds or more, got '-5'" in capsys.readouterr().err


# -- the dataset file, split by split -----------------------------------------------------------


def dies_at(monkeypatch, call: int) -> None:
    """The pipeline's ``call``-th run raises, as if the process were killed there."""
    real = RegionPipeline.forward
    calls = {"n": 0}

    def forward(self, prepared):
        calls["n"] += 1
        if calls["n"] == call:
            raise KeyboardInterrupt
        return real(self, prepared)

    monkeypatch.setattr(RegionPipeline, "forward", forward)


# one picture per chunk, in id order: a, b, c (train), d (val), e, f (test)
@pytest.mark.parametrize(("call", "finished"), [(3, []), (4, ["train"]), (6, ["train", "val"])])
def test_each_finished_split_is_in_the_dataset_file_and_no_other(photos, tmp_path, monkeypatch, call, finished):
    out = tmp_path / "out"
    dies_at(monkeypatch, call)
    with pytest.raises(KeyboardInterrupt):
        extract(photos, out, PIPE, batch_size=1, workers=0, progress=False)
    monkeypatch.undo()
    dataset = out / "dataset_xmatch.json"
    if not finished:
        assert not dataset.exists()
    else:
        doc = json.loads(dataset.read_text())
        assert doc["finished_splits"] == finished
        assert doc["pending_splits"] == [s for s in ("train", "val", "test") if s not in finished]
        assert sorted({im["split"] for im in doc["images"]}) == sorted(finished)
        # training can start: the finished splits read as the teran dataset, the others do not
        assert open_dataset("teran", out, split="train").num_images == 3
        with pytest.raises(DataError, match=r"has no images of split 'test' \(splits present: "):
            open_dataset("teran", out, split="test")
    result = extract(photos, out, PIPE, batch_size=1, workers=0, progress=False, resume=True)
    assert result.images == 6
    final = dataset.read_bytes()
    assert hashlib.sha256(final).hexdigest() == DATASET_BEFORE and b"finished_splits" not in final


def test_an_uninterrupted_run_writes_the_same_file_as_before(photos, tmp_path):
    extract(photos, tmp_path / "out", PIPE, batch_size=2, workers=0, progress=False)
    assert hashlib.sha256((tmp_path / "out" / "dataset_xmatch.json").read_bytes()).hexdigest() == DATASET_BEFORE


def test_a_finished_split_leaves_out_its_unreadable_pictures(photos, tmp_path, monkeypatch):
    (photos / "b.jpg").write_bytes(b"not a jpeg")
    dies_at(monkeypatch, 3)  # b is not run: the third run is d's, the first of val
    with pytest.raises(KeyboardInterrupt):
        extract(photos, tmp_path / "out", PIPE, batch_size=1, workers=0, progress=False)
    doc = json.loads((tmp_path / "out" / "dataset_xmatch.json").read_text())
    assert doc["finished_splits"] == ["train"] and [im["filename"] for im in doc["images"]] == ["a.png", "c.png"]


# -- --help ---------------------------------------------------------------------------------------


def extract_help(capsys) -> str:
    with pytest.raises(SystemExit):
        cli(["extract", "--help"])
    return capsys.readouterr().out


def test_help_lists_every_registered_proposer(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "1000")  # argparse would break a long name at its hyphen
    text = extract_help(capsys)
    assert "selective-search" in text and "windows (default)" in text
    for name in registry.proposers.names():
        assert name in text, name
    with registry.proposers.restored() as proposers:
        proposers.register("my-plugin-proposer", object)
        assert "my-plugin-proposer" in extract_help(capsys)


def test_help_lists_a_plugins_proposer_without_importing_it(tmp_path):
    fake_distribution(tmp_path, "xmatch-testproposer", """
        [xmatch_proposers]
        plugin-boxes = xmatch_testproposer:Proposer
    """, {"xmatch_testproposer": "import torch\n\nProposer = torch.nn.Identity\n"})
    probe = (
        "import contextlib, io, json, sys\nfrom xmatch.cli.main import main\nout = io.StringIO()\n"
        "with contextlib.redirect_stdout(out):\n    try:\n        main(['extract', '--help'])\n    except SystemExit:\n        pass\n"
        "print(json.dumps([out.getvalue(), sorted(m for m in ('torch', 'xmatch_testproposer') if m in sys.modules)]))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]), "COLUMNS": "1000"}
    text, imported = json.loads(subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True,
                                               check=True).stdout.splitlines()[-1])
    assert "plugin-boxes" in text and "selective-search" in text and imported == []
