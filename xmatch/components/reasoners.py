"""Reasoning stacks that contextualise a set: the papers' transformer encoder, and identity.

TERN/TERAN (Messina et al., ICPR 2020 / ACM TOMM 2021) use post-norm transformer encoder
layers with ReLU, 4 heads, feed-forward width 2048 and dropout 0.1. The optional relative
box geometry follows the pairwise box features of Relation Networks for Object Detection
(Hu et al., CVPR 2018), turned into an additive attention bias per head as in
geometry-aware transformers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from xmatch.model.interfaces import Reasoner

GEOMETRIES = ("none", "relative")
#: smallest box side (in image units) the log ratios and scaled offsets divide by: a real
#: region is never thinner than a thousandth of the picture, and the features stay finite
MIN_BOX_SIDE = 1e-3
#: pairwise features per position pair (see :func:`relative_box_features`)
BOX_PAIR_FEATURES = 7


def relative_box_features(boxes: torch.Tensor) -> torch.Tensor:
    """Pairwise geometry of every two boxes, seen from the first (query) box.

    For query box ``i`` and key box ``j`` (``x1, y1, x2, y2`` normalised to the picture): the
    centre offsets ``dx = cx_j - cx_i``, ``dy = cy_j - cy_i``; the same offsets in units of
    the query box's width and height, squashed by ``sign(v) * log(1 + |v|)``;
    ``log(w_j / w_i)``, ``log(h_j / h_i)``; and their IoU. The offsets keep their sign (Hu et
    al. drop it), since "left of" and "right of" differ only by it.

    Args:
        boxes: ``[B, N, 4]`` boxes.

    Returns:
        ``[B, N, N, 7]`` float32 features, ``[b, i, j]`` describing box ``j`` from box ``i``.

    Example:
        >>> f = relative_box_features(torch.tensor([[[0.0, 0.0, 0.2, 0.2], [0.6, 0.0, 0.8, 0.2]]]))
        >>> f[0, 0, 1, :2].tolist(), f[0, 1, 0, 0].item() < 0  # box 1 lies 0.6 right of box 0
        ([0.6000000238418579, 0.0], True)
    """
    boxes = boxes.float()
    x1, y1, x2, y2 = boxes.unbind(-1)
    w = (x2 - x1).clamp_min(MIN_BOX_SIDE)
    h = (y2 - y1).clamp_min(MIN_BOX_SIDE)
    cx, cy = (x1 + x2) / 2, (y1 + y2) / 2
    dx = cx[:, None, :] - cx[:, :, None]
    dy = cy[:, None, :] - cy[:, :, None]
    scaled_dx, scaled_dy = dx / w[:, :, None], dy / h[:, :, None]
    log_w = w.log()[:, None, :] - w.log()[:, :, None]
    log_h = h.log()[:, None, :] - h.log()[:, :, None]
    inter = _intersections(x1, y1, x2, y2)
    area = w * h
    iou = inter / (area[:, :, None] + area[:, None, :] - inter)
    return torch.stack(
        (dx, dy, scaled_dx.sign() * scaled_dx.abs().log1p(), scaled_dy.sign() * scaled_dy.abs().log1p(), log_w, log_h, iou),
        dim=-1,
    )


#: what :func:`edge_features` gives for each pair of boxes
EDGE_FEATURES = 6


def _intersections(x1: torch.Tensor, y1: torch.Tensor, x2: torch.Tensor, y2: torch.Tensor) -> torch.Tensor:
    """``[B, N]`` box coordinates -> ``[B, N, N]`` areas of the pairwise intersections."""
    inter_w = (torch.minimum(x2[:, :, None], x2[:, None, :]) - torch.maximum(x1[:, :, None], x1[:, None, :])).clamp_min(0)
    inter_h = (torch.minimum(y2[:, :, None], y2[:, None, :]) - torch.maximum(y1[:, :, None], y1[:, None, :])).clamp_min(0)
    return inter_w * inter_h


def edge_features(boxes: torch.Tensor) -> torch.Tensor:
    """What "resting on", "next to" and "inside" are made of, which centre offsets and size
    ratios (:func:`relative_box_features`) leave to be computed.

    For query box ``i`` and key box ``j``: the gaps between facing edges (``x1_j - x2_i``,
    ``x1_i - x2_j``, ``y1_j - y2_i``, ``y1_i - y2_j``: negative where the boxes overlap along
    that axis, near zero where they touch) and the share of each box inside the other
    (intersection over ``i``'s area, over ``j``'s).

    Args:
        boxes: ``[B, N, 4]`` boxes (``x1, y1, x2, y2`` normalised to the picture).

    Returns:
        ``[B, N, N, 6]`` float32 features, ``[b, i, j]`` describing box ``j`` from box ``i``.

    Example:
        >>> f = edge_features(torch.tensor([[[0.0, 0.0, 0.2, 0.2], [0.0, 0.2, 0.2, 0.4]]]))
        >>> [round(v, 3) for v in f[0, 0, 1].tolist()]  # box 1 rests under box 0, touching
        [-0.2, -0.2, 0.0, -0.4, 0.0, 0.0]
    """
    x1, y1, x2, y2 = boxes.float().unbind(-1)
    gaps = (x1[:, None, :] - x2[:, :, None], x1[:, :, None] - x2[:, None, :],
            y1[:, None, :] - y2[:, :, None], y1[:, :, None] - y2[:, None, :])
    area = ((x2 - x1) * (y2 - y1)).clamp_min(1e-6)
    inter = _intersections(x1, y1, x2, y2)
    return torch.stack((*gaps, inter / area[:, :, None], inter / area[:, None, :]), dim=-1)


class RelativeGeometryBias(nn.Module):
    """Maps the pairwise box features to one additive attention bias per layer and head.

    A two-layer MLP (``7 -> hidden -> layers * heads``, ReLU) reads
    :func:`relative_box_features`; a pair where either position has no box (a global slot,
    padding: a zero box or a False mask) gets a zero bias. The output layer starts at zero, so
    a reasoner that gains the option computes exactly what it did without it until training
    moves the bias (fine-tuning a converted checkpoint starts from its scores).

    Args:
        layers: reasoner layers (one bias per layer).
        heads: attention heads per layer.
        hidden: width of the MLP's hidden layer.

    Example:
        >>> bias = RelativeGeometryBias(layers=2, heads=4)
        >>> bias(torch.rand(3, 5, 4), torch.ones(3, 5, dtype=torch.bool), torch.float32).shape
        torch.Size([2, 12, 5, 5])
    """

    def __init__(self, layers: int, heads: int, hidden: int = 64) -> None:
        super().__init__()
        if hidden < 1:
            raise ValueError(f"transformer reasoner: geometry_dim must be >= 1, got {hidden}.")
        self.layers, self.heads = layers, heads
        self.net = nn.Sequential(nn.Linear(BOX_PAIR_FEATURES, hidden), nn.ReLU(), nn.Linear(hidden, layers * heads))
        nn.init.zeros_(self.net[2].weight)
        nn.init.zeros_(self.net[2].bias)

    def forward(self, boxes: torch.Tensor, mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """``boxes [B, N, 4]``, ``mask [B, N]`` -> ``[layers, B * heads, N, N]`` biases in
        ``dtype``, laid out as ``torch.nn.MultiheadAttention``'s 3-D ``attn_mask``."""
        b, n = mask.shape
        has_box = mask & (boxes != 0).any(-1)
        pairs = (has_box[:, :, None] & has_box[:, None, :]).unsqueeze(-1)
        weight = self.net[0].weight
        bias = self.net(relative_box_features(boxes).to(weight.dtype)) * pairs
        bias = bias.view(b, n, n, self.layers, self.heads).permute(3, 0, 4, 1, 2)
        return bias.reshape(self.layers, b * self.heads, n, n).to(dtype)


