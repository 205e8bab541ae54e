"""Length buckets: memory and scoring follow the real token count, the scores and rankings stay
those of the padded corpus, and encoding is bounded by default."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import xmatch
from xmatch.model.buckets import BucketedEmbeddings
from xmatch.components.poolers import GlobalCosinePooler, MrAvgwPooler, MrSwPooler, MwSrPooler, SymmPooler
from xmatch.model.embeddings import Embeddings

from conftest import random_regions, tiny_spec


def corpus(n: int, width: int, dim: int = 16, min_len: int = 1, seed: int = 0, holes: bool = False) -> Embeddings:
    g = torch.Generator().manual_seed(seed)
    tokens = F.normalize(torch.randn(n, width, dim, generator=g), dim=-1)
    lengths = torch.randint(min_len, width + 1, (n,), generator=g)
    mask = torch.arange(width)[None] < lengths[:, None]
    if holes:  # a masked first slot, like a dropped [CLS]
        mask[:, 0] = False
        mask[lengths == 1, 0] = True
    pooled = F.normalize(torch.randn(n, dim, generator=g), dim=-1)
    return Embeddings(tokens, mask, pooled)


def test_buckets_hold_the_same_items_with_little_padding():
    e = corpus(300, 40, holes=True)
    b = BucketedEmbeddings.from_embeddings(e, max_waste=0.125)
    assert len(b) == 300 and b.real_tokens == int(e.mask.sum())
    for part in b.parts:
        # each bucket's widest item is at most 1 / (1 - 0.125) times its narrowest
        spans = (part.mask * torch.arange(1, part.tokens.shape[1] + 1)).amax(dim=1)
        assert part.tokens.shape[1] == int(spans.max()) <= int(spans.min()) / 0.875 + 1e-9 or int(spans.max()) == 1
    back = b.to_embeddings()
    assert torch.equal(back.mask, e.trimmed().mask)
    assert torch.equal(back.tokens[back.mask], e.tokens[e.mask]) and torch.equal(back.pooled, e.pooled)
    assert b.slots < 0.6 * e.mask.numel()


def test_one_long_caption_does_not_widen_the_corpus():
    short = corpus(2000, 12, min_len=8, seed=1)
    long = corpus(1, 54, min_len=54, seed=2)
    padded = Embeddings.cat([short, long])
    bucketed = BucketedEmbeddings.from_parts([short, long])
    assert padded.mask.numel() == 2001 * 54
    assert bucketed.slots <= 1.15 * bucketed.real_tokens


def test_consuming_releases_each_batch_once_it_is_bucketed(monkeypatch):
    """Batches are freed as soon as their items are copied into a bucket, within a bucket too
    (one bucket of equal-length images must not hold the whole corpus twice); the buckets are
    those of a non-consuming call."""
    import weakref

    from xmatch.model import buckets

    for equal_lengths in (False, True):
        whole = corpus(600, 30, min_len=30 if equal_lengths else 1, seed=5)
        order = torch.argsort(whole.lengths, stable=True)
        batches = [whole[order[k : k + 50]] for k in range(0, 600, 50)]
        positions = [order[k : k + 50] for k in range(0, 600, 50)]
        kept = BucketedEmbeddings.from_parts(list(batches), positions)
        alive = [weakref.ref(b.tokens) for b in batches]
        freed_before_add = []
        real_add = buckets._Bucket.add

        def watching_add(self, part, rows, alive=alive, log=freed_before_add, real_add=real_add):
            log.append(sum(ref() is None for ref in alive))
            real_add(self, part, rows)

        mine, batches = batches, None
        monkeypatch.setattr(buckets._Bucket, "add", watching_add)
        consumed = BucketedEmbeddings.from_parts(mine, positions, consume=True)
        monkeypatch.undo()
        assert mine == [None] * 12 and all(ref() is None for ref in alive)
        assert freed_before_add == sorted(freed_before_add) and 0 < freed_before_add[-1] < 12
        if equal_lengths:  # one bucket: each batch is gone before the next one is copied
            assert len(consumed.parts) == 1 and freed_before_add == list(range(12))
        for a, b in zip(kept.parts, consumed.parts):
            assert torch.equal(a.tokens, b.tokens) and torch.equal(a.mask, b.mask)
        for a, b in zip(kept.positions, consumed.positions):
            assert torch.equal(a, b)
    with pytest.raises(TypeError, match="list it may empty"):
        BucketedEmbeddings.from_parts(tuple(kept.parts), consume=True)


@pytest.mark.parametrize("pooler", [MrSwPooler(), MwSrPooler(), SymmPooler(), MrAvgwPooler(), GlobalCosinePooler(), MrSwPooler(compat="original")],
                         ids=["MrSw", "MwSr", "Symm", "MrAvgw", "global-cosine", "MrSw-original"])
def test_bucketed_scores_equal_the_padded_ones(pooler):
    img, txt = corpus(40, 12, min_len=3, seed=3), corpus(150, 30, seed=4)
    reference = pooler(img, txt)
    pooler.block_elements = 2000  # many chunks inside each bucket as well
    for a, b in ((BucketedEmbeddings.from_embeddings(img), txt), (img, BucketedEmbeddings.from_embeddings(txt)),
                 (BucketedEmbeddings.from_embeddings(img), BucketedEmbeddings.from_embeddings(txt))):
        scores = pooler(a, b)
        torch.testing.assert_close(scores, reference, rtol=0, atol=2e-6)
        assert torch.equal(scores.argsort(dim=1, stable=True)[:, -5:], reference.argsort(dim=1, stable=True)[:, -5:])
    with pytest.raises(ValueError, match="training batch layout"):
        pooler(BucketedEmbeddings.from_embeddings(img), txt, batch_layout=True)


def test_slices_items_and_files(tmp_path):
    e = corpus(50, 20, seed=5)
    e.boxes = torch.rand(50, 20, 4)
    b = BucketedEmbeddings.from_embeddings(e)
    assert torch.equal(b.to_embeddings().boxes[b.to_embeddings().mask], e.boxes[e.mask])
    part = b[10:30]
    assert len(part) == 20
    torch.testing.assert_close(MrSwPooler()(e[:3], part), MrSwPooler()(e[:3], e[10:30]), rtol=0, atol=2e-6)
    one = b[-1]
    assert isinstance(one, Embeddings) and torch.equal(one.tokens[one.mask], e.tokens[-1][e.mask[-1]])
    with pytest.raises(TypeError, match="contiguous slice"):
        b[::2]
    path = tmp_path / "captions.safetensors"
    b.save(path, metadata={"model": "tiny"})
    loaded = BucketedEmbeddings.load(path)
    assert all(torch.equal(x.tokens, y.tokens) and torch.equal(x.boxes, y.boxes) and torch.equal(p, q)
               for x, y, p, q in zip(loaded.parts, b.parts, loaded.positions, b.positions))
    e.save(tmp_path / "plain.safetensors")
    with pytest.raises(ValueError, match="not a bucketed xmatch embeddings file .* Embeddings.load"):
        BucketedEmbeddings.load(tmp_path / "plain.safetensors")
    with pytest.raises(ValueError, match="not a permutation"):
        BucketedEmbeddings([e[:2], e[2:4]], [torch.tensor([0, 1]), torch.tensor([1, 3])])


def test_encoding_is_batched_by_default_with_the_same_result(fixture_bert):
    model = xmatch.build(tiny_spec(fixture_bert)).eval()
    regions, boxes, mask = random_regions(150, 6, 12)
    sizes = []
    forward = model.image_encoder.forward

    def counting(*args, **kwargs):
        sizes.append(len(args[0]))
        return forward(*args, **kwargs)

    with torch.no_grad():
        whole = model.encode_images(xmatch.RegionInputs(regions, boxes, mask), batch_size=None)
        model.image_encoder.forward = counting
        batched = model.encode_images(xmatch.RegionInputs(regions, boxes, mask))
    assert sizes == [64, 64, 22]
    torch.testing.assert_close(batched.tokens, whole.tokens, rtol=0, atol=1e-6)


def test_a_slice_shares_the_parts_it_holds_whole():
    """score_blocks slices the caption corpus per fold: for the full protocol that slice is the
    whole corpus, which must not be copied."""
    b = BucketedEmbeddings.from_embeddings(corpus(300, 30, seed=7))
    whole = b[0 : len(b)]
    assert [p.tokens.data_ptr() for p in whole.parts] == [p.tokens.data_ptr() for p in b.parts]
    assert all(torch.equal(x, y) for x, y in zip(whole.positions, b.positions))
    half = b[100:200]
    assert len(half) == 100 and torch.equal(half.to_embeddings().tokens, b.to_embeddings().tokens[100:200])


def test_a_slice_of_items_kept_in_corpus_order_is_a_view():
    """Images are encoded and kept in corpus order: the evaluation loop's per-step slice of them
    must not copy the step's tokens (at COCO-5K size, 38 MB a step)."""
    images = corpus(64, 36, min_len=36)
    b = BucketedEmbeddings.from_parts([images[:32], images[32:]], consume=False)
    step = b[10:50]
    assert len(step) == 40 and torch.equal(step.to_embeddings().tokens, images.tokens[10:50])
    storages = {p.tokens.untyped_storage().data_ptr() for p in b.parts}
    assert all(p.tokens.untyped_storage().data_ptr() in storages for p in step.parts), "a copy was made"
    shuffled = BucketedEmbeddings.from_embeddings(corpus(64, 30, seed=2))  # length order, not corpus order
    piece, every = shuffled[10:50].to_embeddings(), shuffled.to_embeddings()[10:50]
    width = piece.tokens.shape[1]
    assert torch.equal(piece.mask, every.mask[:, :width]) and not every.mask[:, width:].any()
    assert torch.equal(piece.tokens[piece.mask], every.tokens[every.mask])
