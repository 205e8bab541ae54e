"""The selective-search proposer: tight boxes of flat-colour objects, boxes in the picture's
frame after segmenting a shrunk copy, a fixed count with padding, determinism, its errors,
and a region pipeline built on it by name."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from xmatch.core.spec import SpecError
from xmatch.regions import ImageInfo, RegionPipeline, RoIConfig, build_proposer
from xmatch.regions.proposer_segments import SelectiveSearchProposer

pytest.importorskip("skimage", reason="the selective-search proposer segments with scikit-image")

#: flat-colour rectangles (x1, y1, x2, y2) and their colours, on a grey gradient
RECTANGLES = [((20, 30, 44, 50), (220, 40, 40)), ((120, 100, 160, 150), (45, 95, 230)),
              ((170, 20, 190, 38), (240, 215, 40)), ((60, 160, 100, 190), (40, 175, 70))]


def picture(width: int = 224, height: int = 224, scale: float = 1.0) -> Image.Image:
    """A grey gradient with :data:`RECTANGLES` drawn on it (coordinates times ``scale``)."""
    x = np.linspace(60, 110, width)[None, :, None]
    array = np.broadcast_to(x, (height, width, 3)).astype(np.uint8).copy()
    for (x1, y1, x2, y2), colour in RECTANGLES:
        array[round(y1 * scale):round(y2 * scale), round(x1 * scale):round(x2 * scale)] = colour
    return Image.fromarray(array)


def iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    from torchvision.ops import box_iou

    return box_iou(a, b)


def info(image: Image.Image) -> ImageInfo:
    return ImageInfo(image.width, image.height, image=image)


def test_flat_colour_rectangles_get_tight_boxes():
    proposals = SelectiveSearchProposer()([info(picture())])[0]
    targets = torch.tensor([box for box, _ in RECTANGLES], dtype=torch.float32)
    best = iou(targets, proposals.boxes).max(1).values
    assert (best > 0.8).all(), best
    assert proposals.boxes[0].tolist() == [0, 0, 224, 224]  # the whole picture comes first


def test_boxes_of_a_shrunk_segmentation_are_in_the_pictures_frame():
    width, height, scale = 600, 540, 600 / 224  # every rectangle inside (y up to 509)
    image = picture(width, height, scale)
    proposals = SelectiveSearchProposer(segment_side=224)([info(image)])[0]
    boxes = proposals.boxes
    assert (boxes[:, :2] >= 0).all() and (boxes[:, 2] <= width).all() and (boxes[:, 3] <= height).all()
    assert ((boxes[:, 2:] - boxes[:, :2]) >= 1).all()
    targets = torch.tensor([box for box, _ in RECTANGLES], dtype=torch.float32) * scale
    assert (iou(targets, boxes).max(1).values > 0.8).all()


def test_a_fixed_count_padded_with_the_pyramid_or_a_variable_one():
    flat = Image.new("RGB", (96, 64), (128, 128, 128))  # one segment: the whole picture only
    fixed = SelectiveSearchProposer(regions=12)([info(flat)])[0]
    assert len(fixed) == 12 and fixed.scores[0] > 0 and (fixed.scores[1:] == 0).all()
    assert fixed.boxes[0].tolist() == [0, 0, 96, 64]
    variable = SelectiveSearchProposer(regions=12, min_regions=3)([info(flat), info(picture())])
    assert len(variable[0]) == 3
    assert len(variable[1]) == 12 and (variable[1].scores > 0).all()  # enough segments: no padding
    assert (variable[1].scores[:-1] >= variable[1].scores[1:]).all()


def test_a_few_proposals_then_the_pyramid():
    every = SelectiveSearchProposer(regions=20)([info(picture())])[0]
    few = SelectiveSearchProposer(regions=20, proposals=5)([info(picture())])[0]
    assert len(few) == 20 and torch.equal(few.boxes[:5], every.boxes[:5])
    assert (few.scores[:5] > 0).all() and (few.scores[5:] == 0).all()
    # the padding is the pyramid of select_and_pad: the whole picture (already first) is not repeated
    assert few.boxes[5].tolist() == [0, 0, 112, 112]
    targets = torch.tensor([box for box, _ in RECTANGLES], dtype=torch.float32)
    assert (iou(targets, few.boxes[:5]).max(1).values > 0.8).all()  # the objects are among the five


@pytest.mark.parametrize("ranking", ["contrast", "hierarchy"])
def test_the_same_picture_gives_the_same_boxes(ranking):
    image = picture()
    first = SelectiveSearchProposer(ranking=ranking, seed=3)([info(image), info(image)])
    again = SelectiveSearchProposer(ranking=ranking, seed=3)([info(image)])[0]
    assert torch.equal(first[0].boxes, first[1].boxes) and torch.equal(first[0].boxes, again.boxes)
    assert torch.equal(first[0].scores, again.scores)


def test_near_duplicates_are_dropped():
    boxes = SelectiveSearchProposer(regions=36, min_regions=1, duplicate_iou=0.5)([info(picture())])[0].boxes
    overlap = iou(boxes, boxes).fill_diagonal_(0)
    assert overlap.max() <= 0.5


def test_a_picture_is_needed():
    with pytest.raises(ValueError, match=r"looks at pixels, but images \[1\] came without a picture; pass ImageInfo\(width, height, image="):
        SelectiveSearchProposer()([info(picture()), ImageInfo(224, 224, name="a.png")])


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"regions": 0}, r"regions must be a positive number of boxes per image, got 0"),
    ({"min_regions": 40}, r"min_regions must be between 1 and regions=36, got 40"),
    ({"scale": 0}, r"scale must be positive \(Felzenszwalb's k, e\.g\. 300\), got 0"),
    ({"sigma": -1}, r"sigma must be 0 or more"),
    ({"min_size": 0}, r"min_size must be a positive number of pixels \(e\.g\. 20\), got 0"),
    ({"segment_side": 8}, r"segment_side must be a number of pixels of at least 16 \(e\.g\. 224\), got 8"),
    ({"strategies": ["colour", "shape"]}, r"strategies must be a non-empty list of colour, texture, size, fill; got \['colour', 'shape'\]"),
    ({"strategies": []}, r"strategies must be a non-empty list"),
    ({"ranking": "random"}, r"ranking must be one of contrast, hierarchy, got 'random'"),
    ({"duplicate_iou": 0}, r"duplicate_iou must be in \(0, 1\] \(1 keeps every box\), got 0"),
    ({"proposals": 40}, r"proposals must be a whole number from 1 to regions=36 \(selective search's own boxes; grid cells fill the rest\), got 40"),
    ({"proposals": 0}, r"proposals must be a whole number from 1 to regions=36"),
])
def test_bad_arguments_are_named_with_the_fix(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SelectiveSearchProposer(**kwargs)


def test_every_strategy_alone_still_groups_the_whole_picture():
    for strategy in ("colour", "texture", "size", "fill"):
        proposals = SelectiveSearchProposer(strategies=[strategy])([info(picture())])[0]
        assert proposals.boxes[0].tolist() == [0, 0, 224, 224] and len(proposals) == 36


def test_built_by_name_and_refused_with_unknown_arguments():
    proposer = build_proposer({"name": "selective-search", "regions": 8, "strategies": ["colour", "size"]})
    assert isinstance(proposer, SelectiveSearchProposer) and proposer.needs_pixels and proposer.regions == 8
    with pytest.raises(SpecError, match="has no argument 'k'"):
        build_proposer({"name": "selective-search", "k": 100})


def test_a_region_pipeline_on_selective_search():
    pipe = RegionPipeline("selective-search", RoIConfig("test_efficientnet", weights="random", image_size=64))
    image = picture()
    regions = pipe.regions_of([image])[0]
    expected = SelectiveSearchProposer()([info(image)])[0]
    assert torch.equal(regions.boxes, expected.boxes)
    assert regions.features.shape == (36, pipe.feature_dim) and pipe.fixed_regions
    assert pipe.settings()["proposer"]["name"] == "selective-search"
