"""The papers' evaluation protocol: Recall@K, median / mean rank, rsum, COCO 1K / 5K,
Flickr30k 1K, NDCG@25 with ROUGE-L and SPICE relevance, ensembles.

Example:
    >>> from xmatch.eval import evaluate_scores
    >>> evaluate_scores(np.eye(3).repeat(5, axis=1), "full").rsum  # doctest: +SKIP
    600.0
"""

from xmatch.eval.evaluate import Encoded, RetrievalSet, encode_dataset, evaluate, score_blocks
from xmatch.eval.protocol import PROTOCOLS, EvalResult, evaluate_blocks, evaluate_scores, fold_layout

__all__ = [
    "PROTOCOLS", "Encoded", "EvalResult", "RetrievalSet", "encode_dataset", "evaluate", "evaluate_blocks",
    "evaluate_scores", "fold_layout", "score_blocks",
]
