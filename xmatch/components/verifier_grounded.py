"""The grounded verifier: each word of the caption is grounded in the image's regions through
the model's own region-word similarities, then a small transformer reads the caption with
where each word's referent lies.

A late-interaction pooler (MrSw, ...) sums how well each word finds *some* region; it never
asks whether the regions the words found stand in the relation the caption states, or whether
the colour and the noun of one phrase found the same object. Grounding makes that a question
about the caption alone: "circle" and "square" now carry their referents' boxes, and whether
the circle's box lies left of the square's is a comparison between two word positions, which
attention with a pairwise box bias (:mod:`xmatch.components.reasoners`) makes directly. The
idea is the grounding-then-reasoning of modular visual reasoning (e.g. Hu et al., 2017; Kamath
et al., MDETR 2021), here on top of the alignment the matching model already learnt; nothing in
it knows a word list or a grammar.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from xmatch.components.layout_likelihood import LayoutLikelihood
from xmatch.components.reasoners import TransformerReasoner
from xmatch.components.verifier import PairVerifier, box_geometry, word_positions
from xmatch.model.embeddings import Embeddings


class GroundedVerifier(PairVerifier):
    """Words grounded in regions by the model's similarities, then reasoned over with their
    referents' boxes; a linear head on a [CLS] token gives the match logit.

    For word ``w`` and region ``r`` (real regions with a box; all real regions when the image
    side gives no boxes) the grounding is ``a[w, r] = softmax_r(<t_w, v_r> / tau)`` on the
    model's unit-norm tokens, with a learned temperature ``tau``. Each word then enters the
    reasoner as ``LN(W_t t_w + W_v sum_r a[w, r] v_r + W_b [box_w, area_w, max_r <t_w, v_r>])``
    plus the sinusoidal code of its position, where ``box_w = sum_r a[w, r] box_r`` is where
    its referent lies. The reasoner is a pre-norm transformer over [CLS] + words whose
    attention gets the pairwise geometry of the words' referent boxes as a bias
    (``TransformerReasoner(geometry="relative")``); the [CLS] slot has no box. Regions carry no
    order: permuting them (with their boxes) leaves the logit unchanged.

    Cheap: a pair costs one ``words x regions`` product and a transformer over the caption's
    words at ``width``, so re-ranking a short list costs a fraction of what the
    ``cross-attention`` head does.

    Args:
        dim: the model's embedding width (set by the model builder: ``embed_dim``).
        width: the reasoner's width.
        layers: reasoner layers.
        heads: attention heads (``width`` must be divisible by it).
        temperature: the grounding softmax's starting temperature (learned).
        geometry_dim: hidden width of the pairwise-geometry MLP.
        dropout: dropout of the reasoner.
        loss_weight: the factor of :meth:`training_loss` in the training objective.
        layout: also score how likely the caption makes its words' referents' layout
            (:class:`~xmatch.components.layout_likelihood.LayoutLikelihood`): the logit gets
            ``- s * surprise`` with a learned ``s`` (starting at 0.1), and training adds the
            layout's negative log-likelihood on the positive pairs (``verifier_layout``). A
            relation then is learnt from every positive caption's word pairs, not only from
            the one bit of a twin; on the tabletop world's exact boxes it is what lets the
            head read "next to" against "on top of" (docs/training.md).

    Example:
        >>> import torch.nn.functional as F
        >>> v = GroundedVerifier(dim=32).eval()
        >>> boxes = torch.rand(3, 5, 2).repeat(1, 1, 2) + torch.tensor([0.0, 0.0, 0.1, 0.1])
        >>> img = Embeddings(F.normalize(torch.randn(3, 5, 32), dim=-1), torch.ones(3, 5, dtype=torch.bool), boxes=boxes)
        >>> txt = Embeddings(F.normalize(torch.randn(3, 7, 32), dim=-1), torch.ones(3, 7, dtype=torch.bool))
        >>> v(img, txt).shape
        torch.Size([3])
    """

    def __init__(
        self,
        dim: int,
        width: int = 128,
        layers: int = 2,
        heads: int = 4,
        temperature: float = 0.05,
        geometry_dim: int = 16,
        dropout: float = 0.0,
        loss_weight: float = 1.0,
        layout: bool = False,
    ) -> None:
        super().__init__()
        if width < 1 or layers < 1:
            raise ValueError(f"grounded verifier: width and layers must be >= 1, got {width} and {layers}.")
        if heads < 1 or width % heads:
            raise ValueError(f"grounded verifier: width {width} is not divisible by heads {heads}.")
        if not temperature > 0:
            raise ValueError(f"grounded verifier: temperature must be > 0, got {temperature}.")
        if not 0 <= dropout < 1:
            raise ValueError(f"grounded verifier: dropout must be in [0, 1), got {dropout}.")
        if loss_weight < 0:
            raise ValueError(f"grounded verifier: loss_weight must be >= 0, got {loss_weight}.")
        self.dim, self.width = dim, width
        self.loss_weight = loss_weight
        self.log_temperature = nn.Parameter(torch.tensor(math.log(temperature)))
        self.word_in = nn.Linear(dim, width)
        self.region_in = nn.Linear(dim, width)
        self.box_in = nn.Linear(6, width)  # the referent's box (4), its area, the best similarity
        self.input_norm = nn.LayerNorm(width)
        self.cls = nn.Parameter(torch.randn(1, 1, width) * 0.02)
        self.reasoner = TransformerReasoner(
            width, layers=layers, heads=heads, ff_dim=2 * width, dropout=dropout, norm_first=True,
            geometry="relative", geometry_dim=geometry_dim,
        )
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, 1)
        self.layout = LayoutLikelihood(dim) if layout else None
        # small at first: an untrained density's surprise is noise that the logit should not follow
        self.layout_scale = nn.Parameter(torch.tensor(0.1)) if layout else None

    def ground(self, img: Embeddings, txt: Embeddings) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Each word's grounding in its own row's image.

        Returns:
            ``(weights [n, W, R], similarity [n, W, R], usable [n, R])``: the softmax weights
            over the regions (zero rows for an image without a usable region), the model's
            region-word similarities, and which regions take part.

        Example:
            >>> import torch.nn.functional as F
            >>> v = GroundedVerifier(dim=8)
            >>> regions = F.normalize(torch.eye(8)[:3].unsqueeze(0), dim=-1)
            >>> words = Embeddings(regions[:, [2, 0]], torch.ones(1, 2, dtype=torch.bool))
            >>> v.ground(Embeddings(regions, torch.ones(1, 3, dtype=torch.bool)), words)[0].argmax(-1).tolist()
            [[2, 0]]
        """
        dtype = self.head.weight.dtype
        regions, words = img.tokens.to(dtype), txt.tokens.to(dtype)
        usable = img.mask if img.boxes is None else img.mask & (img.boxes != 0).any(-1)
        similarity = torch.einsum("nwd,nrd->nwr", words, regions)
        logits = (similarity / self.log_temperature.exp()).masked_fill(~usable[:, None, :], float("-inf"))
        # an image without a usable region grounds nothing (all-zero weights), not NaN
        weights = torch.softmax(logits, dim=-1).nan_to_num(0.0)
        return weights, similarity, usable

    def forward(self, img: Embeddings, txt: Embeddings) -> torch.Tensor:
        """Match logits ``[n]`` of the row-aligned pairs ``(img[k], txt[k])``.

        Raises:
            ValueError: ``img`` and ``txt`` hold different numbers of rows, or a width other
                than the verifier's.
        """
        return self.score_pairs(img, txt)[0]

    def score_pairs(self, img: Embeddings, txt: Embeddings) -> tuple[torch.Tensor, tuple[torch.Tensor, str] | None]:
        """The logits ``[n]`` and, with ``layout``, the layout's per-row negative
        log-likelihood (``"layout"``), which :meth:`training_loss` takes on the positives."""
        self.check_pairs(img, txt)
        longest = max(int(txt.mask.sum(1).max()), 1) if len(txt) else 1
        txt = Embeddings(txt.tokens[:, :longest], txt.mask[:, :longest])  # padding beyond every caption reads nothing
        dtype = self.head.weight.dtype
        weights, similarity, usable = self.ground(img, txt)
        best = similarity.masked_fill(~usable[:, None, :], float("-inf")).max(-1).values
        best = torch.where(usable.any(-1, keepdim=True), best, torch.zeros_like(best))
        n, words = weights.shape[:2]
        boxes = torch.zeros(n, words, 4, dtype=dtype, device=weights.device)
        if img.boxes is not None:
            boxes = weights @ img.boxes.to(dtype)
        referents = weights @ img.tokens.to(dtype)
        x = self.word_in(txt.tokens.to(dtype)) + self.region_in(referents)
        x = x + self.box_in(torch.cat([box_geometry(boxes), best.unsqueeze(-1)], dim=-1))
        x = self.input_norm(x) + word_positions(words, self.width, x.device).to(dtype)
        always = torch.ones(n, 1, dtype=torch.bool, device=txt.mask.device)
        mask = torch.cat([always, txt.mask], dim=1)
        x = torch.cat([self.cls.expand(n, 1, -1), x], dim=1)
        # the [CLS] slot and padding have no box, so no pair with them gets a geometry bias
        boxes = torch.cat([boxes.new_zeros(n, 1, 4), boxes], dim=1) * mask.unsqueeze(-1).to(dtype)
        x = self.reasoner(x, mask, boxes)
        logits = self.head(self.norm(x[:, 0])).squeeze(-1)
        if self.layout is None:
            return logits, None
        fit = self.layout(txt.tokens.to(dtype), txt.mask, boxes[:, 1:], best)
        return logits - self.layout_scale * fit.surprise.to(logits.dtype), (fit.loss, "layout")
