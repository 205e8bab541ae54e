"""Reading original TERN / TERAN checkpoints: which configs convert, to what, and the errors for
those that do not (the parity of the converted models is in test_parity_original.py)."""

from __future__ import annotations

import argparse
import copy
import importlib.util
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import xmatch
from xmatch.cli.main import main
from xmatch.model.convert import original_family, resolve_bert_source, spec_from_original_config
from xmatch.core.spec import check_model_spec

pytestmark = pytest.mark.cpu_kernels  # floats from the CPU's kernels against stored ones (docs/testing.md)

TERN_SMALL = Path(__file__).resolve().parent / "fixtures" / "tern-original" / "tern-small"


@pytest.fixture(scope="module")
def tern_checkpoint() -> dict:
    with torch.serialization.safe_globals([argparse.Namespace]):
        return torch.load(TERN_SMALL / "checkpoint.pth", map_location="cpu", weights_only=True)


@pytest.fixture()
def tern_config(tern_checkpoint) -> dict:
    return copy.deepcopy(tern_checkpoint["config"])


def _teran_config(tern_config: dict, **training) -> dict:
    config = copy.deepcopy(tern_config)
    config["model"].update({"name": "teran", "shared-transformer": False})
    config["training"].update(training)
    return config


def _rewritten(tern_checkpoint: dict, folder: Path, config) -> Path:
    """The TERN fixture with another config, its BERT folder beside it."""
    shutil.copytree(TERN_SMALL / "bert", folder / "bert")
    path = folder / "checkpoint.pth"
    torch.save({**tern_checkpoint, "config": config}, path)
    return path


# --- which original code wrote the config --------------------------------------------------------


def test_tern_yaml_without_loss_type_is_tern(tern_config):
    assert "loss-type" not in tern_config["training"] and "alignment-mode" not in tern_config["training"]
    assert original_family(tern_config) == "tern"
    spec = spec_from_original_config(tern_config, "bert")
    assert spec["pooler"] == {"name": "global-cosine"} and spec["shared_reasoner"] is True
    assert "text_reasoner" not in spec and spec["text_encoder"]["drop_last_wordpiece"] is False


def test_the_released_tern_yaml_converts_to_the_tern_coco_entry():
    # configs/tern.yaml verbatim (full sizes), as the generator of the fixture keeps it
    module_spec = importlib.util.spec_from_file_location("make_tern_fixture", TERN_SMALL.parent / "make_fixture.py")
    generator = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(generator)
    # BERT as the converter finds it for a checkpoint with no BERT folder beside it: the pinned BERT-base
    bert = resolve_bert_source(Path("model_best.pth"), generator.TERN_YAML, None)
    converted = check_model_spec(spec_from_original_config(generator.TERN_YAML, bert))
    entry = check_model_spec(xmatch.info("tern-coco").spec)
    assert converted["text_encoder"].pop("pretrained") is False  # the weights come from the checkpoint
    entry["text_encoder"].pop("pretrained")
    assert converted == entry


def test_tern_code_never_reads_model_name(tern_config):
    del tern_config["model"]["name"]
    assert original_family(tern_config) == "tern"
    tern_config["training"]["loss-type"] = "alignment"  # but TERAN's code needs a loss-type
    assert original_family(tern_config) == "teran"


def test_teran_alignment_config_keeps_the_original_mode(tern_config):
    spec = spec_from_original_config(_teran_config(tern_config, **{"loss-type": "alignment", "alignment-mode": "symm"}), "bert")
    assert spec["pooler"] == {"name": "Symm", "compat": "original"}
    assert spec["text_encoder"]["drop_last_wordpiece"] is True and spec["shared_reasoner"] is False
    assert spec["text_reasoner"] == spec["image_reasoner"]


