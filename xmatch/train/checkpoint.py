"""Resumable checkpoints, written atomically.

A run folder keeps ``checkpoints/step-<N>/`` with the model as a bundle (``model.safetensors``
with the spec in its metadata, plus the tokenizer) and ``trainer_state.pt`` (optimizer,
scheduler, gradient scaler, every process's random state, epoch and batch position, best
figure so far). Each checkpoint is written into a temporary folder and renamed; the file
``checkpoints/latest`` names the newest complete one and is itself replaced atomically, so a
kill at any moment leaves the previous checkpoint usable. ``trainer_state.pt`` holds only
tensors and plain data and is read with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from xmatch._bundle import WEIGHTS_FILE, load_weights, save_pretrained

STATE_FILE = "trainer_state.pt"
LATEST = "latest"


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


def write_checkpoint(run_dir: Path, step: int, model: torch.nn.Module, state: dict[str, Any], keep: int) -> Path:
    """Write ``checkpoints/step-<step>`` atomically, point ``latest`` at it, keep the newest
    ``keep`` checkpoints."""
    folder = run_dir / "checkpoints"
    folder.mkdir(parents=True, exist_ok=True)
    name = f"step-{step:08d}"
    tmp = folder / f".{name}.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    save_pretrained(model, tmp)
    torch.save(state, tmp / STATE_FILE)
    final = folder / name
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    _write_text_atomically(folder / LATEST, name)
    done = sorted(p for p in folder.glob("step-*") if p.is_dir())
    for old in done[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of a run folder, or None."""
    pointer = run_dir / "checkpoints" / LATEST
    if not pointer.is_file():
        return None
    folder = run_dir / "checkpoints" / pointer.read_text(encoding="utf-8").strip()
    if not (folder / STATE_FILE).is_file() or not (folder / WEIGHTS_FILE).is_file():
        raise FileNotFoundError(
            f"{pointer} names {folder.name}, which is incomplete or missing; resume from another "
            f"checkpoint by writing its folder name into {pointer}."
        )
    return folder


def read_checkpoint(folder: Path, model: torch.nn.Module) -> dict[str, Any]:
    """Load a checkpoint's weights into ``model`` (strictly: every tensor, every shape) and
    return its trainer state."""
    load_weights(model, folder / WEIGHTS_FILE)
    return torch.load(folder / STATE_FILE, map_location="cpu", weights_only=True)


def write_bundle(directory: Path, model: torch.nn.Module, extra: dict[str, str] | None = None) -> Path:
    """Write a model bundle (``best/``, ``final/``) atomically, replacing an older one."""
    tmp = directory.with_name(f".{directory.name}.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    save_pretrained(model, tmp)
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
