"""The papers' evaluation protocol: Recall@K, median / mean rank, rsum, COCO 1K / 5K,
Flickr30k 1K, NDCG@25 with ROUGE-L and SPICE relevance, ensembles; and beyond it (in
:mod:`xmatch.eval.suite`): ECCV Caption and CxC, hard-negative groups, perturbation probes,
comparison reports.

Example:
    >>> from xmatch.eval import evaluate_scores
    >>> evaluate_scores(np.eye(3).repeat(5, axis=1), "full").rsum
    600.0
"""

from xmatch.eval.evaluate import Encoded, RetrievalSet, encode_captions, encode_dataset, evaluate, score_blocks, score_dataset
from xmatch.eval.protocol import PROTOCOLS, EvalResult, evaluate_blocks, evaluate_scores, fold_layout
from xmatch.eval.suite import EXTRA_PROTOCOLS, RunRecord, load_records, run_protocols

__all__ = [
    "EXTRA_PROTOCOLS", "PROTOCOLS", "Encoded", "EvalResult", "RetrievalSet", "RunRecord", "encode_captions",
    "encode_dataset", "evaluate", "evaluate_blocks", "evaluate_scores", "fold_layout", "load_records", "run_protocols",
    "score_blocks", "score_dataset",
]
