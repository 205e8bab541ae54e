"""Region features that keep small objects: a finer feature map (``output_stride``) and the
``crop`` mode that encodes each box alone, from ``RoIConfig`` through ``xmatch extract`` to
the manifest that rebuilds the pipeline."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from xmatch.cli.extract import roi_config
from xmatch.cli.main import build_parser, main as cli
from xmatch.regions import RegionPipeline, RoIConfig, RoIFeatureExtractor, read_manifest

ROI = {"backbone": "test_efficientnet", "weights": "random", "image_size": 64}


def extractor(**settings: object) -> RoIFeatureExtractor:
    return RoIFeatureExtractor(RoIConfig.from_table({**ROI, **settings}))


def test_the_region_settings_are_checked():
    assert (RoIConfig().output_stride, RoIConfig().mode, RoIConfig().crop_size) == (16, "roi", 96)
    with pytest.raises(ValueError, match=r"output_stride must be one of 8, 16, 32 \(or None: the backbone's own\), got 12"):
        RoIConfig(output_stride=12)
    with pytest.raises(ValueError, match="mode must be one of roi, crop, mixed, got 'crops'"):
        RoIConfig(mode="crops")
    with pytest.raises(ValueError, match="crop_size must be at least 16 pixels, got 8"):
        RoIConfig(crop_size=8)
    with pytest.raises(TypeError, match="roi: output_stride must be an integer, got '16'"):
        RoIConfig.from_table({"output_stride": "16"})
    parse = build_parser().parse_args
    for bad in ("12", "sixteen"):
        with pytest.raises(SystemExit):
            parse(["extract", "photos", "--out", "feats", "--output-stride", bad])
    flags = parse(["extract", "photos", "--out", "feats", "--image-size", "600", "--output-stride", "16",
                   "--mode", "crop", "--crop-size", "112"])
    assert roi_config(flags) == RoIConfig(image_size=600, output_stride=16, mode="crop", crop_size=112)
    with pytest.raises(ValueError, match="crop_regions must be 0 or more boxes, got -1"):
        RoIConfig(mode="mixed", crop_regions=-1)
    flags = parse(["extract", "photos", "--out", "feats", "--mode", "mixed", "--crop-regions", "12"])
    assert roi_config(flags) == RoIConfig(mode="mixed", crop_regions=12)


def test_output_stride_dilates_the_map_with_the_same_weights():
    coarse, fine = extractor(output_stride=None), extractor()
    assert (coarse.stride, fine.stride) == (32, 16)
    assert fine.fingerprint == coarse.fingerprint  # dilation changes no weight
    assert fine.input.of(100, 75) == (80, 64)  # both sides a multiple of the map's stride
    pixels = torch.randint(0, 256, (1, 3, 64, 64), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    x = fine.normalize(pixels)
    assert fine.backbone(x).shape[-2:] == (4, 4) and coarse.backbone(x).shape[-2:] == (2, 2)
    # a 16-pixel box is one cell of the fine map: pooling it takes that cell's value alone
    box = torch.tensor([[16.0, 32.0, 32.0, 48.0]])
    cell = fine.backbone(x)[0, :, 2, 1]
    pooled = RoIFeatureExtractor(RoIConfig.from_table({**ROI, "output_stride": 16, "pool_bins": 1, "pool_samples": 1})).pool(
        pixels, [box])[0][0]
    torch.testing.assert_close(pooled, cell)


def test_a_token_backbone_refuses_an_output_stride_and_names_the_fix():
    with pytest.raises(ValueError, match=r"test_vit does not take output_stride=16 .*set output_stride=None \(xmatch extract --output-stride none"):
        RoIFeatureExtractor(RoIConfig("test_vit", weights="random", resize="square", image_size=None))
    vit = RoIFeatureExtractor(RoIConfig("test_vit", weights="random", resize="square", image_size=None, output_stride=None))
    side = vit.backbone.data_config["input_size"][-1]
    assert vit.backbone._tokens and vit.input.side == side
    # its crops must have its fixed input size
    own = {"backbone": "test_vit", "weights": "random", "resize": "square", "image_size": None, "output_stride": None,
           "mode": "crop"}
    with pytest.raises(ValueError, match=rf"fixed input size of {side} pixels: crops must be that size; set crop_size={side}"):
        RoIFeatureExtractor(RoIConfig.from_table({**own, "crop_size": side + 16}))
    cropper = RoIFeatureExtractor(RoIConfig.from_table({**own, "crop_size": side}))
    pixels = torch.randint(0, 256, (1, 3, side, side), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    features = cropper.pool(pixels, [torch.tensor([[0.0, 0.0, side / 2, side / 2], [4.0, 4.0, side - 4.0, side - 8.0]])])[0]
    assert features.shape == (2, cropper.feature_dim) and torch.isfinite(features).all()


def test_a_crop_is_the_box_encoded_alone():
    ex = extractor(mode="crop", crop_size=32)
    rng = torch.Generator().manual_seed(1)
    pixels = torch.randint(0, 256, (1, 3, 64, 96), dtype=torch.uint8, generator=rng)
    x = ex.normalize(pixels)
    # a box of exactly crop_size pixels on the pixel grid: the crop is those pixels
    box = torch.tensor([[40.0, 8.0, 72.0, 40.0]])
    direct = ex.backbone(x[:, :, 8:40, 40:72]).mean(dim=(2, 3))[0]
    torch.testing.assert_close(ex.pool(pixels, [box])[0][0], direct, rtol=1e-5, atol=1e-5)
    # what lies outside a box does not reach its crop's feature; the whole picture's map does
    # mix it into a pooled box (why small objects get lost there)
    changed = pixels.clone()
    changed[:, :, :, :30] = 0
    small = torch.tensor([[44.0, 20.0, 60.0, 36.0]])
    torch.testing.assert_close(ex.pool(changed, [small])[0], ex.pool(pixels, [small])[0])
    pooled = extractor()
    assert not torch.allclose(pooled.pool(changed, [small])[0], pooled.pool(pixels, [small])[0])


def test_mixed_mode_crops_the_first_boxes_and_pools_the_others():
    rng = torch.Generator().manual_seed(4)
    pixels = torch.randint(0, 256, (2, 3, 64, 96), dtype=torch.uint8, generator=rng)
    boxes = [torch.tensor([[40.0, 8.0, 72.0, 40.0], [4.0, 4.0, 20.0, 20.0], [0.0, 0.0, 96.0, 64.0]]),
             torch.tensor([[10.0, 30.0, 50.0, 60.0]])]
    cropped = extractor(mode="crop", crop_size=32).pool(pixels, boxes)
    pooled = extractor().pool(pixels, boxes)
    mixed = extractor(mode="mixed", crop_size=32, crop_regions=2).pool(pixels, boxes)
    # the first two boxes of the first picture are its crops, the third is pooled from the map;
    # the second picture has one box, cropped
    torch.testing.assert_close(mixed[0][:2], cropped[0][:2], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mixed[0][2:], pooled[0][2:], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mixed[1], cropped[1], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(mixed[0][2:], cropped[0][2:])
    # no box cropped: the pooled features
    none = extractor(mode="mixed", crop_regions=0).pool(pixels, boxes)
    torch.testing.assert_close(none[0], pooled[0])


def test_crop_features_do_not_depend_on_the_batch_and_take_empty_sets():
    ex = extractor(mode="crop", crop_size=16)
    rng = np.random.default_rng(2)
    pictures = [Image.fromarray(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)) for _ in range(3)]
    pixels = [ex.prepare(p) for p in pictures]
    boxes = [torch.tensor([[0.0, 0.0, 64.0, 48.0], [3.0, 5.0, 11.0, 12.0]]) for _ in range(3)]
    together = ex(pixels, boxes, [p.size for p in pictures])
    for i in range(3):
        torch.testing.assert_close(ex([pixels[i]], [boxes[i]], [pictures[i].size])[0], together[i], rtol=1e-5, atol=1e-6)
    assert together[0].shape == (2, ex.feature_dim)
    assert ex.encode_crops(ex.normalize(pixels[0][None]), torch.zeros(0, 4)).shape == (0, ex.feature_dim)


def small_extraction(tmp_path, seed: int) -> tuple[Path, Path, list[str]]:
    """Two random 64 x 48 pictures, their output folder and the ``xmatch extract`` arguments
    (the random-weight test backbone at 64 px, 4 regions)."""
    photos = tmp_path / "photos"
    photos.mkdir()
    rng = np.random.default_rng(seed)
    for name in ("a.png", "b.png"):
        Image.fromarray(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)).save(photos / name)
    out = tmp_path / "feats"
    args = ["extract", str(photos), "--out", str(out), "--backbone", "test_efficientnet", "--weights", "random",
            "--image-size", "64", "--regions", "4", "--no-progress", "--workers", "0"]
    return photos, out, args


def test_extract_records_the_mode_and_rebuilds_it(tmp_path, capsys):
    photos, out, args = small_extraction(tmp_path, 3)
    assert cli([*args, "--mode", "crop", "--crop-size", "32"]) == 0
    roi = read_manifest(out)["pipeline"]["roi"]
    assert (roi["mode"], roi["crop_size"], roi["output_stride"]) == ("crop", 32, 16)
    recorded = read_manifest(out)["pipeline"]
    pipe = RegionPipeline.from_table({"proposer": recorded["proposer"], "roi": recorded["roi"]})
    stored = np.load(out / "bu_att" / "0.npz")["feat"]
    again = pipe.regions_of([photos / "a.png"])[0].features.numpy()
    np.testing.assert_allclose(again, stored, rtol=1e-5, atol=1e-6)
    # resuming with another mode would mix two kinds of features: refused, the change named
    assert cli([*args, "--mode", "roi", "--resume"]) != 0
    assert "pipeline.roi.mode: 'crop' -> 'roi'" in capsys.readouterr().err


def test_extract_without_a_pipeline_takes_the_defaults(tmp_path):
    from xmatch.extract import extract

    photos = tmp_path / "photos"
    photos.mkdir()
    Image.fromarray(np.random.default_rng(4).integers(0, 256, (90, 120, 3), dtype=np.uint8)).save(photos / "a.png")
    result = extract(photos, tmp_path / "feats", workers=0, progress=False)
    manifest = read_manifest(result.out)
    assert manifest["pipeline"]["roi"] == {**asdict(RoIConfig()), "weights": "package:efficientnet-lite0"}
    assert manifest["pipeline"]["proposer"]["name"] == "windows" and manifest["pipeline"]["stride"] == 16
    # the shorter side at 600 px (a multiple of 16), the aspect kept
    assert manifest["pipeline"]["input"]["side"] == 600


def test_an_extraction_made_before_crop_regions_existed_resumes(tmp_path, capsys):
    _, out, args = small_extraction(tmp_path, 5)
    assert cli(args) == 0
    manifest = json.loads((out / "extract.json").read_text())
    del manifest["pipeline"]["roi"]["crop_regions"]  # as a manifest written before the setting
    manifest["complete"] = False
    (out / "extract.json").write_text(json.dumps(manifest))
    assert cli([*args, "--resume"]) == 0, capsys.readouterr().err
    # a setting that does change the features is still refused
    assert cli([*args, "--resume", "--mode", "mixed"]) != 0
    assert "pipeline.roi.mode: 'roi' -> 'mixed'" in capsys.readouterr().err
