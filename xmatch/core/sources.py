"""Where a pretrained asset lives: a local path, a hub id, a file inside a package or the zoo
folder; and the weight-source tables of zoo entries and backbones, checked before anything is fetched
(:mod:`xmatch.io.hub` fetches them)."""

from __future__ import annotations

import importlib.util
import re
import urllib.parse
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

WEIGHTS_FILE = "model.safetensors"
"""The weights file of a bundle (:mod:`xmatch.io.bundle`)."""
PACKAGE_PREFIX = "package:"
ZOO_PREFIX = "zoo:"
PLUGINS_FILE = "plugins.toml"
"""The zoo folder's list of known plugin distributions (not zoo entries)."""
HF_HUB = "hf-hub:"
FILE_URL = "file://"
PICKLE_SUFFIXES = (".pth", ".pt", ".bin", ".ckpt", ".pkl", ".pickle", ".tar")
SOURCE_KEYS = ("source", "sha256", "size", "filename")
SHA256_HEX = re.compile(r"[0-9a-f]{64}")
#: BERT-base (uncased) at a commit of its Hub repository that holds model.safetensors (440,449,768
#: bytes): the backbone the TERAN and TERN zoo entries pin
BERT_BASE_UNCASED = "hf-hub:google-bert/bert-base-uncased@86b5e0934494bd15c9632b12f734a8a67f723594"
COMMIT_HEX = re.compile(r"[0-9a-f]{40}")
"""A full git commit id (also the form of a git blob sha1, the Hub's ETag of a small file)."""


def zoo_folder() -> Path:
    """The folder of the zoo entries (``*.toml``) and the shipped weights: ``xmatch/zoo`` in an
    installed wheel (the build copies the repository's top-level ``zoo/`` there), or the
    top-level ``zoo/`` of a source checkout, installed in editable mode or not installed at all.

    Example:
        >>> sorted(p.name for p in zoo_folder().glob("*.toml"))
        ['clip.toml', 'plugins.toml', 'scenes.toml', 'teran.toml', 'tern.toml']
    """
    package = Path(__file__).resolve().parents[1]
    for folder in (package / "zoo", package.parent / "zoo"):
        if (folder / PLUGINS_FILE).is_file():
            return folder
    raise FileNotFoundError(
        f"xmatch's zoo folder is missing: neither {package / 'zoo'} (an installed wheel) nor "
        f"{package.parent / 'zoo'} (a source checkout) holds zoo entries; reinstall xmatch-zoo."
    )


def resolve_local_source(source: str) -> str:
    """Return a local path for ``package:module/sub/path`` and ``zoo:sub/path`` sources; other
    sources unchanged.

    Example:
        >>> resolve_local_source("bert-base-uncased")
        'bert-base-uncased'
        >>> Path(resolve_local_source("zoo:weights/tern-scenes")).name
        'tern-scenes'
    """
    if source.startswith(ZOO_PREFIX):
        path = zoo_folder() / source[len(ZOO_PREFIX) :]
        if not path.exists():
            raise FileNotFoundError(f"source '{source}': {path} does not exist in xmatch's zoo folder.")
        return str(path)
    if not source.startswith(PACKAGE_PREFIX):
        return source
    module, _, sub = source[len(PACKAGE_PREFIX) :].partition("/")
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"source '{source}': the Python package '{module}' is not installed; "
            f"pip install {module.replace('_', '-')}."
        )
    path = Path(next(iter(spec.submodule_search_locations))) / sub
    if not path.exists():
        raise FileNotFoundError(f"source '{source}': {path} does not exist in the installed package.")
    return str(path)


@dataclass(frozen=True)
class WeightSource:
    """A validated weight source (see :func:`validate_weight_source`).

    ``kind`` is ``"url"``, ``"file"``, ``"package"`` or ``"hf-hub"``; ``filename`` is the name
    of the weights file (in the cache for URLs; ``model.safetensors`` for a bundle).
    """

    kind: str
    source: str
    sha256: str | None
    size: int | None
    filename: str


