"""xmatch-oan: OAN (Huang, Vaibhav, Chang, Hauptmann, "Improving What Cross-Modal Retrieval
Models Learn through Object-Oriented Inter- and Intra-Modal Attention Networks", ICMR 2019)
as xmatch components and zoo entries.

There is no public reference implementation; REFERENCE.md Part A gives the architecture and
hyper-parameters. The equations implemented are written out below and in each module; where
the paper's summary leaves a choice open, the choice is named as ours.

Notation: regions ``u_i`` (bottom-up features), words ``w_j``; ``D = 512``.

1. Encoders (``encoders.py``). Text: ``e_j = E[w_j]`` (300-d); for every kernel size
   ``k in {1, 2, 3, 5, 7}``, ``h^k_j = tanh(conv_k(e)_j)`` (zero padding keeps one output per
   word); ``x_j = [h^1_j; ...; h^7_j]``. Regions: ``u_i`` as given. The model's projection
   is OAN's perceptron ``W x + b`` and the ``oan-context`` reasoner starts with its ``tanh``:
   ``v_i = tanh(W_v u_i + b_v)``, ``t_j = tanh(W_t x_j + b_t)``.
2. Intra-modal context attention, T-T and V-V (``reasoner.py``), single hop, ``K`` heads
   (6), inverse temperature ``lambda`` (1.0), per set ``X = (x_1..x_n)`` with its mask:
   ``alpha^k_pq = softmax_q(lambda (Q_k x_p) . (K_k x_q) / sqrt(D))`` over real ``q``;
   ``c_p = (1/K) sum_k sum_q alpha^k_pq x_q``; output ``x_p + c_p``. The model then
   l2-normalises every element.
3. Inter-modal attention and set-wise cosine similarity (``attention.py``, ``poolers.py``),
   on unit vectors: ``s_ij = [v_i . t_j]_+``.
   V-T (each region attends to the words): ``s_ij / sqrt(sum_i' s_i'j^2)`` (normalised over
   the regions of each word), ``alpha_ij = softmax_j(lambda_VT .)``, ``a_i = sum_j alpha_ij t_j``,
   ``R_VT = (1/n) sum_i cos(v_i, a_i)``.
   T-V (each word attends to the regions): ``s_ij / sqrt(sum_j' s_ij'^2)``,
   ``beta_ji = softmax_i(lambda_TV .)``, ``b_j = sum_i beta_ji v_i``,
   ``R_TV = (1/m) sum_j cos(t_j, b_j)``.
   Inference score ``r(v, t) = (R_VT + R_TV) / 2`` with ``lambda_VT = 0.5``,
   ``lambda_TV = 0.9``. The same set-wise cosine between two images (two captions), with
   ``lambda = 1.0`` both ways, is the intra-modal similarity ``S^V`` (``S^T``) of the loss.
4. Loss (``loss.py``), batch score matrices ``S = r`` (image x caption), ``S^V``, ``S^T``,
   positives on the diagonal:
   ``L_inter = sum_i max_j [a_inter + S_ij - S_ii]_+ + sum_j max_i [a_inter + S_ij - S_jj]_+``;
   ``L^V_intra = sum_i H_k [a_intra + S^V_ik - S_ii]_+``, ``L^T_intra`` likewise with ``S^T``,
   ``H`` = max over the negatives (``"hardest"``: the intra-modal hard negative) or their
   sum (``"all"``); ``L_intra = beta L^V_intra + (1 - beta) L^T_intra``;
   ``L = (1 - gamma) L_inter + gamma L_intra`` with ``a_inter = 0.2``, ``a_intra = 0.1``,
   ``beta = 0.5``, ``gamma = 0.3``.

Example:
    >>> import xmatch
    >>> xmatch.list_models("oan-*")
    ['oan-coco', 'oan-f30k']
"""

from xmatch.core.lazy import lazy_names

# imported on first use: the zoo entries and the command line read this package without torch
__getattr__, __dir__ = lazy_names(__name__, {
    **dict.fromkeys(("OANCNNTextEncoder", "OANRegionImageEncoder"), "xmatch_oan.encoders"),
    "OANLoss": "xmatch_oan.loss",
    **dict.fromkeys(("OANIntraImagePooler", "OANIntraTextPooler", "OANPooler"), "xmatch_oan.poolers"),
    "OANContextReasoner": "xmatch_oan.reasoner",
})

__all__ = [
    "OANCNNTextEncoder", "OANContextReasoner", "OANIntraImagePooler", "OANIntraTextPooler", "OANLoss", "OANPooler",
    "OANRegionImageEncoder",
]
