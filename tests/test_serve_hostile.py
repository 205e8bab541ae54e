"""`xmatch serve` against hostile requests: paths out of the picture folder, links out of it,
uploads over the limit (announced or not), garbage JSON, out-of-range `k` and queries; every
refusal is a JSON 4xx with a message, never a traceback."""

from __future__ import annotations

import os

import pytest

import xmatch
import xmatch.index
from xmatch.index.photos import index_images

from test_serve_api import NAMES, live, photo_folder, pixel_model  # noqa: F401 - pixel_model: a fixture

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from xmatch.serve.limits import Limits  # noqa: E402
from xmatch.serve.service import open_service  # noqa: E402

LIMITS = Limits(max_k=20, max_query_chars=200, max_upload_bytes=50_000)


@pytest.fixture(scope="module")
def served(tmp_path_factory, pixel_model):
    """A server of a picture index whose folder also holds a link out of it, indexed while it
    pointed at a picture inside, and a secret file beside the folder."""
    root = tmp_path_factory.mktemp("hostile")
    photo_folder(root / "photos")
    (root / "photos" / "linked.png").symlink_to(root / "photos" / NAMES[0])
    index = xmatch.index.create(root / "idx", pixel_model, dtype="float32")
    index_images(index, root / "photos", progress=False)
    index.close()
    (root / "secret.png").write_bytes((root / "photos" / NAMES[1]).read_bytes())
    (root / "photos" / "linked.png").unlink()
    (root / "photos" / "linked.png").symlink_to(root / "secret.png")  # now leads out
    with live(open_service(root / "idx", root / "photos", LIMITS)) as client:
        yield client


def refused(response: httpx.Response, status: int, words: str) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    message = response.json()["error"]
    assert words in message and "Traceback" not in message and 'File "' not in message


@pytest.mark.parametrize("path", ["..%2Fsecret.png", "../secret.png", "%2Fetc%2Fpasswd", "trip/..%2F..%2Fsecret.png",
                                  "img0.png%00.png"])
def test_paths_out_of_the_picture_folder_are_refused(served, path):
    response = served.get(f"/items/{path}/thumbnail")
    assert response.status_code in (404, 422) and "secret" not in response.headers.get("content-type", "")
    assert response.headers["content-type"] == "application/json"


def test_only_items_the_index_holds_are_served(served):
    refused(served.get("/items/notes.txt/thumbnail"), 404, "the index holds no item 'notes.txt'")


def test_a_link_out_of_the_folder_is_not_followed(served):
    refused(served.get("/items/linked.png/thumbnail"), 403, "leads out of the picture folder")


def test_an_upload_over_the_limit_is_refused_announced_or_not(served):
    body = b"\x89PNG" + os.urandom(60_000)
    refused(served.post("/search/image", content=body), 413, "over the server's limit of 50000")
    streamed = served.post("/search/image", content=iter([body[:30_000], body[30_000:]]))  # chunked: no length
    refused(streamed, 413, "over the server's limit")
    huge_json = iter([b'{"text": "', b"a " * 40_000, b'"}'])  # chunked JSON: bounded as well
    refused(served.post("/search", content=huge_json, headers={"Content-Type": "application/json"}), 413,
            "over the server's limit")


def test_garbage_json_and_unknown_fields_are_refused(served):
    refused(served.post("/search", content=b"{not json", headers={"Content-Type": "application/json"}), 400,
            "not valid JSON")
    refused(served.post("/search", json={"text": "a dog", "k": 3, "shell": "rm -rf /"}), 422, "shell")
    refused(served.post("/search", json={"text": ["a", "list"]}), 422, "text")
    refused(served.post("/search", json=[1, 2]), 422, "invalid request")


@pytest.mark.parametrize("k", [0, -1, 21, 10**12])
def test_k_out_of_range_is_refused(served, k):
    refused(served.get("/search", params={"text": "a dog", "k": k}), 422, "k must be a whole number from 1 to 20")


def test_queries_too_long_or_empty_and_rerank_out_of_range_are_refused(served):
    refused(served.get("/search", params={"text": "dog " * 100}), 422, "over the server's limit of 200")
    refused(served.get("/search", params={"text": "   "}), 422, "the query is empty")
    refused(served.get("/search", params={"text": "a dog", "rerank": 1000}), 422, "rerank must be a whole number")
    refused(served.get("/alignment", params={"query": "dog " * 100, "item": NAMES[0]}), 422, "over the server's limit")
    refused(served.get("/alignment", params={"query": "a dog", "item": "nothing.png"}), 404, "holds no item")
    refused(served.get("/alignment", params={"query": "a dog", "item": NAMES[0], "format": "exe"}), 422, "format")


def test_unknown_routes_and_a_failing_server_answer_json_without_a_traceback(served, monkeypatch):
    refused(served.get("/etc/passwd"), 404, "no such route")
    refused(served.delete("/search"), 405, "Method Not Allowed")
    from xmatch.serve.service import SearchService

    monkeypatch.setattr(SearchService, "card", lambda self: 1 / 0)
    refused(served.get("/card"), 500, "the server failed on this request (ZeroDivisionError)")
