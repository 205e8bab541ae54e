"""The command line: models, info, convert with its proof."""

from __future__ import annotations

import pytest

from xmatch.cli import main


def test_models_and_info(capsys):
    assert main(["models", "teran-symm-*"]) == 0
    out = capsys.readouterr().out
    assert "teran-symm-coco" in out and "teran-symm-f30k" in out and "teran-mrsw" not in out
    assert main(["info", "tern-coco", "--spec"]) == 0
    out = capsys.readouterr().out
    assert "ICPR 2020" in out and 'name = "global-cosine"' in out


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
