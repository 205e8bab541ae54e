"""xmatch-vsepp: VSE++ (Faghri, Fleet, Kiros, Fidler, "VSE++: Improving Visual-Semantic
Embeddings with Hard Negatives", BMVC 2018) as xmatch components and zoo entries.

Installing the distribution registers, through entry points (nothing in xmatch is edited):
image encoders ``vsepp-cnn`` (timm CNN on pixels) and ``vsepp-precomp`` (precomputed global
features), the text encoder ``vsepp-gru`` and the pooler ``vsepp-order``, plus the
``vsepp-*`` zoo entries. Cosine scoring and the hardest-negative hinge are xmatch's own
``global-cosine`` pooler and ``hinge`` loss. :func:`init_like_original` gives a built model's
``fc`` (its image projection) VSE++'s Xavier initialisation.

Example:
    >>> import xmatch
    >>> "vsepp-precomp-coco" in xmatch.list_models("vsepp-*")
    True
"""

from xmatch_vsepp.image import VSEPPImageEncoder, VSEPPPrecompImageEncoder
from xmatch_vsepp.init import init_like_original
from xmatch_vsepp.order import OrderPooler
from xmatch_vsepp.text import VSEPPTextEncoder

__all__ = ["OrderPooler", "VSEPPImageEncoder", "VSEPPPrecompImageEncoder", "VSEPPTextEncoder", "init_like_original"]
