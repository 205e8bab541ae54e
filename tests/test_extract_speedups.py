"""Extraction throughput without other features: batch norms folded into the convolutions
(equal to the unfolded backbone within float rounding, weights fingerprinted as loaded), the
opt-in bfloat16 backbone (close to float32, never mixed with it on resume)."""

from __future__ import annotations


import numpy as np
import pytest
import torch
from torch import nn

from xmatch.cli.extract import roi_config
from xmatch.cli.main import build_parser
from xmatch.components.image.backbone import fold_batch_norms
from xmatch.extract import extract
from xmatch.extract.run import ExtractError
from xmatch.regions import RegionPipeline, RoIConfig, RoIFeatureExtractor, fingerprint, read_manifest
from xmatch.regions.features import load_backbone

timm = pytest.importorskip("timm")
Image = pytest.importorskip("PIL.Image")

ROI = {"backbone": "test_efficientnet", "weights": "random", "image_size": 64}
PIPE = {"proposer": {"name": "windows", "regions": 6}, "roi": ROI}
BOXES = torch.tensor([[0.0, 0.0, 64.0, 48.0], [8.0, 4.0, 40.0, 44.0], [30.0, 10.0, 62.0, 30.0]])


def picture(width: int = 80, height: int = 64) -> torch.Tensor:
    """``uint8 [1, 3, h, w]``: smooth gradients with some noise (a photo's statistics, roughly)."""
    y, x = torch.meshgrid(torch.linspace(0, 1, height), torch.linspace(0, 1, width), indexing="ij")
    noise = torch.rand(3, height, width, generator=torch.Generator().manual_seed(0))
    rgb = torch.stack([x, y, (x + y) / 2]) * 0.8 + noise * 0.2
    return (rgb * 255).round().to(torch.uint8)[None]


def perturbed_norms(net: nn.Module, seed: int = 0) -> nn.Module:
    """Batch norms with running statistics and affine maps far from the identity, so that a
    wrong fold cannot pass for a right one."""
    g = torch.Generator().manual_seed(seed)
    for m in net.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=g))
            m.running_var.copy_(torch.rand(m.num_features, generator=g) * 2 + 0.2)
            m.weight.data.copy_(torch.randn(m.num_features, generator=g))
            m.bias.data.copy_(torch.randn(m.num_features, generator=g))
    return net.eval()


@pytest.mark.parametrize("name, options", [("test_efficientnet", {}), ("test_efficientnet", {"output_stride": 16}),
                                           ("resnet18", {})])
def test_folding_keeps_the_map_and_removes_every_norm(name, options):
    torch.manual_seed(0)
    net = perturbed_norms(timm.create_model(name, num_classes=0, **options))
    norms = sum(isinstance(m, nn.BatchNorm2d) for m in net.modules())
    x = torch.randn(2, 3, 64, 80)
    with torch.no_grad():
        before = net.forward_features(x)
        assert fold_batch_norms(net) == norms > 0
        after = net.forward_features(x)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in net.modules())
    torch.testing.assert_close(after, before, rtol=1e-4, atol=1e-4 * before.abs().max().item())


def test_only_a_norm_that_alone_reads_a_plain_convolution_is_folded():
    class Branches(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.shared, self.norm_shared = nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4)
            self.std = timm.layers.ScaledStdConv2d(3, 4, 1)
            self.norm_std = nn.BatchNorm2d(4)
            self.plain, self.norm_plain = nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.shared(x)  # its output also feeds the sum: the norm cannot carry it
            return self.norm_shared(y) + y + self.norm_std(self.std(x)) + self.norm_plain(self.plain(x))

    net = perturbed_norms(Branches())
    x = torch.randn(1, 3, 8, 8)
    with torch.no_grad():
        before = net(x)
        assert fold_batch_norms(net) == 1
        torch.testing.assert_close(net(x), before, rtol=1e-5, atol=1e-5)
    assert isinstance(net.norm_plain, nn.Identity)
    assert isinstance(net.norm_shared, nn.BatchNorm2d) and isinstance(net.norm_std, nn.BatchNorm2d)
    assert fold_batch_norms(perturbed_norms(Branches()).train()) == 0  # training norms use the batch's statistics


@pytest.mark.parametrize("mode", ["roi", "crop"])
def test_extractor_features_equal_the_unfolded_backbones(mode):
    roi = RoIConfig(image_size=64, mode=mode, crop_size=32)  # the packaged EfficientNet-Lite0: real norm statistics
    extractor = RoIFeatureExtractor(roi)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in extractor.backbone.modules())
    reference = load_backbone(roi)
    assert extractor.fingerprint == fingerprint(reference.net)  # manifests of earlier extractions still match
    pixels = picture()
    folded = extractor.pool(pixels, [BOXES])[0]
    extractor.backbone = reference.eval().to(memory_format=torch.channels_last)
    unfolded = extractor.pool(pixels, [BOXES])[0]
    torch.testing.assert_close(folded, unfolded, rtol=1e-4, atol=1e-5 * unfolded.abs().max().item())


