"""Perturbation probes: the transforms, word classes from lists and taggers, and the probe
figures on models whose answer is known (a bag-of-words model is unchanged by shuffling; TERAN
on scenes is not)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

import xmatch
from xmatch.model.interfaces import EncoderOutput
from xmatch.components.text.rnn import BiGRUTextEncoder
from xmatch.eval.probes import (
    DropWords,
    PerturbedCaptions,
    PosTagger,
    ProbeResult,
    ShuffleWords,
    SwapAttributes,
    WordListTagger,
    default_probes,
    make_tagger,
    parse_probe,
    perturb_captions,
    split_words,
)
from xmatch.scenes.tagger import scenes_tagger
from xmatch.core.registry import text_encoders

ZOO = Path(__file__).resolve().parents[1] / "zoo"
FAST = {"backbone": "test_efficientnet", "weights": "random"}
CAPTIONS = [
    "a small red 7 to the left of a large blue circle",
    "there is a big green number three above a tiny white square, with a little orange star elsewhere",
    "a picture of a little purple digit 4 on the right of a small yellow cross",
]


# --- the transforms ---------------------------------------------------------------------


def test_shuffle_keeps_the_words_and_changes_their_order():
    rng = np.random.default_rng(0)
    for caption in CAPTIONS:
        shuffled = ShuffleWords()(caption, rng)
        assert shuffled != caption and Counter(split_words(shuffled)) == Counter(split_words(caption))
        # punctuation keeps its place
        assert [k for k, w in enumerate(split_words(shuffled)) if w == ","] == [
            k for k, w in enumerate(split_words(caption)) if w == ","]
    assert ShuffleWords()("a a a", rng) == "a a a"  # nothing to reorder
    assert perturb_captions(CAPTIONS, ShuffleWords(), 3) == perturb_captions(CAPTIONS, ShuffleWords(), 3)
    assert perturb_captions(CAPTIONS, ShuffleWords(), 3) != perturb_captions(CAPTIONS, ShuffleWords(), 4)


def test_drop_removes_every_member_of_the_class():
    tagger = scenes_tagger()
    assert DropWords("noun", tagger)(CAPTIONS[1], None) == (
        "there is a big green above a tiny white, with a little orange elsewhere")
    assert DropWords("relation", tagger)(CAPTIONS[0], None) == "a small red 7 a large blue circle"
    assert DropWords("adjective", tagger)(CAPTIONS[2], None) == "a picture of a digit 4 on the right of a cross"
    for caption in CAPTIONS:
        dropped = split_words(DropWords("colour", tagger)(caption, None))
        assert not tagger.spans(dropped, "colour")
    assert DropWords("noun", WordListTagger({"noun": ["dog"]}))("dog", None) == "dog"  # never an empty caption


def test_swap_exchanges_attribute_bindings_between_objects():
    tagger = scenes_tagger()
    assert SwapAttributes("colour", tagger)(CAPTIONS[0], None) == "a small blue 7 to the left of a large red circle"
    assert SwapAttributes("size", tagger)(CAPTIONS[0], None) == "a large red 7 to the left of a small blue circle"
    # "little" and "small" are synonyms in the scenes lists: swapping them would change nothing
    assert SwapAttributes("size", tagger)(CAPTIONS[2], None) == CAPTIONS[2]
    assert SwapAttributes("size", WordListTagger({"size": ["small", "little"], "noun": ["4", "cross"]}))(
        "a little 4 above a small cross", None) == "a small 4 above a little cross"  # no synonyms listed
    # the same colour twice: nothing to swap
    assert SwapAttributes("colour", tagger)("a red 7 above a red circle", None) == "a red 7 above a red circle"
    for caption in CAPTIONS:
        swapped = SwapAttributes("colour", tagger)(caption, None)
        assert Counter(split_words(swapped)) == Counter(split_words(caption))


def test_word_classes_from_lists_files_and_taggers(tmp_path: Path):
    path = tmp_path / "classes.json"
    path.write_text(json.dumps({"noun": ["dog", "cat"], "adjective": ["brown", ["small", "little"]],
                                "relation": ["next to"]}))
    tagger = make_tagger(path)
    assert tagger.spans(split_words("a brown dog next to a small cat"), "relation") == [(3, 5)]
    assert [p.name for p in default_probes(tagger)] == ["shuffle", "drop-noun", "drop-adjective", "drop-relation",
                                                        "swap-adjective"]
    assert SwapAttributes("adjective", tagger)("a brown dog next to a small cat", None) == "a small dog next to a brown cat"
    assert SwapAttributes("adjective", tagger)("a little dog next to a small cat", None) == "a little dog next to a small cat"
    tags = {"a": "DET", "brown": "ADJ", "dog": "NOUN", "on": "ADP", "mat": "NOUN"}
    pos = PosTagger(lambda words: [tags.get(w, "X") for w in words])
    assert DropWords("noun", pos)("a brown dog on a mat", None) == "a brown on a"
    assert DropWords("relation", pos)("a brown dog on a mat", None) == "a brown dog a mat"
    with pytest.raises(ValueError, match="unknown word class 'verb'"):
        tagger.spans(["a"], "verb")
    with pytest.raises(ValueError, match="no word class 'verb'"):
        parse_probe("drop-verb", tagger)
    with pytest.raises(ValueError, match="unknown probe 'jumble'"):
        parse_probe("jumble", tagger)
    with pytest.raises(FileNotFoundError, match="not 'scenes', 'spacy', 'nltk' or an existing JSON file"):
        make_tagger(tmp_path / "missing.json")


def test_the_nltk_tagger_names_what_is_missing():
    nltk = pytest.importorskip("nltk")
    try:
        nltk.pos_tag(["a"], tagset="universal")
    except LookupError:
        with pytest.raises(ImportError, match="nltk.downloader averaged_perceptron_tagger_eng"):
            make_tagger("nltk")
    else:
        assert make_tagger("nltk").spans(["a", "brown", "dog"], "noun") == [(2, 3)]


def test_perturbed_captions_wrap_a_training_set_reproducibly(tmp_path: Path):
    pytest.importorskip("timm")
    from xmatch.scenes.dataset import open_scenes

    train = open_scenes(tmp_path, "train", size="tiny", progress=False, **FAST)
    wrapped = PerturbedCaptions(train, [ShuffleWords()], p=0.5, seed=1)
    assert len(wrapped) == len(train) and wrapped.captions == train.captions
    texts = [wrapped[k].text for k in range(len(wrapped))]
    changed = [t != train.captions[k] for k, t in enumerate(texts)]
    assert 0 < sum(changed) < len(texts)  # about half
    assert texts == [wrapped[k].text for k in range(len(wrapped))]  # the same draw again
    wrapped.set_epoch(1)
    assert texts != [wrapped[k].text for k in range(len(wrapped))]
    batch = next(iter(wrapped.loader(4, shuffle=False)))
    assert batch.texts[:4] == [wrapped[k].text for k in range(4)]


# --- probe figures on models with a known answer --------------------------------------------


class BagOfWords(BiGRUTextEncoder):
    """Word embeddings only: no order, no context (a test model)."""

    def forward(self, batch):
        return EncoderOutput(self.project(self.embed(batch.inputs["input_ids"])), batch.mask, batch.content,
                             global_slot=False)


if "test-bag-of-words" not in text_encoders:
    # origin "tests": the contract test lists only xmatch's own registrations as built-ins
    text_encoders.register("test-bag-of-words", BagOfWords, origin="tests")


def _spec(text_encoder: str) -> dict:
    return {
        "embed_dim": 32,
        "image_encoder": {"name": "bottomup", "feature_dim": 256, "layers": 0, "box_hidden_dim": 16},
        # word_dim = 2 x hidden_dim: the bag of words has the width the Bi-GRU would output
        "text_encoder": {"name": text_encoder, "vocab": str(ZOO / "weights/teran-mrsw-scenes/vocab.json"),
                         "word_dim": 16, "hidden_dim": 8},
        "image_reasoner": {"name": "transformer", "layers": 1, "heads": 2, "ff_dim": 32},
        "text_reasoner": {"name": "identity"},
        "pooler": {"name": "MrSw"},
        "loss": {"name": "hinge"},
    }


@pytest.fixture(scope="module")
def tiny_train(tmp_path_factory):
    pytest.importorskip("timm")
    from xmatch.scenes.dataset import open_scenes

    return open_scenes(tmp_path_factory.mktemp("scenes"), "train", size="tiny", progress=False, **FAST)


def _shuffle_costs(model, dataset) -> dict:
    from xmatch.eval.suite import run_protocols

    record = run_protocols(model, dataset, "full,probes", probes=["shuffle", "swap-colour"], progress=False)
    return record.extras["probes"]


def test_a_bag_of_words_model_is_unchanged_by_shuffling(tiny_train):
    torch.manual_seed(0)
    model = xmatch.build(_spec("test-bag-of-words")).eval()
    probes = _shuffle_costs(model, tiny_train)
    for name in ("shuffle", "swap-colour"):  # a swap only reorders words too
        assert probes["probes"][name]["changed"] > 90
        assert all(v == 0 for d in ("i2t", "t2i") for v in probes["probes"][name]["cost"][d].values()), name
    with torch.no_grad():
        texts = list(tiny_train.captions[:10])
        a = model.encode_texts(texts)
        b = model.encode_texts(perturb_captions(texts, ShuffleWords()))
        img = model.encode_images(xmatch.RegionInputs(*(torch.as_tensor(np.stack(x)) for x in zip(*[
            (tiny_train.image(i).regions, tiny_train.image(i).boxes) for i in range(4)]))))
        torch.testing.assert_close(model.similarity(img, a), model.similarity(img, b), rtol=0, atol=1e-5)


def test_an_order_aware_model_scores_shuffled_captions_differently(tiny_train):
    torch.manual_seed(0)
    model = xmatch.build(_spec("bigru")).eval()
    texts = list(tiny_train.captions[:10])
    with torch.no_grad():
        img = model.encode_images(xmatch.RegionInputs(*(torch.as_tensor(np.stack(x)) for x in zip(*[
            (tiny_train.image(i).regions, tiny_train.image(i).boxes) for i in range(4)]))))
        a = model.similarity(img, model.encode_texts(texts))
        b = model.similarity(img, model.encode_texts(perturb_captions(texts, ShuffleWords())))
    assert (a - b).abs().max() > 1e-3


def test_probe_result_table_and_round_trip(tiny_train):
    torch.manual_seed(0)
    probes = _shuffle_costs(xmatch.build(_spec("bigru")).eval(), tiny_train)
    result = ProbeResult.from_dict(json.loads(json.dumps(probes)))
    assert list(result.probes) == ["shuffle", "swap-colour"] and "shuffle" in result.table()
    for name, probe in result.probes.items():
        for d in ("i2t", "t2i"):
            assert probe["cost"][d]["r1"] == pytest.approx(result.base[d]["r1"] - probe[d]["r1"])


@pytest.mark.slow
def test_shipped_teran_loses_recall_when_words_are_shuffled_and_tern_barely():
    """The measured effect on the scenes test split (docs/evaluation.md)."""
    pytest.importorskip("sklearn")
    from xmatch.scenes.dataset import open_scenes
    from xmatch.eval.suite import run_protocols

    test = open_scenes(None, "test")
    costs = {}
    for name in ("teran-mrsw-scenes", "tern-scenes"):
        model = xmatch.build(name, pretrained=True).eval()
        record = run_protocols(model, test, "full,probes", probes=["shuffle"], progress=False)
        costs[name] = record.extras["probes"]["probes"]["shuffle"]["cost"]["t2i"]["r1"]
    assert costs["teran-mrsw-scenes"] > 10 and abs(costs["tern-scenes"]) < 5
