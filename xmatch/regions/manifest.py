"""``extract.json``: how a folder of region features was made, so that it can be resumed,
checked against a model, and reproduced on pixels (:func:`xmatch.extract.on_pixels`)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from xmatch.core.errors import XmatchError

MANIFEST = "extract.json"
#: version 2: the pipeline as ``{"proposer": ..., "roi": ...}`` plus what they resolved to;
#: version 3: every RoI setting of today written (``output_stride``, ``mode``, ``crop_size``), and
#: the defaults a missing one would take are no longer version 2's (600 px, stride 16)
FORMAT = "xmatch.extract/3"


class ManifestError(XmatchError, ValueError):
    """A missing or unusable ``extract.json``, or one that does not fit (the message names it)."""


def manifest_path(folder: str | os.PathLike) -> Path:
    return Path(folder).expanduser() / MANIFEST


#: the entries every manifest holds, and what each must be (checked when it is read)
_REQUIRED: dict[str, tuple[type, ...]] = {
    "complete": (bool,), "layout": (str,), "dtype": (str,), "batch_size": (int,), "feature_dim": (int,),
    "pipeline": (dict,), "images": (dict,),
}
#: the entries a finished extraction adds
_OPTIONAL: dict[str, tuple[type, ...]] = {
    "splits": (dict,), "unreadable": (list,), "captions_per_image": (list,), "captions": (str,),
    "images_folder": (str,), "regions": (dict,),
}


def read_manifest(folder: str | os.PathLike) -> dict[str, Any]:
    """The manifest of a folder written by ``xmatch extract``, its entries checked: the
    settings, the pipeline (``proposer``, ``roi``, ``fingerprint``) and what a finished run
    adds (``splits``, ``unreadable``, ``captions_per_image``) have the types xmatch writes.

    Raises:
        ManifestError: no ``extract.json`` there, not one written by ``xmatch extract``, or an
            entry that is missing or of the wrong type (named).

    Example:
        >>> m = read_manifest("feats")  # needs an extraction folder  # doctest: +SKIP
        >>> m["pipeline"]["roi"]["backbone"], m["feature_dim"], m["complete"]  # doctest: +SKIP
        ('efficientnet_lite0', 1280, True)
    """
    path = manifest_path(folder)
    if not path.is_file():
        raise ManifestError(f"{path} does not exist: {Path(folder)} was not written by xmatch extract.")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ManifestError(f"{path} is not readable JSON ({exc}); extract again with --overwrite.") from None
    found = doc.get("format") if isinstance(doc, dict) else None
    if isinstance(found, str) and found.startswith("xmatch.extract/") and found != FORMAT:
        raise ManifestError(f"{path} was written in the manifest format {found}, this xmatch reads {FORMAT}; "
                            "extract again with --overwrite.")
    if found != FORMAT:
        raise ManifestError(f"{path} is not an xmatch extract manifest (format {FORMAT}).")
    problem = _problem(doc)
    if problem:
        raise ManifestError(f"{path}: {problem}; it is damaged or was not written by xmatch extract. "
                            "Extract again with --overwrite.")
    return doc


def _problem(doc: dict[str, Any]) -> str | None:
    """What is wrong with a manifest's entries, or None."""
    for key, kinds in [*_REQUIRED.items(), *_OPTIONAL.items()]:
        if key not in doc and key in _REQUIRED:
            return f"the entry {key!r} is missing"
        value = doc.get(key)
        if key in doc and (not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds)):
            return f"the entry {key!r} is {value!r:.60}, not a {kinds[0].__name__}"
    if doc["batch_size"] < 1 or doc["feature_dim"] < 1:
        return "batch_size and feature_dim must be positive"
    pipeline = doc["pipeline"]
    if not (isinstance(pipeline.get("proposer"), dict) and isinstance(pipeline.get("roi"), dict)
            and isinstance(pipeline.get("fingerprint"), str)):
        return "the pipeline must hold a 'proposer' and a 'roi' table and the weights' 'fingerprint'"
    if not all(isinstance(k, str) and type(v) is int and v >= 0 for k, v in doc.get("splits", {}).items()):
        return "'splits' must map split names to image counts"
    if not all(isinstance(u, list) and len(u) == 2 and all(isinstance(x, str) for x in u)
               for u in doc.get("unreadable", [])):
        return "'unreadable' must list [image, reason] pairs"
    if not all(type(n) is int and n >= 0 for n in doc.get("captions_per_image", [])):
        return "'captions_per_image' must list caption counts"
    return None


def canonical_pipeline(pipeline: Any) -> Any:
    """A recorded ``pipeline`` table with its ``roi`` table as :class:`RoIConfig` reads it (a
    setting left out takes its default), so that comparing two runs' settings compares what
    they mean, not which keys were written.

    Example:
        >>> canonical_pipeline({"roi": {"mode": "roi"}})["roi"]["crop_regions"]
        8
    """
    from dataclasses import asdict

    from xmatch.regions.config import RoIConfig

    if not (isinstance(pipeline, dict) and isinstance(pipeline.get("roi"), dict)):
        return pipeline
    try:
        roi = asdict(RoIConfig.from_table(pipeline["roi"]))
    except (TypeError, ValueError):  # unreadable settings: compared as written, so the difference is named
        return pipeline
    return {**pipeline, "roi": roi}


def settings_differences(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """``key: old -> new`` for every setting that differs (nested keys joined by dots)."""
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += settings_differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}: {a!r} -> {b!r}")
    return out


def describe_features(root: str | os.PathLike | None) -> str | None:
    """One sentence on how the features under ``root`` were made, or None when ``root`` holds
    no manifest (for error messages about a dataset built on them).

    Example:
        >>> describe_features("feats")  # needs an extraction folder  # doctest: +SKIP
        'feats/extract.json: 1280-d features of efficientnet_lite0 (package:efficientnet-lite0), proposer windows'
    """
    if root is None:
        return None
    folder = Path(root)
    if folder.is_file():
        folder = folder.parent
    try:
        doc = read_manifest(folder)
    except ManifestError:
        return None
    pipeline = doc.get("pipeline", {})
    roi = pipeline.get("roi", {})
    proposer = pipeline.get("proposer", {}).get("name", "?")
    return (
        f"{manifest_path(folder)}: {doc.get('feature_dim')}-d features of {roi.get('backbone')} "
        f"({roi.get('weights')}), proposer {proposer}"
    )