def test_bfloat16_features_are_close_to_float32_and_pooled_in_float32(monkeypatch):
    import xmatch.regions.features as features

    fp32 = RoIFeatureExtractor(RoIConfig(image_size=64))
    bf16 = RoIFeatureExtractor(RoIConfig(image_size=64, compute_dtype="bfloat16"))
    assert next(bf16.backbone.parameters()).dtype == torch.bfloat16 and bf16.fingerprint == fp32.fingerprint
    assert bf16.roi.compute_dtype == "bfloat16" and bf16.describe()["roi"]["compute_dtype"] == "bfloat16"
    pooled_maps = []
    real = features.roi_features
    monkeypatch.setattr(features, "roi_features", lambda fmap, *args: pooled_maps.append(fmap.dtype) or real(fmap, *args))
    pixels = picture()
    a, b = fp32.pool(pixels, [BOXES])[0], bf16.pool(pixels, [BOXES])[0]
    # box corners in bfloat16 would be off by up to a pixel in 256: the map is pooled in float32
    assert pooled_maps == [torch.float32, torch.float32]
    assert b.dtype == torch.float32 and b.shape == a.shape and not torch.equal(a, b)
    assert torch.nn.functional.cosine_similarity(a, b).min() > 0.99


def test_compute_dtype_is_checked_and_set_by_the_cli():
    with pytest.raises(ValueError, match="compute_dtype must be one of float32, bfloat16, got 'float16'"):
        RoIConfig(compute_dtype="float16")
    args = build_parser().parse_args(["extract", "photos", "--out", "o", "--compute-dtype", "bfloat16"])
    assert roi_config(args) == RoIConfig(compute_dtype="bfloat16")
    assert roi_config(build_parser().parse_args(["extract", "photos", "--out", "o"])).compute_dtype == "float32"


def test_resume_keeps_the_compute_dtype(tmp_path):
    photos = tmp_path / "photos"
    photos.mkdir()
    rng = np.random.default_rng(0)
    for k, size in enumerate([(64, 48), (50, 70), (64, 48)]):
        Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(photos / f"{k}.png")
    out = tmp_path / "out"
    extract(photos, out, PIPE, batch_size=2, workers=0, progress=False)
    assert read_manifest(out)["pipeline"]["roi"]["compute_dtype"] == "float32"
    # float32 and bfloat16 features are not mixed in one folder
    with pytest.raises(ExtractError, match=r"other settings \(pipeline.roi.compute_dtype: 'float32' -> 'bfloat16'\)"):
        extract(photos, out, {**PIPE, "roi": {**ROI, "compute_dtype": "bfloat16"}}, batch_size=2, workers=0,
                progress=False, resume=True)
    result = extract(photos, out, PIPE, batch_size=2, workers=0, progress=False, resume=True)
    assert (result.extracted, result.skipped) == (0, 3) and read_manifest(out)["complete"]


def test_a_bfloat16_pipeline_extracts(tmp_path):
    photos = tmp_path / "photos"
    photos.mkdir()
    Image.fromarray(np.asarray(picture()[0].permute(1, 2, 0))).save(photos / "a.png")
    result = extract(photos, tmp_path / "out", {**PIPE, "roi": {**ROI, "compute_dtype": "bfloat16"}}, workers=0,
                     progress=False)
    assert result.extracted == 1
    recorded = read_manifest(tmp_path / "out")["pipeline"]
    pipe = RegionPipeline.from_table({"proposer": recorded["proposer"], "roi": recorded["roi"]})
    assert pipe.extractor.roi.compute_dtype == "bfloat16"  # the pixel-regions encoder rebuilds the same arithmetic
    direct = pipe.regions_of([photos / "a.png"])[0].features
    with np.load(next((tmp_path / "out" / "bu_att").glob("*.npz"))) as stored:
        np.testing.assert_array_equal(stored["feat"], direct.numpy())


def test_decoding_workers_default_to_none_on_two_cores(monkeypatch, tmp_path):
    import xmatch.extract.run as run

    assert [run.decoding_workers(n) for n in (1, 2, 3, 16)] == [0, 0, 2, 2]
    monkeypatch.setattr(run.os, "cpu_count", lambda: 2)
    assert run.decoding_workers() == 0
    used = []
    real = torch.utils.data.DataLoader

    def spy(*args, **kwargs):
        used.append(kwargs["num_workers"])
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.utils.data, "DataLoader", spy)
    photos = tmp_path / "photos"
    photos.mkdir()
    Image.fromarray(np.asarray(picture()[0].permute(1, 2, 0))).save(photos / "a.png")
    extract(photos, tmp_path / "out", PIPE, progress=False)
    assert used == [0]
