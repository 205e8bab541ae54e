"""Every OAN equation (xmatch_oan docstring) on small inputs: numbers worked out by hand, and
direct element-by-element loops as references for random inputs."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from xmatch import Embeddings
from xmatch_oan import (
    OANContextReasoner,
    OANIntraImagePooler,
    OANIntraTextPooler,
    OANLoss,
    OANPooler,
    OANRegionImageEncoder,
    OANCNNTextEncoder,
)
from xmatch.testing import one_torch_thread  # noqa: F401  (autouse: one torch thread)

WORDS = ["a", "dog", "on", "the", "bench", "cat"]


def emb(rows: list[list[list[float]]]) -> Embeddings:
    """Embeddings from ragged lists of vectors (padded with zeros, masked)."""
    width = max(len(r) for r in rows)
    d = len(rows[0][0])
    tokens = torch.zeros(len(rows), width, d, dtype=torch.float64)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for k, r in enumerate(rows):
        tokens[k, : len(r)] = torch.tensor(r, dtype=torch.float64)
        mask[k, : len(r)] = True
    return Embeddings(tokens, mask)


def relevance_loop(queries: list[torch.Tensor], context: list[torch.Tensor], lam: float) -> float:
    """R(A -> B), element by element, straight from the docstring."""
    s = [[max(0.0, float(q @ c)) for c in context] for q in queries]
    column = [math.sqrt(sum(s[p][j] ** 2 for p in range(len(queries)))) + 1e-8 for j in range(len(context))]
    total = 0.0
    for p, q in enumerate(queries):
        weights = [math.exp(lam * s[p][j] / column[j]) for j in range(len(context))]
        attended = sum(w * c for w, c in zip(weights, context)) / sum(weights)
        total += float(q @ attended) / float(attended.norm())
    return total / len(queries)


def setwise_loop(a: list[torch.Tensor], b: list[torch.Tensor], lam_ab: float, lam_ba: float) -> float:
    return (relevance_loop(a, b, lam_ab) + relevance_loop(b, a, lam_ba)) / 2


# --- inter-modal attention and set-wise cosine ------------------------------------------


def test_one_region_one_word_is_their_cosine():
    pooler = OANPooler()
    assert pooler(emb([[[1.0, 0.0]]]), emb([[[0.6, 0.8]]])).item() == pytest.approx(0.6)
    # [cos]_+ clips the attention scores, not the relevance: the only word is still attended.
    assert pooler(emb([[[1.0, 0.0]]]), emb([[[-0.6, 0.8]]])).item() == pytest.approx(-0.6)


def test_two_regions_one_word_by_hand():
    # V-T: each region attends to the only word, R_VT = (0.6 + 0.8) / 2 = 0.7.
    # T-V: s = [0.6, 0.8] normalised over the (single) word of each region -> [1, 1];
    # softmax over the regions -> [1/2, 1/2]; b = [0.5, 0.5]; cos(t, b) = 0.7 / sqrt(0.5).
    expected = (0.7 + 0.7 / math.sqrt(0.5)) / 2
    score = OANPooler()(emb([[[1.0, 0.0], [0.0, 1.0]]]), emb([[[0.6, 0.8]]]))
    assert score.item() == pytest.approx(expected)


def test_one_region_two_words_by_hand_uses_lambda_vt():
    # V-T: s = [1, 0], normalised over the single region -> [1, 0]; weights softmax(0.5 [1, 0]);
    # a = [w1, w2]; cos(v, a) = w1 / |a|. T-V: both words attend to the only region:
    # R_TV = (cos(t1, v) + cos(t2, v)) / 2 = 0.5.
    w1 = math.exp(0.5) / (math.exp(0.5) + 1)
    w2 = 1 - w1
    expected = (w1 / math.hypot(w1, w2) + 0.5) / 2
    score = OANPooler(lambda_vt=0.5, lambda_tv=0.9)(emb([[[1.0, 0.0]]]), emb([[[1.0, 0.0], [0.0, 1.0]]]))
    assert score.item() == pytest.approx(expected)
    sharper = OANPooler(lambda_vt=5.0)(emb([[[1.0, 0.0]]]), emb([[[1.0, 0.0], [0.0, 1.0]]]))
    assert sharper.item() > score.item()


def random_sets(n: int, widths: list[int], d: int, seed: int) -> list[list[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [[F.normalize(torch.randn(d, generator=g, dtype=torch.float64), dim=0) for _ in range(w)] for w in widths[:n]]


def test_pooler_matches_the_direct_loop():
    images = random_sets(3, [4, 2, 3], 5, seed=0)
    texts = random_sets(4, [3, 5, 1, 2], 5, seed=1)
    scores = OANPooler()(emb([[v.tolist() for v in s] for s in images]), emb([[t.tolist() for t in s] for s in texts]))
    expected = torch.tensor([[setwise_loop(v, t, 0.5, 0.9) for t in texts] for v in images], dtype=torch.float64)
    torch.testing.assert_close(scores, expected)


def test_padding_never_changes_a_score():
    images = random_sets(3, [4, 2, 3], 5, seed=0)
    texts = random_sets(2, [3, 5], 5, seed=1)
    img = emb([[v.tolist() for v in s] for s in images])
    txt = emb([[t.tolist() for t in s] for s in texts])
    reference = OANPooler()(img, txt)
    # Wider padding filled with junk.
    tokens = torch.cat([img.tokens, torch.full((3, 2, 5), 7.0, dtype=torch.float64)], dim=1)
    tokens[~torch.cat([img.mask, torch.zeros(3, 2, dtype=torch.bool)], dim=1)] = -3.0
    padded = Embeddings(tokens, torch.cat([img.mask, torch.zeros(3, 2, dtype=torch.bool)], dim=1))
    torch.testing.assert_close(OANPooler()(padded, txt), reference)
    alone = OANPooler()(Embeddings(img.tokens[1:2, :2], img.mask[1:2, :2]), txt)  # unpadded
    torch.testing.assert_close(alone, reference[1:2])


def test_scores_are_the_same_for_every_chunk_size():
    images = random_sets(5, [4, 2, 3, 1, 4], 6, seed=2)
    texts = random_sets(7, [3, 5, 1, 2, 4, 4, 2], 6, seed=3)
    img = emb([[v.tolist() for v in s] for s in images])
    txt = emb([[t.tolist() for t in s] for s in texts])
    pooler = OANPooler()
    full = pooler(img, txt)
    for ic, tc in [(1, 1), (2, 3), (5, 1), (4, 7)]:
        torch.testing.assert_close(pooler(img, txt, image_chunk=ic, text_chunk=tc), full)
    pooler.block_elements = 40
    torch.testing.assert_close(pooler(img, txt), full)


def test_intra_poolers_compare_the_batch_with_itself():
    images = random_sets(3, [4, 2, 3], 5, seed=4)
    texts = random_sets(3, [3, 5, 1], 5, seed=5)
    img = emb([[v.tolist() for v in s] for s in images])
    txt = emb([[t.tolist() for t in s] for s in texts])
    s_image = OANIntraImagePooler()(img, txt, batch_layout=True)
    s_text = OANIntraTextPooler()(img, txt, batch_layout=True, image_chunk=1, text_chunk=2)
    torch.testing.assert_close(s_image, torch.tensor([[setwise_loop(a, b, 1.0, 1.0) for b in images] for a in images],
                                                     dtype=torch.float64))
    torch.testing.assert_close(s_text, torch.tensor([[setwise_loop(a, b, 1.0, 1.0) for b in texts] for a in texts],
                                                    dtype=torch.float64))
    torch.testing.assert_close(s_image, s_image.T)
    with pytest.raises(ValueError, match="batch_layout=True"):
        OANIntraImagePooler()(img, txt)


# --- encoders and intra-modal context attention -----------------------------------------


def test_context_attention_by_hand():
    r = OANContextReasoner(dim=2, heads=1, input_tanh=False)
    with torch.no_grad():
        r.query.weight.copy_(torch.eye(2))
        r.key.weight.copy_(torch.eye(2))
    x = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [9.0, 9.0]]])
    out = r(x, torch.tensor([[True, True, False]]))
    # Element 1: logits [1, 0] / sqrt(2) over the two real elements; context = weights.
    w = math.exp(2**-0.5) / (math.exp(2**-0.5) + 1)
    torch.testing.assert_close(out[0, 0], torch.tensor([1 + w, 1 - w]))
    torch.testing.assert_close(out[0, 1], torch.tensor([1 - w, 1 + w]))


def test_context_attention_matches_the_direct_loop_and_ignores_padding():
    torch.manual_seed(0)
    r = OANContextReasoner(dim=4, heads=3, lambda_softmax=0.7)
    x = torch.randn(2, 5, 4)
    mask = torch.tensor([[True, True, True, False, False], [True, True, True, True, True]])
    out = r(x, mask)
    for b in range(2):
        real = int(mask[b].sum())
        t = torch.tanh(x[b, :real])
        for p in range(real):
            context = torch.zeros(4)
            for k in range(3):
                wq, wk = r.query.weight[4 * k : 4 * k + 4], r.key.weight[4 * k : 4 * k + 4]
                logits = torch.stack([0.7 * (wq @ t[p]) @ (wk @ t[q]) / 2 for q in range(real)])
                context += (logits.softmax(0)[:, None] * t).sum(0) / 3
            torch.testing.assert_close(out[b, p], t[p] + context, rtol=1e-5, atol=1e-6)
    junk = x.clone()
    junk[0, 3:] = 50.0
    torch.testing.assert_close(r(junk, mask)[0, :3], out[0, :3])


def test_text_cnn_matches_the_direct_loop_and_ignores_padding():
    torch.manual_seed(0)
    enc = OANCNNTextEncoder(WORDS, min_count=1, word_dim=3, kernel_sizes=[1, 2, 3, 5, 7], channels=2)
    batch = enc.tokenize(["a dog on the bench", "cat"])
    out = enc(batch)
    assert out.tokens.shape == (2, 5, 10) and out.content.equal(batch.mask) and not out.global_slot
    e = enc.embed.weight[batch.inputs["input_ids"][0]]
    for j in range(5):
        expected = []
        for k, conv in zip([1, 2, 3, 5, 7], enc.convs):
            total = conv.bias.clone()
            for o in range(k):
                position = j - (k - 1) // 2 + o
                if 0 <= position < 5:
                    total = total + conv.weight[:, :, o] @ e[position]
            expected.append(torch.tanh(total))
        torch.testing.assert_close(out.tokens[0, j], torch.cat(expected))
    alone = enc(enc.tokenize(["cat"])).tokens
    torch.testing.assert_close(out.tokens[1:, :1], alone)


def test_region_encoder_passes_features_and_zeroes_padding():
    regions = torch.rand(2, 3, 4)
    mask = torch.tensor([[True, True, False], [True, True, True]])
    out = OANRegionImageEncoder(feature_dim=4)(regions, torch.zeros(2, 3, 4), mask)
    torch.testing.assert_close(out.tokens[mask], regions[mask])
    assert out.tokens[0, 2].abs().sum() == 0 and out.content.equal(mask)
    with pytest.raises(ValueError, match="expects 4"):
        OANRegionImageEncoder(feature_dim=4)(torch.rand(2, 3, 5), torch.zeros(2, 3, 4))


def test_encoder_errors():
    with pytest.raises(ValueError, match="needs a vocabulary"):
        OANCNNTextEncoder()
    with pytest.raises(ValueError, match="kernel_sizes"):
        OANCNNTextEncoder(WORDS, kernel_sizes=[0, 2])
    enc = OANCNNTextEncoder(WORDS, word_dim=3, channels=2, max_length=2)
    with pytest.warns(UserWarning, match="truncated"):
        assert enc.tokenize(["a dog on the bench"]).mask.sum() == 2
    with pytest.raises(ValueError, match="no words"):
        enc.tokenize([""])
    with pytest.raises(ValueError, match="heads"):
        OANContextReasoner(dim=4, heads=0)


# --- loss --------------------------------------------------------------------------------

S = torch.tensor([[0.5, 0.4, 0.1], [0.2, 0.6, 0.5], [0.0, 0.3, 0.7]])
SV = torch.tensor([[1.0, 0.55, 0.3], [0.55, 1.0, 0.9], [0.3, 0.9, 1.0]])
ST = torch.tensor([[1.0, 0.2, 0.45], [0.2, 1.0, 0.1], [0.45, 0.1, 1.0]])
SCORES = {"main": S, "intra_image": SV, "intra_text": ST}


def test_loss_by_hand_hardest():
    # Inter (margin 0.2, hardest): rows 0.2+0.4-0.5=0.1, 0.2+0.5-0.6=0.1, 0.2+0.3-0.7=-0.2 -> 0;
    # columns 0.2+0.2-0.5=-0.1 -> 0, 0.2+0.4-0.6=0, 0.2+0.5-0.7=0 -> L_inter = 0.2.
    # Intra image (margin 0.1): pair 0: max(0.55, 0.3) -> 0.1+0.55-0.5 = 0.15; pair 1: 0.9 ->
    # 0.1+0.9-0.6 = 0.4; pair 2: 0.9 -> 0.1+0.9-0.7 = 0.3 -> 0.85.
    # Intra text: pair 0: 0.45 -> 0.05; pair 1: 0.2 -> -0.3 -> 0; pair 2: 0.45 -> -0.15 -> 0 -> 0.05.
    # L = 0.7 * 0.2 + 0.3 * (0.5 * 0.85 + 0.5 * 0.05) = 0.14 + 0.135 = 0.275.
    out = OANLoss()(SCORES)
    assert out.loss.item() == pytest.approx(0.275)
    assert out.logs["inter_sum"] == pytest.approx(0.2)
    assert out.logs["intra_image_sum"] == pytest.approx(0.85)
    assert out.logs["intra_text_sum"] == pytest.approx(0.05)


def test_loss_by_hand_all_negatives_and_weights():
    # "all": intra image pair 0: 0.15 + (0.1+0.3-0.5 -> 0); pair 1: (0.1+0.55-0.6=0.05) + 0.4;
    # pair 2: (0.1+0.3-0.7 -> 0) + 0.3 -> 0.9. Intra text: pair 0: (0.1+0.2-0.5 -> 0) + 0.05;
    # pair 1: 0; pair 2: 0 -> 0.05. beta 0.25, gamma 0.5:
    # L = 0.5 * 0.2 + 0.5 * (0.25 * 0.9 + 0.75 * 0.05) = 0.1 + 0.13125.
    out = OANLoss(intra_sampling="all", beta=0.25, gamma=0.5)(SCORES)
    assert out.loss.item() == pytest.approx(0.23125)
    assert OANLoss(gamma=0.0)(SCORES).loss.item() == pytest.approx(0.2)
    assert OANLoss(reduction="mean")(SCORES).loss.item() == pytest.approx(0.275 / 6)


def test_loss_same_image_pairs_are_not_negatives():
    ids = torch.tensor([0, 1, 1])
    out = OANLoss(ignore_same_image=True)(SCORES, ids)
    # Pairs 1 and 2 share an image: intra image pair 1 -> 0.1+0.55-0.6 = 0.05, pair 2 -> 0.1+0.3-0.7 -> 0.
    assert out.logs["intra_image_sum"] == pytest.approx(0.15 + 0.05)
    assert OANLoss()(SCORES, ids).logs["intra_image_sum"] == pytest.approx(0.85)


def test_loss_gradient_pushes_the_hard_negative():
    s = {k: v.clone().requires_grad_() for k, v in SCORES.items()}
    OANLoss()(s).loss.backward()
    assert s["intra_image"].grad[1, 2] > 0 and s["intra_image"].grad[1, 0] == 0  # only the hardest
    assert s["main"].grad.diagonal().lt(0).all()


def test_loss_errors():
    with pytest.raises(ValueError, match="gamma"):
        OANLoss(gamma=1.5)
    with pytest.raises(ValueError, match="intra_sampling"):
        OANLoss(intra_sampling="semi")
    with pytest.raises(ValueError, match="square"):
        OANLoss()({"main": S, "intra_image": SV[:2], "intra_text": ST})
