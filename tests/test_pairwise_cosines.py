"""``pairwise_cosines``, the region x word cosine matrix every token pooler shares: bit-equal to
the formula it replaced, padded on a CPU, unmasked; the ``AlignmentPooler`` base of plugins; and
every token pooler of this repository (core, SCAN, OAN, the tutorial's) computing its cosines
with it rather than with a matmul of its own."""

from __future__ import annotations

import importlib.util
import re
import sys
import types
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import xmatch
from xmatch.components.alignment import OUTPUT_COLUMNS_MULTIPLE
from xmatch.components.poolers import MrAvgwPooler, MrSwPooler, MwSrPooler, SymmPooler
from xmatch.core.registry import get_registry
from xmatch.plugin import AlignmentPooler, Embeddings, pairwise_cosines

TUTORIAL = Path(__file__).resolve().parents[1] / "docs" / "tutorial-plugin.md"
TUTORIAL_POOLER = "xmatch-maxsim-demo/src/xmatch_maxsim/pooler.py"
#: distributions of this repository whose token poolers must use pairwise_cosines
OWN_ORIGINS = {"xmatch", "xmatch-scan", "xmatch-oan", "xmatch-vsepp", "xmatch-maxsim-demo"}


def flat_alignment_before(img_tokens: torch.Tensor, txt_tokens: torch.Tensor) -> torch.Tensor:
    """The formula ``pairwise_cosines`` replaced: core's ``_flat_alignment`` (poolers.py, commit
    7d6dfb7) and the ``.view(i, r, t, w)`` its caller took, kept as the reference."""
    d = img_tokens.shape[-1]
    words = txt_tokens.reshape(-1, d)
    n = words.shape[0]
    extra = -n % 16 if words.device.type == "cpu" else 0
    if extra:
        words = torch.cat([words, words.new_zeros(extra, d)])
    n_i, r, _ = img_tokens.shape
    n_t, w, _ = txt_tokens.shape
    return (img_tokens.reshape(-1, d) @ words.T)[:, :n].view(n_i, r, n_t, w)