class TransformerReasoner(Reasoner):
    """A stack of post-norm transformer encoder layers over a padded set.

    Each layer is ``x = LN1(x + Drop(SA(x)))``, ``x = LN2(x + Drop(W2 Drop(ReLU(W1 x))))``
    (``torch.nn.TransformerEncoderLayer``, LN eps 1e-5); padded positions are excluded from
    attention through the key padding mask; there is no final LayerNorm. In training without
    dropout the per-position products run on the real positions only (the same results there,
    zeros on the padding); with dropout and in evaluation torch's layers run as they are.

    With ``geometry = "relative"`` the attention logits of every layer and head also get a
    bias computed from the two positions' boxes (:class:`RelativeGeometryBias`), so the set
    can read spatial relations (left of, above, inside). The model then hands the reasoner the
    image encoder's boxes (``uses_boxes``); without boxes (a text side, an encoder that keeps
    none) the reasoner computes exactly what ``geometry = "none"`` computes with its weights.

    Args:
        dim: model width (set by the model builder: the joint embedding size).
        layers: number of layers.
        heads: attention heads (``dim`` must be divisible by it).
        ff_dim: feed-forward width (2048 in the papers, whatever ``dim`` is).
        dropout: dropout on attention weights and both residual branches.
        norm_first: pre-norm layers instead of the papers' post-norm.
        geometry: ``"none"`` (the papers' reasoner, no extra parameters) or ``"relative"``
            (pairwise box geometry as an attention bias per layer and head).
        geometry_dim: hidden width of the geometry MLP (``"relative"`` only).

    Example:
        >>> r = TransformerReasoner(dim=32, layers=2, heads=4)
        >>> r(torch.randn(2, 5, 32), torch.ones(2, 5, dtype=torch.bool)).shape
        torch.Size([2, 5, 32])
        >>> g = TransformerReasoner(dim=32, layers=2, heads=4, geometry="relative")
        >>> g.uses_boxes, g(torch.randn(2, 5, 32), torch.ones(2, 5, dtype=torch.bool), boxes=torch.rand(2, 5, 4)).shape
        (True, torch.Size([2, 5, 32]))
    """

    def __init__(
        self,
        dim: int,
        layers: int = 2,
        heads: int = 4,
        ff_dim: int = 2048,
        dropout: float = 0.1,
        norm_first: bool = False,
        geometry: str = "none",
        geometry_dim: int = 64,
    ) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"transformer reasoner: dim {dim} is not divisible by heads {heads}.")
        if layers < 0:
            raise ValueError(f"transformer reasoner: layers must be >= 0, got {layers}.")
        if geometry not in GEOMETRIES:
            raise ValueError(
                f"transformer reasoner: unknown geometry {geometry!r}; use one of {', '.join(map(repr, GEOMETRIES))}."
            )
        self.dim = dim
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(
                d_model=dim,
                nhead=heads,
                dim_feedforward=ff_dim,
                dropout=dropout,
                activation="relu",
                batch_first=True,
                norm_first=norm_first,
            )
            for _ in range(layers)
        )
        self.geometry = geometry
        # "none" registers no module, so the papers' state-dict keys stay exactly as they were
        self.geometry_bias = RelativeGeometryBias(layers, heads, geometry_dim) if geometry == "relative" else None
        self.uses_boxes = self.geometry_bias is not None

    def forward(self, x: torch.Tensor, mask: torch.Tensor, boxes: torch.Tensor | None = None) -> torch.Tensor:
        """Contextualise ``x [B, N, D]`` over the real positions of ``mask [B, N]``; ``boxes
        [B, N, 4]`` (normalised ``x1, y1, x2, y2``, zeros where there is no box) are read only
        with ``geometry = "relative"``."""
        padding = ~mask
        if self.geometry_bias is None or boxes is None:
            if self.training and not self._dropout_active():
                return _real_positions_forward(self.layers, x, mask)
            for layer in self.layers:
                x = layer(x, src_key_padding_mask=padding)
            return x
        biases = self.geometry_bias(boxes, mask, x.dtype)
        if self.training and not self._dropout_active():
            return _real_positions_forward(self.layers, x, mask, biases)
        # torch wants both masks of one type: the padding becomes -inf in the logits' dtype
        padding = torch.zeros_like(padding, dtype=x.dtype).masked_fill_(padding, float("-inf"))
        for layer, bias in zip(self.layers, biases):
            x = _biased_layer(layer, x, bias, padding)
        return x

    def _dropout_active(self) -> bool:
        return any(
            p > 0
            for layer in self.layers
            for p in (layer.dropout.p, layer.dropout1.p, layer.dropout2.p, layer.self_attn.dropout)
        )


