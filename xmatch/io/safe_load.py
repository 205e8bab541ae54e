"""Reading pickled torch files and JSON files safely, with errors that say what is wrong with the file.

Every ``torch.load`` in xmatch goes through :func:`load_torch_file`: it always passes
``weights_only=True`` (no arbitrary code runs while unpickling) and turns any failure into a
:class:`CheckpointReadError` that names the file. torch's own message for a refused object
advises re-running with ``weights_only=False``; that advice is unsafe for a file of unknown
origin, so it never reaches the user (not in the message, not in the exception chain).

JSON read from files xmatch did not write itself goes through :func:`load_json`, which bounds
how deep the file may nest (:data:`MAX_JSON_DEPTH`) with an error that names the file, where
Python's parser would raise a bare ``RecursionError``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from xmatch.core.errors import XmatchError
from xmatch.core.sources import PICKLE_SUFFIXES

# torch's weights_only refusal names the object it would have had to import: keep only that.
_UNSUPPORTED_GLOBAL = re.compile(r"Unsupported global: GLOBAL ([\w.]+)")
_UNSUPPORTED_OPCODE = re.compile(r"Unsupported operand (\S+)")
_MAX_REASON = 200
#: the deepest nesting of arrays and objects :func:`load_json` reads (xmatch's own files nest a few levels)
MAX_JSON_DEPTH = 100


class CheckpointReadError(XmatchError, ValueError):
    """A torch file is corrupted (truncated, damaged) or is not a checkpoint xmatch reads."""


class JsonDepthError(XmatchError, ValueError):
    """A JSON text nested deeper than :data:`MAX_JSON_DEPTH` (the message names its source)."""


def load_json(text: str | bytes, source: str | os.PathLike, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads(text)``, refusing a text whose arrays and objects nest deeper than ``max_depth``.

    Args:
        text: the JSON text.
        source: the file (or entry) it comes from, for the message.
        max_depth: the deepest nesting accepted.

    Raises:
        JsonDepthError: the text nests deeper (also when it nests too deep for Python's parser).
        json.JSONDecodeError: the text is not JSON (callers name the file).

    Example:
        >>> load_json('{"a": [1, 2]}', "run.json")
        {'a': [1, 2]}
        >>> load_json("[" * 200 + "]" * 200, "run.json")
        Traceback (most recent call last):
        ...
        xmatch.io.safe_load.JsonDepthError: run.json is JSON nested more than 100 levels deep; ...
    """
    try:
        data = json.loads(text)
        deep = _deeper_than(data, max_depth)
    except RecursionError:  # deeper than Python's parser goes
        data, deep = None, True
    if deep:
        raise JsonDepthError(
            f"{source} is JSON nested more than {max_depth} levels deep; xmatch reads no deeper (its own files nest "
            "a few levels): the file is damaged or was not written by xmatch."
        )
    return data


def _deeper_than(data: Any, max_depth: int) -> bool:
    """Whether the containers of parsed JSON nest deeper than ``max_depth`` (walked without recursion)."""
    stack = [(data, 1)] if isinstance(data, (dict, list)) else []
    while stack:
        node, depth = stack.pop()
        if depth > max_depth:
            return True
        children = node.values() if isinstance(node, dict) else node
        stack += [(child, depth + 1) for child in children if isinstance(child, (dict, list))]
    return False


