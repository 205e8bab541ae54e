"""xmatch-scan: Stacked Cross Attention (Lee, Chen, Hua, Hu, He, "Stacked Cross Attention for
Image-Text Matching", ECCV 2018) as an xmatch plugin.

Installing the distribution registers, through entry points (nothing in xmatch is edited):

- image encoder ``scan-precomp``: precomputed region features (SCAN's ``fc`` is the model's
  image projection);
- text encoder ``scan-bigru``: Bi-GRU with averaged directions and ``<start>`` / ``<end>``
  (no text projection follows it: ``text_projection = false``);
- poolers ``scan-t2i`` and ``scan-i2t`` (Stacked Cross Attention, LogSumExp / average /
  max / sum pooling) and the ``scan-sum-max-t2i`` / ``scan-sum-max-i2t`` baselines;
- the zoo entries ``scan-{t2i,i2t}-{lse,avg}-{f30k,coco}``.

Example:
    >>> import xmatch
    >>> import torch
    >>> model = xmatch.build("scan-t2i-avg-f30k", text_encoder={"vocab": ["a", "dog", "on", "the", "bench"]})
    >>> regions, boxes = torch.rand(2, 36, 2048), torch.zeros(2, 36, 4)  # precomputed bottom-up features
    >>> model.similarity(model.encode_images(xmatch.RegionInputs(regions, boxes)), model.encode_texts(["a dog"])).shape
    torch.Size([2, 1])
"""

from __future__ import annotations

__version__ = "0.1.0"

from xmatch.core.lazy import lazy_names

# imported on first use: the zoo entries and the command line read this package without torch
__getattr__, __dir__ = lazy_names(__name__, {
    **dict.fromkeys(("aggregate", "normalize_raw_scores", "sum_max_scores", "xattn_relevance", "xattn_scores"), "xmatch_scan.attention"),
    "ScanPrecompImageEncoder": "xmatch_scan.image",
    "init_like_original": "xmatch_scan.init",
    **dict.fromkeys(("ScanI2TPooler", "ScanT2IPooler", "StackedCrossAttentionPooler", "SumMaxI2TPooler", "SumMaxT2IPooler"), "xmatch_scan.poolers"),
    **dict.fromkeys(("ScanBiGRUTextEncoder", "load_original_vocab"), "xmatch_scan.text"),
    **dict.fromkeys(("PaperEnsemble", "entry", "entry_names", "paper_ensembles"), "xmatch_scan.zoo"),
})

__all__ = [
    "PaperEnsemble", "ScanBiGRUTextEncoder", "ScanI2TPooler", "ScanPrecompImageEncoder", "ScanT2IPooler",
    "StackedCrossAttentionPooler", "SumMaxI2TPooler", "SumMaxT2IPooler", "aggregate", "entry", "entry_names",
    "init_like_original", "load_original_vocab", "normalize_raw_scores", "paper_ensembles", "sum_max_scores",
    "xattn_relevance", "xattn_scores",
]
