"""A text-side manifest (``text_side.json``) that is not one is a ``TextSideError`` (an
``XmatchError``) naming the file and the entry; its file arguments stay inside its folder."""

from __future__ import annotations

import json

import pytest

from xmatch.components.text.side import MANIFEST, TextSide, TextSideError
from xmatch.core.errors import XmatchError

GOOD = {"format": "xmatch.text_side/1", "kind": "vocabulary", "arguments": {"vocab": "vocab.json"}, "words": 7,
        "distinct_words": 9, "min_count": 2, "captions": 10, "longest": 6, "max_length": None}

BAD = {
    "binary": (b"\x89PNG\r\n\x1a\n\x00", "is not valid JSON"),
    "deep": (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    "a list": (b"[1, 2]", "is not an xmatch text-side manifest"),
    "another format": (json.dumps({**GOOD, "format": "x"}).encode(), "is not an xmatch text-side manifest"),
    "an unknown entry": (json.dumps({**GOOD, "extra": 1}).encode(), r"unknown entries \['extra'\]"),
    "a missing entry": (json.dumps({k: v for k, v in GOOD.items() if k != "words"}).encode(), r"missing entries \['words'\]"),
    "a negative count": (json.dumps({**GOOD, "captions": -1}).encode(), "'captions' = -1 does not fit"),
    "another kind": (json.dumps({**GOOD, "kind": "glove"}).encode(), "'kind' = 'glove' does not fit"),
    "arguments a list": (json.dumps({**GOOD, "arguments": ["vocab.json"]}).encode(), "'arguments' = .* does not fit"),
    "an absolute vocab": (json.dumps({**GOOD, "arguments": {"vocab": "/etc/passwd"}}).encode(), "must be a path inside"),
    "a vocab that climbs out": (json.dumps({**GOOD, "arguments": {"vocab": "../x/vocab.json"}}).encode(), "must be a path inside"),
    "a backbone number": (json.dumps({**GOOD, "arguments": {"backbone": 5}}).encode(), "must be a path inside"),
}


@pytest.mark.parametrize("kind", BAD)
def test_a_bad_manifest_is_named(tmp_path, kind):
    data, message = BAD[kind]
    (tmp_path / MANIFEST).write_bytes(data)
    with pytest.raises(TextSideError, match=message) as info:
        TextSide.load(tmp_path)
    assert isinstance(info.value, XmatchError) and str(tmp_path / MANIFEST) in str(info.value)


def test_a_good_manifest_loads(tmp_path):
    (tmp_path / MANIFEST).write_text(json.dumps(GOOD), encoding="utf-8")
    side = TextSide.load(tmp_path)
    assert side.spec_overrides == {"text_encoder": {"vocab": str(tmp_path / "vocab.json")}} and side.words == 7