def _real_positions_forward(
    layers: nn.ModuleList, x: torch.Tensor, mask: torch.Tensor, biases: torch.Tensor | None = None
) -> torch.Tensor:
    """The layers' training forward without dropout, computed on the real positions only
    (with ``biases [layers, B * heads, T, T]``, each layer's attention bias, as
    :func:`_biased_layer` adds it).

    ``nn.TransformerEncoderLayer`` computes every per-position product (the packed input
    projection, the output projection, the feed-forward) on the padding too, and its
    batch-first attention copies the batch into sequence-first order and back. Half of a
    batch of captions is padding, so a text reasoner spent half its training arithmetic on
    it. Here the per-position work runs on the ``[N_real, D]`` rows and only the attention
    sees the padded ``[B, heads, T, head_dim]`` layout, with the key padding as its mask. The
    real positions get the layer's own result (the same kernels on the same rows: equal to
    its output up to the order of float sums, tests/test_reasoner_real_positions.py); padded positions are
    zero, as the layer's evaluation fast path leaves them.
    """
    b, t, d = x.shape
    rows = None if bool(mask.all()) else mask.nonzero(as_tuple=True)
    h = x.reshape(b * t, d) if rows is None else x[rows]
    keys = None if rows is None else mask[:, None, None, :]
    for n, layer in enumerate(layers):
        attn = layer.self_attn
        heads = attn.num_heads
        if biases is not None:
            # a float mask is added to the logits: the layer's bias, and -inf at the padded keys
            bias = biases[n].view(b, heads, t, t)
            keys = bias if rows is None else bias.masked_fill(~mask[:, None, None, :], float("-inf"))
        qkv = F.linear(layer.norm1(h) if layer.norm_first else h, attn.in_proj_weight, attn.in_proj_bias)
        padded = qkv.view(b, t, 3 * d) if rows is None else qkv.new_zeros(b, t, 3 * d).index_put(rows, qkv)
        q, k, v = padded.view(b, t, 3, heads, d // heads).permute(2, 0, 3, 1, 4).unbind(0)
        logits_mask = keys.to(q.dtype) if keys is not None and keys.is_floating_point() else keys  # autocast
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=logits_mask).transpose(1, 2)
        out = out.reshape(b * t, d) if rows is None else out[rows].reshape(-1, d)
        out = F.linear(out, attn.out_proj.weight, attn.out_proj.bias)
        if layer.norm_first:
            h = h + out
            h = h + layer.linear2(layer.activation(layer.linear1(layer.norm2(h))))
        else:
            h = layer.norm1(h + out)
            h = layer.norm2(h + layer.linear2(layer.activation(layer.linear1(h))))
    return h.view(b, t, -1) if rows is None else h.new_zeros(b, t, h.shape[-1]).index_put(rows, h)


