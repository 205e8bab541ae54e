"""A run folder holds one run: its record (``run.json``), the claim a new run makes on the
folder, and what may change when the run resumes.

``run.json`` keeps the run's id, the model spec, the recipe and a fingerprint of the training
and validation data. A new run refuses a folder that holds anything (``overwrite`` removes the
old run's files first); a resumed run compares its recipe and data with the record and refuses
changes that would silently train part of an epoch twice, jump the learning rate or change what
"best" means, unless forced.

Nothing inside a run folder is read through a symbolic link (:func:`refuse_links`): a resumed
run rewrites its logs and record, so it would read what a link points to and write it back into
the run (or over the link's target). The folder itself may be a link.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from xmatch.core.errors import XmatchError
from xmatch.io.safe_load import JsonDepthError, load_json

RUN_FILE = "run.json"
# Everything a run writes into its folder; ``overwrite`` removes these and nothing else.
RUN_ARTIFACTS = (RUN_FILE, "checkpoints", "best", "final", "train.csv", "val.csv", "tensorboard", "relevance")
# Recipe settings that change neither the data order, the learning-rate trajectory nor the
# meaning of the selection metric: a resumed run may change them freely.
SAFE_ON_RESUME = frozenset({
    "epochs", "max_steps", "num_workers", "log_every_steps", "tensorboard", "keep_checkpoints",
    "checkpoint_every_steps", "val_every_steps", "early_stopping", "allow_unknown_words", "text_min_count",
})


class RunFolderError(XmatchError, RuntimeError):
    """The run folder holds another run, or a resume would change what the run was."""


def data_fingerprint(dataset: Any) -> dict[str, Any] | None:
    """What identifies a dataset for a resumed run: layout, split, sizes and a hash of the
    captions and image names (not the root path: a moved folder is the same data).

    Example:
        >>> data_fingerprint(None) is None
        True
    """
    if dataset is None:
        return None
    captions = list(getattr(dataset, "captions", []))
    names = [str(n) for n in getattr(dataset, "image_names", [])]
    return {
        "layout": type(dataset).__name__,
        "split": getattr(dataset, "split", None),
        "pairs": len(dataset),
        "images": len(names) if names else getattr(dataset, "num_images", None),
        "captions_sha256": _digest(captions),
        "image_names_sha256": _digest(names),
    }


def _digest(lines: list[str]) -> str:
    h = hashlib.sha256()
    for line in lines:
        h.update(line.encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()


def new_run_record(spec: Mapping[str, Any], train: Mapping[str, Any], data: Mapping[str, Any], world_size: int) -> dict[str, Any]:
    """The ``run.json`` of a new run (with a fresh run id)."""
    return {"run_id": uuid.uuid4().hex, "spec": spec, "train": train, "data": data, "world_size": world_size}


def refuse_link(path: Path) -> None:
    """Refuse ``path``, a file or folder inside a run folder, when it is a symbolic link.

    Raises:
        RunFolderError: it is one; the message names it, its target and the fix.

    Example:
        >>> refuse_link(Path("runs/mine/train.csv"))  # a plain file, or none: nothing to say
    """
    if path.is_symlink():
        raise RunFolderError(
            f"{path} is a symbolic link (to {os.readlink(path)}); xmatch follows no links inside a run folder, as a "
            "resumed run would read what the link points to and write it back. Replace the link with a copy of its "
            f"target (cp --remove-destination TARGET {path}), or start a new run folder."
        )


def refuse_links(run_dir: Path) -> None:
    """Refuse a run folder in which a file or folder the run writes (:data:`RUN_ARTIFACTS`, and
    everything under those folders) is a symbolic link; checked before a resumed run reads it.

    Raises:
        RunFolderError: the first link found (named, see :func:`refuse_link`).

    Example:
        >>> refuse_links(Path("runs/mine"))  # no links there: nothing to say
    """
    for name in RUN_ARTIFACTS:
        top = run_dir / name
        refuse_link(top)
        if top.is_dir():
            # os.walk does not enter a linked folder: it is listed among dirs and refused there
            for folder, dirs, files in os.walk(top):
                for entry in sorted((*dirs, *files)):
                    refuse_link(Path(folder) / entry)


def read_run_record(run_dir: Path) -> dict[str, Any] | None:
    """The folder's ``run.json``, or None when it has none.

    Raises:
        RunFolderError: ``run.json`` is a symbolic link, not JSON, nested deeper than
            :data:`~xmatch.io.safe_load.MAX_JSON_DEPTH`, or not an object (named).
    """
    path = run_dir / RUN_FILE
    refuse_link(path)
    if not path.is_file():
        return None
    try:
        record = load_json(path.read_text(encoding="utf-8"), path)
    except JsonDepthError as exc:
        raise RunFolderError(f"{exc} The run record is damaged.") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RunFolderError(f"{path} is not valid JSON ({exc}); the run record is damaged.") from None
    if not isinstance(record, dict):
        raise RunFolderError(f"{path} is not a run record (expected a JSON object).")
    return record


def write_run_record(run_dir: Path, record: Mapping[str, Any]) -> None:
    """Replace ``run.json`` atomically."""
    path = run_dir / RUN_FILE
    tmp = path.with_name(path.name + ".partial")
    tmp.unlink(missing_ok=True)  # never written through a link planted there
    tmp.write_text(json.dumps(record, indent=1), encoding="utf-8")
    tmp.replace(path)


def claim_for_new_run(run_dir: Path, overwrite: bool) -> str | None:
    """Make ``run_dir`` ready for a new run.

    A folder that holds anything is refused (a second run would mix its checkpoints, logs and
    ``best/`` with the first one's); with ``overwrite`` the old run's files (:data:`RUN_ARTIFACTS`)
    are removed, other files are left alone.

    Returns:
        None when the folder is ready, else the refusal message.
    """
    if not run_dir.exists():
        return None
    if not run_dir.is_dir():
        return f"{run_dir} is a file, not a run folder; choose another --out."
    entries = sorted(p.name for p in run_dir.iterdir())
    if not entries:
        return None
    if overwrite:
        for name in RUN_ARTIFACTS:
            path = run_dir / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.exists() or path.is_symlink():
                path.unlink()
        return None
    shown = ", ".join(entries[:6]) + (", ..." if len(entries) > 6 else "")
    return (
        f"the run folder {run_dir} is not empty ({shown}). Continue that run with --resume "
        "(resume=True), choose another --out, or replace it with --overwrite (overwrite=True)."
    )


def resume_changes(record: Mapping[str, Any], train: Mapping[str, Any], data: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """What differs between the recorded run and the resumed one.

    Returns:
        (safe, unsafe): lines ``key: old -> new``; the safe ones are :data:`SAFE_ON_RESUME`
        (``epochs`` only while the schedule does not depend on it, i.e. not ``cosine``).

    Example:
        >>> resume_changes({"train": {"lr": 1e-4, "epochs": 2}}, {"lr": 1e-3, "epochs": 3}, {})
        (['train.epochs: 2 -> 3'], ['train.lr: 0.0001 -> 0.001'])
    """
    safe: list[str] = []
    unsafe: list[str] = []
    old_train = record.get("train")
    if isinstance(old_train, Mapping):
        cosine = "cosine" in (old_train.get("scheduler"), train.get("scheduler"))
        for key in sorted(set(old_train) | set(train)):
            before, after = old_train.get(key), train.get(key)
            if before == after:
                continue
            line = f"train.{key}: {_shown(before)} -> {_shown(after)}"
            ok = key in SAFE_ON_RESUME and not (key == "epochs" and cosine)
            (safe if ok else unsafe).append(line)
    old_data = record.get("data")
    if isinstance(old_data, Mapping):
        for role in sorted(set(old_data) | set(data)):
            before, after = old_data.get(role), data.get(role)
            if before == after:
                continue
            if not isinstance(before, Mapping) or not isinstance(after, Mapping):
                unsafe.append(f"data.{role}: {_shown(before)} -> {_shown(after)}")
                continue
            for key in sorted(set(before) | set(after)):
                if before.get(key) != after.get(key):
                    unsafe.append(f"data.{role}.{key}: {_shown(before.get(key))} -> {_shown(after.get(key))}")
    return safe, unsafe


def _shown(value: Any) -> str:
    text = "(unset)" if value is None else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
