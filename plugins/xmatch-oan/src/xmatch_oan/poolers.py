"""OAN's poolers (Huang et al., ICMR 2019): the image-caption score ``r(v, t)`` and, for the
loss, the intra-modal similarities of a training batch (image x image, caption x caption).

xmatch's loss only sees score matrices, so the intra-modal similarities that pick OAN's
intra-modal hard negatives reach it as two extra poolers of the model spec
(``extra_poolers.intra_image`` / ``intra_text``). They compare the batch with itself: they
only work on a training batch (``batch_layout=True``), where row ``k`` of the images and of the
captions belong to pair ``k``.
"""

from __future__ import annotations

import torch

from xmatch.plugin import Embeddings, Pooler
from xmatch_oan.attention import setwise_cosine


class OANPooler(Pooler):
    """``r(v, t) = (R_VT + R_TV) / 2``: set-wise cosine after inter-modal attention.

    Args:
        lambda_vt: inverse temperature of the V-T attention (regions attend to words), 0.5.
        lambda_tv: inverse temperature of the T-V attention (words attend to regions), 0.9.
        eps: added to the normalisation denominators.

    Example:
        >>> one = torch.ones(1, 1, dtype=torch.bool)
        >>> OANPooler()(Embeddings(torch.tensor([[[1.0, 0.0]]]), one), Embeddings(torch.tensor([[[0.6, 0.8]]]), one))
        tensor([[0.6000]])
    """

    def __init__(self, lambda_vt: float = 0.5, lambda_tv: float = 0.9, eps: float = 1e-8) -> None:
        super().__init__()
        self.lambda_vt = lambda_vt
        self.lambda_tv = lambda_tv
        self.eps = eps

    def pairwise(self, img: Embeddings, txt: Embeddings) -> torch.Tensor:
        return setwise_cosine(img.tokens, img.mask, txt.tokens, txt.mask, self.lambda_vt, self.lambda_tv, self.eps)


class _IntraPooler(Pooler):
    """Set-wise cosine of the batch's images (or captions) with each other, ``[B, B]``."""

    modality: str

    def __init__(self, lambda_softmax: float = 1.0, eps: float = 1e-8) -> None:
        super().__init__()
        self.lambda_softmax = lambda_softmax
        self.eps = eps

    def pairwise(self, a: Embeddings, b: Embeddings) -> torch.Tensor:
        return setwise_cosine(a.tokens, a.mask, b.tokens, b.mask, self.lambda_softmax, self.lambda_softmax, self.eps)

    def forward(
        self,
        img: Embeddings,
        txt: Embeddings,
        *,
        batch_layout: bool = False,
        image_chunk: int | None = None,
        text_chunk: int | None = None,
    ) -> torch.Tensor:
        if not batch_layout:
            raise ValueError(
                f"the {self.modality} x {self.modality} similarity of OAN's loss compares a training batch with "
                "itself (batch_layout=True); score images against captions with the 'oan' pooler."
            )
        if len(img) != len(txt):
            raise ValueError(f"a training batch pairs images with captions one to one; got {len(img)} and {len(txt)}.")
        side = img if self.modality == "image" else txt
        return super().forward(side, side, batch_layout=True, image_chunk=image_chunk, text_chunk=text_chunk)


class OANIntraImagePooler(_IntraPooler):
    """Image x image set-wise cosine of a training batch (``S^V`` of OAN's loss).

    Args:
        lambda_softmax: inverse temperature of the attention both ways (1.0).
        eps: added to the normalisation denominators.

    Example:
        >>> e = Embeddings(torch.eye(2)[:, None], torch.ones(2, 1, dtype=torch.bool))
        >>> OANIntraImagePooler()(e, e, batch_layout=True)
        tensor([[1., 0.],
                [0., 1.]])
    """

    modality = "image"


class OANIntraTextPooler(_IntraPooler):
    """Caption x caption set-wise cosine of a training batch (``S^T`` of OAN's loss).

    Args:
        lambda_softmax: inverse temperature of the attention both ways (1.0).
        eps: added to the normalisation denominators.

    Example:
        >>> e = Embeddings(torch.eye(2)[:, None], torch.ones(2, 1, dtype=torch.bool))
        >>> OANIntraTextPooler()(e, e, batch_layout=True)
        tensor([[1., 0.],
                [0., 1.]])
    """

    modality = "text"
