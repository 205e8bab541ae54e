"""Loading a BERT-family backbone is quiet: no progress bar or load report from transformers
for the heads the encoder leaves out on purpose, and a clear warning when weights are missing;
its weights are read from safetensors only: a pickled weights file is refused unread."""

from __future__ import annotations

import logging
import shutil
import traceback
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModel

import xmatch
from xmatch.components.text.bert import BertTextEncoder
from xmatch.core.errors import XmatchError
from xmatch.core.spec import SpecError
from xmatch.io.safe_load import CheckpointReadError

from conftest import MINILM, tiny_spec


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


# -- pickled weights: never unpickled, never torch's weights_only=False advice ----------------


class Payload:
    """Creates ``marker`` when unpickled by an unrestricted unpickler: a hostile weights file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def hostile_bert(fixture_bert: str, directory: Path, marker: Path, name: str = "pytorch_model.bin") -> Path:
    """A copy of the tiny BERT folder whose ``name`` is a hostile pickle."""
    shutil.copytree(fixture_bert, directory)
    torch.save({"embeddings.word_embeddings.weight": torch.zeros(2, 2), "hook": Payload(marker)}, directory / name)
    return directory / name


def everything(error: BaseException) -> str:
    return "".join(traceback.format_exception(error))


def test_the_payload_of_the_hostile_file_is_live(fixture_bert, tmp_path):
    # the control: an unrestricted unpickler runs it, so the tests below would see the marker
    marker = tmp_path / "MARKER"
    weights = hostile_bert(fixture_bert, tmp_path / "bert", marker)
    torch.load(weights, weights_only=False)
    assert marker.exists()


@pytest.mark.parametrize("name", ["pytorch_model.bin", "pytorch_model-00001-of-00002.bin", "model.pt"])
def test_a_pickled_backbone_is_refused_without_unpickling_it(fixture_bert, tmp_path, name):
    marker = tmp_path / "MARKER"
    weights = hostile_bert(fixture_bert, tmp_path / "bert", marker, name)
    with pytest.raises(CheckpointReadError) as info:
        BertTextEncoder(str(tmp_path / "bert"), layers=None)
    message = str(info.value)
    assert str(weights) in message and "from safetensors only: unpickling a file can run any code" in message
    assert "safetensors" in message and "save_pretrained" in message
    assert isinstance(info.value, XmatchError)
    assert "weights_only=False" not in everything(info.value) and "will likely succeed" not in everything(info.value)
    assert not marker.exists()


def test_a_pickled_backbone_in_a_spec_is_a_spec_error(fixture_bert, tmp_path):
    marker = tmp_path / "MARKER"
    weights = hostile_bert(fixture_bert, tmp_path / "bert", marker)
    spec = tiny_spec(str(tmp_path / "bert"))
    spec["text_encoder"].update(pretrained=True, layers=None)
    with pytest.raises(SpecError, match="from safetensors only") as info:
        xmatch.build(spec)
    assert str(weights) in str(info.value) and "weights_only=False" not in everything(info.value)
    assert not marker.exists()


def test_safetensors_weights_are_loaded_and_a_pickle_beside_them_is_left_alone(fixture_bert, tmp_path):
    marker = tmp_path / "MARKER"
    hostile_bert(fixture_bert, tmp_path / "bert", marker)
    directory = tmp_path / "bert"
    torch.manual_seed(0)
    saved = AutoModel.from_config(AutoConfig.from_pretrained(directory), add_pooling_layer=False)
    saved.save_pretrained(directory)
    encoder = BertTextEncoder(str(directory), layers=None)
    assert torch.equal(encoder.model.embeddings.word_embeddings.weight, saved.embeddings.word_embeddings.weight)
    assert not marker.exists()


def test_a_backbone_directory_without_weights_says_so(fixture_bert):
    with pytest.raises(FileNotFoundError, match=r"holds no weights \(model.safetensors .*pretrained = false"):
        BertTextEncoder(fixture_bert, layers=None)


def test_weights_are_fetched_as_safetensors_only(fixture_bert, tmp_path, monkeypatch):
    # a hub id takes the same call as a directory: transformers then downloads model.safetensors only
    directory = tmp_path / "bert"
    shutil.copytree(fixture_bert, directory)
    AutoModel.from_config(AutoConfig.from_pretrained(directory), add_pooling_layer=False).save_pretrained(directory)
    asked = {}

    def unavailable(source, **kwargs):
        asked.update(kwargs)
        raise OSError("org/bert does not appear to have a file named model.safetensors")

    monkeypatch.setattr(AutoModel, "from_pretrained", unavailable)
    with pytest.raises(OSError, match=r"cannot load the weights of .*model.safetensors only, never from a pickle"):
        BertTextEncoder(str(directory), layers=None)
    assert asked["use_safetensors"] is True
