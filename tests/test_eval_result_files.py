"""Eval result files read back (``xmatch eval RESULTS.json``, ``--report``): a file that is not
one (binary, not UTF-8, not JSON, another layout) is an ``XmatchError`` that names the file and
what was expected, before any model is evaluated."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from xmatch.cli.main import main
from xmatch.core.errors import XmatchError
from xmatch.eval import evaluate_scores
from xmatch.eval.suite import ResultFileError, RunRecord, load_records

EXPECTED = "xmatch eval --json"


def _saved(path: Path) -> dict:
    RunRecord("perfect", evaluate_scores(np.eye(3).repeat(5, axis=1), "full")).save_json(path)
    return json.loads(path.read_text(encoding="utf-8"))


BAD_FILES = {
    "binary": b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x10",
    "latin-1": '{"name": "caf\xe9"}'.encode("latin-1"),
    "utf-16": '{"i2t": {}, "t2i": {}}'.encode("utf-16"),
    "not json": b"i2t r1 50.0\nt2i r1 40.0\n",
    "empty": b"",
    "deep": b"[" * 100_000 + b"]" * 100_000,
}


@pytest.mark.parametrize("kind", BAD_FILES)
def test_a_file_that_is_not_json_is_named(tmp_path, kind):
    path = tmp_path / "results.json"
    path.write_bytes(BAD_FILES[kind])
    with pytest.raises(ResultFileError) as info:
        load_records(path)
    message = str(info.value)
    assert isinstance(info.value, XmatchError) and str(path) in message
    assert "is not UTF-8 JSON" in message and EXPECTED in message


@pytest.mark.parametrize(
    "change",
    [
        {"i2t": 5},
        {"t2i": ["r1", 50.0]},
        {"rsum": "high"},
        {"folds": 3},
        {"timings": 1.5},
        {"provenance": "yesterday"},
        {"ranks": [1, 2, 3]},
        {"ranks": {"i2t": [[1, 2], [3]]}},
        {"ranks": {"t2i": ["first", "second"]}},
        {"queries": {"i2t_ranks": [0, None]}},
        {"queries": 7},
    ],
    ids=lambda change: "-".join(f"{k}={v!r}" for k, v in change.items()),
)
def test_a_record_of_another_layout_is_named(tmp_path, change):
    path = tmp_path / "results.json"
    data = {**_saved(path), **change}
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ResultFileError) as info:
        load_records(path)
    assert str(path) in str(info.value) and EXPECTED in str(info.value), info.value


def test_a_bad_run_of_several_is_named_with_its_index(tmp_path):
    path = tmp_path / "results.json"
    good = _saved(path)
    path.write_text(json.dumps({"runs": [good, {**good, "i2t": None}]}), encoding="utf-8")
    with pytest.raises(ResultFileError, match=r"results\.json\[1\]"):
        load_records(path)


def test_good_files_still_load(tmp_path):
    path = tmp_path / "one.json"
    good = _saved(path)
    (record,) = load_records(path)
    assert record.name == "perfect" and record.ranks("i2t").tolist() == [0, 0, 0]
    path.write_text(json.dumps({"runs": [good, {**good, "name": "again"}]}), encoding="utf-8")
    assert [r.name for r in load_records(path)] == ["perfect", "again"]


def test_the_cli_names_a_binary_result_file(tmp_path, capsys):
    path = tmp_path / "results.json"
    path.write_bytes(BAD_FILES["binary"])
    assert main(["eval", str(path), "--report", str(tmp_path / "report")]) != 0
    err = capsys.readouterr().err
    assert str(path) in err and "is not UTF-8 JSON" in err and "Traceback" not in err
    assert not (tmp_path / "report").exists()
