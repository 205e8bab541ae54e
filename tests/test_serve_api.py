"""`xmatch serve` used as a client would: a tiny picture index behind a live uvicorn server on a
loopback port, asked over HTTP with httpx (search, card, thumbnails, alignments, the page, the
token, appends made by another index object)."""

from __future__ import annotations

import contextlib
import io
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

import xmatch
import xmatch.index
from xmatch.index.photos import index_images

from conftest import tiny_spec

pytest.importorskip("faiss")
pytest.importorskip("timm")
pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")
Image = pytest.importorskip("PIL.Image")

from xmatch.serve.app import create_app  # noqa: E402 - after the skips: it needs FastAPI
from xmatch.serve.limits import Limits  # noqa: E402
from xmatch.serve.service import SearchService, open_service  # noqa: E402

SMALL = {"name": "timm-grid", "backbone": "test_efficientnet", "image_size": 96, "layers": 1, "ff_dim": 32}
NAMES = ["img0.png", "img1.png", "img2.png", "trip/beach.png"]
QUERY = "a small dog on the red man"


def photo_folder(root: Path) -> list[str]:
    """:data:`NAMES`, pictures of random noise of different sizes."""
    rng = np.random.default_rng(0)
    for k, name in enumerate(NAMES):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, size=(60 + 10 * k, 80, 3), dtype=np.uint8)).save(root / name)
    return NAMES


@pytest.fixture(scope="module")
def pixel_model(fixture_bert) -> xmatch.MatchingModel:
    """A tiny random model that reads pixels (grid cells with boxes) and has a verifier head."""
    torch.manual_seed(0)
    return xmatch.build(tiny_spec(fixture_bert, image_encoder=SMALL, verifier={"name": "cross-attention"})).eval()


@pytest.fixture(scope="module")
def picture_index(tmp_path_factory, pixel_model) -> tuple[Path, Path]:
    """``(index folder, picture folder)``: the pictures indexed, the model saved in the index."""
    root = tmp_path_factory.mktemp("serve")
    photo_folder(root / "photos")
    index = xmatch.index.create(root / "idx", pixel_model, dtype="float32")
    index_images(index, root / "photos", progress=False)
    index.close()
    return root / "idx", root / "photos"


def free_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


