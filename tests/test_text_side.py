"""The text side on new captions (xmatch.data.vocab): unknown-token coverage through every kind of
text encoder, building a vocabulary / word-level BERT tokenizer from captions, the run
folder's text side, and the checks before training and evaluation."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import pytest
import torch

import xmatch
from xmatch.data import vocab
from xmatch.cli.main import main
from xmatch.components.text.bert import BertTextEncoder
from xmatch.components.text.rnn import BiGRUTextEncoder
from xmatch.components.text.words import Vocabulary, build_vocabulary
from xmatch.components.text.side import TextSide, TokenCoverage
from xmatch.data import PrecompDataset
from xmatch.train import TrainConfig, Trainer, check_data_fits
from xmatch.io.run_folder import RunFolderError

from conftest import tiny_spec
from learnable import CONCEPTS, write_learnable_precomp

CAPTIONS = ["A zebra beside a red kite.", "a red kite and a zebra", "two zebras", "a kite"]


def bigru_spec(words: list[str] | str) -> dict:
    """A tiny TERAN with a Bi-GRU over ``words`` (a list or a vocab file), 12-d regions."""
    return tiny_spec("unused", text_encoder={"name": "bigru", "vocab": words, "word_dim": 8, "hidden_dim": 8})


# --- coverage ------------------------------------------------------------------------------

def test_vocabulary_coverage_counts_unknown_words_and_captions_without_a_known_one():
    cov = Vocabulary(["a", "red", "kite"]).coverage(CAPTIONS)
    # words: [a zebra beside a red kite .] [a red kite and a zebra] [two zebras] [a kite]
    assert (cov.captions, cov.tokens, cov.unknown, cov.all_unknown, cov.longest) == (4, 17, 7, 1, 7)
    assert cov.unknown_words[0] == ("zebra", 2) and dict(cov.unknown_words)["two"] == 1
    assert cov.rate == pytest.approx(7 / 17)
    assert cov.summary().startswith("41.2% of 17 tokens unknown, 1 of 4 captions entirely; most frequent unknown: 'zebra' (2)")
    assert TokenCoverage(0, 0, 0, 0, 0).rate == 0.0


def test_bert_coverage_counts_unk_word_pieces_and_names_the_words(fixture_bert):
    enc = BertTextEncoder(fixture_bert, layers=1, pretrained=False)
    cov = enc.token_coverage(["a dog near a zebra", "Xylophones xylophones", "a dog"])
    # the fixture's word pieces spell neither "zebra" nor "xylophones"
    assert (cov.unknown, cov.all_unknown) == (3, 1)
    assert cov.unknown_words == [("xylophones", 2), ("zebra", 1)]
    assert cov.tokens == 5 + 2 + 2  # special tokens are not counted


def test_token_coverage_asks_the_encoder_then_its_vocabulary_else_gives_none():
    enc = BiGRUTextEncoder(["a", "kite"], word_dim=4, hidden_dim=4)
    assert vocab.token_coverage(enc, ["a kite", "a zebra"]).unknown == 1

    class VocabularyOnly(torch.nn.Module):  # like the VSE++ and OAN plugin encoders
        vocabulary = Vocabulary(["a"])

    assert vocab.token_coverage(VocabularyOnly(), ["a kite"]).unknown == 1
    assert vocab.token_coverage(torch.nn.Linear(1, 1), ["a kite"]) is None  # no notion of unknown
    model = xmatch.build(bigru_spec(["a", "kite"]))
    assert vocab.token_coverage(model, ["a kite", "a zebra"]).unknown == 1  # a model: its text encoder


def test_the_plugins_encoders_are_measured_without_plugin_code_for_it():
    scan = pytest.importorskip("xmatch_scan.text")
    enc = scan.ScanBiGRUTextEncoder(["a", "kite"], word_dim=4, hidden_dim=4)
    cov = vocab.token_coverage(enc, ["a kite", "a zebra"])
    assert (cov.tokens, cov.unknown) == (4, 1)  # <start> / <end> are not caption words
    vsepp = pytest.importorskip("xmatch_vsepp.text")
    enc = vsepp.VSEPPTextEncoder(["a", "kite"], word_dim=4, hidden_dim=4)
    assert vocab.token_coverage(enc, ["a kite", "a zebra"]).unknown == 1


# --- the check -----------------------------------------------------------------------------

def test_check_captions_warns_above_5_percent_and_refuses_above_20_unless_allowed():
    model = xmatch.build(bigru_spec(["a", "red", "kite", "zebra", "beside", "and", "."]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert vocab.check_captions(model, CAPTIONS[:2], "training").unknown == 0
    # "two zebras" is all unknown (2 of 17 tokens: 11.8 %): warned twice, not refused
    with pytest.warns(vocab.UnknownWordsWarning) as caught:
        assert vocab.check_captions(model, CAPTIONS, "training").unknown == 2
    first, second = (str(w.message) for w in caught)
    assert first.startswith("1 of the 4 training captions have no token")
    assert second.startswith("the training captions do not fit the text encoder 'bigru': 11.8% of 17 tokens unknown")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        vocab.check_captions(model, CAPTIONS[:2] * 2 + ["a zebra kite ?"], "training")  # 1 of 30: under 5 %
    small = xmatch.build(bigru_spec(["a", "red", "kite"]))
    with pytest.warns(vocab.UnknownWordsWarning, match=r"no token"), pytest.raises(vocab.UnknownWordsError) as err:
        vocab.check_captions(small, CAPTIONS, "training")
    message = str(err.value)
    for part in ("training captions", "'bigru'", "41.2% of 17 tokens unknown", "'zebra' (2)", "--build-text-side",
                 "--allow-unknown-words"):
        assert part in message, part
    with pytest.warns(vocab.UnknownWordsWarning) as caught:
        assert vocab.check_captions(small, CAPTIONS, "training", allow=True).unknown == 7
    assert "41.2% of 17 tokens unknown" in str(caught[-1].message)
    with pytest.warns(vocab.UnknownWordsWarning, match="no token"), pytest.raises(vocab.UnknownWordsError):
        vocab.check_captions(model, CAPTIONS, "training", error_above=0.1)


def test_check_captions_measures_an_even_sample_of_large_sets(monkeypatch):
    monkeypatch.setattr(vocab, "MAX_MEASURED", 10)
    model = xmatch.build(bigru_spec(["a"]))
    with pytest.raises(vocab.UnknownWordsError, match=r"measured on 10 of 1,000"):
        vocab.check_captions(model, ["a kite"] * 1000, "training")


def test_check_captions_skips_encoders_without_an_unknown_token():
    assert vocab.check_captions(torch.nn.Linear(1, 1), CAPTIONS, "training") is None


# --- building -------------------------------------------------------------------------------

def test_build_vocabulary_keeps_frequent_words_and_records_what_it_did(tmp_path):
    side = build_vocabulary(CAPTIONS, tmp_path, min_count=2)
    assert Vocabulary.load(tmp_path / "vocab.json").words == ["<pad>", "<unk>", "a", "kite", "red", "zebra"]
    assert (side.words, side.distinct_words, side.min_count, side.captions, side.longest) == (4, 9, 2, 4, 7)
    side.save()
    assert TextSide.load(tmp_path) == side
    assert "5 of 9 distinct words seen fewer than 2 times left out" in side.summary()
    with pytest.raises(ValueError, match="no word .* seen 9\\+ times"):
        build_vocabulary(CAPTIONS, tmp_path / "none", min_count=9)


def test_build_text_side_for_a_word_level_zoo_entry_gives_the_spec_overrides(tmp_path):
    side = vocab.build_text_side("teran-mrsw-scenes", CAPTIONS, tmp_path / "ts")
    assert side.spec_overrides == {"text_encoder": {"vocab": str(tmp_path / "ts" / "vocab.json")}}
    assert side.min_count == 1  # bigru's own default
    model = xmatch.build("teran-mrsw-scenes", **side.spec_overrides)
    assert vocab.token_coverage(model, CAPTIONS).unknown == 0
    assert TextSide.load(tmp_path / "ts").spec_overrides == side.spec_overrides
    # max_length reaches an RNN encoder as its truncation limit
    side = vocab.build_text_side("teran-mrsw-scenes", CAPTIONS, tmp_path / "ml", max_length=5)
    assert side.spec_overrides["text_encoder"]["max_length"] == 5


def test_build_text_side_for_a_plugin_encoder_uses_its_min_count(tmp_path):
    pytest.importorskip("xmatch_vsepp")
    side = vocab.build_text_side("vsepp-precomp-coco", ["a kite"] * 4 + ["a zebra"] * 3, tmp_path)
    assert side.min_count == 4 and Vocabulary.load(side.directory / "vocab.json").words == ["<pad>", "<unk>", "a", "kite"]
    model = xmatch.build("vsepp-precomp-coco", **side.spec_overrides)
    assert vocab.token_coverage(model, ["a zebra"]).unknown == 1


def test_word_level_bert_tokenizer_from_captions(tmp_path):
    side = vocab.build_text_side("tern-scenes", CAPTIONS, tmp_path)
    # BERT splits off the full stop: the longest caption is 7 words + [CLS] + [SEP]
    assert (side.kind, side.longest, side.max_length) == ("tokenizer", 9, 16)
    assert side.spec_overrides["text_encoder"] == {"backbone": str(tmp_path / "text_encoder"), "pretrained": False}
    model = xmatch.build("tern-scenes", **side.spec_overrides)
    config = model.text_encoder.model.config
    assert (config.vocab_size, config.max_position_embeddings, config.hidden_size) == (5 + side.words, 16, 128)
    batch = model.tokenize(["a zebra beside a red kite."])
    assert batch.mask.sum().item() == 9  # one token per word
    assert vocab.token_coverage(model, CAPTIONS).unknown == 0
    assert vocab.token_coverage(model, ["a giraffe"]).unknown_words == [("giraffe", 1)]
    assert vocab.build_text_side("tern-scenes", CAPTIONS, tmp_path / "b", max_length=40).max_length == 40
    assert math.ceil(side.longest / 8) * 8 == side.max_length


def test_a_pretrained_bert_keeps_its_own_vocabulary(tmp_path, fixture_bert):
    spec = tiny_spec(fixture_bert)
    spec["text_encoder"]["pretrained"] = True
    with pytest.raises(ValueError, match="pretrained weights .* text_encoder.pretrained = false"):
        vocab.build_text_side(spec, CAPTIONS, tmp_path)


def test_an_encoder_without_a_vocabulary_argument_has_nothing_to_build(tmp_path, monkeypatch):
    from xmatch.model.interfaces import TextEncoder
    from xmatch.core.registry import text_encoders

    class Chars(TextEncoder):
        def __init__(self, width: int = 4) -> None:
            super().__init__()

    real_get = text_encoders.get
    monkeypatch.setattr(text_encoders, "get", lambda name: Chars if name == "bigru" else real_get(name))
    with pytest.raises(ValueError, match="no word-level text side"):
        vocab.build_text_side({**bigru_spec([]), "text_encoder": {"name": "bigru"}}, CAPTIONS, tmp_path)


# --- the run folder ---------------------------------------------------------------------------

def test_a_run_builds_its_text_side_once_and_a_resume_keeps_it(tmp_path):
    run = tmp_path / "run"
    side = vocab.run_text_side("teran-mrsw-scenes", CAPTIONS, run)
    assert side.directory == run / "text_side" and (run / "text_side" / "vocab.json").is_file()
    # the same command again (e.g. after a data check refused the first start): the same text side
    assert vocab.run_text_side("teran-mrsw-scenes", CAPTIONS, run) == side
    with pytest.raises(ValueError, match="text side of an earlier run"):
        vocab.run_text_side("teran-mrsw-scenes", ["other words"], run)
    # a resumed run keeps what it started with, whatever the captions say now
    assert vocab.run_text_side("teran-mrsw-scenes", ["other words"], run, resume=True) == side
    (run / "run.json").write_text("{}")
    with pytest.raises(RunFolderError, match="not empty"):
        vocab.run_text_side("teran-mrsw-scenes", CAPTIONS, run)
    replaced = vocab.run_text_side("teran-mrsw-scenes", ["other words"], run, overwrite=True)
    assert replaced.words == 2 and not (run / "run.json").exists()
    with pytest.raises(ValueError, match="trained weights of 'local-dir:x'"):
        vocab.run_text_side("local-dir:x", CAPTIONS, tmp_path / "other")


# --- training and evaluation ------------------------------------------------------------------

@pytest.fixture
def learnable(tmp_path) -> Path:
    return write_learnable_precomp(tmp_path / "data", "train", 8, seed=1)


def test_the_trainer_refuses_captions_its_text_side_cannot_read(learnable, tmp_path):
    data = PrecompDataset(learnable, "train", boxes_normalized=True)
    model = xmatch.build(bigru_spec(["a", "with", "and"]))  # none of the concept words
    with pytest.raises(vocab.UnknownWordsError, match=r"training captions .* 37.5% of 320 tokens unknown"):
        Trainer(model, data, TrainConfig(epochs=1), run_dir=tmp_path / "run", progress=False)
    with pytest.warns(vocab.UnknownWordsWarning, match="37.5%"):
        check_data_fits(model, data, "training", allow_unknown_words=True)
    with pytest.warns(vocab.UnknownWordsWarning, match="37.5%"):
        Trainer(model, data, TrainConfig(epochs=1, allow_unknown_words=True), run_dir=tmp_path / "run", progress=False)
    fitting = xmatch.build(bigru_spec(["a", "with", "and", *CONCEPTS]))
    with warnings.catch_warnings():
        warnings.simplefilter("error", vocab.UnknownWordsWarning)
        check_data_fits(fitting, data, "training")


def test_recipe_keys_of_the_text_side_are_checked():
    config = TrainConfig.from_mapping({"build_text_side": True, "text_min_count": 2, "allow_unknown_words": True})
    assert (config.build_text_side, config.text_min_count, config.allow_unknown_words) == (True, 2, True)
    with pytest.raises(ValueError, match="text_min_count: must be at least 1"):
        TrainConfig(text_min_count=0)


def test_vocab_command_measures_then_builds(learnable, tmp_path, capsys):
    spec_file = tmp_path / "tiny.toml"
    import tomli_w

    spec_file.write_text(tomli_w.dumps(bigru_spec(["a", "with", "and"])))
    base = ["vocab", str(spec_file), "--data", str(learnable), "--dataset", "scan-precomp",
            "--data-option", "boxes_normalized=true"]
    assert main(base) == 0
    out = capsys.readouterr().out
    assert "text encoder 'bigru'; train split: 40 captions" in out
    assert "37.5% of 320 tokens unknown" in out and "--out DIR" in out
    assert main([*base, "--out", str(tmp_path / "ts"), "--min-count", "25"]) == 0
    out = capsys.readouterr().out
    # "a" is seen 80 times, "with" and "and" 40, each concept at most 20
    assert "built a word vocabulary of 3 words (10 of 13 distinct words seen fewer than 25 times left out)" in out
    assert "under the new text side: 37.5% of 320 tokens unknown" in out
    assert f"--model-set text_encoder.vocab={tmp_path / 'ts' / 'vocab.json'}" in out
    assert json.loads((tmp_path / "ts" / "text_side.json").read_text())["min_count"] == 25


def test_eval_command_refuses_a_model_whose_vocabulary_does_not_fit(learnable, tmp_path, capsys):
    write_learnable_precomp(learnable, "test", 4, seed=3)
    xmatch.save_pretrained(xmatch.build(bigru_spec(["a", "with", "and"])), tmp_path / "bundle")
    args = ["eval", f"local-dir:{tmp_path / 'bundle'}", "--data", str(learnable), "--dataset", "scan-precomp",
            "--split", "test", "--data-option", "boxes_normalized=true"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "xmatch eval: the test split captions do not fit the text encoder 'bigru'" in err
    assert "evaluate a model trained on captions like these" in err and "--allow-unknown-words." in err
    with pytest.warns(vocab.UnknownWordsWarning):
        assert main([*args, "--allow-unknown-words"]) == 0
    assert "rsum" in capsys.readouterr().out
