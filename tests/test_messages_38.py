"""Three messages that used to mislead (issue 38): a spec file given as a model reference, a
model reference changed in an index's manifest, and a caption that is not a string."""

from __future__ import annotations

import json

import pytest
import tomli_w
import torch

import xmatch
import xmatch.index
from xmatch.cli.main import main
from xmatch.core.errors import XmatchError
from xmatch.core.spec import SpecError
from xmatch.index import ModelMismatchError
from xmatch.model.factory import build_reference

from conftest import tiny_spec

pytest.importorskip("faiss")


@pytest.fixture(scope="module")
def bundles(fixture_bert, tmp_path_factory) -> tuple[str, str]:
    """Two bundles of the same architecture with different weights."""
    out = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        path = xmatch.save_pretrained(xmatch.build(tiny_spec(fixture_bert)), tmp_path_factory.mktemp(f"b{seed}"))
        out.append(f"local-dir:{path}")
    return out[0], out[1]


def test_a_spec_file_as_a_model_reference_says_it_has_no_weights_and_how_to_name_them(fixture_bert, bundles, tmp_path,
                                                                                      capsys):
    spec = tmp_path / "model.toml"
    spec.write_text(tomli_w.dumps(tiny_spec(fixture_bert)))
    with pytest.raises(SpecError, match=r"model\.toml.* a spec without weights.*model\.toml=WEIGHTS"):
        build_reference(str(spec))
    model = xmatch.build(bundles[0], pretrained=True)
    with pytest.raises(SpecError, match=r"model_ref .*model\.toml.* a spec without weights"):
        xmatch.index.create(tmp_path / "refused", model, model_ref=str(spec))
    assert not (tmp_path / "refused").exists()

    # a manifest that records such a reference names the index and what to pass instead
    xmatch.index.create(tmp_path / "idx", model, model_ref=bundles[0])
    manifest = json.loads((tmp_path / "idx" / "index.json").read_text())
    manifest["model"]["ref"] = str(spec)
    (tmp_path / "idx" / "index.json").write_text(json.dumps(manifest))
    with pytest.raises(XmatchError, match=r"idx.* records the model .*model\.toml.* a spec without weights.*model="):
        xmatch.index.open(tmp_path / "idx")
    # the command line: one sentence, no traceback
    assert main(["search", str(tmp_path / "idx"), "--model", str(spec), "--text", "a cat"]) == 2
    err = capsys.readouterr().err
    assert "a spec without weights" in err and "Traceback" not in err


def test_a_changed_model_reference_does_not_advise_opening_without_a_model(bundles, tmp_path):
    model = xmatch.build(bundles[0], pretrained=True)
    xmatch.index.create(tmp_path / "idx", model, model_ref=bundles[0])
    manifest = json.loads((tmp_path / "idx" / "index.json").read_text())
    manifest["model"]["ref"] = bundles[1]  # the other weights
    (tmp_path / "idx" / "index.json").write_text(json.dumps(manifest))
    with pytest.raises(ModelMismatchError) as info:
        xmatch.index.open(tmp_path / "idx")
    message = str(info.value)
    assert "without a model" not in message  # that is what was just done
    assert bundles[1] in message and "records" in message and "model=" in message
    # a query model given by the caller still gets the advice to open without one
    with pytest.raises(ModelMismatchError, match="Open the index without a model"):
        xmatch.index.open(tmp_path / "idx", xmatch.build(bundles[1], pretrained=True))


@pytest.mark.parametrize("texts, item", [(["a cat", None], 1), (["a", "b", 3], 2)])
def test_a_caption_that_is_not_a_string_is_named_by_its_position(bundles, texts, item):
    model = xmatch.build(bundles[0], pretrained=True)
    for call in (lambda: model.encode_texts(texts), lambda: model.text_encoder.tokenize(texts)):
        with pytest.raises(TypeError) as info:
            call()
        message = str(info.value)
        assert f"caption {item} is {texts[item]!r}" in message and "captions must be strings" in message
        assert "wrap a single caption" not in message
    # batches: the position is in the whole list, not in its batch
    with pytest.raises(TypeError, match=r"caption 5 is None"):
        model.encode_texts(["a cat"] * 5 + [None], batch_size=2)
    with pytest.raises(TypeError, match="wrap a single caption in a list"):
        model.encode_texts("a cat")
