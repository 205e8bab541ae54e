"""Vocabulary files of the word-level text encoders (``vocab.json``, the original SCAN / VSE++
``*_vocab.json``, caption files): a file that is not one is a ``VocabularyFileError`` (an
``XmatchError``) that names it."""

from __future__ import annotations

import json

import pytest

from xmatch.components.text.words import VocabularyFileError, load_vocabulary
from xmatch.core.errors import XmatchError

GOOD = {"format": "xmatch.vocabulary/1", "words": ["<pad>", "<unk>", "a", "dog"]}

BAD = {
    "binary vocab.json": ("vocab.json", b"\x89PNG\r\n\x1a\n\x00\x00", "is not valid JSON"),
    "deep vocab.json": ("vocab.json", b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    "deep original vocab": ("f30k_vocab.json", b'{"word2idx": ' + b"[" * 100_000, "nested too deeply"),
    "another layout": ("vocab.json", json.dumps({"words": ["a"]}).encode(), "is not an xmatch vocabulary"),
    "repeated words": ("vocab.json", json.dumps({**GOOD, "words": [*GOOD["words"], "a"]}).encode(), "repeat"),
    "a number for a word": ("vocab.json", json.dumps({**GOOD, "words": [*GOOD["words"], 5]}).encode(), "non-empty strings"),
    "original with an empty word": ("f30k_vocab.json", json.dumps({"word2idx": {"": 4, "a": 5}}).encode(), "non-empty strings"),
    "original with bool ids": ("f30k_vocab.json", json.dumps({"word2idx": {"a": True}}).encode(), "maps words to int ids"),
    "latin-1 captions": ("captions.txt", "a caf\xe9 on a bench\n".encode("latin-1"), "is not UTF-8 text"),
    "captions without words": ("captions.txt", b"\n  \n", "no word of"),
}


@pytest.mark.parametrize("kind", BAD)
def test_a_bad_vocabulary_file_is_named(tmp_path, kind):
    name, data, message = BAD[kind]
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(VocabularyFileError, match=message) as info:
        load_vocabulary(str(path), 1, "bigru")
    assert isinstance(info.value, XmatchError) and isinstance(info.value, ValueError)
    assert str(path) in str(info.value)


def test_good_vocabulary_files_still_load(tmp_path):
    (tmp_path / "vocab.json").write_text(json.dumps(GOOD), encoding="utf-8")
    assert load_vocabulary(str(tmp_path / "vocab.json"), 1, "bigru").words == GOOD["words"]
    (tmp_path / "f30k_vocab.json").write_text(json.dumps({"word2idx": {"<pad>": 0, "dog": 5, "a": 4}}), encoding="utf-8")
    assert load_vocabulary(str(tmp_path / "f30k_vocab.json"), 1, "bigru").words == ["<pad>", "<unk>", "a", "dog"]
    (tmp_path / "captions.txt").write_text("a dog\na café\n", encoding="utf-8")
    assert load_vocabulary(str(tmp_path / "captions.txt"), 1, "bigru").words[2:] == ["a", "café", "dog"]
