"""What a text encoder reports about its text side: how much of a caption set its tokenizer
knows (:class:`TokenCoverage`), and a text side built from captions (:class:`TextSide`).

Both are plain records shared by the text encoders (which measure and build) and
:mod:`xmatch.data.vocab` (which decides what to do with the figures).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from xmatch.core.errors import XmatchError

MANIFEST = "text_side.json"
MANIFEST_FORMAT = "xmatch.text_side/1"


@dataclass
class TokenCoverage:
    """How many of a caption set's tokens a tokenizer maps to its unknown token.

    Attributes:
        captions: captions measured.
        tokens: caption tokens (words, or word pieces for BERT), special tokens left out.
        unknown: tokens that became the unknown token (``<unk>``, ``[UNK]``).
        all_unknown: captions whose every token is unknown (they carry no information).
        longest: tokens of the longest caption.
        unknown_words: the most frequent unknown words with their counts, most frequent first.

    Example:
        >>> cov = TokenCoverage(captions=2, tokens=8, unknown=2, all_unknown=0, longest=5)
        >>> f"{cov.rate:.0%}"
        '25%'
    """

    captions: int
    tokens: int
    unknown: int
    all_unknown: int
    longest: int
    unknown_words: list[tuple[str, int]] = field(default_factory=list)

    @property
    def rate(self) -> float:
        """The share of tokens that are unknown (0 with no tokens)."""
        return self.unknown / self.tokens if self.tokens else 0.0

    @classmethod
    def from_counts(
        cls, unknown_per_caption: list[int], tokens_per_caption: list[int], unknown_words: Counter[str], top: int = 10
    ) -> TokenCoverage:
        """A coverage from per-caption counts (what the encoders measure)."""
        pairs = list(zip(unknown_per_caption, tokens_per_caption, strict=True))
        return cls(
            captions=len(pairs),
            tokens=sum(t for _, t in pairs),
            unknown=sum(u for u, _ in pairs),
            all_unknown=sum(1 for u, t in pairs if t and u == t),
            longest=max((t for _, t in pairs), default=0),
            unknown_words=unknown_words.most_common(top),
        )

    def summary(self) -> str:
        """One line: the rate, the captions with no known token, the most frequent unknown words.

        Example:
            >>> TokenCoverage(5, 20, 10, 1, 6, [("zebra", 4)]).summary()
            "50.0% of 20 tokens unknown, 1 of 5 captions entirely; most frequent unknown: 'zebra' (4)"
        """
        text = f"{self.rate:.1%} of {self.tokens:,} tokens unknown, {self.all_unknown:,} of {self.captions:,} captions entirely"
        if self.unknown_words:
            text += "; most frequent unknown: " + ", ".join(f"{w!r} ({n:,})" for w, n in self.unknown_words[:5])
        return text


@dataclass
class TextSide:
    """A text side (word vocabulary or tokenizer) built from captions, and the spec arguments
    of the text encoder that point at its files.

    Attributes:
        kind: ``"vocabulary"`` (a ``vocab.json`` for word-level encoders: ``bigru``, ``bilstm``
            and the plugins' ``scan-bigru``, ``vsepp-gru``, ``oan-textcnn``) or ``"tokenizer"``
            (a word-level BERT tokenizer and config for a ``bert`` trained from scratch).
        directory: the folder holding the files.
        arguments: the text encoder's spec arguments, paths relative to ``directory``.
        words: words in the vocabulary (special tokens left out).
        distinct_words: distinct words in the captions.
        min_count: words seen fewer times were left out (they become the unknown token).
        captions: captions it was built from.
        longest: tokens of the longest caption (words; for BERT with [CLS] and [SEP]).
        max_length: the position limit written into the config (BERT), else None.

    Example:
        >>> captions = ["a red circle", "a blue seven left of a circle"]
        >>> import xmatch.data.vocab
        >>> side = xmatch.data.vocab.build_text_side("teran-mrsw-scenes", captions, "runs/mine/text_side")
        >>> side.kind, side.words, side.arguments
        ('vocabulary', 7, {'vocab': 'vocab.json'})
        >>> model = xmatch.build("teran-mrsw-scenes", **side.spec_overrides)
    """

    kind: Literal["vocabulary", "tokenizer"]
    directory: Path
    arguments: dict[str, Any]
    words: int
    distinct_words: int
    min_count: int
    captions: int
    longest: int
    max_length: int | None = None

    @property
    def spec_overrides(self) -> dict[str, Any]:
        """``{"text_encoder": {...}}`` with absolute paths: ``xmatch.build(name, **side.spec_overrides)``."""
        args = {k: str(self.directory / v) if k in _PATH_ARGUMENTS else v for k, v in self.arguments.items()}
        return {"text_encoder": args}

    def summary(self) -> str:
        """One line: what was built, from how many captions, what was left out.

        Example:
            >>> TextSide("vocabulary", Path("v"), {"vocab": "vocab.json"}, 40, 42, 2, 1500, 14).summary()
            'word vocabulary of 40 words (2 of 42 distinct words seen fewer than 2 times left out) from 1,500 captions, longest 14 tokens: v/vocab.json'
        """
        what = "word vocabulary" if self.kind == "vocabulary" else "word-level BERT tokenizer"
        left = self.distinct_words - self.words
        dropped = f" ({left:,} of {self.distinct_words:,} distinct words seen fewer than {self.min_count} times left out)" if left else ""
        limit = f", max_position_embeddings {self.max_length}" if self.max_length else ""
        where = ", ".join(str(self.directory / v) for k, v in self.arguments.items() if k in _PATH_ARGUMENTS)
        return (f"{what} of {self.words:,} words{dropped} from {self.captions:,} captions, longest "
                f"{self.longest} tokens{limit}: {where}")

    def save(self) -> Path:
        """Write the manifest ``text_side.json`` into :attr:`directory` (the files are written
        by the builder); :meth:`load` reads it back."""
        data = {"format": MANIFEST_FORMAT, **{k: v for k, v in self.__dict__.items() if k != "directory"}}
        path = self.directory / MANIFEST
        tmp = path.with_name(path.name + ".partial")
        tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, directory: str | os.PathLike) -> TextSide:
        """The text side saved in ``directory`` (by :func:`xmatch.data.vocab.build_text_side`)."""
        directory = Path(directory)
        path = directory / MANIFEST
        if not path.is_file():
            raise FileNotFoundError(
                f"{directory} holds no text side ({MANIFEST} is missing); build one with "
                "`xmatch vocab MODEL --data ... --out DIR` or xmatch.data.vocab.build_text_side."
            )
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
            reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
            raise TextSideError(f"{path} is not valid JSON ({reason}); build the text side again.") from None
        if not isinstance(data, dict) or data.pop("format", None) != MANIFEST_FORMAT:
            raise TextSideError(f"{path} is not an xmatch text-side manifest ({MANIFEST_FORMAT}).")
        _check_manifest(data, path)
        return cls(directory=directory, **data)


class TextSideError(XmatchError, ValueError):
    """A text-side manifest (``text_side.json``) that cannot be read: not JSON, another layout,
    or a path that leaves its folder (the message names the file and the entry)."""


#: the entries of a text-side manifest: whether each value fits
_MANIFEST_ENTRIES: dict[str, Callable[[Any], bool]] = {
    "kind": lambda v: v in ("vocabulary", "tokenizer"),
    "arguments": lambda v: isinstance(v, dict),
    **dict.fromkeys(("words", "distinct_words", "min_count", "captions", "longest"), lambda v: _count(v)),
    "max_length": lambda v: v is None or _count(v),
}


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_manifest(data: dict[str, Any], path: Path) -> None:
    """Refuse a manifest whose entries :class:`TextSide` cannot hold, or whose file arguments
    leave the text side's folder (they are joined to it)."""
    unknown = sorted(set(data) - set(_MANIFEST_ENTRIES))
    missing = sorted(k for k in _MANIFEST_ENTRIES if k not in data and k != "max_length")
    if unknown or missing:
        raise TextSideError(f"{path}: unknown entries {unknown}, missing entries {missing}; build the text side again.")
    wrong = [k for k, fits in _MANIFEST_ENTRIES.items() if k in data and not fits(data[k])]
    if wrong:
        raise TextSideError(f"{path}: '{wrong[0]}' = {data[wrong[0]]!r} does not fit; build the text side again.")
    for key in _PATH_ARGUMENTS:
        value = data["arguments"].get(key)
        if value is None:
            continue
        relative = Path(value) if isinstance(value, str) else None
        if relative is None or not value or relative.is_absolute() or ".." in relative.parts:
            raise TextSideError(
                f"{path}: arguments -> {key} = {value!r} must be a path inside the text side's folder ({path.parent})."
            )


#: spec arguments of a text encoder that name a file or folder of the text side
_PATH_ARGUMENTS = ("vocab", "backbone")