def load_torch_file(
    path: str | os.PathLike,
    *,
    what: str = "a checkpoint",
    allowed_globals: Iterable[Any] = (),
    hint: str = "",
) -> Any:
    """``torch.load(path, map_location="cpu", weights_only=True)`` with a clear error.

    Args:
        path: the file to read.
        what: what the file should be, for the message (``"an original TERN/TERAN checkpoint"``).
        allowed_globals: classes the file may hold besides tensors and plain data (passed to
            ``torch.serialization.safe_globals``), e.g. ``argparse.Namespace``.
        hint: a sentence appended to the error, saying how to get a good file.

    Raises:
        FileNotFoundError: ``path`` is not a file.
        CheckpointReadError: the file cannot be read (the message names the file and the reason,
            and never suggests ``weights_only=False``).

    Example:
        >>> torch.save({"step": 100, "lr": torch.tensor(2e-4)}, "trainer_state.pt")
        >>> load_torch_file("trainer_state.pt", what="a trainer state")["step"]
        100
    """
    import torch

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} {path} does not exist.")
    try:
        with torch.serialization.safe_globals(list(allowed_globals)):
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises UnpicklingError, RuntimeError, EOFError, KeyError, ...
        message = (
            f"{path} could not be read as {what}: it is corrupted (truncated or damaged) or not a "
            f"supported checkpoint ({_reason(exc)})."
        )
        # from None: the original exception carries torch's weights_only=False advice
        raise CheckpointReadError(f"{message} {hint}".rstrip()) from None


def refuse_pickled_weights(folder: str | os.PathLike, safe_files: Iterable[str], what: str, convert: str) -> None:
    """Refuse a weights directory a loader would unpickle: one without any of ``safe_files`` (the
    safetensors files the loader picks first) that holds a pickle (``.bin``, ``.pt``, ``.pth``, ...).

    A pickle can run code while it is loaded, and torch's refusal of a hostile one advises
    loading it with ``weights_only=False``, which would run it; xmatch names the file and how to
    convert it instead, before any loader opens it.

    Args:
        folder: the directory (anything else is left to the loader).
        safe_files: file names whose presence means the loader reads safetensors.
        what: what the weights are, for the message (``"the weights of text encoder 'bert'"``).
        convert: how to convert the file once, where it is trusted (a command).

    Raises:
        CheckpointReadError: the directory holds pickled weights only.

    Example:
        >>> _ = Path("bert").mkdir(), Path("bert/pytorch_model.bin").write_bytes(b"")
        >>> refuse_pickled_weights("bert", ["model.safetensors"], "the weights", "convert them")
        Traceback (most recent call last):
        ...
        xmatch.io.safe_load.CheckpointReadError: the weights are a pickle, bert/pytorch_model.bin, and xmatch reads the weights of a model folder from safetensors only: ...
    """
    folder = Path(folder)
    if not folder.is_dir() or any((folder / name).is_file() for name in safe_files):
        return
    pickles = sorted(p for p in folder.iterdir() if p.is_file() and p.name.endswith(PICKLE_SUFFIXES))
    if pickles:
        more = f" (and {len(pickles) - 1} more)" if len(pickles) > 1 else ""
        raise CheckpointReadError(
            f"{what} are a pickle, {pickles[0]}{more}, and xmatch reads the weights of a model folder from "
            f"safetensors only: unpickling a file can run any code it holds. Convert them once to safetensors, "
            f"where you trust the file: {convert}"
        )


def load_failure_reason(exc: BaseException) -> str:
    """A short description of a failure to load weights that never passes on torch's advice to
    load with ``weights_only=False``.

    Example:
        >>> load_failure_reason(RuntimeError("Weights only load failed. Re-running with weights_only=False will likely succeed"))
        'it holds something other than tensors and plain data, which xmatch never unpickles'
    """
    return _reason(exc)


def _reason(exc: BaseException) -> str:
    """A short, safe description of a torch.load failure."""
    text = str(exc)
    refused = _UNSUPPORTED_GLOBAL.search(text)
    if refused is not None:
        return f"it holds the Python object {refused.group(1)}, which xmatch never unpickles"
    opcode = _UNSUPPORTED_OPCODE.search(text)
    if opcode is not None:
        return f"its bytes are not a pickle of tensors and plain data: unsupported pickle opcode {opcode.group(1)}"
    if "weights_only" in text or "Weights only" in text:
        return "it holds something other than tensors and plain data, which xmatch never unpickles"
    first = text.strip().splitlines()[0] if text.strip() else ""
    first = first.split(". This is an internal")[0]  # miniz's long explanation adds nothing
    if isinstance(exc, EOFError):
        return "the file ends early"
    if not first:
        return type(exc).__name__
    return f"{type(exc).__name__}: {first[:_MAX_REASON]}"
