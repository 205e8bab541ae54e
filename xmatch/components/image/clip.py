"""CLIP and SigLIP image towers (``transformers``' ``CLIPVisionModel`` / ``SiglipVisionModel``)
as xmatch image encoders: patch tokens with their boxes, and the tower's own pooled embedding.

Radford et al., "Learning Transferable Visual Models From Natural Language Supervision", ICML
2021 (CLIP); Zhai et al., "Sigmoid Loss for Language Image Pre-Training", ICCV 2023 (SigLIP);
Yao et al., "FILIP: Fine-grained Interactive Language-Image Pre-Training", ICLR 2022 (late
interaction over patch and word tokens).

One encoder serves three uses:

- **global slot** (position 0): exactly what ``CLIPModel.get_image_features`` /
  ``SiglipModel.get_image_features`` return (``pooler_output``), bit for bit, so
  ``Embeddings.pooled`` is that vector L2-normalised: the CLIP cosine with the ``global-cosine``
  pooler, and stage 1 of a search index.
- **patch tokens** (positions 1..): every patch through the same head as the pooled vector, so
  they live in the same joint space: for CLIP the last layer's patch states through
  ``post_layernorm`` and ``visual_projection`` (what the class token goes through); for SigLIP
  the post-layernorm patch states through the attention-pooling head applied to that patch
  alone (an attention over one key returns that key's value: ``out_proj(v_proj(x))``, then the
  head's residual MLP). Any token pooler (``MrSw``, ``MrAvgw``, ``Symm``) then scores FILIP-style.
- **boxes**: each patch's cell, ``x1, y1, x2, y2`` normalised to the picture it came from
  (the resize and centre crop of the preprocessing undone), zeros for the global slot.

Why the model must not project again. ``MatchingModel`` puts a projection and a reasoner after
every encoder and takes ``pooled`` from position 0 of their output. The zoo entries of these
towers set ``image_projection = false`` / ``text_projection = false`` (``embed_dim`` = the
towers' projection width) and ``identity`` reasoners, so position 0 reaches
``Embeddings.pooled`` untouched: a learned projection on top would re-project the tower's
embedding and break both the parity with ``get_image_features`` and the zero-shot use. The
towers' own projections are trained when the towers fine-tune (``finetune = true``).

The architecture is given by the arguments (a spec is data: it builds with random weights and
no network); pretrained weights come from the upstream ``model.safetensors`` of the hub
repository, loaded by ``xmatch.build(name, pretrained=True)`` (:meth:`upstream_names` maps its
tensors onto the encoder).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from xmatch.model.inputs import PixelInputs
from xmatch.model.interfaces import EncoderOutput, ImageEncoder

#: OpenAI CLIP's pixel statistics (transformers' OPENAI_CLIP_MEAN / _STD); SigLIP uses 0.5 / 0.5
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
SIGLIP_MEAN = (0.5, 0.5, 0.5)
SIGLIP_STD = (0.5, 0.5, 0.5)
#: the resize filters a tower's preprocessing may name (those of the hub's checkpoints)
RESAMPLE_FILTERS = ("bicubic", "bilinear")


def patch_grid(cells: int) -> torch.Tensor:
    """Boxes ``[cells * cells, 4]`` of a square patch grid in its own frame, row by row (the
    order of a ViT's patch tokens).

    Example:
        >>> patch_grid(2)[1]
        tensor([0.5000, 0.0000, 1.0000, 0.5000])
    """
    steps = torch.arange(cells, dtype=torch.float64) / cells
    y, x = torch.meshgrid(steps, steps, indexing="ij")
    boxes = torch.stack([x, y, x + 1 / cells, y + 1 / cells], dim=-1).reshape(-1, 4)
    return boxes.clamp(0, 1).float()


class _TowerImageEncoder(ImageEncoder):
    """What the CLIP and SigLIP image towers share: preprocessing, boxes, freezing, the
    upstream checkpoint's names. Subclasses build ``self.vision_model`` and implement
    :meth:`_embed` (pixels -> pooled ``[B, D]``, patch tokens ``[B, P, D]``)."""

    input_type = PixelInputs
    #: prefixes of the upstream checkpoint's keys that belong to this encoder, kept as they are
    upstream_prefixes: tuple[str, ...] = ("vision_model.",)
    #: whether the preprocessing centre-crops (CLIP) or squashes the picture to a square (SigLIP)
    centre_crop: bool = True
    #: the resize filter of the hub's image processor (``bicubic``; SigLIP 2's is ``bilinear``)
    resample: str = "bicubic"

    def __init__(self, image_size: int, patch_size: int, mean: Sequence[float], std: Sequence[float],
                 finetune: bool) -> None:
        super().__init__()
        if not 0 < patch_size <= image_size:
            raise ValueError(f"image_size={image_size} must be at least patch_size={patch_size} (both positive).")
        self.image_size, self.patch_size, self.finetune = image_size, patch_size, finetune
        self.mean, self.std = tuple(mean), tuple(std)
        # the ViT's patch convolution keeps image_size // patch_size cells a side and drops the
        # rest (SigLIP So400m/14 at 384 px: 27 cells of 14 px cover 378 of the 384 pixels)
        cells = image_size // patch_size
        self.register_buffer("cell_boxes", patch_grid(cells) * (cells * patch_size / image_size), persistent=False)

    def _finish_init(self) -> None:
        self.requires_grad_(self.finetune)

    def upstream_names(self, keys: set[str]) -> dict[str, str | None]:
        """``{key of an upstream checkpoint: key of this encoder}`` for the tensors of
        ``keys`` that are this encoder's: those of transformers' ``CLIPModel`` /
        ``SiglipModel`` ``model.safetensors`` under :attr:`upstream_prefixes` keep their names;
        the position-id buffers some files carry map to None (nothing to load: they are
        ``arange``).

        Example:
            >>> enc = ClipImageEncoder(width=32, layers=1, heads=2, ff_dim=64, patch_size=16, image_size=32, projection_dim=8)
            >>> enc.upstream_names({"vision_model.post_layernorm.weight", "text_model.final_layer_norm.weight"})
            {'vision_model.post_layernorm.weight': 'vision_model.post_layernorm.weight'}
        """
        return {k: (None if k.endswith(".position_ids") else k) for k in sorted(keys) if k.startswith(self.upstream_prefixes)}

    def preprocess(self, images: Sequence[Any]) -> torch.Tensor:
        """Pictures (PIL images, paths, uint8 arrays) -> ``[B, 3, S, S]`` pixels, as the hub's
        image processor makes them: CLIP resizes the shorter side to ``image_size`` (bicubic)
        and centre-crops; SigLIP resizes to ``image_size`` square (bicubic; SigLIP 2:
        ``resample = "bilinear"``); both rescale to [0, 1] and normalise."""
        return self._pixels(self._opened(images))

    def _opened(self, images: Sequence[Any]) -> list[Any]:
        """The pictures as RGB PIL images (a file is opened once, its size checked first)."""
        from xmatch.components.image.backbone import to_pil

        return [to_pil(im, i) for i, im in enumerate(self._pictures(images))]

    def _pixels(self, pictures: list[Any]) -> torch.Tensor:
        from transformers import CLIPImageProcessor
        from transformers.image_utils import PILImageResampling

        size = self.image_size
        options: dict[str, Any] = {"image_mean": list(self.mean), "image_std": list(self.std),
                                   "resample": PILImageResampling[self.resample.upper()]}
        if self.centre_crop:
            options.update(size={"shortest_edge": size}, crop_size={"height": size, "width": size})
        else:
            options.update(size={"height": size, "width": size}, do_center_crop=False)
        return CLIPImageProcessor(**options)(images=pictures, return_tensors="pt")["pixel_values"]

    @staticmethod
    def _pictures(images: Sequence[Any]) -> list[Any]:
        if isinstance(images, (str, bytes)) or not isinstance(images, Sequence):
            raise TypeError(
                f"images must be a list of PIL images, paths or uint8 arrays, got {type(images).__name__}; "
                "wrap a single picture in a list."
            )
        if len(images) == 0:
            raise ValueError("images is empty; give at least one picture.")
        return list(images)

    def picture_boxes(self, width: int, height: int) -> torch.Tensor:
        """The patches' boxes ``[patches, 4]`` normalised to a picture of ``width x height``
        pixels: the cells of the ``image_size`` square mapped back through the preprocessing
        (for CLIP: the shorter side resized to ``image_size`` with the longer one rounded down,
        then a centre crop at ``int((side - image_size) / 2)``, as transformers computes them).

        Example:
            >>> enc = ClipImageEncoder(width=32, layers=1, heads=2, ff_dim=64, patch_size=16, image_size=32, projection_dim=8)
            >>> enc.picture_boxes(64, 32)[0]  # a 2:1 picture: the crop is its middle half
            tensor([0.2500, 0.0000, 0.5000, 0.5000])
        """
        if width < 1 or height < 1:
            raise ValueError(f"width and height must be positive pixel counts, got {width} x {height}.")
        cells = self.cell_boxes.cpu().double()
        if not self.centre_crop:
            return cells.float()
        size = self.image_size
        short, long = (width, height) if width <= height else (height, width)
        resized_long = int(size * long / short)
        new_w, new_h = (size, resized_long) if width <= height else (resized_long, size)
        left, top = int((new_w - size) / 2.0), int((new_h - size) / 2.0)
        x = (left + cells[:, 0::2] * size) / new_w
        y = (top + cells[:, 1::2] * size) / new_h
        return torch.stack([x[:, 0], y[:, 0], x[:, 1], y[:, 1]], dim=1).clamp(0, 1).float()

    def _embed(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # pragma: no cover - interface
        """Preprocessed pixels -> ``(pooled [B, D], patch tokens [B, P, D])``; each tower
        (CLIP, SigLIP) implements it."""
        raise NotImplementedError

    def forward(self, images: Sequence[Any] | torch.Tensor) -> EncoderOutput:
        if isinstance(images, torch.Tensor):
            pixels, sizes = images, None  # preprocessed: the boxes stay in the square's frame
        else:
            pictures = self._opened(images)
            pixels, sizes = self._pixels(pictures), [p.size for p in pictures]
        if pixels.dim() != 4 or pixels.shape[1] != 3 or tuple(pixels.shape[2:]) != (self.image_size,) * 2:
            raise ValueError(
                f"a pixel tensor must be float [B, 3, {self.image_size}, {self.image_size}] made by encoder.preprocess, "
                f"got {pixels.dtype} {tuple(pixels.shape)}."
            )
        pixels = pixels.to(device=self.cell_boxes.device, dtype=next(self.parameters()).dtype)
        with torch.set_grad_enabled(self.finetune and torch.is_grad_enabled()):
            pooled, patches = self._embed(pixels)
        tokens = torch.cat([pooled.unsqueeze(1), patches], dim=1)
        n, width = tokens.shape[:2]
        mask = torch.ones(n, width, dtype=torch.bool, device=tokens.device)
        content = mask.clone()
        content[:, 0] = False
        if sizes is None:
            cells = self.cell_boxes.expand(n, -1, -1)
        else:
            cells = torch.stack([self.picture_boxes(*size) for size in sizes]).to(tokens.device)
        boxes = torch.cat([cells.new_zeros(n, 1, 4), cells], dim=1)
        return EncoderOutput(tokens, mask, content, global_slot=True, boxes=boxes)


class ClipImageEncoder(_TowerImageEncoder):
    """CLIP's image tower (``CLIPVisionModel`` + ``visual_projection``): the projected class
    token as the global slot, every patch token through the same layer norm and projection,
    with its box. Defaults: ViT-B/32 at 224 pixels (``openai/clip-vit-base-patch32``).

    Args:
        width, layers, heads, ff_dim: the ViT's hidden size, depth, attention heads, MLP width.
        patch_size, image_size: patch side and square input side, in pixels.
        projection_dim: width of the joint embedding (``visual_projection``).
        activation: the MLP's activation (``quick_gelu`` for OpenAI's CLIP).
        layer_norm_eps: the layer norms' epsilon.
        finetune: train the tower (default); False freezes it.

    Example:
        >>> from PIL import Image
        >>> enc = ClipImageEncoder(width=32, layers=1, heads=2, ff_dim=64, patch_size=16, image_size=32, projection_dim=8)
        >>> out = enc(images=[Image.new("RGB", (64, 32))])
        >>> out.tokens.shape, out.boxes[0, 1].tolist()  # 1 global slot + 2 x 2 patches of the middle square
        (torch.Size([1, 5, 8]), [0.25, 0.0, 0.5, 0.5])
    """

    upstream_prefixes = ("vision_model.", "visual_projection.")
    centre_crop = True

    def __init__(
        self,
        width: int = 768,
        layers: int = 12,
        heads: int = 12,
        ff_dim: int = 3072,
        patch_size: int = 32,
        image_size: int = 224,
        projection_dim: int = 512,
        activation: str = "quick_gelu",
        layer_norm_eps: float = 1e-5,
        finetune: bool = True,
    ) -> None:
        super().__init__(image_size, patch_size, CLIP_MEAN, CLIP_STD, finetune)
        from transformers import CLIPVisionConfig, CLIPVisionModel

        config = CLIPVisionConfig(
            hidden_size=width, num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=ff_dim,
            patch_size=patch_size, image_size=image_size, projection_dim=projection_dim, hidden_act=activation,
            layer_norm_eps=layer_norm_eps,
        )
        _check_heads(width, heads, "image")
        self.vision_model = CLIPVisionModel(config)
        self.visual_projection = nn.Linear(width, projection_dim, bias=False)
        self.output_dim = projection_dim
        self._finish_init()

    def _embed(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.vision_model(pixel_values=pixels)
        # CLIPModel.get_image_features: visual_projection(post_layernorm(class token))
        pooled = self.visual_projection(out.pooler_output)
        patches = self.visual_projection(self.vision_model.post_layernorm(out.last_hidden_state[:, 1:]))
        return pooled, patches


class SiglipImageEncoder(_TowerImageEncoder):
    """SigLIP's image tower (``SiglipVisionModel`` with its attention-pooling head): the head's
    pooled output as the global slot, every patch through the head alone, with its box.
    Defaults: B/16 at 224 pixels (``google/siglip-base-patch16-224``).

    Args:
        width, layers, heads, ff_dim: the ViT's hidden size, depth, attention heads, MLP width
            (the pooled embedding is ``width`` wide: SigLIP has no separate projection).
        patch_size, image_size: patch side and square input side, in pixels.
        activation: the MLP's activation (``gelu_pytorch_tanh`` for SigLIP).
        layer_norm_eps: the layer norms' epsilon.
        resample: the filter that resizes the pictures, as the checkpoint's image processor
            does: ``bicubic`` (SigLIP) or ``bilinear`` (the SigLIP 2 checkpoints).
        finetune: train the tower (default); False freezes it.

    Example:
        >>> from PIL import Image
        >>> enc = SiglipImageEncoder(width=32, layers=1, heads=2, ff_dim=64, patch_size=16, image_size=32)
        >>> enc(images=[Image.new("RGB", (64, 48))]).tokens.shape
        torch.Size([1, 5, 32])
    """

    upstream_prefixes = ("vision_model.",)
    centre_crop = False

    def __init__(
        self,
        width: int = 768,
        layers: int = 12,
        heads: int = 12,
        ff_dim: int = 3072,
        patch_size: int = 16,
        image_size: int = 224,
        activation: str = "gelu_pytorch_tanh",
        layer_norm_eps: float = 1e-6,
        resample: str = "bicubic",
        finetune: bool = True,
    ) -> None:
        super().__init__(image_size, patch_size, SIGLIP_MEAN, SIGLIP_STD, finetune)
        from transformers import SiglipVisionConfig, SiglipVisionModel

        if resample not in RESAMPLE_FILTERS:
            raise ValueError(
                f"image encoder 'siglip-vision': resample={resample!r} is not one of {list(RESAMPLE_FILTERS)}; "
                "give the filter of the checkpoint's image processor (preprocessor_config.json: 3 bicubic, 2 bilinear)."
            )
        self.resample = resample

        _check_heads(width, heads, "image")
        config = SiglipVisionConfig(
            hidden_size=width, num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=ff_dim,
            patch_size=patch_size, image_size=image_size, hidden_act=activation, layer_norm_eps=layer_norm_eps,
        )
        self.vision_model = SiglipVisionModel(config)
        self.output_dim = width
        self._finish_init()

    def _embed(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.vision_model(pixel_values=pixels)
        return out.pooler_output, head_per_token(self.vision_model.head, out.last_hidden_state)


def head_per_token(head: nn.Module, states: torch.Tensor) -> torch.Tensor:
    """SigLIP's attention-pooling head applied to each of ``states`` ``[B, T, D]`` alone:
    what ``head`` returns for a sequence of that one token (an attention over one key returns
    its value, ``out_proj(v_proj(x))``), then the head's residual MLP.

    Example:
        >>> from transformers import SiglipVisionConfig
        >>> from transformers.models.siglip.modeling_siglip import SiglipMultiheadAttentionPoolingHead
        >>> head = SiglipMultiheadAttentionPoolingHead(SiglipVisionConfig(hidden_size=8, num_attention_heads=2, intermediate_size=16))
        >>> x = torch.randn(3, 1, 8)
        >>> torch.allclose(head_per_token(head, x)[:, 0], head(x), atol=1e-6)
        True
    """
    attention = head.attention
    width = states.shape[-1]
    values = F.linear(states, attention.in_proj_weight[2 * width :], attention.in_proj_bias[2 * width :])
    tokens = attention.out_proj(values)
    return tokens + head.mlp(head.layernorm(tokens))


def _check_heads(width: int, heads: int, side: str) -> None:
    if width % heads:
        raise ValueError(f"{side} tower: width={width} is not divisible by heads={heads}; choose heads that divide it.")