@pytest.mark.parametrize("loss_type", ["matching", "alignment+matching"])
def test_teran_with_a_matching_loss_scores_with_the_cls_outputs(tern_config, loss_type):
    # TERAN's evalrank uses the alignment only for loss-type exactly 'alignment'
    spec = spec_from_original_config(_teran_config(tern_config, **{"loss-type": loss_type}), "bert")
    assert spec["pooler"] == {"name": "global-cosine"} and spec["text_encoder"]["drop_last_wordpiece"] is False


# --- configs that do not convert, and what the error says ----------------------------------------


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda c: c["model"].__setitem__("name", "vsepp"),
         r"neither TERN's nor TERAN's: its model.name is 'vsepp' \(found sections .*'training'.*training keys"),
        (lambda c: c.pop("training"), r"neither TERN's nor TERAN's: it has no 'training' section \(found sections"),
        (lambda c: c.__setitem__("model", "tern"), r"it has no 'model' section"),
        (lambda c: c["model"].pop("embed-size"), r"TERN checkpoint config has no model -> embed-size.*found model keys"),
        (lambda c: c["image-model"].pop("feat-dim"), r"no image-model -> feat-dim"),
        (lambda c: c["training"].__setitem__("measure", "order"), r"training.measure 'order' is not supported"),
        (lambda c: c["model"].__setitem__("text-aggregation", "gated"), r"model.text-aggregation 'gated' is not supported"),
        (lambda c: c["text-model"].__setitem__("pre-extracted", True), r"pre-extracted.*no BERT weights"),
        (lambda c: c["model"].__setitem__("name", "teran"), r"TERAN checkpoint config has no training -> loss-type"),
    ],
)
def test_unconvertible_configs_say_what_they_hold(tern_config, change, message):
    change(tern_config)
    with pytest.raises(ValueError, match=message):
        spec_from_original_config(tern_config, "bert")


def test_teran_alignment_without_a_mode_names_the_key(tern_config):
    with pytest.raises(ValueError, match=r"alignment-mode None is not one of \['MrAVGw', 'MrSw', 'MwSr', 'symm'\] \(the key is missing\)"):
        spec_from_original_config(_teran_config(tern_config, **{"loss-type": "alignment"}), "bert")
    with pytest.raises(ValueError, match=r"loss-type 'contrastive' is not one the original code knows"):
        spec_from_original_config(_teran_config(tern_config, **{"loss-type": "contrastive"}), "bert")


def test_a_config_that_is_not_a_dict_is_named(tmp_path, tern_checkpoint):
    path = _rewritten(tern_checkpoint, tmp_path, ["not", "a", "dict"])
    with pytest.raises(ValueError, match=r"checkpoint\['config'\] is a list, not the YAML dict"):
        xmatch.convert_original(path)


