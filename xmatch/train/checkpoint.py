"""Resumable checkpoints, written atomically.

A run folder keeps ``checkpoints/step-<N>/`` with the model as a bundle (``model.safetensors``
with the spec in its metadata, plus the tokenizer) and ``trainer_state.pt`` (optimizer,
scheduler, gradient scaler, every process's random state, epoch and batch position, best
figure so far). Each checkpoint is written into a temporary folder and renamed; the file
``checkpoints/latest`` names the newest complete one and is itself replaced atomically, so a
kill at any moment leaves the previous checkpoint usable. ``trainer_state.pt`` holds only
tensors and plain data and is read with ``torch.load(weights_only=True)``; a damaged one is
reported by name and the trainer falls back to the previous kept checkpoint. Each checkpoint
is stamped with its run's id, and pruning removes only that run's older checkpoints.
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import safetensors
import torch

from xmatch.io.bundle import WEIGHTS_FILE, load_weights, nonfinite_allowed, nonfinite_message, nonfinite_tensors, save_pretrained
from xmatch.io.run_folder import RunFolderError, refuse_link
from xmatch.io.safe_load import CheckpointReadError, load_torch_file
from xmatch.core.errors import XmatchError
from xmatch.train.errors import TrainingError

STATE_FILE = "trainer_state.pt"
LATEST = "latest"
RUN_ID_FILE = "run_id"
# free space under which a failed write is taken for a full disk
FULL_DISK_BYTES = 1 << 20


class CheckpointError(TrainingError):
    """A checkpoint's file is damaged or not what xmatch wrote; the message names it."""


class DiskFullError(XmatchError, OSError):
    """The disk filled up while writing a checkpoint or a model (``errno.ENOSPC``)."""


