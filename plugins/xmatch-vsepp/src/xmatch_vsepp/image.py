"""VSE++ image encoders (Faghri, Fleet, Kiros, Fidler, "VSE++: Improving Visual-Semantic
Embeddings with Hard Negatives", BMVC 2018; code: fartashf/vsepp ``model.py``).

Both return one global slot, so the model's pooled vector is the image embedding. Both stop
before VSE++'s ``fc``, which is the model's image projection (``image_projection = true``;
:func:`xmatch_vsepp.init_like_original` gives it the original Xavier initialisation):

- ``vsepp-cnn`` (``EncoderImageFull``): pixels -> ImageNet CNN (a timm backbone, its
  classifier removed) -> l2norm. The model's projection is VSE++'s ``fc`` and the model
  l2-normalises its output, so the whole is ``l2norm(fc(l2norm(cnn(x))))`` as in the original.
- ``vsepp-precomp`` (``EncoderImagePrecomp``): a precomputed feature vector per image (the
  original's ``*_ims.npy``), not normalised; the projection is ``fc``, then l2norm. Region sets
  ``[B, R, F]`` are averaged over their real regions first (with ``R = 1`` nothing changes).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from xmatch.plugin import (
    EncoderOutput,
    ImageEncoder,
    PixelInputs,
    RegionFeaturesImageEncoder,
    RegionInputs,
    create_timm_model,
)


class VSEPPImageEncoder(ImageEncoder):
    """An ImageNet CNN from timm whose l2-normalised pooled output is the image feature.

    Preprocessing comes from the backbone's timm data config
    (``timm.data.resolve_data_config`` + ``create_transform``): in training mode a random
    resized crop and a horizontal flip (VSE++'s train transform, no colour jitter), in eval
    mode the config's resize + centre crop.

    Args:
        backbone: a timm model name (VSE++: ``"vgg19"``, 4096-d fc7 output, or
            ``"resnet152"``, 2048-d average pool).
        pretrained: load timm's ImageNet weights for ``backbone`` (timm's hub mechanism).
        weights: instead of ``pretrained``, a weights file in timm's key layout for ``backbone``,
            any weight source of :mod:`xmatch.io.hub` (a local ``.safetensors`` / ``.pth`` file,
            ``hf-hub:org/name/file.safetensors``, ...), fetched, checked and loaded as the timm
            encoders' ``weights=`` are (:func:`xmatch.plugin.load_backbone_weights`; a classifier in
            the file is dropped).
        finetune: train the CNN (VSE++ ``--finetune``); False freezes its parameters.
        train_augment: random crop + flip while the module is in training mode.

    Example:
        >>> enc = VSEPPImageEncoder("efficientnet_lite0")
        >>> enc(images=torch.randn(2, 3, 224, 224)).tokens.shape
        torch.Size([2, 1, 1280])
    """

    input_type = PixelInputs

    def __init__(
        self,
        backbone: str = "vgg19",
        pretrained: bool = False,
        weights: str | None = None,
        finetune: bool = False,
        train_augment: bool = True,
    ) -> None:
        super().__init__()
        from timm.data import create_transform, resolve_data_config

        # the shared loader: timm's hub, a file or a package, checked like every backbone's weights
        self.cnn = create_timm_model(backbone, pretrained=pretrained, weights=weights, classifier=False)
        self.backbone = backbone
        self.output_dim = int(getattr(self.cnn, "head_hidden_size", None) or self.cnn.num_features)
        self.finetune = finetune
        self.cnn.requires_grad_(finetune)
        self.data_config = resolve_data_config({}, model=self.cnn)
        self.eval_transform = create_transform(**self.data_config, is_training=False)
        self.train_transform = (
            create_transform(**self.data_config, is_training=True, color_jitter=None)
            if train_augment
            else self.eval_transform
        )

    def preprocess(self, images: Sequence[Any]) -> torch.Tensor:
        """PIL images -> ``[B, 3, H, W]`` with the backbone's transform (train or eval)."""
        from PIL import Image

        bad = [k for k, im in enumerate(images) if not isinstance(im, Image.Image)]
        if bad:
            raise TypeError(
                f"images {bad[:5]} are {type(images[bad[0]]).__name__}, not PIL images; pass PIL images or "
                "one preprocessed float tensor [B, 3, H, W]."
            )
        transform = self.train_transform if self.training else self.eval_transform
        return torch.stack([transform(im.convert("RGB")) for im in images])

    def forward(self, images: Sequence[Any] | torch.Tensor) -> EncoderOutput:
        if isinstance(images, torch.Tensor):
            if images.dim() != 4 or images.shape[1] != 3 or not images.is_floating_point():
                raise ValueError(
                    f"image tensors must be float [B, 3, H, W], already preprocessed, got {images.dtype} "
                    f"{tuple(images.shape)}; or pass PIL images and let the encoder preprocess them."
                )
            pixels = images
        else:
            if len(images) == 0:
                raise ValueError("no images to encode.")
            pixels = self.preprocess(images)
        weight = next(self.cnn.parameters())
        features = self.cnn(pixels.to(device=weight.device, dtype=weight.dtype))
        # VSE++ normalises the CNN output before its fc layer (the model's projection).
        return EncoderOutput.global_vector(F.normalize(features, dim=-1))


class VSEPPPrecompImageEncoder(RegionFeaturesImageEncoder):
    """Precomputed global features (VSE++'s ``*_precomp`` data): one vector per image.

    A region set ``[B, R, F]`` with its mask is averaged over the real regions; the original's
    global features are ``R = 1``. Boxes are accepted (``encode_images`` passes them) and unused.

    Args:
        feature_dim: feature width (4096 for the VGG fc7 features of the original data).

    Example:
        >>> enc = VSEPPPrecompImageEncoder(feature_dim=8)
        >>> enc(torch.rand(2, 1, 8), torch.zeros(2, 1, 4)).tokens.shape
        torch.Size([2, 1, 8])
    """

    def __init__(self, feature_dim: int = 4096) -> None:
        super().__init__(feature_dim)

    def forward(
        self, regions: torch.Tensor | RegionInputs, boxes: torch.Tensor | None = None, mask: torch.Tensor | None = None
    ) -> EncoderOutput:
        # padded rows are zeros, so they add nothing to the sum
        summed, mask = self.real_regions(regions, boxes, mask)
        return EncoderOutput.global_vector(summed.sum(dim=1) / mask.sum(dim=1, keepdim=True).to(summed.dtype))
