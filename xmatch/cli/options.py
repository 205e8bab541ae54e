"""What several commands read the same way: ``KEY=VALUE`` settings (``--set``, ``--model-set``,
``--proposer-option``), the dataset of ``--dataset`` / ``--data`` / ``--data-option``, and a
MODEL argument as an index records it."""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path
from typing import Any


def toml_value(text: str) -> Any:
    """``text`` read as a TOML value (numbers, booleans, lists, quoted strings), else the text itself.

    Example:
        >>> toml_value("1e-4"), toml_value("true"), toml_value("[1, 2]"), toml_value("bf16")
        (0.0001, True, [1, 2], 'bf16')
    """
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def setting(text: str) -> tuple[list[str], Any]:
    """``a.b=VALUE`` -> ``(["a", "b"], VALUE)``, the value read by :func:`toml_value`.

    Example:
        >>> setting("text_encoder.layers=2")
        (['text_encoder', 'layers'], 2)
    """
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValueError(f"'{text}' is not KEY=VALUE.")
    return key.strip().split("."), toml_value(value)


def model_overrides(settings: list[str]) -> dict[str, Any]:
    """The nested spec overrides of ``--model-set PATH=VALUE`` arguments, for ``xmatch.build``.

    Example:
        >>> model_overrides(["pooler.name=MwSr", "text_encoder.layers=2"])
        {'pooler': {'name': 'MwSr'}, 'text_encoder': {'layers': 2}}
    """
    out: dict[str, Any] = {}
    for text in settings:
        path, value = setting(text)
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
    return out


def open_data(args: argparse.Namespace, split: str, options: list[str] | None) -> Any:
    """The dataset of ``--dataset`` (or the one layout ``--data`` looks like) at ``--data``.

    Sets ``args.dataset`` to the recognised layout when it was not given, and prints which.
    """
    import inspect

    from xmatch.core.registry import get_registry
    from xmatch.data import open_dataset
    from xmatch.data.layouts import choose_layout

    if args.dataset is None:
        args.dataset = choose_layout(args.data)
        print(f"dataset layout: {args.dataset} (recognised in {args.data}; --dataset to choose another)")
    if args.data is None:
        builder = get_registry("datasets").get(args.dataset)
        root = inspect.signature(builder).parameters.get("root")
        if root is None or root.default is not None:
            raise ValueError(f"the {args.dataset} layout needs --data FOLDER (the dataset's root folder).")
    pairs = [kv.split("=", 1) for kv in options or []]
    bad = [kv for kv, pair in zip(options or [], pairs) if len(pair) != 2]
    if bad:
        raise ValueError(f"--data-option {bad[0]!r} is not KEY=VALUE.")
    return open_dataset(args.dataset, args.data, split=split, **dict(pairs))


def check_captions_per_image(dataset: Any, where: Path | None, option: str) -> None:
    """Refuse, with the option that fixes it, a dataset whose images have different numbers of
    captions: the papers' protocol ranks the same number for every image (a folder of one's own
    photos often has more captions for some). ``option`` is the command's option that passes
    ``captions_per_image`` to that dataset (``--data-option``, ``--val-option``).

    Example:
        >>> check_captions_per_image(open_dataset("image-captions", "photos/", split="test"), Path("photos/"), "--data-option")  # needs a folder  # doctest: +SKIP
    """
    import numpy as np

    if dataset.captions_per_image or not len(dataset.captions):
        return
    owners = getattr(dataset, "caption_image", None)  # a plugin's dataset may not map captions to images
    counts = np.bincount(owners) if owners is not None and len(owners) else None
    have = f"these images have {counts.min()} to {counts.max()}" if counts is not None else "these images have different numbers"
    at_most = f" (N at most {counts.min()}; the image-captions layout)" if counts is not None else " (the image-captions layout)"
    raise ValueError(
        f"{where}: the papers' Recall@K protocol needs the same number of captions for every image; {have}. "
        f"Evaluate the first N captions of each with {option} captions_per_image=N{at_most}, or give every "
        "image the same number."
    )


def tokenizer_overrides(folder: Path | None) -> dict[str, Any]:
    """The spec overrides of ``--tokenizer DIR``: the text tower reads its tokenizer from that
    folder (the fingerprint of an index leaves the tokenizer's location out, so the model
    still fits the index).

    Example:
        >>> tokenizer_overrides(None)
        {}
    """
    if folder is None:
        return {}
    if not folder.is_dir():
        raise FileNotFoundError(
            f"--tokenizer {folder}: no such folder; give the folder a tokenizer's save_pretrained wrote (tokenizer.json, "
            "tokenizer_config.json, ...), e.g. the tokenizer files of the model's hub repository."
        )
    return {"text_encoder": {"tokenizer": str(folder.resolve())}}


def indexed_model(root: Path, model: str | None, tokenizer: Path | None, device: str | None) -> Any:
    """The query model of ``xmatch search`` / ``xmatch index --append``: ``model`` (``--model``),
    else the index's own; with ``--tokenizer DIR`` built here with that tokenizer, else named
    for :func:`xmatch.index.open` to build."""
    reference = model and model_ref(model)
    if tokenizer is None:
        return reference
    from xmatch.index.store import read_manifest
    from xmatch.index.search import MODEL_FOLDER
    from xmatch.model.factory import build_reference

    reference = reference or read_manifest(root)["model"].get("ref") or f"local-dir:{root / MODEL_FOLDER}"
    return build_reference(reference, device, **tokenizer_overrides(tokenizer))


def model_ref(text: str) -> str:
    """A MODEL argument as an index records it: a weights path, and a spec file's path, made
    absolute (a search from another folder finds both); a zoo name stays a name.

    Example:
        >>> model_ref("teran-mrsw-scenes")
        'teran-mrsw-scenes'
        >>> model_ref("my.toml=w.safetensors") == f"{Path('my.toml').resolve()}={Path('w.safetensors').resolve()}"
        True
    """
    if "=" in text:
        name, weights = text.split("=", 1)
        if name.endswith(".toml"):  # a spec file (build reads any other name as a zoo entry)
            name = str(Path(name).resolve())
        return f"{name}={Path(weights).resolve()}"
    return text
