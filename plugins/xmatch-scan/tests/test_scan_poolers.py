"""SCAN poolers: block-size independence, masks, dtypes, gradients and bad input."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import xmatch
from xmatch import Embeddings, SpecError

from xmatch_scan import ScanI2TPooler, ScanT2IPooler, StackedCrossAttentionPooler, SumMaxI2TPooler, SumMaxT2IPooler

F64 = torch.float64
POOLERS = {
    "t2i-lse": lambda: ScanT2IPooler(9.0, "LogSumExp", 6.0),
    "t2i-avg": lambda: ScanT2IPooler(9.0, "Mean"),
    "i2t-lse": lambda: ScanI2TPooler(4.0, "LogSumExp", 20.0),
    "i2t-avg": lambda: ScanI2TPooler(4.0, "Mean"),
    "i2t-softmax-max": lambda: ScanI2TPooler(4.0, "Max", raw_feature_norm="softmax"),
    "sum-max-t2i": SumMaxT2IPooler,
    "sum-max-i2t": SumMaxI2TPooler,
}


def embeddings(n, width, lengths, seed, dim=8, dtype=F64, garbage=None):
    """Unit-norm tokens; padded slots hold ``garbage`` (default: ordinary random unit vectors)."""
    g = torch.Generator().manual_seed(seed)
    tokens = F.normalize(torch.randn(n, width, dim, generator=g, dtype=dtype), dim=-1)
    mask = torch.arange(width)[None] < torch.as_tensor(lengths)[:, None]
    if garbage is not None:
        tokens = tokens.masked_fill(~mask[..., None], garbage)
    return Embeddings(tokens, mask)


@pytest.fixture(scope="module")
def pair():
    img = embeddings(7, 6, [6, 2, 5, 1, 6, 3, 4], seed=0)
    txt = embeddings(9, 8, [8, 3, 1, 5, 7, 2, 8, 4, 6], seed=1)
    return img, txt


@pytest.mark.parametrize("name", sorted(POOLERS))
@pytest.mark.parametrize("chunks", [(1, 1), (2, 3), (7, 1), (3, 9), (4, 5)])
def test_scores_do_not_depend_on_the_block_size(name, chunks, pair):
    img, txt = pair
    pooler = POOLERS[name]()
    whole = pooler.pairwise(img, txt)
    chunked = pooler(img, txt, image_chunk=chunks[0], text_chunk=chunks[1])
    torch.testing.assert_close(chunked, whole, rtol=1e-12, atol=1e-12)


def test_default_blocks_bound_the_work_per_block(pair):
    img, txt = pair
    pooler = ScanT2IPooler()
    pooler.block_elements = 200  # regions x words of ~4 pairs per block
    i_chunk, t_chunk = pooler.chunk_sizes(img, txt)
    assert i_chunk * t_chunk * 6 * 8 <= 200 and (i_chunk, t_chunk) != (7, 9)
    torch.testing.assert_close(pooler(img, txt), pooler.pairwise(img, txt), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", sorted(POOLERS))
@pytest.mark.parametrize("garbage", [0.0, 1e3, -7.5])
def test_padding_never_changes_a_score(name, garbage, pair):
    """Each pair scored alone, unpadded, equals its score inside a padded block whatever the
    padded slots hold."""
    img, txt = pair
    img_g = Embeddings(img.tokens.masked_fill(~img.mask[..., None], garbage), img.mask)
    txt_g = Embeddings(txt.tokens.masked_fill(~txt.mask[..., None], garbage), txt.mask)
    pooler = POOLERS[name]()
    scores = pooler(img_g, txt_g)
    assert torch.isfinite(scores).all()
    for i in range(len(img)):
        one_img = Embeddings(img.tokens[i : i + 1, : int(img.lengths[i])], img.mask[i : i + 1, : int(img.lengths[i])])
        for t in range(len(txt)):
            n = int(txt.lengths[t])
            one_txt = Embeddings(txt.tokens[t : t + 1, :n], txt.mask[t : t + 1, :n])
            torch.testing.assert_close(scores[i, t], pooler(one_img, one_txt)[0, 0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", sorted(POOLERS))
def test_gradients_reach_real_tokens_only_and_float32_agrees(name, pair):
    img, txt = pair
    pooler = POOLERS[name]()
    img32 = Embeddings(img.tokens.float().requires_grad_(), img.mask)
    txt32 = Embeddings(txt.tokens.float().requires_grad_(), txt.mask)
    scores = pooler(img32, txt32, batch_layout=True)
    scores.sum().backward()
    for e in (img32, txt32):
        assert torch.isfinite(e.tokens.grad).all()
        assert e.tokens.grad[~e.mask].abs().max() == 0
        assert e.tokens.grad[e.mask].abs().sum() > 0
    torch.testing.assert_close(scores.detach().double(), pooler(img, txt), rtol=1e-5, atol=1e-5)


def test_lse_is_stable_where_the_original_overflows():
    """exp(lambda_lse * R) without the max shift overflows float16 already for lambda 20."""
    img = embeddings(2, 3, [3, 2], seed=2, dtype=torch.float32)
    txt = embeddings(3, 4, [4, 2, 3], seed=3, dtype=torch.float32)
    pooler = ScanI2TPooler(4.0, "LogSumExp", 20.0)
    expected = pooler(img, txt)
    half = pooler(img.to(torch.float16), txt.to(torch.float16))
    assert torch.isfinite(half).all()
    torch.testing.assert_close(half.float(), expected, rtol=2e-2, atol=2e-2)


def test_items_without_elements_are_a_clear_error(pair):
    img, txt = pair
    empty = Embeddings(txt.tokens[:2], torch.tensor([[True] + [False] * 7, [False] * 8]))
    with pytest.raises(ValueError, match=r"captions \[1\] have none \(their mask is all False\)"):
        ScanT2IPooler()(img, empty)
    with pytest.raises(ValueError, match=r"images \[0\] have none"):
        SumMaxI2TPooler()(Embeddings(img.tokens[:1], torch.zeros(1, 6, dtype=torch.bool)), txt)
    with pytest.raises(ValueError, match="different widths"):
        ScanT2IPooler()(img, Embeddings(torch.ones(1, 2, 4, dtype=F64), torch.ones(1, 2, dtype=torch.bool)))


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="lambda_softmax is an inverse temperature and must be positive, got 0"):
        ScanT2IPooler(lambda_softmax=0)
    with pytest.raises(ValueError, match="agg_func must be one of 'LogSumExp', 'Mean', 'Max', 'Sum'; got 'AVG'"):
        ScanI2TPooler(agg_func="AVG")
    with pytest.raises(TypeError, match="base class; use ScanT2I"):
        StackedCrossAttentionPooler()
    with pytest.raises(SpecError, match="model -> pooler -> agg_func: expected"):
        xmatch.build("scan-t2i-avg-f30k", pooler={"agg_func": "AVG"})
    with pytest.raises(SpecError, match="'scan-i2t' has no argument 'smooth'"):
        xmatch.build("scan-i2t-avg-f30k", pooler={"smooth": 4.0})


def test_repr_states_the_hyperparameters():
    assert "lambda_softmax=4.0, agg_func='LogSumExp', lambda_lse=20.0" in repr(ScanI2TPooler(4.0, "LogSumExp", 20.0))
    assert "lambda_lse" not in repr(ScanT2IPooler(9.0, "Mean"))
