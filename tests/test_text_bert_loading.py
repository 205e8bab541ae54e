"""Loading a BERT-family backbone is quiet: no progress bar or load report from transformers
for the heads the encoder leaves out on purpose, and a clear warning when weights are missing."""

from __future__ import annotations

import logging
import shutil

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModel

from xmatch.components.text.bert import BertTextEncoder

from conftest import MINILM


def test_a_backbone_with_a_pooler_in_its_weights_loads_without_output(capfd, caplog):
    with caplog.at_level(logging.WARNING):
        encoder = BertTextEncoder(MINILM, layers=2)  # the file's pooler and 4 more layers are left out
    out, err = capfd.readouterr()
    assert out == "" and err == "", (out, err)
    assert not [r for r in caplog.records if r.name.startswith("xmatch")]
    assert encoder.model.config.num_hidden_layers == 2


def test_missing_weights_are_named_in_a_warning(fixture_bert, tmp_path, caplog):
    directory = tmp_path / "bert"
    shutil.copytree(fixture_bert, directory)
    torch.manual_seed(0)
    AutoModel.from_config(AutoConfig.from_pretrained(directory), add_pooling_layer=False).save_pretrained(directory)
    weights = load_file(directory / "model.safetensors")
    dropped = next(k for k in weights if "encoder.layer.0.attention.self.query.weight" in k)
    save_file({k: v for k, v in weights.items() if k != dropped}, directory / "model.safetensors", {"format": "pt"})
    with caplog.at_level(logging.WARNING, logger="xmatch"):
        BertTextEncoder(str(directory), layers=None)
    warned = [r.getMessage() for r in caplog.records if r.name == "xmatch.components.text.bert"]
    assert len(warned) == 1 and "1 tensors" in warned[0] and "start random" in warned[0], warned
    assert "encoder.layer.0.attention.self.query.weight" in warned[0]
