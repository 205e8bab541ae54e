"""An index records the folder its pictures were read from (``xmatch index --images DIR``, a
dataset's folder of pictures), and ``xmatch serve INDEX`` shows them without ``--images``
(issue 40: ``xmatch demo && xmatch index ... --out idx && xmatch serve idx`` shows a page with
its pictures); ``--images`` overrides, an index without the record opens as before."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

import xmatch
import xmatch.index
from xmatch.cli.main import main
from xmatch.index.errors import DamagedIndexError
from xmatch.index.synthetic import scoring_model

from conftest import tiny_spec

pytest.importorskip("faiss")

SMALL = {"name": "timm-grid", "backbone": "test_efficientnet", "image_size": 96, "layers": 1, "ff_dim": 32}
#: the tiny scenes preset with a random test backbone: two test images, generated in seconds
SCENES = ["--dataset", "scenes", "--data-option", "size=tiny", "--data-option", "backbone=test_efficientnet",
          "--data-option", "weights=random", "--data-option", "generate=true"]


def recorded(index: Path) -> dict | None:
    return json.loads((index / "index.json").read_text()).get("pictures")


def photos(root: Path, names: tuple[str, ...] = ("a.png", "trip/b.png")) -> Path:
    """A folder of small pictures (two, one in a subfolder)."""
    from PIL import Image

    for k, name in enumerate(names):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (40 + 10 * k, 30), (200, 30 * k, 0)).save(root / name)
    return root


@pytest.fixture(scope="module")
def pixel_bundle(tmp_path_factory, fixture_bert) -> Path:
    """A tiny random model that reads pixels, saved as ``local-dir:`` reads it."""
    pytest.importorskip("timm")
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("model") / "tiny-grid"
    xmatch.save_pretrained(xmatch.build(tiny_spec(fixture_bert, image_encoder=SMALL)).eval(), folder)
    return folder


@pytest.fixture(scope="module")
def picture_index(tmp_path_factory, pixel_bundle) -> tuple[Path, Path]:
    """``(index, picture folder)``: ``xmatch index --images`` run from the folder's parent with
    a relative path, as a person types it."""
    root = tmp_path_factory.mktemp("pictures")
    photos(root / "photos")
    here = os.getcwd()
    os.chdir(root)
    try:
        assert main(["index", f"local-dir:{pixel_bundle}", "--images", "photos/../photos", "--out", "idx",
                     "--no-progress"]) == 0
    finally:
        os.chdir(here)
    return root / "idx", root / "photos"


@pytest.fixture(scope="module")
def scenes_index(tmp_path_factory) -> tuple[Path, Path]:
    """``(index, scenes folder)``: the tiny scenes' test split indexed with a region model."""
    pytest.importorskip("sklearn")
    root = tmp_path_factory.mktemp("scenes")
    bundle = root / "tiny-model"
    xmatch.save_pretrained(scoring_model("MrSw", 256), bundle)
    assert main(["index", f"local-dir:{bundle}", *SCENES, "--data", str(root / "data"), "--out", str(root / "idx"),
                 "--no-progress"]) == 0
    return root / "idx", next((root / "data").glob("scenes-tiny-*"))


# --- what xmatch index records -------------------------------------------------------------------


def test_the_folder_given_with_images_is_recorded_resolved(picture_index, tmp_path):
    index, folder = picture_index
    assert recorded(index) == {"root": str(folder.resolve())}
    assert xmatch.index.open(index).pictures == folder.resolve()
    assert main(["index", "--from-index", str(index), "--out", str(tmp_path / "copied"), "--no-progress"]) == 0
    assert recorded(tmp_path / "copied") == recorded(index)  # the same ids: the same pictures


def test_a_scenes_index_records_the_scenes_folder(scenes_index):
    index, folder = scenes_index
    assert recorded(index) == {"root": str(folder.resolve())}
    opened = xmatch.index.open(index)
    assert opened.pictures == folder.resolve() and len(opened) == 2
    assert all((folder / "images" / f"{i}.png").is_file() for i in opened.ids)  # the ids' pictures are there


