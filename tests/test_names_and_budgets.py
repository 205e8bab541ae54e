"""One name rule for every id (index ids, the pictures of ``xmatch index --images``, extract's
names), the pixel budget for query pictures, and links out of a picture folder listed as skipped."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch

import xmatch
import xmatch.index
from xmatch.index import SearchIndexError
from xmatch.index.photos import index_images
from xmatch.index.synthetic import scoring_model

from conftest import tiny_spec

Image = pytest.importorskip("PIL.Image")

DIM = 16
SMALL = {"name": "timm-grid", "backbone": "test_efficientnet", "image_size": 96, "layers": 1, "ff_dim": 32}
#: ids that are not relative paths of plain names, and what the refusal says about each
BAD_IDS = [
    ("new\nline", "control character"),
    ("tab\there", "control character"),
    ("../up", "'..'"),
    ("a/../b", "'..'"),
    ("/abs/olute", "absolute"),
    ("a//b", "empty"),
    ("a/", "empty"),
    ("./a", "'.'"),
    ("back\\slash", "would lead out of the folder"),
    ("C:", "would lead out of the folder"),
    ("x" * 10_000, "longer than"),
    ("a/" + "y" * 256, "longer than a file name can be"),
    ("/".join(["abcdefghi"] * 410), "longer than a path can be (4096 bytes)"),
    ("", "non-empty"),
]


def tokens(n: int, seed: int = 0) -> xmatch.Embeddings:
    """``n`` unit token sets of 3 tokens with pooled vectors, as the scoring model's images."""
    g = torch.Generator().manual_seed(seed)
    return xmatch.Embeddings(torch.nn.functional.normalize(torch.randn(n, 3, DIM, generator=g), dim=-1),
                      torch.ones(n, 3, dtype=torch.bool), torch.nn.functional.normalize(torch.randn(n, DIM, generator=g), dim=-1))


@pytest.mark.parametrize("engine", ["faiss", pytest.param("qdrant", marks=pytest.mark.skipif(
    __import__("importlib").util.find_spec("qdrant_edge") is None, reason="needs qdrant-edge-py"))])
def test_add_refuses_an_id_that_is_not_a_plain_name_and_writes_nothing(tmp_path, engine):
    pytest.importorskip("faiss")
    index = xmatch.index.create(tmp_path / "idx", scoring_model("MrSw", DIM), engine=engine, dtype="float32")
    good = ["trip/beach.jpg", 7, "900#2", "été/photo 1.png", "a" * 255, "/".join(["abcdefghi"] * 409)]
    index.add(tokens(len(good)), ids=good)
    before = sorted(p.relative_to(index.root).as_posix() for p in index.root.rglob("*"))
    for bad, rule in BAD_IDS:
        with pytest.raises(SearchIndexError, match=rf"{index.root}: item 1 of the batch: the id ") as info:
            index.add(tokens(2, seed=1), ids=["fine", bad])
        message = str(info.value)
        assert rule in message and len(message) < 800, bad[:40]  # the rule, and the id cut short
        if bad:
            assert repr(bad[:20])[:-1] in message, bad[:40]
    assert sorted(p.relative_to(index.root).as_posix() for p in index.root.rglob("*")) == before
    assert index.ids == [str(i) for i in good]
    index.close()
    again = xmatch.index.open(tmp_path / "idx")
    assert again.ids == [str(i) for i in good]
    again.close()


@pytest.fixture(scope="module")
def pixel_bundle(fixture_bert, tmp_path_factory):
    pytest.importorskip("faiss")
    pytest.importorskip("timm")
    torch.manual_seed(0)
    model = xmatch.build(tiny_spec(fixture_bert, image_encoder=SMALL)).eval()
    bundle = tmp_path_factory.mktemp("pixel") / "pixel-model"
    xmatch.save_pretrained(model, bundle)
    return model, bundle


def picture(path, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 256, size=(48, 64, 3), dtype=np.uint8)).save(path)


def test_picture_names_that_are_not_plain_and_links_out_are_skipped_and_listed(tmp_path, pixel_bundle):
    model, _ = pixel_bundle
    photos = tmp_path / "photos"
    (photos / "trip").mkdir(parents=True)
    picture(photos / "a.png")
    picture(photos / "trip" / "b.png", 1)
    picture(photos / "new\nline.png", 2)
    picture(tmp_path / "secret.png", 3)
    (photos / "out.png").symlink_to(tmp_path / "secret.png")
    (photos / "in.png").symlink_to(photos / "a.png")  # a link that stays inside is indexed
    index = xmatch.index.create(tmp_path / "idx", model, dtype="float32")
    added, skipped = index_images(index, photos, progress=False)
    assert added == 3 and sorted(index.ids) == ["a.png", "in.png", "trip/b.png"]
    why = dict(skipped)
    assert sorted(why) == ["new\nline.png", "out.png"]
    assert "control character" in why["new\nline.png"]
    assert "a link out of the folder" in why["out.png"] and str(tmp_path / "secret.png") in why["out.png"]