@contextlib.contextmanager
def live(service: SearchService, token: str | None = None) -> Iterator[httpx.Client]:
    """A uvicorn server of ``service`` on a free loopback port, in a thread; an httpx client
    of it. The server is stopped (and the service closed) on exit."""
    sock = free_socket()
    server = uvicorn.Server(uvicorn.Config(create_app(service, token=token), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        for _ in range(1000):  # started within 10 s, or the test fails below
            if server.started:
                break
            threading.Event().wait(0.01)
        assert server.started, "the server did not start"
        with httpx.Client(base_url=f"http://127.0.0.1:{sock.getsockname()[1]}", timeout=60) as client:
            yield client
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()
        service.close()


@pytest.fixture(scope="module")
def client(picture_index) -> Iterator[httpx.Client]:
    idx, photos = picture_index
    with live(open_service(idx, photos, Limits(max_k=20, max_upload_bytes=200_000))) as c:
        yield c


def expected_order(model: xmatch.MatchingModel, photos: Path, text: str) -> list[str]:
    """The pictures ranked for ``text`` by scoring every one with the model itself."""
    pictures = [Image.open(photos / n).convert("RGB") for n in NAMES]
    with torch.no_grad():
        scores = model.similarity(model.encode_images(xmatch.PixelInputs(pictures)), model.encode_texts([text]))[:, 0]
    return [NAMES[i] for i in scores.argsort(descending=True).tolist()]


def test_search_finds_the_best_picture_first_and_says_how_sure(client, picture_index, pixel_model):
    got = client.get("/search", params={"text": QUERY, "k": 3})
    assert got.status_code == 200
    answer = got.json()
    assert [h["id"] for h in answer["hits"]] == expected_order(pixel_model, picture_index[1], QUERY)[:3]
    assert answer["query"] == QUERY and answer["exactness"] in ("proven", "exhaustive") and answer["exact"] is True
    assert answer["total"] == len(NAMES) and answer["unknown_words"] == [] and answer["warnings"] == []
    assert {"score", "row", "stage"} <= set(answer["hits"][0]) and "stage2" in answer["timings"]
    posted = client.post("/search", json={"text": QUERY, "k": 3, "exact": True}).json()
    assert [h["id"] for h in posted["hits"]] == [h["id"] for h in answer["hits"]]
    assert posted["exactness"] == "exhaustive"


def test_unknown_words_are_named(client):
    answer = client.get("/search", params={"text": "a dog qqzzxq", "k": 2}).json()
    assert answer["unknown_words"] and "unknown to the model's text side" in answer["warnings"][0]


def test_rerank_uses_the_verifier(client):
    answer = client.get("/search", params={"text": QUERY, "k": 3, "rerank": 2}).json()
    assert answer["reranked"] == 2 and [h["stage"] for h in answer["hits"]] == ["verifier", "verifier", "pooler"]
    assert all("verifier" in h for h in answer["hits"][:2])


def test_card_and_health(client, picture_index, pixel_model):
    card = client.get("/card").json()
    assert card["size"] == len(NAMES) and card["side"] == "images" and card["verifier"] is True
    assert card["fingerprint"] == xmatch.index.open(picture_index[0]).fingerprint
    assert card["model"].startswith("local-dir:") and card["pictures"] is True and card["limits"]["max_k"] == 20
    assert client.get("/health").json() == {"status": "ok", "items": len(NAMES)}


def test_thumbnail_is_the_items_picture_shrunk(client, picture_index):
    got = client.get("/items/trip/beach.png/thumbnail")
    assert got.status_code == 200 and got.headers["content-type"] == "image/jpeg"
    thumb = Image.open(io.BytesIO(got.content))
    assert thumb.size == Image.open(picture_index[1] / "trip/beach.png").size  # small pictures stay their size


def test_alignment_as_json_and_as_picture(client):
    got = client.get("/alignment", params={"query": QUERY, "item": "img1.png"})
    assert got.status_code == 200
    pair = got.json()
    words, boxes, cosines = pair["words"], pair["boxes"], pair["cosines"]
    assert words == ["a", "small", "dog", "on", "the", "red", "man"] and pair["pooler"] == "MrSw" and pair["marks"] == "words"
    assert len(cosines) == len(boxes) > 1 and all(len(row) == len(words) for row in cosines)
    assert all(len(b) == 4 and 0 <= min(b) <= max(b) <= 1 for b in boxes)
    best = pair["best"]
    assert [b["word"] for b in best] == words and len({b["colour"] for b in best}) == len(words)
    assert all(b["cosine"] == pytest.approx(max(row[j] for row in cosines)) for j, b in enumerate(best))
    png = client.get("/alignment", params={"query": QUERY, "item": "img1.png", "format": "png"})
    assert png.headers["content-type"] == "image/png"
    picture = np.asarray(Image.open(io.BytesIO(png.content)).convert("L"))
    assert picture.shape[1] > 200 and picture.std() > 10  # drawn: not blank


def test_the_page_and_its_files_are_served(client):
    page = client.get("/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert "default-src 'self'" in page.headers["content-security-policy"] and "http" not in page.text.replace(
        "http-equiv", "")  # no CDN: every file is the server's own
    for asset in ("/static/app.js", "/static/style.css"):
        assert client.get(asset).status_code == 200 and asset.removeprefix("/") in page.text
    assert client.get("/docs").status_code == 200 and "/search" in client.get("/openapi.json").json()["paths"]


def test_a_token_is_asked_for_every_api_route(picture_index):
    idx, photos = picture_index
    with live(open_service(idx, photos), token="s3cret") as c:
        for path in ("/card", "/search?text=a+dog", f"/items/{NAMES[0]}/thumbnail", f"/alignment?query=a&item={NAMES[0]}"):
            refused = c.get(path)
            assert refused.status_code == 401 and "Authorization: Bearer" in refused.json()["error"]
            assert c.get(path, headers={"Authorization": "Bearer wrong"}).status_code == 401
            assert c.get(path, headers={"Authorization": "Bearer s3cret"}).status_code == 200
        assert c.get("/health").status_code == 200 and c.get("/").status_code == 200


def test_appends_by_another_writer_are_served_at_the_next_request(tmp_path, pixel_model):
    photo_folder(tmp_path / "photos")
    index = xmatch.index.create(tmp_path / "idx", pixel_model, dtype="float32")
    index.add(xmatch.PixelInputs([Image.open(tmp_path / "photos" / NAMES[0]).convert("RGB")]), ids=[NAMES[0]])
    with live(open_service(tmp_path / "idx", tmp_path / "photos")) as c:
        assert c.get("/health").json()["items"] == 1
        writer = xmatch.index.open(tmp_path / "idx", pixel_model)
        writer.add(xmatch.PixelInputs([Image.open(tmp_path / "photos" / n).convert("RGB") for n in NAMES[1:]]),
                   ids=NAMES[1:])
        assert c.get("/health").json()["items"] == len(NAMES) and c.get("/card").json()["size"] == len(NAMES)
        answer = c.get("/search", params={"text": QUERY, "k": 10}).json()
        assert sorted(h["id"] for h in answer["hits"]) == sorted(NAMES)
        assert c.get("/items/trip/beach.png/thumbnail").status_code == 200


def test_a_caption_index_is_searched_with_an_uploaded_picture(tmp_path, pixel_model):
    captions = ["a dog on a beach", "a red car", "two cats asleep"]
    index = xmatch.index.create(tmp_path / "captions", pixel_model, side="texts", dtype="float32")
    index.add(captions, ids=["c0", "c1", "c2"])
    picture = Image.fromarray(np.random.default_rng(1).integers(0, 256, size=(64, 64, 3), dtype=np.uint8))
    body = io.BytesIO()
    picture.save(body, format="PNG")
    with torch.no_grad():
        scores = pixel_model.similarity(pixel_model.encode_images(xmatch.PixelInputs([picture])),
                                        pixel_model.encode_texts(captions))[0]
    with live(open_service(tmp_path / "captions")) as c:
        got = c.post("/search/image", params={"k": 3}, content=body.getvalue(), headers={"Content-Type": "image/png"})
        assert got.status_code == 200
        assert [h["id"] for h in got.json()["hits"]] == [f"c{i}" for i in scores.argsort(descending=True).tolist()]
        assert got.json()["hits"][0]["text"] == captions[int(scores.argmax())]
        refused = c.get("/search", params={"text": "a dog"})
        assert refused.status_code == 422 and "holds captions" in refused.json()["error"]


def test_an_image_index_refuses_a_picture_query_saying_why(client):
    got = client.post("/search/image", content=b"\x89PNG not really", headers={"Content-Type": "image/png"})
    assert got.status_code == 422 and "search it with text" in got.json()["error"]


def test_the_command_serves_the_index_until_interrupted(picture_index):
    import signal
    import subprocess
    import sys

    idx, photos = picture_index
    sock = free_socket()
    port = sock.getsockname()[1]
    sock.close()  # the server binds it again (SO_REUSEADDR)
    server = subprocess.Popen([sys.executable, "-m", "xmatch", "serve", str(idx), "--images", str(photos), "--port",
                               str(port)], stderr=subprocess.PIPE, text=True)
    try:
        health = None
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5) as c:
            for _ in range(600):  # the model loads first
                if server.poll() is not None:
                    break
                try:
                    health = c.get("/health").json()
                    break
                except httpx.TransportError:
                    threading.Event().wait(0.1)
            assert health == {"status": "ok", "items": len(NAMES)}, server.stderr.read() if server.poll() else ""
            assert c.get("/search", params={"text": QUERY, "k": 1}).json()["hits"][0]["id"] in NAMES
    finally:
        server.send_signal(signal.SIGINT)
        _, err = server.communicate(timeout=60)
    assert server.returncode == 0 and f"at http://127.0.0.1:{port}/" in err


def test_without_fastapi_the_command_names_the_extra(picture_index, monkeypatch, capsys):
    import sys

    from xmatch.cli.main import main

    monkeypatch.setitem(sys.modules, "fastapi", None)  # an import of it fails, as where it is not installed
    assert main(["serve", str(picture_index[0])]) == 2
    assert "pip install \"xmatch-zoo[serve]\"" in capsys.readouterr().err