def test_a_folder_extracted_from_pictures_records_the_pictures_folder(tmp_path, fixture_bert):
    """``xmatch extract photos/ --out feats`` records where it read the pictures; an index of
    ``feats`` read alone (its ids are the pictures' paths) records that folder."""
    pytest.importorskip("timm")
    from test_index_extracted_photos import extracted

    feats = extracted(tmp_path, captions=False)
    torch.manual_seed(0)
    spec = tiny_spec(fixture_bert, image_encoder={"name": "bottomup", "feature_dim": 256, "layers": 1, "ff_dim": 32})
    xmatch.save_pretrained(xmatch.build(spec).eval(), tmp_path / "teran")
    assert main(["index", f"local-dir:{tmp_path / 'teran'}", "--data", str(feats), "--out", str(tmp_path / "idx"),
                 "--no-progress"]) == 0
    assert recorded(tmp_path / "idx") == {"root": str((tmp_path / "photos").resolve())}


def test_a_dataset_without_pictures_records_nothing(tmp_path):
    from xmatch.index.photos import dataset_pictures

    class Features:  # a region-feature dataset whose pictures are nowhere on disk
        root = tmp_path
        image_names = ["1", "2"]

    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "1.png").write_bytes(b"")  # one picture of two is not a picture folder
    assert dataset_pictures(Features()) is None
    (tmp_path / "images" / "2.jpg").write_bytes(b"")
    assert dataset_pictures(Features()) == tmp_path.resolve()


def test_an_append_keeps_the_record_and_an_old_index_gets_one(picture_index, pixel_bundle, tmp_path, capsys):
    index, folder = picture_index
    copy = tmp_path / "idx"
    assert main(["index", "--copy", str(index), "--out", str(copy)]) == 0
    more = photos(tmp_path / "more", ("a.png", "trip/b.png", "c.png"))
    assert main(["index", "--images", str(more), "--out", str(copy), "--append", "--no-progress"]) == 0
    said = capsys.readouterr()
    assert "indexed 1 images" in said.out and f"xmatch serve {copy} --images DIR" in said.err
    assert recorded(copy) == {"root": str(folder.resolve())}  # the first folder stays: its ids are paths in it

    old = json.loads((copy / "index.json").read_text())
    del old["pictures"]
    (copy / "index.json").write_text(json.dumps(old))  # as written before the record existed
    assert main(["index", "--images", str(folder), "--out", str(copy), "--append", "--no-progress"]) == 0
    assert recorded(copy) is None  # c.png is not in that folder: it is not the index's picture folder
    assert f"records no picture folder: {folder} does not hold the picture of every item" in capsys.readouterr().err
    assert main(["index", "--images", str(more), "--out", str(copy), "--append", "--no-progress"]) == 0
    assert recorded(copy) == {"root": str(more.resolve())}  # every item's picture is there


def test_an_index_without_the_record_opens_and_a_bad_record_is_named(picture_index, tmp_path):
    from xmatch.index.store import read_manifest

    manifest = json.loads((picture_index[0] / "index.json").read_text())
    old = {key: value for key, value in manifest.items() if key != "pictures"}
    (tmp_path / "index.json").write_text(json.dumps(old))
    assert "pictures" not in read_manifest(tmp_path)
    for bad in ({"root": "photos"}, {"root": 3}, "photos", {}):
        (tmp_path / "index.json").write_text(json.dumps(old | {"pictures": bad}))
        with pytest.raises(DamagedIndexError, match="'pictures' must be"):
            read_manifest(tmp_path)


def test_an_old_index_opens_and_serves_without_pictures(picture_index, tmp_path):
    pytest.importorskip("fastapi")
    from xmatch.serve.service import open_service

    import shutil

    shutil.copytree(picture_index[0], tmp_path / "idx")
    manifest = json.loads((tmp_path / "idx" / "index.json").read_text())
    del manifest["pictures"]
    (tmp_path / "idx" / "index.json").write_text(json.dumps(manifest))
    index = xmatch.index.open(tmp_path / "idx")
    assert index.pictures is None and len(index) == 2 and index.search_texts(["a red square"], k=1)[0].ids
    service = open_service(tmp_path / "idx")
    try:
        assert service.pictures.root is None
    finally:
        service.close()


