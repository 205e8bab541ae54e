"""SCAN's text encoder: <start>/<end>, vocabulary rules, averaged Bi-GRU against a loop."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn
from xmatch.plugin import Vocabulary

from xmatch_scan import ScanBiGRUTextEncoder, load_original_vocab

WORDS = ["a", "dog", "on", "the", "bench", "cat", "red", "car"]


def test_start_and_end_surround_every_caption_and_take_part():
    enc = ScanBiGRUTextEncoder(WORDS, word_dim=8, hidden_dim=6)
    assert enc.vocabulary.words[:4] == ["<pad>", "<unk>", "<start>", "<end>"]
    batch = enc.tokenize(["a dog on the bench", "a zebra", "cat"])
    ids = batch.inputs["input_ids"].tolist()
    word = {w: i for i, w in enumerate(enc.vocabulary.words)}
    assert ids[0] == [2, word["a"], word["dog"], word["on"], word["the"], word["bench"], 3]
    assert ids[1] == [2, word["a"], 1, 3, 0, 0, 0]  # unknown word -> <unk>, then <pad>
    assert ids[2] == [2, word["cat"], 3, 0, 0, 0, 0]
    assert batch.mask.sum(1).tolist() == [7, 4, 3]
    assert torch.equal(batch.content, batch.mask)


def test_max_length_counts_words_without_the_markers():
    enc = ScanBiGRUTextEncoder(WORDS, word_dim=8, hidden_dim=6, max_length=2)
    with pytest.warns(UserWarning, match="truncated"):
        batch = enc.tokenize(["a red car"])
    assert batch.inputs["input_ids"].tolist() == [[2, enc.vocabulary.words.index("a"), enc.vocabulary.words.index("red"), 3]]


def test_words_are_the_mean_of_both_directions_like_a_per_caption_loop():
    torch.manual_seed(0)
    enc = ScanBiGRUTextEncoder(WORDS, word_dim=8, hidden_dim=6).double()
    batch = enc.tokenize(["a dog on the bench", "red car", "cat"])
    out = enc(batch)
    assert enc.output_dim == 6 and out.tokens.shape == (3, 7, 6)
    for k in range(3):
        n = int(batch.mask[k].sum())
        x = enc.embed(batch.inputs["input_ids"][k : k + 1, :n])
        full, _ = enc.rnn(x)  # unpadded: no packing needed
        expected = (full[..., :6] + full[..., 6:]) / 2
        torch.testing.assert_close(out.tokens[k, :n], expected[0], rtol=1e-12, atol=1e-12)
        if n < 7:  # padded positions come out as zeros
            assert out.tokens[k, n:].abs().max() == 0


def test_initialisation_is_the_originals():
    enc = ScanBiGRUTextEncoder([f"w{i}" for i in range(500)])
    table = enc.embed.weight[1:]  # row 0 is <pad>
    assert table.shape == (503, 300) and table.abs().max() <= 0.1 and table.abs().max() > 0.09
    assert isinstance(enc.rnn, nn.GRU) and enc.rnn.bidirectional and enc.rnn.hidden_size == 1024
    assert enc.rnn.num_layers == 1 and enc.rnn.input_size == 300


def test_vocabulary_from_captions_keeps_words_seen_four_times(tmp_path):
    captions = tmp_path / "train_caps.txt"
    captions.write_text("a dog\n" * 4 + "a cat\n" * 3 + "the dog\n")
    enc = ScanBiGRUTextEncoder(str(captions), word_dim=4, hidden_dim=4)
    assert enc.vocabulary.words == ["<pad>", "<unk>", "<start>", "<end>", "a", "dog"]
    assert ScanBiGRUTextEncoder(str(captions), min_count=1, word_dim=4, hidden_dim=4).vocabulary.words[4:] == ["a", "dog", "cat", "the"]


def test_original_vocab_json_keeps_its_word_order(tmp_path):
    words = ["<pad>", "<start>", "<end>", "<unk>", "zebra", "a", "dog"]
    path = tmp_path / "f30k_precomp_vocab.json"
    path.write_text(json.dumps({
        "word2idx": {w: i for i, w in enumerate(words)},
        "idx2word": {str(i): w for i, w in enumerate(words)},  # str keys after the JSON round trip
        "idx": len(words),
    }))
    expected = ["<pad>", "<unk>", "<start>", "<end>", "zebra", "a", "dog"]
    assert load_original_vocab(path).words == expected
    assert ScanBiGRUTextEncoder(str(path), word_dim=4, hidden_dim=4).vocabulary.words == expected
    bad = tmp_path / "other.json"
    bad.write_text(json.dumps({"word2idx": {"a": "zero"}}))
    with pytest.raises(ValueError, match="not a vocabulary of the original SCAN"):
        load_original_vocab(bad)


def test_saved_vocabulary_round_trips(tmp_path):
    enc = ScanBiGRUTextEncoder(WORDS, word_dim=4, hidden_dim=4)
    assert enc.save_assets(tmp_path) == {"vocab": "vocab.json"}
    assert Vocabulary.load(tmp_path / "vocab.json") == enc.vocabulary
    again = ScanBiGRUTextEncoder(str(tmp_path / "vocab.json"), word_dim=4, hidden_dim=4)
    assert again.vocabulary == enc.vocabulary


def test_missing_vocabulary_builds_but_cannot_tokenise(tmp_path):
    enc = ScanBiGRUTextEncoder(word_dim=4, hidden_dim=4)
    with pytest.raises(ValueError, match="has no vocabulary: every word would be <unk>"):
        enc.tokenize(["a dog"])
    with pytest.raises(FileNotFoundError, match="vocab='.*nowhere.txt' does not exist"):
        ScanBiGRUTextEncoder(str(tmp_path / "nowhere.txt"))
    enc = ScanBiGRUTextEncoder(WORDS, word_dim=4, hidden_dim=4)
    with pytest.raises(ValueError, match="captions \\[1\\] have no words"):
        enc.tokenize(["a dog", "   "])
    with pytest.raises(TypeError, match="list of strings"):
        enc.tokenize("a dog")