def capture_rng(device: torch.device) -> dict[str, Any]:
    """This process's random states (Python, NumPy, torch CPU and the device's)."""
    _, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, python_gauss = random.getstate()
    state = {
        "python": [version, list(internal), python_gauss],
        "numpy": [torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss],
        "torch": torch.get_rng_state(),
    }
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def restore_rng(state: dict[str, Any], device: torch.device) -> None:
    """Put back what :func:`capture_rng` took."""
    version, internal, python_gauss = state["python"]
    random.setstate((version, tuple(internal), python_gauss))
    keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state(("MT19937", keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def write_checkpoint(
    run_dir: Path, step: int, model: torch.nn.Module, state: dict[str, Any], keep: int, run_id: str | None = None
) -> Path:
    """Write ``checkpoints/step-<step>`` atomically, point ``latest`` at it, keep the newest
    ``keep`` checkpoints of this run (those stamped with ``run_id``, or unstamped).

    Raises:
        DiskFullError: the disk filled up; the partial folder is removed and the previous
            checkpoint stays the latest.
    """
    folder = run_dir / "checkpoints"
    name = f"step-{step:08d}"
    tmp = folder / f".{name}.partial"
    with _disk_full_names(tmp, "the checkpoint"):
        folder.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        save_pretrained(model, tmp)
        torch.save(state, tmp / STATE_FILE)
        if run_id is not None:
            (tmp / RUN_ID_FILE).write_text(run_id, encoding="utf-8")
        final = folder / name
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        _write_text_atomically(folder / LATEST, name)
    for old in _own_checkpoints(folder, run_id)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _own_checkpoints(folder: Path, run_id: str | None) -> list[Path]:
    """This run's step folders, oldest first; another run's stamp keeps a folder out of pruning."""
    own = []
    for path in folder.glob("step-*"):
        stamp = path / RUN_ID_FILE
        if path.is_dir() and (run_id is None or not stamp.is_file() or stamp.read_text(encoding="utf-8").strip() == run_id):
            own.append(path)
    return sorted(own)


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of a run folder, or None."""
    candidates = checkpoint_candidates(run_dir)
    return candidates[0] if candidates else None


def checkpoint_candidates(run_dir: Path) -> list[Path]:
    """Complete checkpoints to resume from, best first: the one ``latest`` names, then the
    others newest first (the fallbacks when a file turns out to be damaged)."""
    folder = run_dir / "checkpoints"
    complete = sorted(
        (p for p in folder.glob("step-*") if (p / STATE_FILE).is_file() and (p / WEIGHTS_FILE).is_file()),
        reverse=True,
    )
    pointer = folder / LATEST
    if pointer.is_file():
        named = folder / pointer.read_text(encoding="utf-8").strip()
        if named in complete:
            complete.remove(named)
            complete.insert(0, named)
    return complete


def read_checkpoint(folder: Path, model: torch.nn.Module) -> dict[str, Any]:
    """Load a checkpoint's weights into ``model`` (strictly: every tensor, every shape) and
    return its trainer state.

    Raises:
        CheckpointError: a file of the checkpoint is damaged, not a trainer state, a symbolic
            link, or holds NaN or infinite values (named; ``XMATCH_ALLOW_NONFINITE_WEIGHTS=1``
            reads those).
    """
    weights = folder / WEIGHTS_FILE
    try:  # a checkpoint is read as it is, never through a link (see xmatch.io.run_folder)
        for path in (folder, weights, folder / STATE_FILE):
            refuse_link(path)
    except RunFolderError as exc:
        raise CheckpointError(str(exc)) from None
    try:
        load_weights(model, weights)
    except (OSError, ValueError, RuntimeError, safetensors.SafetensorError) as exc:
        raise CheckpointError(f"{weights} cannot be loaded: {_first_line(exc)}") from None
    path = folder / STATE_FILE
    try:
        state = load_torch_file(path, what="a trainer state written by xmatch")
    except CheckpointReadError as exc:  # every failure of the unpickler means the same: unusable
        raise CheckpointError(str(exc)) from None
    missing = {"epoch", "batch", "step", "optimizer", "scheduler", "rng"} - set(state if isinstance(state, dict) else ())
    if missing:
        raise CheckpointError(f"{path} is not a trainer state written by xmatch (missing {', '.join(sorted(missing))}).")
    # the optimizer's moments too: a NaN there turns the next step's weights into NaN
    found = [] if nonfinite_allowed() else nonfinite_tensors({k: v for k, v in state.items() if k != "rng"})
    if found:
        raise CheckpointError(nonfinite_message(path, found, "values"))
    return state


def _first_line(exc: BaseException) -> str:
    # torch's unpickler errors go on with advice to load with weights_only=False, which would
    # run code from the file: never pass that on
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _disk_is_full(exc: BaseException, folder: Path) -> bool:
    # torch.save reports a full disk as a RuntimeError of its zip writer, not as ENOSPC:
    # ask the file system when the error does not say
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return True
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        return shutil.disk_usage(folder).free < FULL_DISK_BYTES
    except OSError:
        return False


@contextlib.contextmanager
def _disk_full_names(partial: Path, what: str) -> Iterator[None]:
    try:
        yield
    except (OSError, RuntimeError) as exc:
        if not _disk_is_full(exc, partial.parent):
            raise
        shutil.rmtree(partial, ignore_errors=True)
        raise DiskFullError(
            errno.ENOSPC,
            f"no space left on the device while writing {what} {partial.name.strip('.').removesuffix('.partial')} "
            f"into {partial.parent}; the partial files were removed and the previous checkpoint is intact. "
            "Free space (or lower train.keep_checkpoints) and resume with --resume, or use another --out",
        ) from None


def write_bundle(
    directory: Path, model: torch.nn.Module, extra: dict[str, str] | None = None,
    verifier_validation: dict[str, Any] | None = None,
) -> Path:
    """Write a model bundle (``best/``, ``final/``) atomically, replacing an older one; a
    verifier head's validation record goes into its metadata."""
    tmp = directory.with_name(f".{directory.name}.partial")
    with _disk_full_names(tmp, "the model"):
        shutil.rmtree(tmp, ignore_errors=True)
        save_pretrained(model, tmp, verifier_validation=verifier_validation)
        for name, text in (extra or {}).items():
            (tmp / name).write_text(text, encoding="utf-8")
    old = directory.with_name(f".{directory.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if directory.exists():
        os.replace(directory, old)
    os.replace(tmp, directory)
    shutil.rmtree(old, ignore_errors=True)
    return directory


def _write_text_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
