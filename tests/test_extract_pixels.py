"""Region models on pixels (the ``pixel-regions`` image encoder, :func:`xmatch.extract.on_pixels`):
the same embeddings as encoding the ``xmatch extract`` output, for TERAN, TERN and SCAN specs,
with the regions' boxes returned; bundles round-trip without the frozen backbone."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import xmatch
from xmatch import Embeddings, SpecError
from xmatch.data import open_dataset
from xmatch.extract import extract
from xmatch.regions import on_pixels
from xmatch.regions.manifest import ManifestError
from xmatch.model.inputs import PixelInputs, RegionInputs

from test_extract import PIPE, ROI, make_photos

WORDS = ["picture", "caption", "a", "png", "jpg", "0", "1", "2", "3", "4"]


@pytest.fixture(scope="module")
def extracted(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("pixels")
    photos = make_photos(root / "photos")
    extract(photos, root / "feats", PIPE, workers=0, progress=False)
    return photos, root / "feats"


def teran() -> xmatch.MatchingModel:
    return xmatch.build("teran-mrsw-scenes", image_encoder={"feature_dim": 256})


def tern() -> xmatch.MatchingModel:
    return xmatch.build("tern-scenes", image_encoder={"feature_dim": 256})


def scan() -> xmatch.MatchingModel:
    pytest.importorskip("xmatch_scan")
    return xmatch.build({
        "embed_dim": 16,
        "image_encoder": {"name": "scan-precomp", "feature_dim": 256},
        "text_encoder": {"name": "bigru", "vocab": WORDS, "word_dim": 8, "hidden_dim": 6},
        "image_reasoner": {"name": "identity"}, "text_reasoner": {"name": "identity"},
        "pooler": {"name": "scan-t2i"}, "loss": {"name": "hinge"},
    })


def from_files(model: xmatch.MatchingModel, feats: Path, split: str) -> tuple[Embeddings, list[str], np.ndarray]:
    """Embeddings of the extracted features of a split, the pictures' paths, their boxes."""
    ds = open_dataset("teran", feats, split=split)
    batch = next(ds.image_batches(ds.num_images))
    doc = {str(im["imgid"]): im for im in json.loads((feats / "dataset_xmatch.json").read_text())["images"]}
    paths = [str(Path(doc[k]["filepath"]) / doc[k]["filename"]) for k in ds.image_names]
    with torch.no_grad():
        img = model.encode_images(batch.images)
    return img, paths, batch.images.boxes.numpy()


@pytest.mark.parametrize("build", [teran, tern, scan], ids=["teran", "tern", "scan"])
def test_pixels_give_the_embeddings_of_the_extracted_features(extracted, build):
    photos, feats = extracted
    torch.manual_seed(0)
    model = build().eval()
    expected, paths, boxes = from_files(model, feats, "train")
    pixels = on_pixels(model, feats).eval()
    assert pixels.image_encoder.input_type is PixelInputs and model.image_encoder.input_type is RegionInputs
    with torch.no_grad():
        got = pixels.encode_images(images=[photos / p for p in paths])
    torch.testing.assert_close(got.tokens, expected.tokens, rtol=1e-4, atol=1e-5)
    assert torch.equal(got.mask, expected.mask)
    if expected.pooled is not None:
        torch.testing.assert_close(got.pooled, expected.pooled, rtol=1e-4, atol=1e-5)
    # the regions' boxes come back with the embeddings, normalised to each picture
    np.testing.assert_array_equal(got.boxes.numpy(), boxes)
    texts = ["a picture caption", "caption 3"]
    with torch.no_grad():
        torch.testing.assert_close(pixels.similarity(got, pixels.encode_texts(texts)),
                                   model.similarity(expected, model.encode_texts(texts)), rtol=1e-4, atol=1e-5)


def test_the_pixel_model_saves_without_its_backbone_and_rebuilds(extracted, tmp_path):
    photos, feats = extracted
    pixels = on_pixels(teran().eval(), feats).eval()
    spec = pixels.spec["image_encoder"]
    assert spec["name"] == "pixel-regions" and spec["encoder"]["name"] == "bottomup"
    recorded = json.loads((feats / "extract.json").read_text())["pipeline"]
    assert spec["fingerprint"] == recorded["fingerprint"]
    assert (spec["proposer"], spec["roi"]) == (recorded["proposer"], recorded["roi"])
    assert spec["roi"]["weights"] == "random" and spec["roi"]["image_size"] == 64
    keys = list(pixels.state_dict())
    assert not any("pipeline" in k for k in keys) and any(k.startswith("image_encoder.encoder.") for k in keys)
    xmatch.save_pretrained(pixels, tmp_path / "bundle")
    again = xmatch.build(f"local-dir:{tmp_path / 'bundle'}", pretrained=True).eval()
    pictures = [photos / "a.png", photos / "b.jpg"]
    with torch.no_grad():
        a, b = pixels.encode_images(images=pictures), again.encode_images(images=pictures)
    torch.testing.assert_close(a.tokens, b.tokens)
    assert torch.equal(a.boxes, b.boxes)