def validate_weight_source(table: Mapping[str, Any] | str, *, local_pickle: bool = False) -> WeightSource:
    """Check one entry of a zoo entry's ``weights`` list (or a backbone's weight source) and
    return it parsed.

    Raises ``ValueError`` naming every problem: unknown keys, an unsupported source, a URL
    without ``sha256`` and ``size``, a malformed checksum, a pickle file from the network, or
    any pickle file unless ``local_pickle`` (``TypeError`` when ``table`` is not a table at all).

    Args:
        table: ``{source, sha256, size, filename}`` or a source string.
        local_pickle: also accept a pickle file (``.pth``) from a local path or an installed
            package, for backbone weights read with ``torch.load(weights_only=True)``; a
            network source must be ``.safetensors`` all the same. A zoo entry's weights are
            always safetensors (its pickles are converted with ``xmatch convert``).

    Example:
        >>> validate_weight_source({"source": "hf-hub:org/name@v1"}).kind
        'hf-hub'
        >>> validate_weight_source({"source": "https://example.org/m.safetensors"})
        Traceback (most recent call last):
        ...
        ValueError: weight source 'https://example.org/m.safetensors': a URL needs sha256 and size.
    """
    if isinstance(table, str):
        table = {"source": table}
    if not isinstance(table, Mapping):
        raise TypeError(f"a weight source is a table with {', '.join(SOURCE_KEYS)}, got {type(table).__name__}.")
    source = table.get("source")
    if not isinstance(source, str) or not source:
        raise ValueError(f"weight source {dict(table)}: 'source' must be a non-empty string.")
    problems: list[str] = []
    unknown = sorted(set(table) - set(SOURCE_KEYS))
    if unknown:
        problems.append(f"unknown keys {unknown} (allowed: {', '.join(SOURCE_KEYS)})")
    sha256 = table.get("sha256")
    if sha256 is not None and not (isinstance(sha256, str) and SHA256_HEX.fullmatch(sha256.lower())):
        problems.append("sha256 must be 64 hexadecimal digits")
    size = table.get("size")
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size <= 0):
        problems.append("size must be a positive number of bytes")
    filename = table.get("filename")
    if filename is not None and (not isinstance(filename, str) or not filename or Path(filename).name != filename):
        problems.append("filename must be a plain file name")

    scheme = urllib.parse.urlsplit(source).scheme.lower()
    if scheme in ("http", "https"):
        kind = "url"
        if sha256 is None or size is None:
            problems.append("a URL needs sha256 and size")
        name = filename or Path(urllib.parse.unquote(urllib.parse.urlsplit(source).path)).name
        if not name:
            problems.append("the URL names no file; give filename")
    elif source.startswith(HF_HUB):
        kind = "hf-hub"
        try:
            _, _, path = parse_hf_source(source)
        except ValueError as exc:
            problems.append(str(exc))
            path = None
        name = filename or (Path(path).name if path else WEIGHTS_FILE)
    elif source.startswith(PACKAGE_PREFIX):
        kind = "package"
        if not source[len(PACKAGE_PREFIX) :].partition("/")[0]:
            problems.append("expected package:some_pkg/path/inside")
        name = filename or Path(source).name
    elif source.startswith(ZOO_PREFIX):
        kind = "package"
        if not source[len(ZOO_PREFIX) :]:
            problems.append("expected zoo:path/inside/the/zoo/folder")
        name = filename or Path(source).name
    elif source.startswith(FILE_URL) or "://" not in source:
        kind = "file"
        name = filename or Path(source).name
    else:
        kind, name = "", ""
        problems.append(f"unsupported scheme '{scheme}' (use https://, http://, file://, hf-hub:, package:, zoo: or a path)")
    if name.lower().endswith(PICKLE_SUFFIXES) and not (local_pickle and kind in ("file", "package")):
        problems.append(
            "pickle checkpoints are never loaded from a weight source; publish .safetensors "
            "(convert an original checkpoint with `xmatch convert`)"
        )
    elif kind in ("url", "hf-hub") and name and not name.endswith(".safetensors"):
        problems.append("a network source must be a .safetensors file or an hf-hub bundle repository")
    if problems:
        raise ValueError(f"weight source '{source}': {'; '.join(problems)}.")
    return WeightSource(kind, source, sha256.lower() if sha256 else None, size, name)


class MovableRevisionWarning(UserWarning):
    """An ``hf-hub:`` reference that names a branch, a tag, ``refs/pr/N`` or no revision: what
    it points at may change, and its integrity rests on the Hub's answer at download time."""


_WARNED_MOVABLE: set[str] = set()


def unpinned_problem(source: str) -> str | None:
    """Why the ``hf-hub:`` reference ``source`` is not pinned to a commit (None: it names a full
    40-hex commit). Zoo entries must pin every hub reference; a user's own may move.

    Example:
        >>> unpinned_problem("hf-hub:org/name@main/model.safetensors")
        "names the revision 'main', which can move (branches, tags and refs/pr/N do); pin a full 40-hex commit: hf-hub:org/name@<commit>[/path]"
        >>> unpinned_problem("hf-hub:org/name@" + "0" * 40) is None
        True
    """
    _, revision, _ = parse_hf_source(source)
    if revision is not None and COMMIT_HEX.fullmatch(revision):
        return None
    what = "names no revision (the default branch, which moves)" if revision is None else (
        f"names the revision '{revision}', which can move (branches, tags and refs/pr/N do)")
    return f"{what}; pin a full 40-hex commit: hf-hub:org/name@<commit>[/path]"


def warn_if_movable(source: str) -> None:
    """Warn once per process and source (:class:`MovableRevisionWarning`) when the ``hf-hub:``
    reference ``source`` is not pinned to a commit.

    Example:
        >>> warn_if_movable("hf-hub:org/name@" + "0" * 40)  # pinned: no warning
    """
    problem = unpinned_problem(source)
    if problem is None or source in _WARNED_MOVABLE:
        return
    _WARNED_MOVABLE.add(source)
    warnings.warn(
        f"'{source}' {problem.split(';')[0]}: what it names may change, and its integrity rests on the Hub's "
        "answer at download time (the file is checked against the sha256 and size the Hub states for the commit "
        "it resolves to). Pin a commit (hf-hub:org/name@<40-hex commit>) for a reproducible download.",
        MovableRevisionWarning, stacklevel=3,
    )


def parse_hf_source(source: str) -> tuple[str, str | None, str | None]:
    """``hf-hub:org/name[@rev][/path]`` -> (repo id, revision, path in repo)."""
    parts = source[len(HF_HUB) :].split("/")
    if len(parts) < 2 or not parts[0] or not parts[1] or parts[1].startswith("@"):
        raise ValueError("expected hf-hub:org/name[@revision][/path/in/repo.safetensors]")
    name, _, revision = parts[1].partition("@")
    path = "/".join(parts[2:]) or None
    return f"{parts[0]}/{name}", revision or None, path
