"""`xmatch index MODEL --images DIR`: a folder of pictures indexed without captions, each hit
naming its file; unreadable pictures skipped and listed; resumable; region models refused with
the extract route."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import xmatch
import xmatch.index
from xmatch.index.photos import index_images
from xmatch.index.synthetic import scoring_model

from conftest import tiny_spec

pytest.importorskip("faiss")
pytest.importorskip("timm")
Image = pytest.importorskip("PIL.Image")

SMALL = {"name": "timm-grid", "backbone": "test_efficientnet", "image_size": 96, "layers": 1, "ff_dim": 32}


def photo_folder(root, n: int = 5):
    """``n`` pictures (one in a subfolder), a text file and a broken .jpg."""
    (root / "trip").mkdir(parents=True)
    rng = np.random.default_rng(0)
    names = [f"img{k}.png" for k in range(n - 1)] + ["trip/beach.jpg"]
    for name in names:
        Image.fromarray(rng.integers(0, 256, size=(64 + 8 * len(name), 80, 3), dtype=np.uint8)).save(root / name)
    (root / "notes.txt").write_text("not a picture")
    (root / "broken.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    return sorted(names)


@pytest.fixture(scope="module")
def pixel_model(fixture_bert) -> xmatch.MatchingModel:
    torch.manual_seed(0)
    return xmatch.build(tiny_spec(fixture_bert, image_encoder=SMALL)).eval()


def test_a_picture_folder_is_indexed_by_file_name_and_found_again(tmp_path, pixel_model):
    names = photo_folder(tmp_path / "photos")
    index = xmatch.index.create(tmp_path / "idx", pixel_model, dtype="float32")
    added, skipped = index_images(index, tmp_path / "photos", shard_size=2, progress=False)
    assert added == len(names) and sorted(index.ids) == names
    assert [name for name, _ in skipped] == ["broken.jpg"] and "not a readable image" in skipped[0][1]
    queries = xmatch.PixelInputs([Image.open(tmp_path / "photos" / n).convert("RGB") for n in names])
    with torch.no_grad():
        expected = pixel_model.similarity(pixel_model.encode_images(queries), pixel_model.encode_texts(["a dog on a beach"]))
    best = index.search_texts(["a dog on a beach"], k=1, exact=True)[0].hits[0]
    assert best.id == names[int(expected[:, 0].argmax())]
    assert len(index.store.shards) == 3  # 5 pictures, 2 per committed append
    assert index_images(index, tmp_path / "photos", resume=True, progress=False)[0] == 0


def test_a_region_model_is_sent_to_xmatch_extract(tmp_path):
    photo_folder(tmp_path / "photos")
    index = xmatch.index.create(tmp_path / "idx", scoring_model("MrSw", 16))
    with pytest.raises(xmatch.index.SearchIndexError, match="xmatch extract .*photos --out FEATURES"):
        index_images(index, tmp_path / "photos")


def test_an_empty_folder_is_named(tmp_path, pixel_model):
    (tmp_path / "empty").mkdir()
    index = xmatch.index.create(tmp_path / "idx", pixel_model)
    with pytest.raises(FileNotFoundError, match="no pictures in"):
        index_images(index, tmp_path / "empty")


def test_cli_indexes_a_picture_folder_and_search_prints_file_names(tmp_path, capsys, pixel_model):
    from xmatch.cli.main import main

    names = photo_folder(tmp_path / "photos")
    bundle = tmp_path / "pixel-model"
    xmatch.save_pretrained(pixel_model, bundle)
    out = tmp_path / "idx"
    assert main(["index", f"local-dir:{bundle}", "--images", str(tmp_path / "photos"), "--out", str(out), "--no-progress"]) == 0
    captured = capsys.readouterr()
    assert f"indexed {len(names)} images" in captured.out and "skipped broken.jpg" in captured.err
    assert main(["search", str(out), "--text", "a dog on a beach", "-k", "2", "--json"]) == 0
    hits = json.loads(capsys.readouterr().out)[0]["hits"]
    assert len(hits) == 2 and {h["id"] for h in hits} <= set(names)
    assert main(["index", f"local-dir:{bundle}", "--images", str(tmp_path / "photos"), "--out", str(tmp_path / "x"),
                 "--data", str(tmp_path)]) == 2
    assert "--images DIR indexes a folder of pictures" in capsys.readouterr().err


def test_a_clip_model_indexes_a_photo_folder_and_finds_by_its_cosine(tmp_path, capsys):
    """The issue's flow (`xmatch index clip-vit-b-32 --images photos/ --out idx && xmatch search
    idx --text "a cat"`), with a tiny CLIP of the entry's layout saved locally instead of the
    hub's weights."""
    from clip_assets import tiny_tower_overrides

    from xmatch.cli.main import main

    names = photo_folder(tmp_path / "photos")
    torch.manual_seed(0)
    model = xmatch.build("clip-vit-b-32", **tiny_tower_overrides("clip")).eval()
    bundle = tmp_path / "tiny-clip"
    xmatch.save_pretrained(model, bundle)
    out = tmp_path / "idx"
    assert main(["index", f"local-dir:{bundle}", "--images", str(tmp_path / "photos"), "--out", str(out), "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["search", str(out), "--text", "a cat", "-k", "3", "--json"]) == 0
    hits = json.loads(capsys.readouterr().out)[0]["hits"]
    pictures = [Image.open(tmp_path / "photos" / n).convert("RGB") for n in names]
    with torch.no_grad():
        cosine = model.similarity(model.encode_images(xmatch.PixelInputs(pictures)), model.encode_texts(["a cat"]))[:, 0]
    assert [h["id"] for h in hits] == [names[i] for i in cosine.topk(3).indices.tolist()]
    assert [h["score"] for h in hits] == pytest.approx(cosine.topk(3).values.tolist(), abs=2e-3)  # float16 storage


def test_search_names_the_query_words_the_model_does_not_know(tmp_path, capsys):
    from xmatch.cli.main import main

    index = xmatch.index.create(tmp_path / "idx", scoring_model("MrSw", 16))  # the scenes vocabulary
    g = torch.Generator().manual_seed(0)
    index.add(xmatch.RegionInputs(torch.randn(4, 3, 16, generator=g), torch.tensor([0.1, 0.1, 0.5, 0.5]).expand(4, 3, 4)))
    assert main(["search", str(tmp_path / "idx"), "--text", "a cat", "--text", "zebra giraffe", "--text", "a red circle",
                 "-k", "2"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2
    assert "1 of the 2 words of 'a cat' are unknown" in err[0] and "('cat')" in err[0]
    assert "no word of 'zebra giraffe' is known" in err[1] and "'zebra'" in err[1] and "'giraffe'" in err[1]


def test_bfloat16_encoding_stores_float32_embeddings_close_to_float32s(tmp_path, pixel_model):
    names = photo_folder(tmp_path / "photos")
    exact = xmatch.index.create(tmp_path / "fp32", pixel_model, dtype="float32")
    index_images(exact, tmp_path / "photos", progress=False)
    fast = xmatch.index.create(tmp_path / "bf16", pixel_model, dtype="float32")
    index_images(fast, tmp_path / "photos", progress=False, compute_dtype="bfloat16")
    a, b = exact.get(names), fast.get(names)
    assert b.tokens.dtype == torch.float32 and torch.equal(a.mask, b.mask)
    cosine = torch.nn.functional.cosine_similarity(a.tokens[a.mask], b.tokens[b.mask], dim=-1)
    assert cosine.min() > 0.98 and not torch.equal(a.tokens, b.tokens)  # bfloat16 arithmetic, not float32's
    # an unknown precision is refused before any picture is read or written
    empty = xmatch.index.create(tmp_path / "empty", pixel_model)
    with pytest.raises(ValueError, match="compute_dtype must be one of float32, bfloat16, got 'float16'"):
        index_images(empty, tmp_path / "photos", progress=False, compute_dtype="float16")
    assert len(empty) == 0
    # the command line takes it too
    from xmatch.cli.main import build_parser

    args = build_parser().parse_args(["index", "m", "--images", "photos", "--out", "idx", "--compute-dtype", "bfloat16"])
    assert args.compute_dtype == "bfloat16"
