"""A timm model as a backbone: created with its weights
(:mod:`xmatch.components.image.backbone_weights`), reduced to its last spatial feature map, with the
preprocessing of its pretrained config.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from xmatch.components.image.backbone_weights import load_backbone_weights
from xmatch.io.safe_load import load_failure_reason, refuse_pickled_weights


def create_timm_model(
    backbone: str,
    *,
    pretrained: bool = False,
    weights: str | None = None,
    weights_by_position: bool = False,
    classifier: bool = True,
    output_stride: int | None = None,
) -> nn.Module:
    """A timm model with its weights from timm's hub, a local file or an installed package.

    Args:
        backbone: a timm model name (``timm.list_models()``, optionally with a pretrained tag),
            or timm's ``hf-hub:`` / ``local-dir:`` names.
        pretrained: timm's own pretrained weights (downloaded by timm; needs the network or
            timm's cache).
        weights: a weight source of :mod:`xmatch.io.hub` (a ``.safetensors`` / ``.pth`` file,
            ``package:<module>/<path>``, ``hf-hub:org/name/file.safetensors``) or
            ``package:<name>`` of :data:`PACKAGED_WEIGHTS` (see :func:`load_backbone_weights`).
        weights_by_position: map the file's tensors onto the model in order, checking every
            shape (for checkpoints of another implementation); packaged weights set it.
        classifier: keep the classification head (False: ``reset_classifier(0)``, and a file
            may then lack the head's tensors).
        output_stride: the feature map's stride (timm's ``output_stride``: the last stages are
            dilated instead of strided; the weights are the same); None keeps the model's own.

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
        raise ValueError(f"give either pretrained=True (timm's weights for {backbone}) or weights=..., not both.")
    if not backbone.startswith(("hf-hub:", "local-dir:")) and not timm.is_model(backbone):
        import difflib

        close = difflib.get_close_matches(backbone, timm.list_models(), n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"'{backbone}' is not a timm model.{hint} See timm.list_models().")
    if pretrained and backbone.startswith("local-dir:"):
        # timm picks model.safetensors first, else it would unpickle a pytorch_model.bin / .pth
        folder = backbone[len("local-dir:") :]
        convert = (
            "safetensors.torch.save_file(torch.load(FILE, weights_only=True), "
            f"'{Path(folder) / 'model.safetensors'}') for a FILE that holds a state dict of tensors."
        )
        refuse_pickled_weights(folder, ["model.safetensors"], f"the pretrained weights of {backbone}", convert)
    options = {} if output_stride is None else {"output_stride": output_stride}
    try:
        net = timm.create_model(backbone, pretrained=pretrained, **options)
    except TypeError as exc:
        if not options:
            raise
        raise ValueError(
            f"the timm model {backbone} does not take output_stride={output_stride} ({exc}); set output_stride=None "
            "(xmatch extract --output-stride none: the model's own stride), or use a CNN that can dilate its last "
            "stages (EfficientNet, ResNet...)."
        ) from None
    except (OSError, RuntimeError) as exc:
        if not pretrained:
            raise
        # from None: torch's and timm's messages for a refused pickle advise weights_only=False
        raise OSError(
            f"timm could not fetch the pretrained weights of {backbone} ({load_failure_reason(exc)}); offline, pass "
            "weights=<local .safetensors / .pth file> or a packaged set (weights='package:efficientnet-lite0')."
        ) from None
    if weights is not None:
        load_backbone_weights(net, weights, backbone=backbone, by_position=weights_by_position, headless=not classifier)
    if not classifier:
        net.reset_classifier(0)
    return net


def fold_batch_norms(net: nn.Module) -> int:
    """Fold every eval-mode batch norm into the convolution that feeds it, in place; the
    number folded.

    A frozen network's batch norm is an affine map per channel (``(x - mean) / sqrt(var + eps)
    * weight + bias`` with the running statistics), so it can be carried by the preceding
    convolution's weight and bias: the norm's own pass over the feature map (a fifth of
    EfficientNet-Lite0's time on a CPU) disappears and the output is the same up to float
    rounding (about 1e-5 of the map's largest value). A norm is folded only where ``torch.fx``
    shows that its input is a plain ``nn.Conv2d`` (or timm's ``Conv2dSame``) whose output
    goes nowhere else; the norm is replaced by what it applied after normalising (timm's
    ``BatchNormAct2d``: its dropout and activation; ``nn.BatchNorm2d``: nothing). A network
    ``torch.fx`` cannot trace, or one without such pairs (ViTs, ConvNeXt), is left as it is.
    Only for inference: the folded network no longer has batch norms to train.

    Example:
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).eval()
        >>> x = torch.randn(1, 3, 8, 8)
        >>> before = net(x)
        >>> fold_batch_norms(net), type(net[1]).__name__
        (1, 'Identity')
        >>> torch.allclose(net(x), before, atol=1e-5)
        True
    """
    import torch.fx

    convolutions = _plain_convolutions()
    norms = _plain_batch_norms()

    class _Tracer(torch.fx.Tracer):
        def is_leaf_module(self, module: nn.Module, name: str) -> bool:
            return isinstance(module, (nn.Conv2d, nn.BatchNorm2d)) or super().is_leaf_module(module, name)

    try:
        graph = _Tracer().trace(net)
    except Exception:  # noqa: BLE001 - any model fx cannot trace (data-dependent control flow...) runs unfolded
        return 0
    modules = dict(net.named_modules())
    folded = 0
    for node in graph.nodes:
        norm = modules.get(node.target) if node.op == "call_module" else None
        source = node.args[0] if node.args else None
        if type(norm) not in norms or norm.training or norm.running_var is None or not isinstance(source, torch.fx.Node):
            continue
        conv = modules.get(source.target) if source.op == "call_module" else None
        if type(conv) not in convolutions or len(source.users) != 1 or len(node.args) != 1 or node.kwargs:
            continue
        with torch.no_grad():
            scale = torch.rsqrt(norm.running_var + norm.eps)
            shift = -norm.running_mean * scale
            if norm.weight is not None:
                scale, shift = scale * norm.weight, shift * norm.weight + norm.bias
            bias = shift if conv.bias is None else conv.bias * scale + shift
            conv.weight = nn.Parameter(conv.weight * scale.view(-1, 1, 1, 1), requires_grad=False)
            conv.bias = nn.Parameter(bias, requires_grad=False)
        after = nn.Sequential(norm.drop, norm.act) if hasattr(norm, "act") else nn.Identity()
        parent, _, name = node.target.rpartition(".")
        setattr(modules[parent] if parent else net, name, after)
        folded += 1
    return folded


