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

from xmatch.core.lazy import lazy_names

# imported on first use: the zoo entries and the command line read this package without torch
__getattr__, __dir__ = lazy_names(__name__, {
    **dict.fromkeys(("VSEPPImageEncoder", "VSEPPPrecompImageEncoder"), "xmatch_vsepp.image"),
    "init_like_original": "xmatch_vsepp.init",
    "OrderPooler": "xmatch_vsepp.order",
    "VSEPPTextEncoder": "xmatch_vsepp.text",
})

__all__ = ["OrderPooler", "VSEPPImageEncoder", "VSEPPPrecompImageEncoder", "VSEPPTextEncoder", "init_like_original"]
