"""Each training caption parsed once per dataset: a disk cache of the spaCy tagger's analyses.

With ``word_classes = "spacy"`` the structural negatives read every training caption's parse.
Parsing one caption at a time inside the training steps made the first epoch's steps dearer
than the later ones, and every new run parsed the same captions again.
:func:`warm_tagger` parses a training set's captions in batches before the first step
(:meth:`~xmatch.eval.spacy_tagger.SpacyTagger.warm`) and keeps the analyses in
``<xmatch cache>/parses/`` (:func:`xmatch.io.hub.cache_dir`), one gzip'd JSON file per training
set, spaCy model and :data:`~xmatch.eval.spacy_tagger.ANALYSIS_VERSION`: the next run on the
same data reads them and parses nothing. The file is written atomically; one that cannot be
read, or that belongs to other data, is named in a warning, ignored and written again.

Example:
    >>> from xmatch.eval.spacy_tagger import SpacyTagger
    >>> done = warm_tagger(SpacyTagger(), ["a dog on a sofa", "a cat under a table"], {"captions": "..."})  # writes into the xmatch cache  # doctest: +SKIP
    >>> done.parsed, done.loaded  # parsed now, read from an earlier run  # doctest: +SKIP
    (2, 0)
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from xmatch.eval.probes import split_words
from xmatch.io.files import move_into_place
from xmatch.io.safe_load import JsonDepthError, load_json

logger = logging.getLogger(__name__)

#: the cache's folder under :func:`xmatch.io.hub.cache_dir`
FOLDER = "parses"
#: the version of the file layout (entries of words and analyses)
FILE_VERSION = 1


@dataclass(frozen=True)
class WarmedParses:
    """What :func:`warm_tagger` did.

    Attributes:
        path: the cache file of this training set and tagger.
        loaded: captions whose analyses came from the file.
        parsed: captions parsed now (then written to the file).
    """

    path: Path
    loaded: int
    parsed: int


def cache_key(tagger: Any, fingerprint: Any) -> dict[str, Any]:
    """What a cache file belongs to: the training data's fingerprint
    (:func:`xmatch.io.run_folder.data_fingerprint`), the spaCy model with its version and
    spaCy's, and :data:`~xmatch.eval.spacy_tagger.ANALYSIS_VERSION`.

    Example:
        >>> from xmatch.eval.spacy_tagger import SpacyTagger
        >>> sorted(cache_key(SpacyTagger(), {"captions_sha256": "..."}))
        ['analysis', 'data', 'model', 'model_version', 'spacy']
    """
    import spacy

    from xmatch.eval import spacy_tagger

    try:
        model_version = metadata.version(tagger.model)
    except metadata.PackageNotFoundError:  # a pipeline loaded from a folder: its name alone
        model_version = None
    return {
        "data": fingerprint,
        "model": tagger.model,
        "model_version": model_version,
        "spacy": spacy.__version__,
        "analysis": spacy_tagger.ANALYSIS_VERSION,
    }


def cache_path(key: dict[str, Any], folder: str | os.PathLike | None = None) -> Path:
    """The file of ``key`` (:func:`cache_key`) in ``folder`` (default: ``parses/`` in xmatch's cache).

    Example:
        >>> cache_path({"data": None}, "/tmp/parses").name
        'aeb0d7f9d1cfc8fe468ead31.json.gz'
    """
    if folder is None:
        from xmatch.io.hub import cache_dir

        folder = cache_dir() / FOLDER
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode("utf-8")).hexdigest()[:24]
    return Path(folder) / f"{digest}.json.gz"


def warm_tagger(
    tagger: Any, captions: Sequence[str], fingerprint: Any, *, folder: str | os.PathLike | None = None, write: bool = True
) -> WarmedParses:
    """Give ``tagger`` (a :class:`~xmatch.eval.spacy_tagger.SpacyTagger`) the analyses of every
    caption of a training set before training: read from the cache file of ``fingerprint``, the
    others parsed in batches and the file written again (``write``; only one process of a
    distributed run writes).

    Args:
        tagger: the spaCy tagger of the structural negatives.
        captions: the training set's captions (texts).
        fingerprint: what identifies the training data (:func:`xmatch.io.run_folder.data_fingerprint`).
        folder: where the cache files live (default: ``parses/`` in :func:`xmatch.io.hub.cache_dir`).
        write: write the file when something was parsed.

    Example:
        >>> from xmatch.eval.spacy_tagger import SpacyTagger
        >>> import tempfile
        >>> folder = tempfile.mkdtemp()
        >>> warm_tagger(SpacyTagger(), ["a dog on a sofa"], {"captions": "1"}, folder=folder).parsed
        1
        >>> warm_tagger(SpacyTagger(), ["a dog on a sofa"], {"captions": "1"}, folder=folder).loaded
        1
    """
    key = cache_key(tagger, fingerprint)
    path = cache_path(key, folder)
    words = [split_words(c) for c in captions]
    stored = _read(path, key)
    if stored:
        tagger.add_analyses(stored)
    parsed = tagger.warm(words)
    if parsed and write:
        try:
            _write(path, key, tagger.analyses(words))
        except OSError as exc:  # a read-only or full cache costs the next run a parse, not this one its training
            logger.warning("the parse cache %s cannot be written (%s): the next run parses its captions again", path, exc)
    return WarmedParses(path, len(tagger.analyses(words)) - parsed, parsed)


def _read(path: Path, key: dict[str, Any]) -> dict[tuple[str, ...], Any]:
    """The analyses of the file at ``path``, or {} (with a warning when it exists and is not usable)."""
    if not path.is_file():
        return {}
    try:
        document = load_json(gzip.decompress(path.read_bytes()), path)
        if not isinstance(document, dict) or document.get("version") != FILE_VERSION:
            raise ValueError(f"not a version-{FILE_VERSION} parse cache")
        if document.get("key") != json.loads(json.dumps(key)):
            raise ValueError("it belongs to other data or another spaCy model")
        return dict(_entry(item) for item in document["entries"])
    except (OSError, EOFError, gzip.BadGzipFile, JsonDepthError, json.JSONDecodeError, UnicodeDecodeError,
            KeyError, TypeError, ValueError) as exc:
        logger.warning("the parse cache %s cannot be used (%s): its captions are parsed again and the file rewritten",
                       path, exc)
        return {}


def _entry(item: Any) -> tuple[tuple[str, ...], Any]:
    """One ``[words, analysis]`` entry, checked: an analysis is the tagger's packed bytes (hex)
    or, for a caption of 256 words or more, its lists of spans."""
    from xmatch.eval.spacy_tagger import STORED

    words, stored = item
    if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
        raise TypeError(f"an entry's words are not a list of strings: {words!r:.80}")
    if isinstance(stored, str):
        packed = bytes.fromhex(stored)
        end = 0
        for _ in STORED:  # one count, then two numbers per pair, for each stored entry
            end += 1 + 2 * packed[end] if end < len(packed) else len(packed) + 1
        if end != len(packed):
            raise ValueError(f"the analysis of {' '.join(words)!r:.80} has the wrong length")
        return tuple(words), packed
    if not isinstance(stored, dict) or set(stored) != set(STORED):
        raise ValueError(f"the analysis of {' '.join(words)!r:.80} has other entries than {list(STORED)}")
    return tuple(words), {k: [(int(s), int(e)) for s, e in v] for k, v in stored.items()}


def _write(path: Path, key: dict[str, Any], analyses: dict[tuple[str, ...], Any]) -> None:
    entries = [[list(words), packed.hex() if isinstance(packed, bytes) else packed] for words, packed in analyses.items()]
    data = gzip.compress(json.dumps({"version": FILE_VERSION, "key": key, "entries": entries}).encode("utf-8"), 6)
    path.parent.mkdir(parents=True, exist_ok=True)
    # a temporary file renamed into place: a run killed while writing leaves the old file or none
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        move_into_place(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


__all__ = ["FOLDER", "WarmedParses", "cache_key", "cache_path", "warm_tagger"]
