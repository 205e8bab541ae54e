"""``xmatch extract``: RoI features, the written layouts read back by the datasets, the
extract -> dataset -> train -> eval loop, resumption after a crash, and clear errors."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import xmatch
import xmatch.eval
from xmatch.cli.extract import roi_config
from xmatch.cli.main import build_parser, main as cli
from xmatch.data import open_dataset
from xmatch.extract import extract
from xmatch.regions import RegionPipeline, RoIConfig, RoIFeatureExtractor, fingerprint, read_manifest, roi_features
from xmatch.extract.captions import CaptionsError
from xmatch.regions.features import InputSize, load_backbone, resolve_weights
from xmatch.extract.run import ExtractError
from xmatch.extract.writers import npz_bytes

from conftest import tiny_spec

#: a tiny random backbone: fast, and its features are as good as any for plumbing
ROI = {"backbone": "test_efficientnet", "weights": "random", "image_size": 64}
PIPE = {"proposer": {"name": "windows", "regions": 6}, "roi": ROI}
CLI_PIPE = ["--backbone", "test_efficientnet", "--weights", "random", "--image-size", "64", "--regions", "6", "--no-progress"]
SPLITS = {"a.png": "train", "b.jpg": "train", "sub/c.png": "train", "d.png": "val", "e.png": "test", "f.png": "test"}
SIZES = {"a.png": (64, 48), "b.jpg": (50, 70), "sub/c.png": (64, 48), "d.png": (90, 40), "e.png": (33, 33), "f.png": (64, 48)}


def make_photos(folder: Path, captions: bool = True) -> Path:
    rng = np.random.default_rng(0)
    (folder / "sub").mkdir(parents=True, exist_ok=True)
    for name, (w, h) in SIZES.items():
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(folder / name)
    if captions:
        with (folder / "captions.csv").open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["image", "caption", "split"])
            for name, split in SPLITS.items():
                for k in range(5):
                    writer.writerow([name, f"picture {name} caption {k}", split])
    return folder


@pytest.fixture()
def photos(tmp_path: Path) -> Path:
    return make_photos(tmp_path / "photos")


def files_of(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# -- RoI features -------------------------------------------------------------------------


def bilinear(fmap: torch.Tensor, y: float, x: float) -> torch.Tensor:
    """Plain bilinear interpolation of ``[C, H, W]`` at a point inside the map."""
    y0, x0 = int(np.floor(y)), int(np.floor(x))
    y1, x1 = min(y0 + 1, fmap.shape[1] - 1), min(x0 + 1, fmap.shape[2] - 1)
    ly, lx = y - y0, x - x0
    return ((1 - ly) * (1 - lx) * fmap[:, y0, x0] + (1 - ly) * lx * fmap[:, y0, x1]
            + ly * (1 - lx) * fmap[:, y1, x0] + ly * lx * fmap[:, y1, x1])


def test_roi_features_equal_a_direct_crop_and_pool():
    fmap = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    stride = 32
    # a box on cell borders, one bin per cell and one sample per bin: the samples are the
    # cells' centres, so the pooled feature is the plain mean of the cropped cells
    box = torch.tensor([[2 * stride, 1 * stride, 5 * stride, 4 * stride]], dtype=torch.float32)
    pooled = roi_features(fmap, [box], 1 / stride, bins=3, samples=1)[0]
    torch.testing.assert_close(pooled[0], fmap[0, :, 1:4, 2:5].mean(dim=(1, 2)))
    # any box, 2 x 2 bins of 2 x 2 samples: the mean of 16 bilinear samples
    for x1, y1, x2, y2 in ([40.0, 50.0, 170.0, 130.0], [100.0, 33.0, 131.0, 200.0]):
        got = roi_features(fmap, [torch.tensor([[x1, y1, x2, y2]])], 1 / stride, bins=2, samples=2)[0][0]
        sx, sy = (x2 - x1) / stride / 4, (y2 - y1) / stride / 4  # sample spacing in map cells
        points = [(y1 / stride - 0.5 + (i + 0.5) * sy, x1 / stride - 0.5 + (j + 0.5) * sx) for i in range(4) for j in range(4)]
        expected = torch.stack([bilinear(fmap[0], y, x) for y, x in points]).mean(0)
        torch.testing.assert_close(got, expected)


def test_input_size_keeps_the_aspect_and_the_stride():
    rule = InputSize(224, 448, 32, "shorter", "bicubic")
    assert rule.of(640, 480) == (288, 224)  # 298.7 -> 288: every side a multiple of 32
    assert rule.of(224, 224) == (224, 224)
    assert rule.of(2000, 100) == (448, 32)  # the longer side capped
    assert InputSize(224, 448, 32, "square").of(640, 480) == (224, 224)


def test_roi_config_checks_its_settings():
    assert RoIConfig() == RoIConfig.from_table(None) == RoIConfig.from_table({})
    assert (RoIConfig().image_size, RoIConfig().output_stride) == (600, 16)  # the bottom-up convention
    parse = build_parser().parse_args
    # a flag left out takes RoIConfig's default; none is the backbone's own
    assert roi_config(parse(["extract", "photos", "--out", "feats"])) == RoIConfig()
    assert roi_config(parse(["extract", "photos", "--out", "feats", "--image-size", "224"])) == RoIConfig(image_size=224)
    flags = parse(["extract", "photos", "--out", "feats", "--backbone", "vit_small_patch16_224", "--image-size", "None",
                   "--output-stride", "none"])
    assert roi_config(flags) == RoIConfig("vit_small_patch16_224", image_size=None, output_stride=None)
    flags = parse(["extract", "photos", "--out", "feats", "--backbone", "efficientnet_lite2", "--pretrained", "--max-size", "512"])
    assert roi_config(flags) == RoIConfig("efficientnet_lite2", pretrained=True, max_size=512)
    assert RoIConfig.from_table(ROI) == RoIConfig("test_efficientnet", weights="random", image_size=64)
    with pytest.raises(ValueError, match="resize must be one of shorter, square, got 'crop'"):
        RoIConfig(resize="crop")
    with pytest.raises(ValueError, match="pool_bins must be at least 1 and pool_samples at least 0, got 0, 2"):
        RoIConfig(pool_bins=0)
    with pytest.raises(ValueError, match="image_size must be a positive number of pixels"):
        RoIConfig(image_size=0)
    with pytest.raises(TypeError, match="roi: max_size must be an integer, got '448'"):
        RoIConfig.from_table({"max_size": "448"})
    with pytest.raises(TypeError, match="pretrained must be true or false"):
        RoIConfig(pretrained=1)
    with pytest.raises(ValueError, match=r"roi -> pool_bin: not a RoI setting\. Did you mean 'pool_bins'\? Settings: backbone, weights, "):
        RoIConfig.from_table({"pool_bin": 3})
    with pytest.raises(ValueError, match=r"pipeline: unknown key\(s\) backbone; .*'roi'"):
        RegionPipeline.from_table({"proposer": "windows", "backbone": "test_efficientnet"})
    with pytest.raises(TypeError, match=r"roi must be a RoIConfig \(RoIConfig.from_table\(table\) for a table\), got dict"):
        RegionPipeline("windows", ROI)


@pytest.fixture(scope="module")
def extractor() -> RoIFeatureExtractor:
    return RoIFeatureExtractor(RoIConfig.from_table(ROI))


def test_features_do_not_depend_on_the_batch(extractor):
    rng = np.random.default_rng(1)
    pictures = [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for w, h in ((64, 48), (50, 70), (64, 48))]
    pixels = [extractor.prepare(p) for p in pictures]
    assert [tuple(p.shape) for p in pixels] == [(3, 64, 80), (3, 96, 64), (3, 64, 80)]  # sides a multiple of the stride, 16
    boxes = [torch.tensor([[0.0, 0.0, w, h], [5.0, 5.0, 20.0, 30.0]]) for w, h in ((64, 48), (50, 70), (64, 48))]
    sizes = [p.size for p in pictures]
    together = extractor(pixels, boxes, sizes)
    for i in range(3):
        alone = extractor([pixels[i]], [boxes[i]], [sizes[i]])[0]
        torch.testing.assert_close(alone, together[i], rtol=1e-5, atol=1e-6)
    assert together[0].shape == (2, extractor.feature_dim) and together[0].dtype == torch.float32


def test_weights_resolution_and_fingerprint(extractor):
    assert resolve_weights("efficientnet_lite0", "auto", False) == "package:efficientnet-lite0"
    assert resolve_weights("efficientnet_lite2", "auto", False) == "package:efficientnet-lite2"
    with pytest.raises(ValueError, match="no offline weights are packaged for the backbone resnet18.*--weights"):
        resolve_weights("resnet18", "auto", False)
    same = RoIFeatureExtractor(RoIConfig.from_table(ROI))
    other = RoIFeatureExtractor(RoIConfig.from_table({**ROI, "seed": 1}))
    assert same.fingerprint == extractor.fingerprint != other.fingerprint
    assert other.roi == RoIConfig("test_efficientnet", weights="random", image_size=64, seed=1)
    assert RoIFeatureExtractor(RoIConfig("efficientnet_lite0", image_size=64)).roi.weights == "package:efficientnet-lite0"
    assert extractor.fingerprint == fingerprint(load_backbone(extractor.roi).net) and extractor.fingerprint.startswith("sha256:")


def test_npz_files_are_byte_identical_for_equal_arrays():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    first = npz_bytes(feat=a)
    time.sleep(1.1)  # np.savez would stamp another time
    assert npz_bytes(feat=a.copy()) == first


# -- the layouts, read back by the datasets ------------------------------------------------


def test_extract_dataset_train_eval_loop(photos, tmp_path, fixture_bert):
    out = tmp_path / "feats"
    assert cli([
        "extract", str(photos), "--out", str(out), "--layout", "teran", "--proposer", "windows", "--workers", "0", *CLI_PIPE,
    ]) == 0
    assert sorted(os.listdir(out)) == ["bu_att", "bu_box", "dataset_xmatch.json", "extract.json"]
    manifest = read_manifest(out)
    assert manifest["complete"] and manifest["splits"] == {"train": 3, "val": 1, "test": 2}
    assert manifest["pipeline"]["fingerprint"].startswith("sha256:") and manifest["feature_dim"] == 256
    # the flags' settings, nested as RegionPipeline.settings() gives them, then what they resolved to
    assert manifest["pipeline"]["roi"] == {**asdict(RoIConfig()), **ROI}
    assert sorted(manifest["pipeline"]) == ["feature_dim", "fingerprint", "input", "proposer", "roi", "stride"]
    # read back as a newcomer would: the teran dataset, no options
    train = open_dataset("teran", out, split="train")
    assert train.num_images == 3 and train.captions_per_image == 5 and train.feature_dim == 256
    item = train.image(1)
    assert item.regions.shape == (6, 256) and item.boxes.shape == (6, 4)
    np.testing.assert_array_equal(item.boxes[0], [0, 0, 1, 1])  # the whole picture, normalised by its own size
    # the very features the pipeline computes for that picture
    pipe = RegionPipeline.from_table(PIPE)
    assert pipe.settings() == {key: manifest["pipeline"][key] for key in ("proposer", "roi")}
    direct = pipe.regions_of([photos / "b.jpg"])[0]
    np.testing.assert_allclose(item.regions, direct.features.numpy(), rtol=1e-5, atol=1e-6)
    again = RegionPipeline.from_table(pipe.settings()).regions_of([photos / "b.jpg"])[0]
    assert torch.equal(again.features, direct.features)
    # train a step and evaluate
    model = xmatch.build(tiny_spec(fixture_bert, image_encoder={"name": "bottomup", "feature_dim": 256, "layers": 1, "ff_dim": 32}))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    batch = next(iter(train.loader(4)))
    loss = model(batch).loss
    loss.backward()
    optimizer.step()
    assert torch.isfinite(loss)
    result = xmatch.eval.evaluate(model.eval(), open_dataset("teran", out, split="test"), "full", progress=False)
    assert 0 <= result.i2t["r10"] <= 100
    # a model of another region width is refused, naming the features' manifest
    narrow = xmatch.build(tiny_spec(fixture_bert))
    with pytest.raises(ValueError, match=r"region features are 256-wide .*feature_dim = 12.*extract.json: 256-d features of test_efficientnet"):
        xmatch.eval.evaluate(narrow, open_dataset("teran", out, split="test"), "full", progress=False)


def test_precomp_layout_is_read_by_scan_precomp(photos, tmp_path):
    teran = extract(photos, tmp_path / "teran", PIPE, workers=0, progress=False)
    result = extract(photos, tmp_path / "precomp", PIPE, layout="precomp", workers=0, progress=False)
    assert result.splits == {"train": 3, "dev": 1, "test": 2} and teran.images == result.images == 6
    names = sorted(p.name for p in (tmp_path / "precomp").iterdir())
    assert "dev_ims.npy" in names and "test_img_sizes.npy" in names and not any(n.startswith(".") for n in names)
    ds = open_dataset("scan-precomp", tmp_path / "precomp", split="val")
    reference = open_dataset("teran", tmp_path / "teran", split="val")
    assert ds.captions == reference.captions and ds.has_boxes
    np.testing.assert_array_equal(ds.image(0).regions, reference.image(0).regions)
    np.testing.assert_array_equal(ds.image(0).boxes, reference.image(0).boxes)
    assert (tmp_path / "precomp" / "train_images.txt").read_text().split() == ["a.png", "b.jpg", "sub/c.png"]


def test_layouts_refuse_what_they_cannot_hold(photos, tmp_path):
    variable = {**PIPE, "proposer": {"name": "boxes", "source": str(tmp_path / "b"), "regions": 6, "min_regions": 2}}
    (tmp_path / "b").mkdir()
    with pytest.raises(ValueError, match="precomp layout stores a fixed number of regions"):
        extract(photos, tmp_path / "o", variable, layout="precomp", workers=0, progress=False)
    uneven = photos / "captions.csv"
    uneven.write_text(uneven.read_text() + "a.png,one more caption,train\n")
    with pytest.raises(ValueError, match=r"same number of captions for every image, got \[5, 6\]"):
        extract(photos, tmp_path / "o", PIPE, layout="precomp", workers=0, progress=False)


def test_variable_region_counts_in_the_teran_layout(photos, tmp_path):
    boxes = tmp_path / "boxes"
    boxes.mkdir()
    (boxes / "a.json").write_text(json.dumps([[1, 1, 30, 30], [10, 10, 60, 40], [0, 0, 5, 5]]))
    for name in ("b", "c", "d", "e", "f"):
        (boxes / f"{name}.json").write_text("[]")
    pipe = {**PIPE, "proposer": {"name": "boxes", "source": str(boxes), "regions": 10, "min_regions": 2}}
    extract(photos, tmp_path / "out", pipe, workers=0, progress=False)
    train = open_dataset("teran", tmp_path / "out", split="train")
    assert [len(train.image(i).regions) for i in range(3)] == [3, 2, 2]
    np.testing.assert_allclose(train.image(0).boxes[0], [1 / 64, 1 / 48, 30 / 64, 30 / 48], rtol=1e-6)


def test_without_captions_every_image_is_extracted(tmp_path):
    folder = make_photos(tmp_path / "p", captions=False)
    result = extract(folder, tmp_path / "out", PIPE, workers=0, progress=False)
    assert result.images == 6 and result.splits == {"test": 6} and result.captions_per_image == [0]
    doc = json.loads((tmp_path / "out" / "dataset_xmatch.json").read_text())
    assert [im["filename"] for im in doc["images"]] == ["a.png", "b.jpg", "d.png", "e.png", "f.png", "c.png"]
    assert doc["images"][5]["filepath"] == "sub" and doc["images"][1]["width"] == 50 and doc["images"][1]["height"] == 70


def test_karpathy_captions_keep_their_ids_and_splits(photos, tmp_path):
    doc = {"images": [{"split": "train", "imgid": 7, "filepath": "sub", "filename": "c.png", "sentences": [{"raw": f"c {k}"} for k in range(5)]},
                      {"split": "test", "cocoid": 123, "imgid": 0, "filepath": "", "filename": "a.png", "sentences": [{"raw": f"a {k}"} for k in range(5)]}]}
    (tmp_path / "k.json").write_text(json.dumps(doc))
    extract(photos, tmp_path / "out", PIPE, captions=tmp_path / "k.json", workers=0, progress=False)
    assert sorted(os.listdir(tmp_path / "out" / "bu_att")) == ["123.npz", "7.npz"]
    test = open_dataset("teran", tmp_path / "out", split="test")
    assert test.image_names == ["123"] and test.captions[0] == "a 0"


# -- resuming, and errors ---------------------------------------------------------------------


def extract_killed_at_the_second_chunk(images, out: Path, monkeypatch) -> None:
    """An extraction in chunks of 2 interrupted as its second chunk runs (a killed process)."""
    real = RegionPipeline.forward
    calls = {"n": 0}

    def dies_on_the_second_chunk(self, prepared):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt  # as if the process were killed mid-run
        return real(self, prepared)

    monkeypatch.setattr(RegionPipeline, "forward", dies_on_the_second_chunk)
    with pytest.raises(KeyboardInterrupt):
        extract(images, out, PIPE, batch_size=2, workers=0, progress=False)
    monkeypatch.setattr(RegionPipeline, "forward", real)


def test_resume_after_a_crash_gives_identical_files(photos, tmp_path, monkeypatch):
    clean = tmp_path / "clean"
    extract(photos, clean, PIPE, batch_size=2, workers=0, progress=False)
    crashed = tmp_path / "crashed"
    extract_killed_at_the_second_chunk(photos, crashed, monkeypatch)
    assert len(os.listdir(crashed / "bu_att")) == 2 and not read_manifest(crashed)["complete"]
    with pytest.raises(ExtractError, match=r"already holds an extraction .*--resume"):
        extract(photos, crashed, PIPE, batch_size=2, workers=0, progress=False)
    with pytest.raises(ExtractError, match=r"other settings \(batch_size: 2 -> 3"):
        extract(photos, crashed, PIPE, batch_size=3, workers=0, progress=False, resume=True)
    with pytest.raises(ExtractError, match=r"other settings \(pipeline.fingerprint: .*; pipeline.roi.seed: 0 -> 1\)"):
        extract(photos, crashed, {**PIPE, "roi": {**ROI, "seed": 1}}, batch_size=2, workers=0, progress=False, resume=True)
    result = extract(photos, crashed, PIPE, batch_size=2, workers=0, progress=False, resume=True)
    assert (result.extracted, result.skipped) == (4, 2)
    assert files_of(crashed) == files_of(clean)
    again = extract(photos, crashed, PIPE, batch_size=2, workers=0, progress=False, resume=True)
    assert again.extracted == 0 and files_of(crashed) == files_of(clean)
    redo = extract(photos, crashed, PIPE, batch_size=2, workers=0, progress=False, overwrite=True)
    assert redo.extracted == 6 and files_of(crashed) == files_of(clean)


def test_unreadable_images_are_listed_and_skipped(photos, tmp_path):
    (photos / "e.png").write_bytes(b"not a png")
    result = extract(photos, tmp_path / "out", PIPE, workers=1, progress=False)
    assert result.images == 5 and [name for name, _ in result.unreadable] == ["e.png"]
    assert "e.png is not a readable image" in result.unreadable[0][1]
    assert open_dataset("teran", tmp_path / "out", split="test").image_names == ["5"]
    assert read_manifest(tmp_path / "out")["unreadable"][0][0] == "e.png"


def test_clear_errors_name_the_file(photos, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match=rf"no images in {empty} \(looked recursively"):
        extract(empty, tmp_path / "o", PIPE, progress=False)
    with pytest.raises(FileNotFoundError, match="image folder .*nowhere does not exist"):
        extract(tmp_path / "nowhere", tmp_path / "o", PIPE, progress=False)
    (photos / "d.png").unlink()
    with pytest.raises(FileNotFoundError, match=r"captions.csv names 1 image files that do not exist: .*d.png"):
        extract(photos, tmp_path / "o", PIPE, progress=False)
    bad = tmp_path / "bad.csv"
    bad.write_text("picture,text\nx.png,hello\n")
    with pytest.raises(CaptionsError, match=r"bad.csv: the first line must be a header with columns 'image' and 'caption'"):
        extract(photos, tmp_path / "o", PIPE, captions=bad, progress=False)
    junk = tmp_path / "junk"
    junk.mkdir()
    for name in ("x.jpg", "y.png"):
        (junk / name).write_bytes(b"junk")
    with pytest.raises(ExtractError, match=r"none of the 2 images could be read \(e.g. .*x.jpg is not a readable image"):
        extract(junk, tmp_path / "o2", PIPE, workers=0, progress=False)
    (tmp_path / "foreign" / "bu_att").mkdir(parents=True)
    with pytest.raises(ExtractError, match="holds region features that xmatch extract did not write"):
        extract(make_photos(tmp_path / "p2"), tmp_path / "foreign", PIPE, progress=False)
    (tmp_path / "older").mkdir()
    (tmp_path / "older" / "extract.json").write_text(json.dumps({"format": "xmatch.extract/1"}))
    with pytest.raises(ExtractError, match=r"manifest format xmatch.extract/1, this xmatch reads xmatch.extract/3; extract again with --overwrite"):
        extract(tmp_path / "p2", tmp_path / "older", PIPE, progress=False, resume=True)


# -- real kills and several processes (slow) -----------------------------------------------------


@pytest.mark.slow
def test_kill_and_rerun_gives_identical_files(tmp_path):
    rng = np.random.default_rng(0)
    folder = tmp_path / "many"
    folder.mkdir()
    for k in range(48):
        Image.fromarray(rng.integers(0, 256, (120, 160, 3), dtype=np.uint8)).save(folder / f"{k:02d}.png")
    args = [sys.executable, "-m", "xmatch", "extract", str(folder), "--batch-size", "2", "--workers", "0",
            "--backbone", "test_efficientnet", "--weights", "random", "--image-size", "128", "--no-progress"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run([*args, "--out", str(tmp_path / "clean")], check=True, env=env, capture_output=True)
    victim = subprocess.Popen([*args, "--out", str(tmp_path / "killed")], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    att = tmp_path / "killed" / "bu_att"
    deadline = time.time() + 120
    while time.time() < deadline and (not att.is_dir() or len(os.listdir(att)) < 6):
        time.sleep(0.05)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert 6 <= len(os.listdir(att)) < 48, "killed mid-run"
    subprocess.run([*args, "--out", str(tmp_path / "killed"), "--resume"], check=True, env=env, capture_output=True)
    assert files_of(tmp_path / "killed") == files_of(tmp_path / "clean")


@pytest.mark.slow
def test_torchrun_splits_the_work(photos, tmp_path):
    base = ["extract", str(photos), "--batch-size", "2", "--workers", "0", "--device", "cpu", *CLI_PIPE]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, "-m", "xmatch", *base, "--out", str(tmp_path / "one")], check=True, env=env, capture_output=True)
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", "29533",
         "-m", "xmatch", *base, "--out", str(tmp_path / "two")],
        env=env, capture_output=True, text=True,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert files_of(tmp_path / "two") == files_of(tmp_path / "one")