def _plain_convolutions() -> tuple[type, ...]:
    """Convolutions whose forward uses the stored weight as it is (not e.g. a weight-standardised
    ``ScaledStdConv2d``, where a folded scale would be normalised away)."""
    from timm.layers import Conv2dSame

    return nn.Conv2d, Conv2dSame


def _plain_batch_norms() -> tuple[type, ...]:
    """Batch norms that, in eval mode, apply their running statistics and affine map only
    (timm's ``BatchNormAct2d`` then its dropout and activation)."""
    from timm.layers import BatchNormAct2d

    return nn.BatchNorm2d, BatchNormAct2d


class TimmBackbone(nn.Module):
    """A timm model reduced to its last spatial feature map ``[B, C, h, w]``, with the
    preprocessing of its pretrained config.

    CNNs give the map of ``forward_features`` (for EfficientNet-Lite0: the 1280-channel head
    convolution, stride 32); models whose features are channels-last (``output_fmt ==
    "NHWC"``, e.g. Swin) are permuted; token models (ViT) give their last block's patch
    tokens laid out as a grid (``forward_intermediates``, with the final norm).

    Args:
        backbone, pretrained, weights, weights_by_position: as :func:`create_timm_model`.
        image_size: square input side (default: the pretrained config's ``input_size``).
        crop_pct: centre-crop fraction of the eval transform (default: the config's; 1.0
            keeps the whole of a square image).
        output_stride: the feature map's stride, as :func:`create_timm_model`'s.

    Example:
        >>> bb = TimmBackbone("efficientnet_lite0", weights="package:efficientnet-lite0")  # needs a photo and the packaged backbone  # doctest: +SKIP
        >>> bb(bb.preprocess([pil_image])).shape  # doctest: +SKIP
        torch.Size([1, 1280, 7, 7])
    """

    def __init__(
        self,
        backbone: str,
        *,
        pretrained: bool = False,
        weights: str | None = None,
        weights_by_position: bool = False,
        image_size: int | None = None,
        crop_pct: float | None = None,
        output_stride: int | None = None,
    ) -> None:
        super().__init__()
        import timm.data

        if image_size is not None and image_size < 16:
            raise ValueError(f"image_size must be at least 16 pixels, got {image_size}.")
        if crop_pct is not None and not 0 < crop_pct <= 1:
            raise ValueError(f"crop_pct must be in (0, 1], got {crop_pct}.")
        self.net = create_timm_model(
            backbone, pretrained=pretrained, weights=weights, weights_by_position=weights_by_position, classifier=False,
            output_stride=output_stride,
        )
        overrides: dict[str, Any] = {}
        if image_size is not None:
            overrides["input_size"] = (3, image_size, image_size)
        if crop_pct is not None:
            overrides["crop_pct"] = crop_pct
        self.data_config = timm.data.resolve_data_config(overrides, model=self.net)
        self.transform = timm.data.create_transform(**self.data_config)
        self.model_name = backbone
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
                "and an image_size the model accepts (None: its pretrained input size)."
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
    uint8 array. Anything else is a TypeError naming the position in the batch. A file (a path,
    or a picture opened but not yet decoded) larger than :data:`xmatch.io.pictures.MAX_PIXELS`
    is refused with an ``ImageTooLargeError`` before it is decoded."""
    from PIL import Image, UnidentifiedImageError

    from xmatch.io.pictures import ImageTooLargeError, check_pixels, is_undecoded

    if isinstance(image, Image.Image):
        if is_undecoded(image):
            check_pixels(image.size, f"image {index}")
        return image.convert("RGB")
    if isinstance(image, (str, os.PathLike)):
        path = Path(image)
        if not path.is_file():
            raise FileNotFoundError(f"image {index}: file {path} does not exist.")
        try:
            with Image.open(path) as im:
                check_pixels(im.size, f"image {index}: {path}")
                return im.convert("RGB")
        except ImageTooLargeError:
            raise
        except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as exc:
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
