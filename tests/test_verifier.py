"""The verifiers (issue 27): the contract every built-in head keeps (``cross-attention``,
``grounded``), the cross-attention head's construction, its training loss, the model's
``verify`` / ``similarity(..., rerank=K)``, saving and loading, and ``xmatch eval --rerank``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import xmatch
from xmatch.components.verifier import TERMS, CrossAttentionVerifier, training_pairs
from xmatch.components.verifier_grounded import GroundedVerifier
from xmatch.core.spec import SpecError
from xmatch.model.buckets import BucketedEmbeddings
from xmatch.model.embeddings import Embeddings
from xmatch.model.rerank import RowGatherer, rerank_scores

ZOO = Path(__file__).resolve().parents[1] / "zoo"


def small_spec(**overrides) -> dict:
    """A scenes-vocabulary model that builds in a fraction of a second."""
    spec = {
        "embed_dim": 32,
        "image_encoder": {"name": "bottomup", "feature_dim": 256, "layers": 0, "box_hidden_dim": 16},
        "text_encoder": {"name": "bigru", "vocab": str(ZOO / "weights/teran-mrsw-scenes/vocab.json"),
                         "word_dim": 16, "hidden_dim": 8},
        "image_reasoner": {"name": "transformer", "layers": 1, "heads": 2, "ff_dim": 32},
        "text_reasoner": {"name": "transformer", "layers": 1, "heads": 2, "ff_dim": 32},
        "pooler": {"name": "MrSw"},
        "loss": {"name": "hinge"},
    }
    spec.update(overrides)
    return spec


def tokens(n: int, t: int, d: int = 32, *, lengths: list[int] | None = None, boxes: bool = False, seed: int = 0) -> Embeddings:
    g = torch.Generator().manual_seed(seed)
    x = F.normalize(torch.randn(n, t, d, generator=g), dim=-1)
    mask = torch.ones(n, t, dtype=torch.bool) if lengths is None else torch.arange(t)[None] < torch.tensor(lengths)[:, None]
    b = None
    if boxes:
        corner = torch.rand(n, t, 2, generator=g) * 0.5
        b = torch.cat([corner, corner + 0.4], dim=-1)
    return Embeddings(x, mask, None, b)


HEADS = {"cross-attention": CrossAttentionVerifier, "grounded": GroundedVerifier}


@pytest.fixture(scope="module", params=sorted(HEADS))
def verifier(request) -> CrossAttentionVerifier | GroundedVerifier:
    torch.manual_seed(0)
    return HEADS[request.param](dim=32, layers=2, heads=4).eval()


# -- the contract -----------------------------------------------------------------------------


def test_one_logit_per_row_pair(verifier):
    out = verifier(tokens(5, 7, boxes=True), tokens(5, 4, seed=1))
    assert out.shape == (5,) and out.dtype == torch.float32 and torch.isfinite(out).all()
    for name, cls in HEADS.items():
        assert xmatch.core.registry.get_registry("verifiers").get(name.title()) is cls
        assert xmatch.core.registry.verifiers.is_builtin(name)


def test_padded_tokens_do_not_change_the_logit(verifier):
    img, txt = tokens(3, 6, lengths=[2, 6, 4], boxes=True), tokens(3, 5, lengths=[5, 1, 3], seed=1)
    base = verifier(img, txt)
    # garbage in the padded slots, and extra padding columns on both sides
    noisy_img = Embeddings(torch.where(img.mask[..., None], img.tokens, 9.0), img.mask, None,
                           torch.where(img.mask[..., None], img.boxes, 0.7))
    wide_img = Embeddings(F.pad(noisy_img.tokens, (0, 0, 0, 3), value=5.0), F.pad(img.mask, (0, 3)), None,
                          F.pad(noisy_img.boxes, (0, 0, 0, 3), value=0.3))
    wide_txt = Embeddings(F.pad(txt.tokens, (0, 0, 0, 4), value=-3.0), F.pad(txt.mask, (0, 4)))
    torch.testing.assert_close(verifier(wide_img, wide_txt), base, atol=1e-5, rtol=1e-5)
    # each row alone (trimmed to its own length) gives its logit in the batch
    for k in range(3):
        alone = verifier(img[k].trimmed(), txt[k].trimmed())
        torch.testing.assert_close(alone, base[k : k + 1], atol=1e-5, rtol=1e-5)


def test_permuting_the_regions_does_not_change_the_logit(verifier):
    img, txt = tokens(2, 8, boxes=True), tokens(2, 5, seed=1)
    perm = torch.randperm(8, generator=torch.Generator().manual_seed(3))
    shuffled = Embeddings(img.tokens[:, perm], img.mask[:, perm], None, img.boxes[:, perm])
    torch.testing.assert_close(verifier(shuffled, txt), verifier(img, txt), atol=1e-5, rtol=1e-5)
    # ...but the words' order is read, even from tokens that do not carry it: not a bag of words
    reversed_txt = Embeddings(txt.tokens.flip(1), txt.mask)
    assert not torch.allclose(verifier(img, reversed_txt), verifier(img, txt), atol=1e-4)


def test_boxes_are_read_when_present(verifier):
    img, txt = tokens(2, 6, boxes=True), tokens(2, 4, seed=1)
    without = Embeddings(img.tokens, img.mask)
    assert not torch.allclose(verifier(img, txt), verifier(without, txt))


def test_an_image_without_regions_still_gets_a_finite_logit(verifier):
    img = tokens(2, 3, lengths=[0, 3])
    assert torch.isfinite(verifier(img, tokens(2, 4, seed=1))).all()


def test_errors_name_the_problem(verifier):
    with pytest.raises(ValueError, match="row-aligned pairs .* got 3 images and 2 captions"):
        verifier(tokens(3, 4), tokens(2, 4))
    with pytest.raises(ValueError, match="the verifier is 32 wide but the caption embeddings are 16 wide"):
        verifier(tokens(2, 4), tokens(2, 4, d=16))
    with pytest.raises(ValueError, match="not divisible by heads 5"):
        type(verifier)(dim=32, heads=5)
    with pytest.raises(ValueError, match="layers must be >= 1"):
        type(verifier)(dim=32, layers=0)


# -- the training loss ------------------------------------------------------------------------


def test_training_pairs_pick_the_hardest_negatives():
    scores = torch.tensor([[0.9, 0.8, 0.1], [0.2, 0.7, 0.6], [0.5, 0.3, 0.4]])
    p = training_pairs(scores)
    # positives; each caption's hardest other image; each image's hardest other caption
    assert p.image.tolist() == [0, 1, 2, 2, 0, 1, 0, 1, 2]
    assert p.text.tolist() == [0, 1, 2, 0, 1, 2, 1, 2, 0]
    assert p.label.tolist() == [1, 1, 1, 0, 0, 0, 0, 0, 0]
    assert [TERMS[t] for t in p.term.tolist()] == ["positive"] * 3 + ["image_negative"] * 3 + ["text_negative"] * 3
    # rows 0 and 1 show the same image: never each other's negatives
    same = training_pairs(scores, image_ids=torch.tensor([7, 7, 8]))
    assert same.image.tolist()[3:] == [2, 2, 1, 0, 1, 2] and same.text.tolist()[3:] == [0, 1, 2, 2, 2, 0]
    # structural negatives follow, each with its owner's image
    with_negatives = training_pairs(scores, owner=torch.tensor([2, 0]))
    assert with_negatives.image.tolist()[-2:] == [2, 0] and with_negatives.text.tolist()[-2:] == [3, 4]
    assert with_negatives.label.tolist()[-2:] == [0, 0]
    # one image shown by every row: no negatives at all
    assert training_pairs(scores, image_ids=torch.zeros(3, dtype=torch.long)).label.tolist() == [1, 1, 1]


class Recorder(CrossAttentionVerifier):
    """A verifier whose logit is a known function of the pair: the first feature of the
    image's first region minus that of the caption's first word, times 10."""

    def forward(self, img, txt):
        self.seen = (img, txt)
        return 10 * (img.tokens[:, 0, 0] - txt.tokens[:, 0, 0]) + self.head.bias * 0


def test_training_loss_numbers_on_hand_made_inputs():
    v = Recorder(dim=4, loss_weight=0.5)
    # row k of both sides carries the value k in its first feature: a positive's logit is 0
    img = Embeddings(torch.tensor([0.0, 1.0])[:, None, None] * torch.tensor([1.0, 0, 0, 0]), torch.ones(2, 1, dtype=torch.bool))
    txt = Embeddings(torch.tensor([0.0, 1.0])[:, None, None] * torch.tensor([1.0, 0, 0, 0]), torch.ones(2, 1, dtype=torch.bool))
    negatives = Embeddings(torch.full((1, 2, 4), 0.2), torch.tensor([[True, False]]))
    out = v.training_loss(img, txt, torch.tensor([[0.9, 0.1], [0.2, 0.8]]), negatives, torch.tensor([1]))
    # pairs: (0,0) (1,1) | caption 0 <- image 1, caption 1 <- image 0 | image 0 -> caption 1, image 1 -> caption 0 | (1, neg)
    logits = torch.tensor([0.0, 0.0, 10.0, -10.0, -10.0, 10.0, 8.0])
    labels = torch.tensor([1.0, 1, 0, 0, 0, 0, 0])
    bce = F.binary_cross_entropy_with_logits(logits, labels, reduction="none")
    # positives and negatives weigh alike: the mean of the two means
    assert out.loss.item() == pytest.approx(0.5 * (bce[:2].mean() + bce[2:].mean()).item() / 2, rel=1e-5)
    assert out.logs["verifier_loss"].item() == pytest.approx(out.loss.item())
    assert out.logs["verifier_positive"].item() == pytest.approx(bce[:2].mean().item())
    assert out.logs["verifier_image_negative"].item() == pytest.approx(bce[2:4].mean().item())
    assert out.logs["verifier_text_negative"].item() == pytest.approx(bce[4:6].mean().item())
    assert out.logs["verifier_structural"].item() == pytest.approx(bce[6].item())
    assert out.logs["verifier_accuracy"].item() == pytest.approx(2 / 7)  # a logit of 0 says "no": the positives miss
    assert all(not v.requires_grad for v in out.logs.values())
    seen_img, seen_txt = v.seen
    assert seen_txt.tokens.shape[1] == 2 and seen_txt.mask[:6, 1].sum() == 0  # captions padded to the negatives' width


def test_training_loss_gradients_reach_the_head_and_the_embeddings():
    torch.manual_seed(0)
    v = CrossAttentionVerifier(dim=32, layers=1, dropout=0.0)
    img, txt = tokens(4, 5, boxes=True), tokens(4, 3, seed=1)
    img.tokens.requires_grad_(True)
    out = v.training_loss(img, txt, torch.randn(4, 4), tokens(2, 6, seed=2), torch.tensor([0, 3]),
                          image_ids=torch.tensor([0, 1, 2, 2]))
    out.loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in v.parameters())
    assert img.tokens.grad is not None and img.tokens.grad.abs().sum() > 0
    # a few steps of training separate positives from negatives
    opt = torch.optim.Adam(v.parameters(), lr=3e-3)
    first = None
    for _ in range(40):
        opt.zero_grad()
        loss = v.training_loss(img.detach(), txt, torch.randn(4, 4)).loss
        loss.backward()
        opt.step()
        first = loss.item() if first is None else first
    assert loss.item() < 0.5 * first


def test_training_loss_errors():
    v = CrossAttentionVerifier(dim=32)
    e = tokens(3, 4)
    with pytest.raises(ValueError, match=r"scores are 2 x 2 but the batch has 3 pairs"):
        v.training_loss(e, e, torch.zeros(2, 2))
    with pytest.raises(ValueError, match="together"):
        v.training_loss(e, e, torch.zeros(3, 3), negatives=tokens(1, 4))
    with pytest.raises(ValueError, match="2 negative captions but 1 owner rows"):
        v.training_loss(e, e, torch.zeros(3, 3), tokens(2, 4), torch.tensor([0]))
    with pytest.raises(ValueError, match=r"owner must be a \[M\] tensor of batch rows in 0 .. 2"):
        v.training_loss(e, e, torch.zeros(3, 3), tokens(1, 4), torch.tensor([3]))


# -- the model --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model() -> xmatch.MatchingModel:
    torch.manual_seed(0)
    return xmatch.build(small_spec(verifier={"name": "cross-attention", "layers": 1, "heads": 2})).eval()


@pytest.fixture(scope="module")
def encoded(model) -> tuple[Embeddings, Embeddings]:
    g = torch.Generator().manual_seed(1)
    regions = torch.rand(6, 5, 256, generator=g)
    corner = torch.rand(6, 5, 2, generator=g) * 0.5
    with torch.inference_mode():
        img = model.encode_images(xmatch.RegionInputs(regions, torch.cat([corner, corner + 0.3], -1)))
        txt = model.encode_texts(["a red circle left of a blue seven", "a small green square", "a big blue three",
                                  "a yellow circle above a red square", "a seven", "a green four right of a small two",
                                  "a blue square", "a small red circle"])
    return img, txt


def test_verify_is_the_verifier_on_each_row(model, encoded):
    img, txt = encoded
    with torch.inference_mode():
        rows = img[torch.tensor([0, 0, 3, 5])], txt[torch.tensor([1, 2, 2, 7])]
        got = model.verify(*rows, batch_size=3)
        torch.testing.assert_close(got, model.verifier(*rows))
    with pytest.raises(ValueError, match="got 2 images and 3 captions"):
        model.verify(img[:2], txt[:3])


def test_a_model_without_a_verifier_says_how_to_get_one(encoded):
    plain = xmatch.build(small_spec())
    assert plain.verifier is None and "verifier" not in plain.spec
    img, txt = encoded
    for call in (lambda: plain.verify(img[:1], txt[:1]), lambda: plain.similarity(img, txt, rerank=2)):
        with pytest.raises(ValueError, match=r"has none: build it with a \[verifier\] table .*verifier=\{'name': 'cross-attention'\}"):
            call()


def _order(column: torch.Tensor) -> list[int]:
    return column.argsort(descending=True, stable=True).tolist()


@pytest.mark.parametrize("k", [1, 3, 6, 50])
def test_t2i_rerank_puts_the_top_k_first_in_verifier_order(model, encoded, k):
    img, txt = encoded
    with torch.inference_mode():
        plain = model.similarity(img, txt)
        reranked = model.similarity(img, txt, rerank=k, verify_batch=5)
        for j in range(len(txt)):
            pooler_order = _order(plain[:, j])
            top = pooler_order[:k]
            logits = model.verify(img[torch.tensor(top)], txt[torch.tensor([j] * len(top))])
            verifier_order = [top[i] for i in _order(logits)]
            rest = [i for i in pooler_order if i not in top]
            assert _order(reranked[:, j]) == verifier_order + rest
            torch.testing.assert_close(reranked[rest, j], plain[rest, j].float())  # the rest keep their scores


def test_i2t_rerank_works_along_the_rows(model, encoded):
    img, txt = encoded
    with torch.inference_mode():
        plain = model.similarity(img, txt)
        reranked = model.similarity(img, txt, rerank=3, direction="i2t")
        for i in range(len(img)):
            pooler_order = _order(plain[i])
            top = pooler_order[:3]
            logits = model.verify(img[torch.tensor([i] * 3)], txt[torch.tensor(top)])
            assert _order(reranked[i]) == [top[t] for t in _order(logits)] + pooler_order[3:]


def test_rerank_none_is_the_pooler_bit_for_bit(model, encoded):
    img, txt = encoded
    with torch.inference_mode():
        assert torch.equal(model.similarity(img, txt, rerank=None), model.pooler(img, txt))
        assert torch.equal(model.similarity(img, txt, image_chunk=2, text_chunk=3), model.pooler(img, txt, image_chunk=2, text_chunk=3))


def test_rerank_reads_bucketed_embeddings(model, encoded):
    img, txt = encoded
    with torch.inference_mode():
        padded = model.similarity(img, txt, rerank=4)
        bucketed = model.similarity(BucketedEmbeddings.from_embeddings(img), BucketedEmbeddings.from_embeddings(txt), rerank=4)
    torch.testing.assert_close(bucketed, padded, atol=1e-5, rtol=1e-5)


def test_rerank_arguments_are_checked(model, encoded):
    img, txt = encoded
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="positive int"):
            model.similarity(img, txt, rerank=bad)
    with pytest.raises(ValueError, match="choose 't2i'"):
        model.similarity(img, txt, rerank=2, direction="both")
    with pytest.raises(ValueError, match=r"scores are \(2, 2\) but there are 6 images and 8 captions"):
        model.rerank(torch.zeros(2, 2), img, txt, 2)


def test_rerank_scores_verifies_each_pair_once():
    scores = torch.tensor([[0.9, 0.1, 0.5], [0.8, 0.7, 0.2], [0.1, 0.3, 0.6]])
    calls = []

    def logits(i, t):
        calls.append((i.tolist(), t.tolist()))
        return -(i * 3 + t).float()  # prefers low images, then low captions

    out = rerank_scores(scores, 2, logits, ("t2i", "i2t"), batch_size=4)
    pairs = [p for i, t in calls for p in zip(i, t)]
    assert len(pairs) == len(set(pairs)) and all(len(i) <= 4 for i, _ in calls)
    # t2i top-2 per caption: {0,1}, {1,2}, {2,0}; i2t top-2 per image: {0,2}, {0,1}, {2,1}
    assert set(pairs) == {(0, 0), (1, 0), (1, 1), (2, 1), (2, 2), (0, 2), (1, 1), (0, 2), (2, 1), (1, 0), (0, 0)}
    assert _order(out["t2i"][:, 2]) == [0, 2, 1] and _order(out["i2t"][1]) == [0, 1, 2]
    assert out["t2i"][2, 0] == scores[2, 0] and out["i2t"][0, 1] == scores[0, 1]


def test_rerank_scores_calls_the_verifier_with_captions_of_like_length():
    g = torch.Generator().manual_seed(0)
    scores = torch.rand(8, 12, generator=g)
    lengths = torch.randint(3, 30, (12,), generator=g)
    calls = []

    def logits(i, t):
        calls.append((i, t))
        return torch.sin(i * 1.7 + t * 0.3)  # any pair function: the output must not depend on the calls

    by_length = rerank_scores(scores, 4, logits, ("t2i", "i2t"), batch_size=8, text_lengths=lengths)
    images, texts = (torch.cat(side) for side in zip(*calls))
    assert lengths[texts].diff().min() >= 0  # shortest captions first, across the calls
    pairs = set(zip(images.tolist(), texts.tolist()))
    assert len(pairs) == len(texts)  # each pair once
    calls.clear()
    in_image_order = rerank_scores(scores, 4, logits, ("t2i", "i2t"), batch_size=8)
    images, texts = (torch.cat(side) for side in zip(*calls))
    assert set(zip(images.tolist(), texts.tolist())) == pairs
    assert lengths[texts].diff().min() < 0  # in image order the calls mix lengths
    for direction in ("t2i", "i2t"):
        assert torch.equal(by_length[direction], in_image_order[direction])
    with pytest.raises(ValueError, match=r"one length per caption, \[12\]; got \(11,\)"):
        rerank_scores(scores, 4, logits, text_lengths=lengths[:11])


def test_model_rerank_gives_the_same_order_whatever_the_verifier_calls_hold(model, encoded):
    img, txt = encoded
    with torch.inference_mode():
        scores = model.similarity(img, txt)
        one_call = model.rerank(scores, img, txt, 3, directions=("t2i", "i2t"), batch_size=10_000)
        small_calls = model.rerank(scores, img, txt, 3, directions=("t2i", "i2t"), batch_size=3)
    for direction in ("t2i", "i2t"):
        torch.testing.assert_close(small_calls[direction], one_call[direction], rtol=0, atol=1e-5)


def test_row_gatherer_matches_padded_indexing(encoded):
    _, txt = encoded
    rows = torch.tensor([7, 0, 3, 3, 1])
    got = RowGatherer(BucketedEmbeddings.from_embeddings(txt))(rows)
    want = txt[rows].trimmed()
    assert torch.equal(got.mask, want.mask)
    torch.testing.assert_close(got.tokens * got.mask[..., None], want.tokens * want.mask[..., None])


def test_row_gatherer_of_one_bucket_is_a_plain_gather():
    # pictures with the same number of regions make one bucket: the rows are gathered from it directly
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([3, 5, 3, 3, 5, 3])
    e = Embeddings(torch.randn(6, 5, 4, generator=g), torch.arange(5)[None] < lengths[:, None],
                   torch.randn(6, 4, generator=g), torch.rand(6, 5, 4, generator=g))
    bucketed = BucketedEmbeddings.from_embeddings(e)
    assert len(bucketed.parts) == 2
    for rows in (torch.tensor([3, 0, 0, 5]), torch.tensor([4, 1, 4]), torch.tensor([2, 4])):  # one bucket, the other, both
        got, want = RowGatherer(bucketed)(rows), e[rows].trimmed()
        assert got.tokens.shape == want.tokens.shape and torch.equal(got.mask, want.mask) and torch.equal(got.pooled, want.pooled)
        real = want.mask[..., None]
        assert torch.equal(got.tokens * real, want.tokens * real) and torch.equal(got.boxes * real, want.boxes * real)


# -- specs, saving and loading ----------------------------------------------------------------


def test_the_verifier_table_round_trips_through_a_bundle(model, encoded, tmp_path):
    assert model.spec["verifier"] == {"name": "cross-attention", "layers": 1, "heads": 2, "ff_dim": None,
                                      "dropout": 0.1, "loss_weight": 1.0}
    xmatch.save_pretrained(model, tmp_path / "bundle")
    loaded = xmatch.build(f"local-dir:{tmp_path / 'bundle'}", pretrained=True).eval()
    assert loaded.spec["verifier"] == model.spec["verifier"]
    img, txt = encoded
    with torch.inference_mode():
        assert torch.equal(loaded.similarity(img, txt, rerank=3), model.similarity(img, txt, rerank=3))
    again = xmatch.build(model.spec)
    assert isinstance(again.verifier, CrossAttentionVerifier) and len(again.verifier.layers) == 1


def test_bundles_without_a_verifier_load_as_before(tmp_path):
    plain = xmatch.build(small_spec())
    assert not any(k.startswith("verifier") for k in plain.state_dict())
    xmatch.save_pretrained(plain, tmp_path / "plain")
    assert xmatch.build(f"local-dir:{tmp_path / 'plain'}", pretrained=True).verifier is None


def test_verifier_spec_errors():
    with pytest.raises(SpecError, match=r"model -> verifier -> name: unknown verifier 'cross-atention'. Did you mean: 'cross-attention'"):
        xmatch.build(small_spec(verifier={"name": "cross-atention"}))
    with pytest.raises(SpecError, match=r"model -> verifier -> dim: set by the model builder"):
        xmatch.build(small_spec(verifier={"name": "cross-attention", "dim": 8}))
    with pytest.raises(SpecError, match=r"model -> verifier \(cross-attention\): .*not divisible by heads 5"):
        xmatch.build(small_spec(verifier={"name": "cross-attention", "heads": 5}))


# -- evaluation: xmatch eval --rerank K -------------------------------------------------------

FAST = ["--data-option", "size=tiny", "--data-option", "backbone=test_efficientnet", "--data-option", "weights=random"]


@pytest.fixture(scope="module")
def scenes_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("scenes")


@pytest.fixture(scope="module")
def bundles(tmp_path_factory) -> dict[str, str]:
    out = {}
    for name, extra in (("verifier", {"verifier": {"name": "cross-attention", "layers": 1, "heads": 2}}), ("plain", {})):
        torch.manual_seed(0)
        path = tmp_path_factory.mktemp(name)
        xmatch.save_pretrained(xmatch.build(small_spec(**extra)), path)
        out[name] = f"local-dir:{path}"
    return out


@pytest.fixture(scope="module")
def train_split(scenes_root, bundles):
    pytest.importorskip("timm")
    from xmatch.scenes.dataset import open_scenes

    return open_scenes(scenes_root, "train", size="tiny", backbone="test_efficientnet", weights="random", progress=False)


def test_eval_rerank_is_reported_apart_and_k1_keeps_the_poolers_figures(bundles, scenes_root, train_split, tmp_path, capsys):
    from xmatch.cli.main import main
    from xmatch.eval.suite import load_records

    code = main(["eval", bundles["verifier"], "--dataset", "scenes", "--data", str(scenes_root), *FAST, "--split", "train",
                 "--protocol", "full,groups", "--rerank", "1", "--json", str(tmp_path / "r.json")])
    text = capsys.readouterr().out
    assert code == 0, text
    assert f"Re-ranked: {bundles['verifier']}'s verifier re-scores each query's top 1" in text
    assert "hard-negative groups, each caption's top 1 over the split re-ranked:" in text and "s without re-ranking (encode" in text
    assert "hard-negative groups, the verifier deciding within each group" in text
    (record,) = load_records(tmp_path / "r.json")  # the re-ranked figures round-trip through the result file
    rerank = record.extras["rerank"]
    # re-ranking a list of one changes no order: every figure is the pooler's own
    assert rerank["k"] == 1 and rerank["recall"]["i2t"] == record.result.i2t and rerank["recall"]["t2i"] == record.result.t2i
    assert len(rerank["verifier"]) == 12  # the verifier's fingerprint: the model's covers the pooler's figures only
    assert rerank["recall"]["rsum"] == pytest.approx(record.result.rsum)
    for kind, row in record.extras["groups"]["by_kind"].items():
        assert {f: rerank["groups"]["by_kind"][kind][f] for f in ("t2i", "i2t", "text", "image", "group")} == \
               {f: row[f] for f in ("t2i", "i2t", "text", "image", "group")}
    t = rerank["timings"]
    assert t["with_s"] == pytest.approx(t["without_s"] + t["rerank_s"]) and t["ratio"] > 1
    assert t["without_s"] == pytest.approx(t["encode_s"] + t["similarity_s"])
    images, captions = len(train_split.image_names), len(train_split.captions)
    assert rerank["pairs"] <= images + captions and rerank["pairs"] >= max(images, captions)


def test_rerank_of_every_candidate_is_the_verifiers_own_ranking(bundles, train_split):
    from xmatch.eval.groups import dataset_groups, score_groups
    from xmatch.eval.protocol import evaluate_scores
    from xmatch.eval.rerank import rerank_figures

    model = xmatch.build(bundles["verifier"], pretrained=True).eval()
    groups = dataset_groups(train_split)
    figures = rerank_figures(model, train_split, 1000, groups=groups, progress=False)
    with torch.inference_mode():
        img = Embeddings.cat([model.encode_images(b.images) for b in train_split.image_batches(64)])
        txt = model.encode_texts(list(train_split.captions))
        n, m = len(img), len(txt)
        logits = model.verify(img[torch.arange(n).repeat_interleave(m)], txt[torch.arange(m).repeat(n)]).view(n, m)
    expected = evaluate_scores(logits, captions_per_image=train_split.captions_per_image)
    assert figures["recall"]["i2t"] == pytest.approx(expected.i2t) and figures["recall"]["t2i"] == pytest.approx(expected.t2i)
    own = score_groups(logits, groups)
    assert all(figures["groups"]["overall"][f] == pytest.approx(own.overall[f]) for f in ("t2i", "i2t", "text", "image", "group"))
    # deciding within each group reads the same logits of the group's own pairs
    within = figures["groups_within"]
    assert all(within["overall"][f] == pytest.approx(own.overall[f]) for f in ("t2i", "i2t", "text", "image", "group"))
    assert within["pairs"] == sum(len(i) * len(c) for i, c in groups.blocks(groups_per_block=1))
    assert figures["pairs"] == n * m  # every pair verified once, though it is in both directions' lists
    # without a Recall@K protocol (a split of groups only) the groups are still re-ranked
    assert rerank_figures(model, train_split, 1000, recall=None, groups=groups, progress=False)["recall"] is None


def test_a_comparison_shows_the_reranked_model_as_a_row_and_keeps_plain_models(bundles, scenes_root, train_split, tmp_path, capsys):
    from xmatch.cli.main import main
    from xmatch.eval.suite import load_records, with_reranked

    code = main(["eval", bundles["verifier"], bundles["plain"], "--dataset", "scenes", "--data", str(scenes_root), *FAST,
                 "--split", "train", "--protocol", "full,groups", "--rerank", "3", "--json", str(tmp_path / "r.json")])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert f"--rerank 3: {bundles['plain']} has no verifier; its figures are the pooler's only" in out.err
    assert f"{bundles['verifier']} + verifier@3" in out.out
    records = load_records(tmp_path / "r.json")  # the file keeps the evaluated models only
    assert [r.name for r in records] == [bundles["verifier"], bundles["plain"]]
    shown = with_reranked(records)
    assert [r.name for r in shown] == [bundles["verifier"], f"{bundles['verifier']} + verifier@3",
                                       f"{bundles['verifier']} + verifier, within groups", bundles["plain"]]
    rerank = records[0].extras["rerank"]
    assert shown[2].extras["groups"]["pairs"] == rerank["groups_within"]["pairs"]
    assert shown[1].result.t2i == rerank["recall"]["t2i"] and shown[1].extras["groups"] == rerank["groups"]
    assert shown[1].provenance["reranked"]["k"] == 3
    assert [r.name for r in with_reranked(shown)] == [r.name for r in shown]  # a results.json read back: no second row


def test_eval_rerank_errors(bundles, scenes_root, capsys):
    from xmatch.cli.main import main

    data = ["--dataset", "scenes", "--data", str(scenes_root), *FAST, "--split", "train"]
    assert main(["eval", bundles["plain"], *data, "--rerank", "5"]) == 2
    err = capsys.readouterr().err
    assert f"--rerank 5: the model {bundles['plain']} has no verifier to re-rank with" in err and "leave out --rerank" in err
    assert main(["eval", bundles["verifier"], *data, "--rerank", "0"]) == 2
    assert "at least 1; got 0" in capsys.readouterr().err
    assert main(["eval", bundles["verifier"], bundles["verifier"], "--ensemble", *data, "--rerank", "5"]) == 2
    assert "without --ensemble" in capsys.readouterr().err


def test_groups_read_each_direction_from_its_own_scores():
    import numpy as np

    from xmatch.eval.groups import Group, GroupSet, score_groups

    gs = GroupSet([Group((0, 1), "relation")], caption_image=np.array([0, 1]))
    t2i = np.array([[0.9, 0.2], [0.3, 0.8]])  # each caption prefers its own image
    i2t = np.array([[0.1, 0.2], [0.3, 0.8]])  # image 0 prefers caption 1
    both = score_groups(t2i, gs, i2t_scores=i2t).overall
    assert (both["t2i"], both["i2t"], both["image"], both["text"], both["group"]) == (100.0, 50.0, 100.0, 0.0, 0.0)
    assert score_groups(t2i, gs).overall["group"] == 100.0
    with pytest.raises(ValueError, match=r"i2t_scores are \[1, 2\] but scores are \[2, 2\]"):
        score_groups(t2i, gs, i2t_scores=i2t[:1])
