"""A folder of photos extracted without captions (``xmatch extract photos/ --out feats``) indexed
for text search by a region model (``xmatch index MODEL --data feats``), each hit naming its
picture; training, evaluation and a caption index still refuse images without captions, and
a captioned folder indexes as before (issue 28, part 3)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import xmatch
import xmatch.index
from xmatch.cli.main import main
from xmatch.data import open_dataset
from xmatch.data import NoCaptionsError
from xmatch.index.build import index_dataset

from conftest import tiny_spec
from test_extract import CLI_PIPE, SIZES, make_photos

pytest.importorskip("faiss")
pytest.importorskip("timm")

PICTURES = sorted(SIZES)  # a.png, b.jpg, ..., sub/c.png: paths inside the photo folder


def extracted(root: Path, captions: bool) -> Path:
    """``xmatch extract`` of the test photos (with or without their captions.csv) into ``root/feats``."""
    photos = make_photos(root / "photos", captions=captions)
    assert main(["extract", str(photos), "--out", str(root / "feats"), "--layout", "teran", "--workers", "0", *CLI_PIPE]) == 0
    return root / "feats"


@pytest.fixture(scope="module")
def bare(tmp_path_factory) -> Path:
    return extracted(tmp_path_factory.mktemp("bare"), captions=False)


@pytest.fixture(scope="module")
def captioned(tmp_path_factory) -> Path:
    return extracted(tmp_path_factory.mktemp("captioned"), captions=True)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory, fixture_bert) -> Path:
    """A tiny TERAN over the extracted 256-d regions, saved as ``local-dir:`` reads it."""
    torch.manual_seed(0)
    spec = tiny_spec(fixture_bert, image_encoder={"name": "bottomup", "feature_dim": 256, "layers": 1, "ff_dim": 32})
    folder = tmp_path_factory.mktemp("model") / "tiny-teran"
    xmatch.save_pretrained(xmatch.build(spec).eval(), folder)
    return folder


def test_images_read_alone_are_named_by_their_pictures_and_have_no_pairs(bare, captioned):
    alone = open_dataset("teran", bare, split="test", captions_per_image="0")  # as --data-option passes it
    assert sorted(alone.image_names) == PICTURES and alone.captions == [] and len(alone) == 0
    assert alone.captions_per_image == 0 and len(alone.caption_image) == 0
    with pytest.raises(ValueError, match="has no captions, so no training pairs"):
        alone.loader(2)
    assert len(alone.images) == 6 and alone.image(0).regions.shape == (6, 256)
    # a captioned folder read alone: the same images and features, named by their pictures, captions left out
    test = open_dataset("teran", captioned, split="test")
    pictures = open_dataset("teran", captioned, split="test", captions_per_image=0)
    assert pictures.image_names == ["e.png", "f.png"] and test.image_names != pictures.image_names
    assert len(test.captions) == 10 and pictures.captions == []
    for i in range(2):
        assert (pictures.image(i).regions == test.image(i).regions).all() and (pictures.image(i).boxes == test.image(i).boxes).all()
    with pytest.raises(ValueError, match=r"at least 1, None \(every caption\) or 0 \(the images alone\), got -1"):
        open_dataset("teran", bare, split="test", captions_per_image=-1)


def test_training_and_evaluation_still_refuse_images_without_captions(bare, bundle, capsys):
    for options in ({}, {"captions_per_image": None}, {"captions_per_image": 1}):
        with pytest.raises(NoCaptionsError, match="6 of the 6 images have no captions") as caught:
            open_dataset("teran", bare, split="test", **options)
        assert f"--out {bare} --captions FILE" in str(caught.value) and f"xmatch index MODEL --data {bare}" in str(caught.value)
        assert (caught.value.missing, caught.value.total) == (6, 6)
    assert main(["eval", f"local-dir:{bundle}", "--data", str(bare)]) == 2
    err = capsys.readouterr().err
    assert "have no captions" in err and "Training and evaluation need captions" in err


def test_a_captionless_folder_is_indexed_and_search_names_the_pictures(bare, bundle, tmp_path, capsys):
    out = tmp_path / "idx"
    assert main(["index", f"local-dir:{bundle}", "--data", str(bare), "--out", str(out), "--no-progress",
                 "--dtype", "float32"]) == 0
    printed = capsys.readouterr().out
    assert "dataset layout: teran" in printed and "6 of the 6 test images" in printed and "indexing the images alone" in printed
    assert "indexed 6 images" in printed
    index = xmatch.index.open(out)
    assert sorted(index.ids) == PICTURES
    # the ranking is the model's own over the extracted regions, each picture under its file name
    model = index.model
    alone = open_dataset("teran", bare, split="test", captions_per_image=0)
    batch = next(iter(alone.image_loader(6)))
    with torch.no_grad():
        scores = model.similarity(model.encode_images(batch.images), model.encode_texts(["a red car"]))[:, 0]
    best = [alone.image_names[i] for i in scores.topk(3).indices.tolist()]
    index.close()
    assert main(["search", str(out), "--text", "a red car", "-k", "3", "--json"]) == 0
    hits = json.loads(capsys.readouterr().out)[0]["hits"]
    assert [h["id"] for h in hits] == best
    assert [h["score"] for h in hits] == pytest.approx(scores.topk(3).values.tolist(), abs=1e-4)
    assert main(["search", str(out), "--text", "a red car", "-k", "1"]) == 0
    assert f"  {best[0]}\n" in capsys.readouterr().out  # the printed ranking names the file too
    # --append finds every picture indexed already
    assert main(["index", "--data", str(bare), "--out", str(out), "--append", "--no-progress"]) == 0
    assert "indexed 0 images" in capsys.readouterr().out


def test_a_caption_index_of_a_captionless_folder_names_the_problem_and_the_fix(bare, bundle, tmp_path, capsys):
    out = tmp_path / "idx"
    assert main(["index", f"local-dir:{bundle}", "--data", str(bare), "--side", "texts", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--side texts indexes captions, and 6 of the 6 test images" in err and "leave out --side texts" in err
    assert f"xmatch extract PICTURES --out {bare} --captions FILE" in err and not out.exists()
    # a number of captions asked for is kept: no images-only reading behind the user's back
    assert main(["index", f"local-dir:{bundle}", "--data", str(bare), "--data-option", "captions_per_image=5",
                 "--out", str(out)]) == 2
    assert "6 of the 6 images have no captions" in capsys.readouterr().err and not out.exists()
    # from Python: a caption index refuses a dataset without captions
    index = xmatch.index.create(out, xmatch.build(f"local-dir:{bundle}"), side="texts")
    with pytest.raises(ValueError, match="caption index and the dataset has no captions"):
        index_dataset(index, open_dataset("teran", bare, split="test", captions_per_image=0), progress=False)
    assert len(index) == 0


def test_a_captioned_folder_indexes_as_before(captioned, bundle, tmp_path, capsys):
    test = open_dataset("teran", captioned, split="test")
    for side, ids in (("images", test.image_names), ("texts", [f"{n}#{k}" for n in test.image_names for k in range(5)])):
        out = tmp_path / side
        assert main(["index", f"local-dir:{bundle}", "--data", str(captioned), "--side", side, "--out", str(out),
                     "--no-progress"]) == 0
        assert "indexing the images alone" not in capsys.readouterr().out
        index = xmatch.index.open(out)
        assert index.ids == ids  # the feature ids the captions refer to, as before
        index.close()
