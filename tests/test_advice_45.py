"""Advice that leads somewhere (issue 45, part 6): a picture index built offline from a local
weights file fetches no tokenizer, and a text search of it names the option that gives one;
a failed `xmatch index` leaves nothing it created; the "no weights" errors, the cards and the
demo advise what fits the model; and every `xmatch ...` command they quote parses as the
command line would read it (an option that does not exist fails)."""

from __future__ import annotations

import dataclasses
import json
import shutil
import re
import shlex
from pathlib import Path

import numpy as np
import pytest
import tomli_w
import torch

import xmatch
from xmatch.cli.main import COMMANDS, build_parser, main
from xmatch.core.zoo import info, list_models
from xmatch.model import factory

from clip_assets import tiny_tower_overrides, tokenizer_dirs

pytest.importorskip("faiss")
Image = pytest.importorskip("PIL.Image")

ROOT = Path(__file__).resolve().parents[1]
#: where an `xmatch ...` command starts in a message or a card (not the "xmatch index:" that
#: opens an error line)
COMMAND = re.compile(rf"\bxmatch (?:{'|'.join(COMMANDS)})\b(?!:)")


def quoted_commands(text: str) -> list[str]:
    """The ``xmatch ...`` commands quoted in ``text``: each ends at a backtick, a bracket, a
    comma or a semicolon, or with the word that ends a sentence (its full stop left out)."""
    out = []
    for start in COMMAND.finditer(text):
        words = start.group().split()
        for word in text[start.end():].split(" ")[1:] if text[start.end():].startswith(" ") else []:
            if word == "...":  # a placeholder for the arguments left out, not a full stop
                words.append(word)
                continue
            cut = re.split(r"[`,;()]", word, maxsplit=1)
            if cut[0]:
                words.append(cut[0].rstrip("."))
            if len(cut) > 1 or word.endswith(".") or not word:
                break
        out.append(" ".join(words))
    return out


def parses(command: str) -> None:
    """``command`` is read by ``xmatch``'s own parser: the subcommand and every option exist and
    the required arguments are there (``--help`` would not tell: it exits before argparse
    reports an unknown option)."""
    argv = shlex.split(command)[1:]
    try:
        build_parser().parse_args(argv)
    except SystemExit as exc:
        pytest.fail(f"`{command}` does not parse (exit {exc.code})")


def photos(folder: Path, n: int = 3) -> Path:
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for k in range(n):
        Image.fromarray(rng.integers(0, 256, size=(40, 48, 3), dtype=np.uint8)).save(folder / f"p{k}.png")
    return folder


@pytest.fixture(scope="module")
def local_clip(tmp_path_factory) -> dict[str, Path]:
    """A tiny CLIP of clip-vit-b-32's layout as a user has it after downloading the weights by
    hand: ``model.safetensors`` and a spec whose tokenizer is the entry's (on the Hub, not in
    this test's empty cache), with a picture folder."""
    root = tmp_path_factory.mktemp("local-clip")
    torch.manual_seed(0)
    model = xmatch.build("clip-vit-b-32", **tiny_tower_overrides("clip"))
    bundle = xmatch.save_pretrained(model, root / "bundle")
    spec = dict(model.spec)
    spec["text_encoder"] = {**spec["text_encoder"], "tokenizer": info("clip-vit-b-32").spec["text_encoder"]["tokenizer"]}
    (root / "tiny-clip.toml").write_text(tomli_w.dumps(spec))
    return {"spec": root / "tiny-clip.toml", "weights": Path(bundle) / "model.safetensors",
            "photos": photos(root / "photos"), "tokenizer": Path(tokenizer_dirs()["clip"])}


# --- 1. a tokenizer folder on the command line; pictures are indexed without one ----------------