# --- what xmatch serve does with it --------------------------------------------------------------


def test_serve_shows_the_recorded_pictures_without_images(picture_index, scenes_index):
    from test_serve_api import live
    from xmatch.serve.service import open_service

    index, folder = picture_index
    with live(open_service(index)) as client:
        assert client.get("/card").json()["pictures"] is True
        assert client.get("/items/trip/b.png/thumbnail").status_code == 200
    scenes, _ = scenes_index
    item = xmatch.index.open(scenes).ids[0]
    with live(open_service(scenes)) as client:  # a dataset's folder: the scenes keep images/ID.png
        got = client.get(f"/items/{item}/thumbnail")
        assert got.status_code == 200 and got.headers["content-type"] == "image/jpeg"


def test_images_overrides_the_recorded_folder(picture_index, tmp_path):
    pytest.importorskip("fastapi")
    from xmatch.serve.limits import RequestError
    from xmatch.serve.service import open_service

    (tmp_path / "elsewhere").mkdir()
    service = open_service(picture_index[0], tmp_path / "elsewhere")
    try:
        assert service.pictures.root == tmp_path / "elsewhere"
        with pytest.raises(RequestError, match="no picture for the item 'a.png' in"):
            service.thumbnail("a.png")
    finally:
        service.close()


def test_a_link_out_of_the_recorded_folder_is_refused(picture_index, tmp_path):
    pytest.importorskip("fastapi")
    import shutil

    from xmatch.serve.limits import RequestError
    from xmatch.serve.service import open_service

    index, folder = picture_index
    shutil.copytree(index, tmp_path / "idx")
    shutil.copytree(folder, tmp_path / "photos")
    manifest = json.loads((tmp_path / "idx" / "index.json").read_text())
    (tmp_path / "idx" / "index.json").write_text(json.dumps(manifest | {"pictures": {"root": str(tmp_path / "photos")}}))
    (tmp_path / "photos" / "a.png").rename(tmp_path / "outside.png")
    (tmp_path / "photos" / "a.png").symlink_to(tmp_path / "outside.png")
    service = open_service(tmp_path / "idx")
    try:
        assert service.thumbnail("trip/b.png")
        with pytest.raises(RequestError, match="leads out of the picture folder") as refused:
            service.thumbnail("a.png")
        assert refused.value.status == 403
    finally:
        service.close()


@pytest.fixture()
def served(monkeypatch) -> list[tuple]:
    """``xmatch serve`` run up to the server, which is not started: the apps it would serve."""
    uvicorn = pytest.importorskip("uvicorn")
    pytest.importorskip("fastapi")
    apps: list[tuple] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: apps.append((app, kwargs)))
    return apps


def test_the_command_uses_the_recorded_folder_or_says_it_is_gone(picture_index, tmp_path, served, capsys):
    import shutil

    index, folder = picture_index
    assert main(["serve", str(index)]) == 0 and len(served) == 1
    err = capsys.readouterr().err
    assert f"pictures from {folder.resolve()}" in err and "no --images" not in err

    shutil.copytree(index, tmp_path / "idx")
    shutil.copytree(folder, tmp_path / "photos")
    manifest = json.loads((tmp_path / "idx" / "index.json").read_text())
    (tmp_path / "idx" / "index.json").write_text(json.dumps(manifest | {"pictures": {"root": str(tmp_path / "gone")}}))
    assert main(["serve", str(tmp_path / "idx")]) == 0
    err = capsys.readouterr().err
    assert f"{tmp_path / 'gone'}, which is not a folder" in err and "--images DIR" in err
    assert main(["serve", str(tmp_path / "idx"), "--images", str(tmp_path / "photos")]) == 0
    err = capsys.readouterr().err
    assert "gone" not in err and "warning" not in err
