"""Which registered dataset layouts a folder looks like, so that a command run without
``--dataset`` can pick the right one or name the candidates.

A layout is recognised by the files its reader needs first; a plugin's dataset takes part by
giving its builder a ``looks_like(root: Path) -> bool`` attribute.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from xmatch.core.registry import get_registry


def _teran(root: Path) -> bool:
    homes = [root, root / "features_36"]
    has_features = any((h / "bu_att").is_dir() for h in homes)
    captions = [root, root / "annotations"]
    has_captions = any(
        any(c.glob(pattern)) for c in captions if c.is_dir() for pattern in ("dataset_*.json", "coco_*_ids.npy")
    )
    return has_features or has_captions


def _precomp(root: Path) -> bool:
    return any(root.glob("*_ims.npy")) and any(root.glob("*_caps.txt"))


def _image_captions(root: Path) -> bool:
    if root.is_file():
        return root.suffix in (".csv", ".jsonl")
    return any(root.glob("*.csv")) or any(root.glob("*.jsonl"))


def _webdataset(root: Path) -> bool:
    from xmatch.data.webdataset import SHARD_SUFFIX, is_shard_spec

    if not root.exists():
        return is_shard_spec(root)
    if root.is_file():
        return root.suffix == SHARD_SUFFIX
    return any(root.glob(f"*{SHARD_SUFFIX}")) or any(root.glob(f"*/*{SHARD_SUFFIX}"))


def _scenes(root: Path) -> bool:
    return any(p.is_dir() for p in root.glob("scenes-*"))


BUILT_IN: dict[str, Callable[[Path], bool]] = {
    "teran": _teran,
    "scan-precomp": _precomp,
    "image-captions": _image_captions,
    "webdataset": _webdataset,
    "scenes": _scenes,
}


def guess_layouts(root: str | Path) -> list[str]:
    """The registered layouts whose files ``root`` holds (in registry order).

    Example:
        >>> guess_layouts("/no/such/folder")
        []
    """
    from xmatch.data.webdataset import is_shard_spec

    root = Path(root).expanduser()
    if not root.exists() and not is_shard_spec(root):  # a shard pattern names files, not itself
        return []
    registry = get_registry("datasets")
    found = []
    for name in registry.names():
        test = BUILT_IN.get(name) or getattr(registry.get(name), "looks_like", None)
        try:
            if test is not None and test(root):
                found.append(name)
        except OSError:  # an unreadable folder matches nothing
            continue
    return found


def choose_layout(root: str | Path | None) -> str:
    """The one layout ``root`` looks like, for a command given no ``--dataset``.

    Raises:
        ValueError: no folder, no layout or several layouts recognised (the message lists them
            and the registered ones).
    """
    names = ", ".join(get_registry("datasets").names())
    if root is None:
        raise ValueError(f"pass --data FOLDER and --dataset LAYOUT (one of {names}), or --dataset scenes for the built-in benchmark.")
    found = guess_layouts(root)
    if len(found) == 1:
        return found[0]
    if not Path(root).expanduser().exists():
        raise ValueError(f"the data folder {root} does not exist.")
    if not found:
        raise ValueError(
            f"{root} does not look like any registered dataset layout ({names}); pass --dataset LAYOUT "
            "(see docs/data.md for what each layout expects)."
        )
    raise ValueError(f"{root} looks like several dataset layouts ({', '.join(found)}); pass --dataset with one of them.")