def _biased_layer(
    layer: nn.TransformerEncoderLayer, x: torch.Tensor, bias: torch.Tensor, padding: torch.Tensor
) -> torch.Tensor:
    """``layer(x, src_mask=bias, src_key_padding_mask=padding)`` as its slow path computes it.

    Calling the layer would be wrong in eval mode without gradients: its fused fast path turns
    a float ``src_mask`` into a boolean one (every non-zero bias masks its key; pytorch issue
    #118628), which drops the geometry and gives NaN rows. ``MultiheadAttention`` itself
    declines its fast path for float masks, so the same weights give the same result in
    training and evaluation.
    """

    def attend(h: torch.Tensor) -> torch.Tensor:
        out = layer.self_attn(h, h, h, attn_mask=bias, key_padding_mask=padding, need_weights=False)[0]
        return layer.dropout1(out)

    def feed_forward(h: torch.Tensor) -> torch.Tensor:
        return layer.dropout2(layer.linear2(layer.dropout(layer.activation(layer.linear1(h)))))

    if layer.norm_first:
        x = x + attend(layer.norm1(x))
        return x + feed_forward(layer.norm2(x))
    x = layer.norm1(x + attend(x))
    return layer.norm2(x + feed_forward(x))


class IdentityReasoner(Reasoner):
    """No reasoning: the projected set is returned unchanged.

    Example:
        >>> IdentityReasoner(dim=8)(torch.ones(1, 2, 8), torch.ones(1, 2, dtype=torch.bool)).sum()
        tensor(16.)
    """

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return x