def test_cli_lists_skipped_names_and_links_on_one_line_each(tmp_path, capsys, pixel_bundle):
    from xmatch.cli.main import main

    _, bundle = pixel_bundle
    photos = tmp_path / "photos"
    photos.mkdir()
    picture(photos / "a.png")
    picture(photos / "new\nline.png", 1)
    picture(tmp_path / "secret.png", 2)
    (photos / "out.png").symlink_to(tmp_path / "secret.png")
    out = tmp_path / "idx"
    assert main(["index", f"local-dir:{bundle}", "--images", str(photos), "--out", str(out), "--no-progress"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert any(line.startswith("skipped 'new\\nline.png': ") and "control character" in line for line in err)
    assert any(line.startswith("skipped out.png: a link out of the folder") for line in err)
    assert "xmatch index: 2 pictures were skipped and are not in the index." in err
    assert xmatch.index.open(out).ids == ["a.png"]


def test_index_max_pixels_sets_the_picture_budget(tmp_path, capsys, pixel_bundle):
    from xmatch.cli.main import main

    _, bundle = pixel_bundle
    photos = tmp_path / "photos"
    photos.mkdir()
    picture(photos / "a.png")
    picture(photos / "b.png", 1)
    out = tmp_path / "idx"
    assert main(["index", f"local-dir:{bundle}", "--images", str(photos), "--out", str(out), "--no-progress",
                 "--max-pixels", "1000"]) == 0
    err = capsys.readouterr().err
    assert "skipped a.png: " in err and "over the budget of 0.001 megapixels" in err
    assert "raise the budget (xmatch index --max-pixels 3072" in err
    assert main(["index", f"local-dir:{bundle}", "--out", str(tmp_path / "other"), "--max-pixels", "1000"]) == 2
    assert "--max-pixels is the picture budget of --images DIR" in capsys.readouterr().err


def forbid_decoding(monkeypatch) -> None:
    """Decoding any picture's pixels from now on fails the test: a refusal must come from the header."""
    from PIL import ImageFile

    def load(self, *args, **kwargs):
        raise AssertionError(f"{getattr(self, 'filename', 'a picture')} was decoded")

    monkeypatch.setattr(ImageFile.ImageFile, "load", load)
    monkeypatch.setattr(Image.Image, "load", load)


def caption_index(path, model, bundle):
    """A caption index of the pixel model, searched with --image queries."""
    index = xmatch.index.create(path, model, side="texts", model_ref=f"local-dir:{bundle}", dtype="float32")
    index.add(["a dog on a beach", "a red car"], ids=["dog", "car"])
    index.close()
    return path


def test_a_huge_query_picture_is_refused_from_its_header(tmp_path, capsys, pixel_bundle, monkeypatch):
    from xmatch.cli.main import main

    out = caption_index(tmp_path / "idx", *pixel_bundle)
    huge = tmp_path / "huge.png"
    Image.new("1", (12_000, 12_000)).save(huge)  # 144 megapixels in a few kilobytes
    assert huge.stat().st_size < 100_000
    capsys.readouterr()
    forbid_decoding(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not even Pillow's decompression-bomb warning: the budget speaks first
        assert main(["search", str(out), "--image", str(huge), "-k", "1"]) == 2
    err = capsys.readouterr().err
    assert f"{huge} is 12000x12000 = 144 megapixels, over the budget of 50 megapixels" in err
    assert "xmatch search --max-pixels 144000000" in err and "was decoded" not in err
    index = xmatch.index.open(out)
    with pytest.raises(xmatch.io.pictures.ImageTooLargeError, match="144 megapixels"), \
            pytest.warns(Image.DecompressionBombWarning):  # the Python path: the header is read as Pillow opens it
        index.search_images(xmatch.PixelInputs([huge]), k=1)
    index.close()


def test_search_max_pixels_sets_the_query_budget(tmp_path, capsys, pixel_bundle):
    from xmatch.cli.main import main

    out = caption_index(tmp_path / "idx", *pixel_bundle)
    photos = tmp_path / "photos"
    photos.mkdir()
    picture(photos / "a.png")
    assert main(["search", str(out), "--image", str(photos / "a.png"), "-k", "1", "--max-pixels", "1000"]) == 2
    assert "is 64x48 = 0.003072 megapixels, over the budget of 0.001 megapixels" in capsys.readouterr().err
    assert main(["search", str(out), "--image", str(photos / "a.png"), "-k", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["hits"][0]["id"] in ("dog", "car")


def test_extract_refuses_a_picture_name_that_is_not_plain(tmp_path):
    from xmatch.extract.captions import CaptionsError, read_records

    photos = tmp_path / "photos"
    photos.mkdir()
    picture(photos / "a.png")
    picture(photos / "back\\slash.png", 1)  # a plain file name on Linux, a path on Windows
    with pytest.raises(CaptionsError, match=r"image 'back\\\\slash.png'.* is not a plain relative name"):
        read_records(photos, None)