def test_neither_config_through_every_entry_point(tmp_path, tern_checkpoint, tern_config, capsys):
    tern_config["model"]["name"] = "vsepp"
    path = _rewritten(tern_checkpoint, tmp_path, tern_config)
    expected = "neither TERN's nor TERAN's: its model.name is 'vsepp'"
    with pytest.raises(ValueError, match=expected):
        xmatch.convert_original(path)
    with pytest.raises(ValueError, match=expected):
        xmatch.build("tern-coco", checkpoint=path)
    assert main(["convert", str(path), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert expected in err and "\n" not in err.strip()


def test_tern_config_without_a_name_converts_end_to_end(tmp_path, tern_checkpoint, tern_config):
    del tern_config["model"]["name"]
    model = xmatch.convert_original(_rewritten(tern_checkpoint, tmp_path, tern_config))
    assert model.spec["pooler"]["name"] == "global-cosine" and model.spec["shared_reasoner"] is True


# --- build(name, checkpoint=original checkpoint): the entry must describe the same model ---------


def test_a_tern_checkpoint_is_refused_by_a_teran_entry():
    with pytest.raises(ValueError) as err:
        xmatch.build("teran-mrsw-coco", checkpoint=TERN_SMALL / "checkpoint.pth")
    message = str(err.value)
    assert "shared_reasoner: True in the checkpoint, False in 'teran-mrsw-coco'" in message
    assert "pooler: 'global-cosine' in the checkpoint, 'MrSw' in 'teran-mrsw-coco'" in message
    assert "tern-coco" in message and "xmatch.convert_original(" in message


def test_tern_align_entry_needs_its_alignment_loss():
    # the entry trains with an extra MrSw pooler and uncertainty weighting; a TERN checkpoint has neither
    with pytest.raises(ValueError, match=r"extra_poolers: \{\} in the checkpoint, \{'alignment': 'MrSw'\} in 'tern-align-coco'"):
        xmatch.build("tern-align-coco", checkpoint=TERN_SMALL / "checkpoint.pth")


def test_a_teran_checkpoint_with_another_pooler_gets_the_override_to_use(mrsw_small):
    with pytest.raises(ValueError, match=r"pooler=\{'name': 'Symm', 'compat': 'original'\}"):
        xmatch.build("teran-symm-coco", checkpoint=mrsw_small / "checkpoint.pth")
    model = xmatch.build("teran-symm-coco", checkpoint=mrsw_small / "checkpoint.pth", pooler={"name": "Symm", "compat": "original"})
    assert model.spec["pooler"]["compat"] == "original"
    with pytest.raises(ValueError, match="'MrSw' in the checkpoint, 'global-cosine' in 'tern-coco'"):
        xmatch.build("tern-coco", checkpoint=mrsw_small / "checkpoint.pth")


# --- xmatch convert --check --------------------------------------------------------------------


def test_convert_and_check_a_tern_checkpoint(tmp_path, capsys):
    code = main(["convert", str(TERN_SMALL / "checkpoint.pth"), str(tmp_path / "out"), "--check", str(TERN_SMALL / "io.npz")])
    out = capsys.readouterr().out
    assert code == 0, out
    for row in ("region embeddings", "word embeddings", "image CLS embeddings", "text CLS embeddings", "similarity global-cosine"):
        assert row in out
    assert "reproduces the original outputs" in out and "similarity MrSw" not in out
    assert xmatch.build(f"local-dir:{tmp_path / 'out'}", pretrained=True).spec["pooler"]["name"] == "global-cosine"


@pytest.mark.parametrize(("key", "row"), [("sim_dot", "similarity global-cosine"), ("cap_emb_aggr", "text CLS embeddings"),
                                          ("eval_img_set_raw", "region embeddings")])
def test_check_fails_when_an_output_differs(tmp_path, capsys, key, row):
    io = dict(np.load(TERN_SMALL / "io.npz"))
    io[key] = io[key].copy()
    io[key][0, 1] += 1e-3  # for the sets: slot 1 of image 0, a real region
    np.savez(tmp_path / "io.npz", **io)
    code = main(["convert", str(TERN_SMALL / "checkpoint.pth"), str(tmp_path / "out"), "--check", str(tmp_path / "io.npz")])
    captured = capsys.readouterr()
    assert code == 1 and "does NOT reproduce" in captured.err
    failed = [line for line in captured.out.splitlines() if line.endswith(" NO")]
    assert len(failed) == 1 and failed[0].startswith(row)


def test_check_file_without_the_inputs_or_outputs_is_named(tmp_path, capsys):
    io = dict(np.load(TERN_SMALL / "io.npz"))
    np.savez(tmp_path / "no-inputs.npz", **{k: v for k, v in io.items() if k != "boxes_norm"})
    np.savez(tmp_path / "no-outputs.npz", **{k: io[k] for k in ("region_features", "boxes_norm", "n_regions", "captions")})
    checkpoint = str(TERN_SMALL / "checkpoint.pth")
    assert main(["convert", checkpoint, str(tmp_path / "a"), "--check", str(tmp_path / "no-inputs.npz")]) == 2
    assert "lacks the inputs ['boxes_norm']" in capsys.readouterr().err
    assert main(["convert", checkpoint, str(tmp_path / "b"), "--check", str(tmp_path / "no-outputs.npz")]) == 2
    assert "holds none of the original outputs" in capsys.readouterr().err
