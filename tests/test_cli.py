"""The command line: models (and which have weights), info, convert with its proof, demo's choice of model."""

from __future__ import annotations

import tomllib

import pytest

import xmatch
from xmatch.cli.main import main
from xmatch.core.spec import load_spec


def test_models_and_info(capsys):
    assert main(["models", "teran-symm-*"]) == 0
    out = capsys.readouterr().out
    assert "teran-symm-coco" in out and "teran-symm-f30k" in out and "teran-mrsw" not in out
    assert main(["info", "tern-coco"]) == 0
    out = capsys.readouterr().out
    assert "ICPR 2020" in out and "weights: none published" in out


def weights_column(out: str) -> dict[str, str]:
    header, *rows = out.splitlines()
    assert header.split()[:2] == ["name", "weights"], header
    return {row.split()[0]: row.split()[1] for row in rows}


def test_models_shows_and_filters_the_entries_with_weights(capsys):
    assert main(["models", "te*"]) == 0
    shown = weights_column(capsys.readouterr().out)
    assert shown["teran-mrsw-scenes"] == "yes" and shown["tern-scenes"] == "yes" and shown["tern-coco"] == "-"
    assert main(["models", "--pretrained"]) == 0
    pretrained = weights_column(capsys.readouterr().out)
    assert set(pretrained.values()) == {"yes"}
    assert list(pretrained) == xmatch.list_models(pretrained=True)
    assert {"teran-mrsw-scenes", "tern-scenes", "teran-mrsw-grid-scenes"} <= set(pretrained)
    assert all(xmatch.info(name).weights for name in pretrained)
    assert not any(xmatch.info(name).weights for name in set(xmatch.list_models()) - set(pretrained))


def test_list_models_filters_on_weights_like_timm():
    assert xmatch.list_models("tern-*", pretrained=True) == ["tern-scenes"]
    assert "tern-coco" in xmatch.list_models("tern-*") and xmatch.list_models("scan-*", pretrained=True) == []


def test_models_says_when_nothing_matches(capsys):
    assert main(["models", "--pretrained", "teran-symm-*"]) == 0
    captured = capsys.readouterr()
    assert captured.out == "" and "no zoo entries with weights match 'teran-symm-*'" in captured.err


@pytest.mark.parametrize("name", ["tern-coco", "teran-mrsw-scenes", "teran-mrsw-grid-scenes"])
def test_info_spec_prints_a_toml_spec_and_nothing_else(name, tmp_path, capsys):
    assert main(["info", name, "--spec"]) == 0
    out = capsys.readouterr().out
    assert tomllib.loads(out) == xmatch.info(name).spec
    (tmp_path / "spec.toml").write_text(out)  # what `xmatch info NAME --spec > spec.toml` writes
    assert load_spec(tmp_path / "spec.toml") == xmatch.info(name).spec


def test_demo_refuses_a_model_without_weights_before_making_data(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XMATCH_HOME", str(tmp_path / "home"))
    for name in ("tern-coco", str(tmp_path / "spec.toml")):
        assert main(["demo", "--model", name, "--out", str(tmp_path / "out"), "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert "has no trained weights" in err and f"xmatch demo --model {name} --train" in err
    assert not (tmp_path / "home").exists()  # refused before the scenes data are generated


def test_convert_and_check(mrsw_small, tmp_path, capsys):
    code = main(["convert", str(mrsw_small / "checkpoint.pth"), str(tmp_path / "out"), "--check", str(mrsw_small / "io.npz")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "reproduces the original outputs" in out and "similarity MwSr" in out
    assert (tmp_path / "out" / "model.safetensors").is_file()


def test_errors_are_one_line(tmp_path, capsys):
    assert main(["convert", str(tmp_path / "missing.pth"), str(tmp_path / "out")]) == 2
    assert "does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["info"])
    assert main(["info", "teran-nope"]) == 2
    assert "Did you mean" in capsys.readouterr().err
