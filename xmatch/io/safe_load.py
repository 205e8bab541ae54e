"""Reading pickled torch files safely, with errors that say what is wrong with the file.

Every ``torch.load`` in xmatch goes through :func:`load_torch_file`: it always passes
``weights_only=True`` (no arbitrary code runs while unpickling) and turns any failure into a
:class:`CheckpointReadError` that names the file. torch's own message for a refused object
advises re-running with ``weights_only=False``; that advice is unsafe for a file of unknown
origin, so it never reaches the user (not in the message, not in the exception chain).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from xmatch.core.errors import XmatchError

# torch's weights_only refusal names the object it would have had to import: keep only that.
_UNSUPPORTED_GLOBAL = re.compile(r"Unsupported global: GLOBAL ([\w.]+)")
_UNSUPPORTED_OPCODE = re.compile(r"Unsupported operand (\S+)")
_MAX_REASON = 200


class CheckpointReadError(XmatchError, ValueError):
    """A torch file is corrupted (truncated, damaged) or is not a checkpoint xmatch reads."""


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


def _reason(exc: Exception) -> str:
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
