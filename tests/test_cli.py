"""The command line: one module per command, --help and --version, models (and which have
weights), info, convert with its proof, demo's choice of model."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import xmatch
import xmatch.cli
from xmatch.cli.main import COMMANDS, DISTRIBUTION, build_parser, main
from xmatch.core.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
#: the modules of xmatch.cli that are not a command: the assembly, and what several commands share
SHARED_MODULES = {"main", "options"}


def test_every_command_is_one_module_with_add_parser_and_run():
    modules = {m.name for m in pkgutil.iter_modules(xmatch.cli.__path__)} - SHARED_MODULES
    assert sorted(modules) == sorted(COMMANDS)  # no command module left out of the table
    subparsers = next(a for a in build_parser()._actions if a.dest == "command")
    assert list(subparsers.choices) == list(COMMANDS)  # the order `xmatch --help` lists them in
    for name, module in COMMANDS.items():
        assert module.__name__ == f"xmatch.cli.{name}"
        assert callable(module.add_parser) and callable(module.run), name
        assert build_parser().parse_args([name, *REQUIRED.get(name, [])]).run is module.run


#: the smallest command line each command parses
REQUIRED = {"info": ["tern-coco"], "download": ["tern-coco"], "convert": ["a.pth", "out"], "eval": ["tern-coco"],
            "train": ["tern-coco"], "vocab": ["tern-coco"], "extract": ["images", "--out", "feats"],
            "index": ["--out", "idx"], "search": ["idx"], "serve": ["idx"]}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_has_its_help(command, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0 and out.startswith(f"usage: xmatch {command} ")
    assert "options:" in out and "--help" in out


def test_version_names_the_distribution_and_the_package_version(capsys):
    assert DISTRIBUTION == tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["name"] == "xmatch-zoo"
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out == f"xmatch-zoo {xmatch.__version__}\n"


def test_python_dash_m_xmatch_and_the_console_script_run_main():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"xmatch": "xmatch.cli.main:main"}
    run = subprocess.run([sys.executable, "-m", "xmatch", "--version"], capture_output=True, text=True, check=False)
    assert (run.returncode, run.stdout) == (0, f"xmatch-zoo {xmatch.__version__}\n"), run.stderr


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
    # tern-coco's BERT comes from the Hub and its features are not the scenes': a scenes spec trains offline
    for name, train in (("tern-coco", "teran-mrsw-scenes"), (str(tmp_path / "spec.toml"), str(tmp_path / "spec.toml"))):
        assert main(["demo", "--model", name, "--out", str(tmp_path / "out"), "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert "has no trained weights" in err and f"xmatch demo --model {train} --train" in err
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


def test_word_classes_scenes_is_the_scenes_grammar_tagger():
    from xmatch.cli.eval import word_classes_option

    assert word_classes_option("scenes").classes == ("noun", "colour", "size", "adjective", "relation")
    assert word_classes_option("nltk") == "nltk" and word_classes_option(None) is None
