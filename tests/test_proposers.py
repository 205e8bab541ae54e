"""Region proposers: the registry contract (shapes and invariants of every built-in proposer),
the bottom-up select-and-pad rule, grids and windows, user boxes, and torchvision detectors
(random weights: no download)."""

from __future__ import annotations

import json

import pytest
import torch
from PIL import Image

import xmatch
from xmatch.regions import ImageInfo, Proposals, build_proposer, pyramid_boxes, select_and_pad
from xmatch.regions.proposer_boxes import BoxesError
from xmatch.regions.proposer_detector import TorchvisionDetector
from xmatch.core.registry import get_registry
from xmatch.core.spec import SpecError

SIZES = [(64, 48), (37, 90), (200, 200)]
DETECTOR = {"backbone": "fasterrcnn_mobilenet_v3_large_320_fpn", "weights": None, "score_threshold": 0.0, "min_size": 64, "max_size": 128}


def pictures() -> list[ImageInfo]:
    g = torch.Generator().manual_seed(0)
    out = []
    for k, (w, h) in enumerate(SIZES):
        array = torch.randint(0, 256, (h, w, 3), generator=g, dtype=torch.uint8).numpy()
        out.append(ImageInfo(w, h, name=f"img{k}.png", image=Image.fromarray(array)))
    return out


