"""Poolers on hand-computed cases, the original compatibility mode, and chunk invariance."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from xmatch import Embeddings
from xmatch.components.poolers import GlobalCosinePooler, MrAvgwPooler, MrSwPooler, MwSrPooler, SymmPooler


def unit(*rows):
    return F.normalize(torch.tensor(rows, dtype=torch.float32), dim=-1)


@pytest.fixture
def pair():
    # image: 2 real regions + 1 padded slot; text: 3 real words + 1 padded slot
    regions = torch.stack([unit([1, 0], [0, 1], [1, 1])])
    words = torch.stack([unit([1, 0], [1, 1], [-1, 0], [0, 1])])
    img = Embeddings(regions, torch.tensor([[True, True, False]]))
    txt = Embeddings(words, torch.tensor([[True, True, True, False]]))
    return img, txt


S = 2**-0.5  # cos 45 degrees


def test_mrsw_hand_computed(pair):
    img, txt = pair
    # words: [1,0] best region 1.0; [1,1]/sqrt2 best S; [-1,0] best max(-1, 0) = 0
    assert MrSwPooler()(img, txt).item() == pytest.approx(1 + S + 0)


def test_mwsr_hand_computed(pair):
    img, txt = pair
    # regions: [1,0] best word 1.0; [0,1] best word S (the padded [0,1] word must not count)
    assert MwSrPooler()(img, txt).item() == pytest.approx(1 + S)


def test_symm_and_mravgw(pair):
    img, txt = pair
    assert SymmPooler()(img, txt).item() == pytest.approx(2 + 2 * S)
    assert MrAvgwPooler()(img, txt).item() == pytest.approx((1 + S) / 3)


def test_negative_best_is_kept_in_clean_mode_and_zeroed_in_original():
    img = Embeddings(unit([1, 0], [0, 1]).unsqueeze(0), torch.tensor([[True, False]]))
    txt = Embeddings(unit([-1, 0]).unsqueeze(0), torch.tensor([[True]]))
    assert MrSwPooler()(img, txt).item() == pytest.approx(-1.0)
    # the original zero-fills the padded region slot, so the word's best becomes 0
    assert MrSwPooler(compat="original")(img, txt).item() == pytest.approx(0.0)
    # with a full-width image (no padded slot) the original keeps -1 too
    assert MrSwPooler(compat="original", region_slots=1)(img, txt).item() == pytest.approx(-1.0)
    # the training layout pads to the batch maximum: here 1 region, so no zero candidate
    assert MrSwPooler(compat="original")(img, txt, batch_layout=True).item() == pytest.approx(-1.0)


def test_mwsr_original_sees_zero_for_short_captions():
    img = Embeddings(unit([1, 0]).unsqueeze(0), torch.tensor([[True]]))
    txt = Embeddings(unit([-1, 0], [0, 1]).unsqueeze(0), torch.tensor([[True, True]]))
    assert MwSrPooler()(img, txt).item() == pytest.approx(0.0)  # best word: [0,1] -> 0 exactly
    txt = Embeddings(unit([-1, 0]).unsqueeze(0), torch.tensor([[True]]))
    assert MwSrPooler()(img, txt).item() == pytest.approx(-1.0)
    assert MwSrPooler(compat="original")(img, txt).item() == pytest.approx(0.0)  # 1 word < 85 slots


def test_global_cosine():
    pooled = unit([1, 0], [0, 1], [1, 1])
    e = Embeddings(torch.zeros(3, 1, 2), torch.ones(3, 1, dtype=torch.bool), pooled)
    scores = GlobalCosinePooler()(e, e)
    assert torch.allclose(scores, pooled @ pooled.T)
    with pytest.raises(ValueError, match="global vectors"):
        GlobalCosinePooler()(Embeddings(torch.zeros(1, 1, 2), torch.ones(1, 1, dtype=torch.bool)), e)


def random_sets(n, t, d, seed):
    g = torch.Generator().manual_seed(seed)
    tokens = F.normalize(torch.randn(n, t, d, generator=g), dim=-1)
    lengths = torch.randint(1, t + 1, (n,), generator=g)
    return Embeddings(tokens, torch.arange(t)[None] < lengths[:, None])


@pytest.mark.parametrize("cls", [MrSwPooler, MwSrPooler, SymmPooler, MrAvgwPooler])
@pytest.mark.parametrize("compat", ["clean", "original"])
def test_every_chunk_size_gives_the_same_scores(cls, compat):
    img, txt = random_sets(13, 7, 8, 0), random_sets(29, 9, 8, 1)
    pooler = cls(compat=compat)
    full = pooler(img, txt, image_chunk=13, text_chunk=29)
    for ic, tc in [(1, 1), (4, 5), (13, 3), (2, 29), (100, 100)]:
        torch.testing.assert_close(pooler(img, txt, image_chunk=ic, text_chunk=tc), full)
    # the automatic block size bounds memory and still agrees
    pooler.block_elements = 7 * 9 * 10
    torch.testing.assert_close(pooler(img, txt), full)


def assert_symm_is_the_direct_loop_definition(img, txt):
    scores = SymmPooler()(img, txt)
    for i in range(len(img)):
        for j in range(len(txt)):
            a = img.tokens[i][img.mask[i]] @ txt.tokens[j][txt.mask[j]].T
            expected = a.max(dim=0).values.sum() + a.max(dim=1).values.sum()
            assert scores[i, j].item() == pytest.approx(expected.item(), abs=1e-5)


def test_matches_a_direct_loop_definition():
    assert_symm_is_the_direct_loop_definition(random_sets(5, 6, 4, 2), random_sets(7, 5, 4, 3))


def test_width_mismatch_is_a_clear_error():
    with pytest.raises(ValueError, match="different widths"):
        MrSwPooler()(random_sets(2, 3, 4, 0), random_sets(2, 3, 5, 0))


def test_bad_compat_is_rejected():
    with pytest.raises(ValueError, match="compat"):
        MrSwPooler(compat="zero")


def test_masks_with_holes_match_the_direct_definition():
    # masks need not be left-aligned (e.g. stop-words dropped inside a caption)
    g = torch.Generator().manual_seed(4)
    img, txt = random_sets(4, 6, 5, 5), random_sets(6, 7, 5, 6)
    img = Embeddings(img.tokens, torch.rand(4, 6, generator=g) > 0.4)
    txt = Embeddings(txt.tokens, torch.rand(6, 7, generator=g) > 0.4)
    img.mask[:, 3] = True
    txt.mask[:, 5] = True
    assert_symm_is_the_direct_loop_definition(img, txt)


def test_automatic_blocks_are_balanced_and_bounded():
    img, txt = random_sets(5000, 36, 4, 0), random_sets(25000, 12, 4, 1)
    pooler = MrSwPooler()
    ic, tc = pooler.chunk_sizes(img, txt)
    assert ic * 36 * tc * 12 <= pooler.elements_per_block("cpu") == 1 << 23
    assert 0.25 < (ic * 36) / (tc * 12) < 4  # square-ish matmul blocks stay compute-bound
    assert pooler.chunk_sizes(img, txt[:3]) == (5000, 3)  # few texts: the image side widens
    assert pooler.chunk_sizes(img, txt, image_chunk=7)[0] == 7
    assert pooler.chunk_sizes(img, txt, image_chunk=300)[0] == 300  # an explicit size is kept
    ic, _ = pooler.chunk_sizes(img[:256], txt)
    assert ic == 64, "256 images in equal chunks (80 + 80 + 80 + 16 would make a thin last block)"