def test_mismatches_are_refused(extracted):
    _, feats = extracted
    with pytest.raises(ManifestError, match=r"extract.json: the features are 256-wide but the model's image encoder reads 1280"):
        on_pixels(xmatch.build("teran-mrsw-scenes"), feats)
    table = json.loads((feats / "extract.json").read_text())["pipeline"]
    with pytest.raises(ValueError, match="have the fingerprint sha256:.* but the region encoder was trained on features of weights sha256:0"):
        xmatch.build("teran-mrsw-scenes", image_encoder={
            "name": "pixel-regions", "roi": ROI,
            "proposer": table["proposer"], "fingerprint": "sha256:0", "encoder": {"name": "bottomup", "layers": 0}})
    with pytest.raises(ValueError, match="feature_dim: 12, but the backbone's features are 256-wide"):
        xmatch.build("teran-mrsw-scenes", image_encoder={
            "name": "pixel-regions", "roi": ROI, "encoder": {"name": "bottomup", "feature_dim": 12}})
    # the RoI settings are one nested table: a flat or misspelt key is refused, naming it
    with pytest.raises(SpecError, match=r"image_encoder -> backbone: 'pixel-regions' has no argument 'backbone'.* Arguments: proposer, roi,"):
        xmatch.build("teran-mrsw-scenes", image_encoder={"name": "pixel-regions", "backbone": "test_efficientnet"})
    with pytest.raises(SpecError, match=r"image_encoder \(pixel-regions\): roi -> image_sise: not a RoI setting\. Did you mean 'image_size'"):
        xmatch.build("teran-mrsw-scenes", image_encoder={"name": "pixel-regions", "roi": {**ROI, "image_sise": 64}})
    with pytest.raises(ValueError, match="already takes pixels"):
        on_pixels(on_pixels(teran(), feats), feats)


def test_pixel_model_trains_on_pictures(extracted):
    photos, _ = extracted
    model = xmatch.build("teran-mrsw-scenes", image_encoder={
        "name": "pixel-regions", "roi": ROI, "proposer": {"name": "grid", "regions": 4}, "encoder": {"name": "bottomup", "layers": 0, "box_hidden_dim": 16}})
    ds = open_dataset("image-captions", photos / "captions.csv")
    out = model(next(iter(ds.loader(4, shuffle=False))))
    out.loss.backward()
    assert torch.isfinite(out.loss)
    assert all(p.grad is not None for p in model.image_encoder.encoder.parameters())
    assert not any(p.requires_grad for p in model.image_encoder.pipeline.parameters())


def test_embeddings_carry_boxes_through_slicing_joining_and_disk(tmp_path):
    g = torch.Generator().manual_seed(0)
    mask = torch.tensor([[True, True, False], [True, True, True]])
    e = Embeddings(torch.randn(2, 3, 4, generator=g), mask, None, torch.rand(2, 3, 4, generator=g))
    assert torch.equal(e[1].boxes, e.boxes[1:])
    narrow = Embeddings(e.tokens[:1, :2], mask[:1, :2], None, e.boxes[:1, :2])
    joined = Embeddings.cat([narrow, e[1:]])
    assert joined.boxes.shape == (2, 3, 4) and torch.equal(joined.boxes[0, 2], torch.zeros(4))
    assert torch.equal(e[:1].trimmed().boxes, e.boxes[:1, :2])
    e.save(tmp_path / "e.safetensors")
    assert torch.equal(Embeddings.load(tmp_path / "e.safetensors").boxes, e.boxes)
    with pytest.raises(ValueError, match=r"Embeddings.boxes must be \[N, T, 4\]"):
        Embeddings(e.tokens, mask, None, torch.zeros(2, 3))
    with pytest.raises(ValueError, match="every part has region boxes or none"):
        Embeddings.cat([e, Embeddings(e.tokens, mask)])


@pytest.mark.slow
def test_docs_example_runs(tmp_path):
    """The real-photo example of docs/extract.md: packaged EfficientNet-Lite0, the shipped
    teran-mrsw-scenes, skimage's photos; it prints the ranking and writes the picture."""
    import re
    import subprocess
    import sys

    pytest.importorskip("skimage")
    page = (Path(__file__).resolve().parents[1] / "docs" / "extract.md").read_text()
    section = page.split("## End to end on real photos", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                         env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.splitlines()
    assert lines[0].startswith("4 images (test 4) in photo-feats (teran layout, 1280-d features)")
    assert [line.split()[1] for line in lines[1:5]] == ["coffee.jpg", "chelsea.jpg", "astronaut.jpg", "rocket.jpg"]
    assert (tmp_path / "alignment.png").is_file()