@pytest.fixture(scope="module")
def boxes_file(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("boxes") / "boxes.json"
    images = [{"id": k, "file_name": f"img{k}.png"} for k in range(len(SIZES))]
    annotations = [{"image_id": 0, "bbox": [5, 5, 20, 10], "score": 0.4}, {"image_id": 0, "bbox": [1, 2, 3, 4], "score": 0.9},
                   {"image_id": 1, "bbox": [0, 0, 37, 90], "score": 0.5}]
    path.write_text(json.dumps({"images": images, "annotations": annotations}))
    return str(path)


def contract_kwargs(name: str, boxes_file: str) -> dict:
    return {
        "grid": {"regions": 9},
        "windows": {"regions": 12},
        "boxes": {"source": boxes_file, "regions": 6},
        "torchvision-detector": {**DETECTOR, "regions": 8, "min_regions": 3},
        "selective-search": {"regions": 10, "min_regions": 4},
    }[name]


def builtin() -> list[str]:
    reg = get_registry("proposers")
    return [n for n in reg.names() if reg.origin(n) == "xmatch"]


def test_every_builtin_proposer_has_contract_arguments(boxes_file):
    assert set(builtin()) == {"grid", "windows", "boxes", "torchvision-detector", "selective-search"}
    assert get_registry("proposers").entry_point_group == "xmatch_proposers"


@pytest.mark.parametrize("name", builtin())
def test_proposer_contract(name, boxes_file):
    proposer = build_proposer({"name": name, **contract_kwargs(name, boxes_file)})
    infos = pictures()
    out = proposer(infos)
    assert len(out) == len(infos)
    low = getattr(proposer, "min_regions", 1)
    for info, p in zip(infos, out):
        assert isinstance(p, Proposals)
        assert p.boxes.dtype == torch.float32 and p.boxes.shape == (len(p), 4) and p.scores.shape == (len(p),)
        assert low <= len(p) <= proposer.regions
        assert (p.boxes[:, 0] >= 0).all() and (p.boxes[:, 1] >= 0).all()
        assert (p.boxes[:, 2] <= info.width).all() and (p.boxes[:, 3] <= info.height).all()
        assert (p.boxes[:, 2] - p.boxes[:, 0] >= 1).all() and (p.boxes[:, 3] - p.boxes[:, 1] >= 1).all()
        assert (p.scores[1:] <= p.scores[:-1]).all(), "best first"
    assert [len(p) for p in proposer(infos)] == [len(p) for p in out], "deterministic"


def test_unknown_proposer_and_argument_are_spec_errors():
    with pytest.raises(SpecError, match="unknown proposer 'windowz'. Did you mean: 'windows'"):
        build_proposer("windowz")
    with pytest.raises(SpecError, match="'windows' has no argument 'region'"):
        build_proposer({"name": "windows", "region": 3})
    assert "grid" in xmatch.list_components("proposers")


def test_grid_is_the_largest_square_grid_that_fits():
    p = build_proposer({"name": "grid", "regions": 10})([ImageInfo(90, 30)])[0]
    assert len(p) == 9  # 3 x 3
    assert p.boxes[0].tolist() == [0, 0, 30, 10] and p.boxes[-1].tolist() == [60, 20, 90, 30]
    assert (p.scores == 1).all()


def test_windows_levels_coarse_to_fine():
    p = build_proposer("windows")([ImageInfo(120, 80)])[0]
    assert len(p) == 36
    assert p.boxes[0].tolist() == [0, 0, 120, 80]  # the whole image
    halves = p.boxes[1:10]
    assert torch.allclose(halves[:, 2] - halves[:, 0], torch.tensor(60.0)) and halves[4].tolist() == [30, 20, 90, 60]
    thirds = p.boxes[10:35]
    assert torch.allclose(thirds[:, 2] - thirds[:, 0], torch.tensor(40.0))
    assert torch.allclose(p.boxes[35], torch.tensor([45.0, 30.0, 75.0, 50.0]))  # the centre quarter window
    assert p.scores.tolist() == sorted(p.scores.tolist(), reverse=True)
    with pytest.raises(ValueError, match="overlap must be in"):
        build_proposer({"name": "windows", "overlap": 1.0})


def test_pyramid_padding_is_whole_image_then_finer_grids():
    boxes = pyramid_boxes(40, 20, 1 + 4 + 2)
    assert boxes[0].tolist() == [0, 0, 40, 20]
    assert boxes[1:5].tolist() == [[0, 0, 20, 10], [20, 0, 40, 10], [0, 10, 20, 20], [20, 10, 40, 20]]
    # the 3 x 3 level does not fit whole: 2 of its cells, spread over it (cells 2 and 6)
    assert torch.allclose(boxes[5:], torch.tensor([[80 / 3, 0, 40, 20 / 3], [0, 40 / 3, 40 / 3, 20]]))


def test_select_and_pad_keeps_the_best_and_pads():
    boxes = torch.tensor([[0, 0, 10, 10], [5, 5, 50, 50], [3, 3, 3.5, 20], [-5, -5, 8, 8.0], [0, 0, 40, 40]])
    scores = torch.tensor([0.2, 0.9, 0.8, 0.5, 0.1])
    p = select_and_pad(boxes, scores, 40, 40, regions=3, min_regions=3)
    # the degenerate box (0.5 px wide) is dropped, the best three kept, clipped into the image
    assert p.boxes.tolist() == [[5, 5, 40, 40], [0, 0, 8, 8], [0, 0, 10, 10]]
    assert torch.allclose(p.scores, torch.tensor([0.9, 0.5, 0.2]))
    padded = select_and_pad(boxes[4:], scores[4:], 40, 40, regions=10, min_regions=4)
    # the whole image is already there: padding goes on with the 2 x 2 cells
    assert padded.boxes.tolist() == [[0, 0, 40, 40], [0, 0, 20, 20], [20, 0, 40, 20], [0, 20, 20, 40]]
    assert padded.scores.tolist()[1:] == [0, 0, 0]
    empty = select_and_pad(torch.zeros(0, 4), torch.zeros(0), 30, 30, regions=5, min_regions=2)
    assert empty.boxes.tolist() == [[0, 0, 30, 30], [0, 15, 15, 30]]  # whole image, one spread 2 x 2 cell


def test_boxes_from_a_coco_file(boxes_file):
    proposer = build_proposer({"name": "boxes", "source": boxes_file, "regions": 2, "min_regions": 1})
    first, second, third = proposer(pictures())
    assert first.boxes.tolist() == [[1, 2, 4, 6], [5, 5, 25, 15]]  # x, y, w, h -> x1, y1, x2, y2, by score
    assert second.boxes.tolist() == [[0, 0, 37, 90]]
    assert third.boxes.tolist() == [[0, 0, 200, 200]]  # no annotation: only padding
    with pytest.raises(BoxesError, match=r"no boxes for image other.png: .*boxes.json lists no image"):
        proposer([ImageInfo(10, 10, name="other.png")])
    with pytest.raises(BoxesError, match="give image paths"):
        proposer([ImageInfo(10, 10)])


def test_boxes_from_one_json_per_image(tmp_path):
    (tmp_path / "dogs").mkdir()
    (tmp_path / "dogs" / "rex.json").write_text(json.dumps({"boxes": [[0, 0, 5, 5], [2, 2, 9, 9]], "scores": [0.1, 0.7]}))
    (tmp_path / "cat.json").write_text(json.dumps([[1, 1, 4, 4]]))
    (tmp_path / "bad.json").write_text(json.dumps({"boxes": [[1, 2, 3]]}))
    proposer = build_proposer({"name": "boxes", "source": str(tmp_path), "regions": 2, "min_regions": 1})
    rex, cat = proposer([ImageInfo(10, 10, name="dogs/rex.jpg"), ImageInfo(10, 10, name="/abs/photos/cat.png")])
    assert rex.boxes.tolist() == [[2, 2, 9, 9], [0, 0, 5, 5]]
    assert cat.boxes.tolist() == [[1, 1, 4, 4]]
    with pytest.raises(BoxesError, match=r"bad.json: boxes must be a list of \[x1, y1, x2, y2\]"):
        proposer([ImageInfo(10, 10, name="bad.png")])
    with pytest.raises(BoxesError, match=r"no boxes for image nope.jpg: none of .*nope.json exists"):
        proposer([ImageInfo(10, 10, name="nope.jpg")])
    with pytest.raises(BoxesError, match="does not exist"):
        build_proposer({"name": "boxes", "source": str(tmp_path / "missing.json")})


@pytest.fixture(scope="module")
def detector() -> TorchvisionDetector:
    return TorchvisionDetector(**{**DETECTOR, "regions": 5})


def test_detector_with_random_weights_end_to_end(detector):
    out = detector(pictures())
    assert [len(p) for p in out] == [5, 5, 5]
    assert all((p.scores > 0).any() for p in out), "random weights still detect something at threshold 0"
    # nothing passes a threshold of 1: every box is padding (whole image, then grid cells)
    detector.score_threshold, detector.min_regions = 1.0, 3
    p = detector(pictures())[0]
    detector.score_threshold, detector.min_regions = 0.0, 5
    assert len(p) == 3 and p.boxes[0].tolist() == [0, 0, 64, 48] and (p.scores == 0).all()
    assert not any(t.requires_grad for t in detector.parameters())
    detector.train()
    assert not detector.net.training, "a proposer stays in eval mode"


def test_one_stage_detector():
    ssd = TorchvisionDetector("ssdlite320_mobilenet_v3_large", weights=None, score_threshold=0.0, regions=4)
    assert ssd.net.score_thresh == 0.0  # one-stage models filter on the model itself
    assert [len(p) for p in ssd(pictures()[:1])] == [4]


def test_detector_errors_name_the_fix():
    with pytest.raises(ValueError, match="'fasterrcnn' is not a torchvision detection model. Did you mean"):
        TorchvisionDetector("fasterrcnn", weights=None)
    with pytest.raises(ValueError, match=r"neither a weight tag of .* \(DEFAULT, COCO_V1\) nor an existing file"):
        TorchvisionDetector("fasterrcnn_mobilenet_v3_large_320_fpn", weights="IMAGENET")
    with pytest.raises(ValueError, match="needs the pictures"):
        TorchvisionDetector(**DETECTOR)([ImageInfo(10, 10)])


def test_detector_weights_from_a_local_file(tmp_path):
    from safetensors.torch import save_file

    reference = TorchvisionDetector(**{**DETECTOR, "seed": 3})
    assert not torch.equal(next(reference.parameters()), next(TorchvisionDetector(**DETECTOR).parameters()))
    path = tmp_path / "detector.safetensors"
    save_file({k: v.contiguous() for k, v in reference.net.state_dict().items()}, str(path))
    loaded = TorchvisionDetector(**{**DETECTOR, "weights": str(path)})
    infos = pictures()
    for a, b in zip(reference(infos), loaded(infos)):
        assert torch.equal(a.boxes, b.boxes)
    wrong = tmp_path / "wrong.safetensors"
    save_file({"x": torch.zeros(1)}, str(wrong))
    with pytest.raises(OSError, match="do not fit fasterrcnn_mobilenet_v3_large_320_fpn"):
        TorchvisionDetector(**{**DETECTOR, "weights": str(wrong)})


def test_a_registered_proposer_drives_the_extraction(tmp_path):
    from xmatch.regions import Proposer, RegionPipeline, RoIConfig
    from xmatch.core.registry import proposers

    class Centre(Proposer):
        """The central half of the picture."""

        def __init__(self, regions: int = 1) -> None:
            super().__init__()
            self.regions = regions

        def forward(self, images):
            return [Proposals(torch.tensor([[i.width / 4, i.height / 4, 3 * i.width / 4, 3 * i.height / 4]]), torch.ones(1))
                    for i in images]

    name = "test-centre"
    if name not in proposers:
        xmatch.core.registry.register_proposer(name)(Centre)
    pipe = RegionPipeline(name, RoIConfig("test_efficientnet", weights="random", image_size=64))
    regions = pipe.regions_of([pictures()[0].image])[0]
    assert regions.boxes.tolist() == [[16, 12, 48, 36]] and regions.features.shape == (1, pipe.feature_dim)
    assert pipe.settings()["proposer"] == {"name": name, "regions": 1}
    assert pipe.settings()["roi"]["backbone"] == "test_efficientnet" and pipe.settings()["roi"]["pool_bins"] == 2


def test_the_detector_argument_is_backbone():
    from xmatch.regions.pipeline import proposer_table

    table = proposer_table({**DETECTOR, "name": "torchvision-detector"})
    assert table["backbone"] == DETECTOR["backbone"] and "model" not in table
    with pytest.raises(SpecError, match=r"proposer -> model: 'torchvision-detector' has no argument 'model'\. Arguments: backbone, "):
        proposer_table({"name": "torchvision-detector", "model": DETECTOR["backbone"]})


def test_weights_none_from_the_command_line_is_a_random_initialisation():
    import argparse

    from xmatch.cli.extract import add_parser
    from xmatch.cli.options import toml_value

    parser = argparse.ArgumentParser().add_subparsers()
    add_parser(parser)
    help_text = parser.choices["extract"].format_help()
    assert "backbone=" in help_text and "model=" not in help_text
    spelled = TorchvisionDetector(**{**DETECTOR, "weights": toml_value("none")})  # --proposer-option weights=none
    reference = TorchvisionDetector(**DETECTOR)
    assert all(torch.equal(a, b) for a, b in zip(spelled.parameters(), reference.parameters()))