def test_an_image_index_from_a_local_weights_file_fetches_no_tokenizer(local_clip, tmp_path, capsys):
    out = tmp_path / "idx"
    reference = f"{local_clip['spec']}={local_clip['weights']}"
    assert main(["index", reference, "--images", str(local_clip["photos"]), "--out", str(out), "--no-progress"]) == 0, \
        capsys.readouterr().err
    assert "indexed 3 images" in capsys.readouterr().out
    # a search by text needs the tokenizer: the error names the option that gives it
    assert main(["search", str(out), "--text", "a cat"]) == 2
    err = capsys.readouterr().err
    assert "hf-hub:openai/clip-vit-base-patch32" in err and "--tokenizer DIR" in err
    assert main(["search", str(out), "--text", "a cat", "--tokenizer", str(local_clip["tokenizer"]), "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)[0]["hits"]) == 3


def test_eval_of_a_local_weights_file_takes_a_tokenizer_folder(local_clip, tmp_path, capsys):
    folder = tmp_path / "captioned"
    shutil.copytree(local_clip["photos"], folder)
    (folder / "test.csv").write_text("image,caption\n" + "".join(f"p{k}.png,photo number {k}\n" for k in range(3)))
    reference = f"{local_clip['spec']}={local_clip['weights']}"
    command = ["eval", reference, "--dataset", "image-captions", "--data", str(folder)]
    assert main(command) == 2
    assert "--tokenizer DIR" in capsys.readouterr().err
    assert main([*command, "--tokenizer", str(tmp_path / "missing")]) == 2
    assert "--tokenizer" in capsys.readouterr().err
    assert main([*command, "--tokenizer", str(local_clip["tokenizer"]), "--json", str(tmp_path / "r.json")]) == 0
    figures = json.loads((tmp_path / "r.json").read_text())
    assert "rsum" in json.dumps(figures)


def test_an_index_of_a_relative_spec_and_weights_is_searched_from_another_folder(local_clip, tmp_path, capsys, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(local_clip["spec"], work / "tiny.toml")
    shutil.copy(local_clip["weights"], work / "tiny.safetensors")
    monkeypatch.chdir(work)
    assert main(["index", "tiny.toml=tiny.safetensors", "--images", str(local_clip["photos"]), "--out", str(tmp_path / "idx"),
                 "--no-progress"]) == 0
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main(["search", "idx", "--text", "a cat", "--tokenizer", str(local_clip["tokenizer"]), "--json"]) == 0, \
        capsys.readouterr().err
    assert len(json.loads(capsys.readouterr().out)[0]["hits"]) == 3


def test_index_takes_a_tokenizer_folder_and_says_to_search_with_it(local_clip, tmp_path, capsys):
    reference = f"{local_clip['spec']}={local_clip['weights']}"
    out = tmp_path / "idx"
    assert main(["index", reference, "--images", str(local_clip["photos"]), "--out", str(out), "--no-progress",
                 "--tokenizer", str(local_clip["tokenizer"])]) == 0
    assert f"--tokenizer {local_clip['tokenizer']}" in capsys.readouterr().out
    # a folder that is not there is refused before anything is encoded or written
    assert main(["index", reference, "--images", str(local_clip["photos"]), "--out", str(tmp_path / "no"),
                 "--tokenizer", str(tmp_path / "missing")]) == 2
    assert "--tokenizer" in capsys.readouterr().err and not (tmp_path / "no").exists()


# --- 2. a failed run leaves nothing it created -------------------------------------------------


def test_a_failed_index_leaves_no_folder_it_made(local_clip, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    reference = f"{local_clip['spec']}={local_clip['weights']}"
    out = tmp_path / "new" / "deeper" / "idx"
    assert main(["index", reference, "--images", str(tmp_path / "empty"), "--out", str(out), "--no-progress"]) == 2
    assert "no pictures in" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()
    # an empty folder the user made stays; a folder with the user's files is refused and untouched
    (tmp_path / "mine").mkdir()
    assert main(["index", reference, "--images", str(tmp_path / "empty"), "--out", str(tmp_path / "mine")]) == 2
    assert (tmp_path / "mine").is_dir() and not any((tmp_path / "mine").iterdir())
    (tmp_path / "theirs" / "model").mkdir(parents=True)
    (tmp_path / "theirs" / "model" / "notes.txt").write_text("mine")
    assert main(["index", reference, "--images", str(local_clip["photos"]), "--out", str(tmp_path / "theirs")]) == 2
    assert (tmp_path / "theirs" / "model" / "notes.txt").read_text() == "mine"


# --- 3. and 4. the advice of "no weights" fits the family ----------------------------------------


def test_a_hub_tower_without_weights_is_advised_its_own_file(monkeypatch):
    entry = dataclasses.replace(info("clip-vit-b-32"), weights=[])
    monkeypatch.setattr(factory, "info", lambda name: entry)
    with pytest.raises(ValueError, match="no published xmatch weights") as caught:
        xmatch.build("clip-vit-b-32", pretrained=True)
    message = str(caught.value)
    assert "checkpoint='model.safetensors'" in message and "model_best.pth" not in message


@pytest.mark.parametrize("name", ["teran-mrsw-coco", "teran-symm-f30k", "tern-coco"])
def test_an_original_checkpoint_entry_is_advised_the_authors_checkpoint(name):
    with pytest.raises(ValueError, match="no published xmatch weights") as caught:
        xmatch.build(name, pretrained=True)
    message = str(caught.value)
    assert f"build('{name}', checkpoint='model_best.pth')" in message and "pretrained=." not in message


def test_an_entry_the_converter_cannot_read_is_not_sent_to_it():
    """TERAN's Bi-GRU ablation: the converter reads BERT checkpoints only."""
    with pytest.raises(ValueError, match="no published xmatch weights") as caught:
        xmatch.build("teran-bigru-coco", pretrained=True)
    message = str(caught.value)
    assert "model_best.pth" not in message and "xmatch train teran-bigru-coco" in message


def test_no_card_and_no_download_says_pass_it_as_pretrained(capsys):
    for name in list_models():
        entry = info(name)
        assert "as pretrained=" not in entry.origin + entry.notes, name
    assert main(["download", "teran-mrsw-coco"]) == 2
    err = capsys.readouterr().err
    assert "as pretrained=" not in err and "checkpoint=" in err


# --- 5. and 6. the commands a refusal suggests exist ---------------------------------------------


def test_a_region_model_is_sent_to_the_real_extract_command(tmp_path, capsys):
    folder = photos(tmp_path / "photos")
    assert main(["index", "teran-mrsw-scenes", "--images", str(folder), "--out", str(tmp_path / "idx")]) == 2
    err = capsys.readouterr().err
    assert f"xmatch extract {folder} --out FEATURES" in err and "--images" not in err.split("xmatch extract")[1][:40]
    assert not (tmp_path / "idx").exists()
    for command in quoted_commands(err):
        parses(command)


def test_the_demo_of_an_entry_without_weights_suggests_what_runs_offline(tmp_path, capsys):
    assert main(["demo", "--model", "teran-mrsw-coco", "--out", str(tmp_path / "demo"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--model teran-mrsw-coco --train" not in err  # BERT from the Hub, and 2048-d features the scenes lack
    assert "bert-base-uncased" in err and "xmatch demo --model teran-mrsw-scenes --train" in err
    for command in quoted_commands(err):
        parses(command)


def test_the_demo_of_a_spec_of_ones_own_still_suggests_training_it(tmp_path, capsys):
    spec = dict(info("teran-mrsw-scenes").spec)
    (tmp_path / "mine.toml").write_text(tomli_w.dumps(spec))
    assert main(["demo", "--model", str(tmp_path / "mine.toml"), "--out", str(tmp_path / "demo"), "--no-progress"]) == 2
    assert f"xmatch demo --model {tmp_path / 'mine.toml'} --train" in capsys.readouterr().err


# --- 7. the README counts what ships -------------------------------------------------------------


def test_the_readme_counts_the_scenes_demo_models_that_ship():
    scenes = [n for n in list_models() if n.endswith("-scenes") and info(n).weights]
    shipped = sorted(p.name for p in (ROOT / "zoo" / "weights").iterdir() if p.is_dir())
    assert sorted(scenes) == shipped
    words = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6}
    readme = (ROOT / "README.md").read_text()
    counts = re.findall(r"\b(two|three|four|five|six) (?:scenes )?demo\s+models", readme, flags=re.IGNORECASE)
    assert counts and {words[c.lower()] for c in counts} == {len(shipped)}


# --- 8. every command a card or a touched message quotes parses; the cheap ones run --------------


def card_commands() -> list[tuple[str, str]]:
    """``(entry, command)`` for each ``xmatch ...`` command quoted in a card's origin, notes or
    metrics sources."""
    out = []
    for name in list_models():
        entry = info(name)
        texts = [entry.origin, entry.notes, *(str(m.get("source", "")) for m in entry.metrics.values())]
        out += [(name, c) for text in texts for c in quoted_commands(text)]
    return sorted(set(out))


def test_the_cards_quote_commands():
    commands = [c for _, c in card_commands()]
    assert any(c.startswith("xmatch convert ") for c in commands) and any(c.startswith("xmatch train ") for c in commands)


@pytest.mark.parametrize("name, command", card_commands())
def test_every_command_a_card_quotes_parses(name, command):
    parses(command)


def test_every_command_a_no_weights_message_quotes_parses(monkeypatch):
    messages = []
    for name in ("teran-mrsw-coco", "tern-coco", "teran-bigru-coco"):
        with pytest.raises(ValueError) as caught:
            xmatch.build(name, pretrained=True)
        messages.append(str(caught.value))
    commands = [c for m in messages for c in quoted_commands(m)]
    assert any(c.startswith("xmatch convert ") for c in commands)
    for command in commands:
        parses(command)


def test_the_convert_command_of_the_cards_fails_only_for_the_missing_checkpoint(tmp_path, monkeypatch, capsys):
    """Run for real: the checkpoint the card says to download is the one thing missing."""
    monkeypatch.chdir(tmp_path)
    converts = {c for _, c in card_commands() if c.startswith("xmatch convert ")}
    assert converts
    for command in converts:
        assert main(shlex.split(command)[1:]) == 2
        err = capsys.readouterr().err
        checkpoint = shlex.split(command)[2]
        assert checkpoint in err and ("does not exist" in err or "not found" in err or "No such file" in err), err