def unit_sets(n: int, width: int, dim: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return F.normalize(torch.randn(n, width, dim, generator=g), dim=-1).to(dtype)


def embeddings(n: int, width: int, dim: int, seed: int) -> Embeddings:
    """Unit tokens with 1..width real slots per item, padded slots holding large vectors."""
    g = torch.Generator().manual_seed(seed + 100)
    lengths = torch.randint(1, width + 1, (n,), generator=g)
    mask = torch.arange(width)[None] < lengths[:, None]
    tokens = torch.where(mask[..., None], unit_sets(n, width, dim, seed), torch.full((dim,), 5.0))
    return Embeddings(tokens, mask)


# 21 and 5 columns are padded to 32 and 16, 16 and 32 are whole, 156 is padded to 160
WIDTHS = [(7, 3), (1, 5), (4, 4), (2, 16), (12, 13)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("n_txt, words", WIDTHS)
def test_bit_equal_to_the_formula_it_replaced(dtype, n_txt, words):
    for dim in (64, 1024):
        img, txt = unit_sets(3, 5, dim, 0, dtype), unit_sets(n_txt, words, dim, 1, dtype)
        a = pairwise_cosines(img, txt)
        assert a.shape == (3, 5, n_txt, words) and a.dtype == dtype
        assert torch.equal(a, flat_alignment_before(img, txt))


def test_the_cosines_of_every_region_with_every_word():
    img, txt = unit_sets(3, 5, 32, 0), unit_sets(7, 3, 32, 1)
    expected = torch.einsum("ird,twd->irtw", img.double(), txt.double())
    torch.testing.assert_close(pairwise_cosines(img, txt).double(), expected, rtol=0, atol=1e-6)
    regions = torch.eye(3)[None, :2]
    assert pairwise_cosines(regions, torch.tensor([[[0.6, 0.8, 0.0]]])).flatten().tolist() == pytest.approx([0.6, 0.8])


def test_cpu_products_are_padded_to_whole_column_widths():
    # BLAS runs far below its rate when the product's columns are not a multiple of 16
    img, txt = unit_sets(3, 5, 64, 0), unit_sets(7, 3, 64, 1)  # 21 word columns
    a = pairwise_cosines(img, txt)
    assert OUTPUT_COLUMNS_MULTIPLE == 16
    assert a.stride() == (5 * 32, 32, 3, 1), "the product's rows are 32 columns wide, 21 of them kept"
    assert pairwise_cosines(img, unit_sets(4, 4, 64, 1)).is_contiguous(), "16 columns need no padding"


def test_padded_slots_are_not_masked():
    # a zeroed slot gives 0, any other vector its dot product: masking is the caller's job
    regions = torch.tensor([[[1.0, 0.0], [0.0, 0.0]]])
    words = torch.tensor([[[0.6, 0.8], [3.0, 4.0]]])
    assert pairwise_cosines(regions, words)[0, :, 0].tolist() == [[pytest.approx(0.6), 3.0], [0.0, 0.0]]


def test_shapes_that_do_not_fit_are_a_clear_error():
    with pytest.raises(ValueError, match=r"same width D; got \(2, 3, 8\) and \(4, 5, 6\)"):
        pairwise_cosines(torch.zeros(2, 3, 8), torch.zeros(4, 5, 6))
    with pytest.raises(ValueError, match=r"\[n_img, R, D\]"):
        pairwise_cosines(torch.zeros(6, 8), torch.zeros(4, 5, 8))


class MeanMaxPooler(AlignmentPooler):
    """Mean over the real words of their best region (the base class's docstring example)."""

    def pairwise(self, img: Embeddings, txt: Embeddings) -> torch.Tensor:
        best = self.region_max(self.alignment(img, txt), img)
        return best.masked_fill(~txt.mask[None], 0).sum(dim=2) / txt.lengths[None]


def direct_best(img: Embeddings, txt: Embeddings, i: int, t: int) -> torch.Tensor:
    return img.tokens[i][img.mask[i]] @ txt.tokens[t][txt.mask[t]].T  # real regions x real words


def test_alignment_pooler_maxima_see_only_real_regions_and_words():
    img, txt = embeddings(4, 6, 8, 0), embeddings(5, 7, 8, 1)
    a = AlignmentPooler.alignment(img, txt)
    by_region, by_word = AlignmentPooler.region_max(a, img), AlignmentPooler.word_max(a, txt)
    for i in range(len(img)):
        for t in range(len(txt)):
            direct = direct_best(img, txt, i, t)
            torch.testing.assert_close(by_region[i, t, : int(txt.lengths[t])], direct.amax(dim=0))
            torch.testing.assert_close(by_word[i, t, : int(img.lengths[i])], direct.amax(dim=1))
    expected = torch.tensor([[direct_best(img, txt, i, t).amax(0).mean() for t in range(5)] for i in range(4)])
    torch.testing.assert_close(MeanMaxPooler()(img, txt), expected)


def test_alignment_pooler_items_without_real_tokens_have_no_best_match():
    img, txt = embeddings(2, 3, 8, 2), embeddings(3, 4, 8, 3)
    img.mask[1] = False
    txt.mask[2] = False
    a = AlignmentPooler.alignment(img, txt)
    assert torch.isneginf(AlignmentPooler.region_max(a, img)[1]).all()
    assert torch.isfinite(AlignmentPooler.region_max(a, img)[0]).all()
    assert torch.isneginf(AlignmentPooler.word_max(a, txt)[:, 2]).all()


def test_alignment_pooler_blocks_give_the_same_scores():
    img, txt = embeddings(7, 5, 8, 4), embeddings(9, 6, 8, 5)
    pooler = MeanMaxPooler()
    whole = pooler(img, txt)
    for image_chunk, text_chunk in ((1, 1), (2, 4), (7, 2)):
        torch.testing.assert_close(pooler(img, txt, image_chunk=image_chunk, text_chunk=text_chunk), whole)
    pooler.block_elements = 5 * 6 * 4  # forward now cuts the blocks itself
    assert pooler.chunk_sizes(img, txt) != (len(img), len(txt))
    torch.testing.assert_close(pooler(img, txt), whole)


def test_teran_poolers_are_alignment_poolers():
    assert all(issubclass(cls, AlignmentPooler) for cls in (MrSwPooler, MwSrPooler, SymmPooler, MrAvgwPooler))


def tutorial_pooler_module() -> types.ModuleType:
    """The pooler module ``docs/tutorial-plugin.md`` writes, run from the page."""
    fence = re.compile(r'^```python title="' + re.escape(TUTORIAL_POOLER) + r'"\n(.*?)^```', re.S | re.M)
    found = fence.search(TUTORIAL.read_text(encoding="utf-8"))
    assert found, f"docs/tutorial-plugin.md has no block titled {TUTORIAL_POOLER}"
    module = types.ModuleType("tutorial_pooler")
    exec(compile(found.group(1), str(TUTORIAL), "exec"), module.__dict__)
    return module


def test_every_token_pooler_computes_its_cosines_with_pairwise_cosines(monkeypatch):
    registry = get_registry("poolers")
    poolers = {
        name: registry.get(name)
        for name in xmatch.list_components("poolers")
        if registry.origin(name) in OWN_ORIGINS and registry.get(name).uses_tokens
    }
    expected = {"MrSw", "MwSr", "Symm", "MrAvgw"}
    if importlib.util.find_spec("xmatch_scan"):
        expected |= {"scan-t2i", "scan-i2t", "scan-sum-max-t2i", "scan-sum-max-i2t"}
    if importlib.util.find_spec("xmatch_oan"):
        expected |= {"oan", "oan-intra-image", "oan-intra-text"}
    assert expected <= set(poolers)
    tutorial = tutorial_pooler_module()
    poolers["the tutorial's soft-mrsw"] = tutorial.SoftMrSwPooler

    calls: list[tuple[int, ...]] = []
    original = pairwise_cosines  # this module's own name is patched too

    def counted(image_tokens: torch.Tensor, text_tokens: torch.Tensor) -> torch.Tensor:
        calls.append(tuple(image_tokens.shape))
        return original(image_tokens, text_tokens)

    # every module that imported the function (the poolers' modules were imported above)
    for namespace in [vars(m) for m in list(sys.modules.values()) if m is not None] + [vars(tutorial)]:
        if namespace.get("pairwise_cosines") is original:
            monkeypatch.setitem(namespace, "pairwise_cosines", counted)

    img, txt = embeddings(3, 5, 8, 6), embeddings(3, 4, 8, 7)
    for name, cls in poolers.items():
        calls.clear()
        scores = cls()(img, txt, batch_layout=True)
        assert scores.shape == (3, 3)
        assert calls, (
            f"{name} ({cls.__module__}.{cls.__qualname__}) scores without xmatch.plugin.pairwise_cosines: "
            "compute the region x word cosines with it, not with a matmul of its own."
        )
