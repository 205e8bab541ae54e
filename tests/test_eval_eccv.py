"""ECCV Caption and CxC: xmatch's vectorised figures equal the eccv-caption package's own
evaluator on the same rankings (synthetic scores: random, perfect, perturbed), on small
synthetic id sets (fast) and on the package's real COCO 5K ids (slow)."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pytest

from xmatch.eval import eccv

eccv_caption = pytest.importorskip("eccv_caption")


def _theirs(package, items: dict, what: str, **kwargs):
    with contextlib.redirect_stderr(io.StringIO()):  # the package's evaluator always shows a bar
        return getattr(package, what)(items, "all", **kwargs)


def _assert_same(package, scores: np.ndarray, ids: eccv.CocoIds) -> None:
    """xmatch's ECCV Caption, CxC and PMRP figures against the package's, on one score matrix."""
    items = eccv.retrieved_items(scores, ids, k=100)
    mine = eccv.eccv_caption_metrics(scores, ids, package)
    theirs = _theirs(package, items, "eccv_metrics")
    for direction in ("i2t", "t2i"):
        for key in ("map_at_r", "rprecision", "r1"):
            assert mine[direction][key] == pytest.approx(100 * theirs[f"eccv_{key}"][direction], abs=1e-9), (direction, key)
    cxc = eccv.cxc_recalls(scores, ids, package=package)
    for k in (1, 5, 10):
        theirs = _theirs(package, items, "cxc_recalls", K=k)
        assert cxc["i2t"][f"r{k}"] == pytest.approx(100 * theirs["i2t"], abs=1e-9)
        assert cxc["t2i"][f"r{k}"] == pytest.approx(100 * theirs["t2i"], abs=1e-9)
    if package.pm_gts:
        pm, theirs = eccv.pmrp(scores, ids, package), _theirs(package, items, "pmrp")
        assert pm["i2t"] == pytest.approx(100 * theirs["i2t"]) and pm["t2i"] == pytest.approx(100 * theirs["t2i"])


# --- a small synthetic id space, through the package's own evaluator (fast) ----------------


def _synthetic_package(seed: int = 0, n_images: int = 60, per_image: int = 5):
    rng = np.random.default_rng(seed)
    images = rng.choice(10**6, n_images, replace=False)
    captions = rng.choice(10**6, n_images * per_image, replace=False)
    owner = np.repeat(np.arange(n_images), per_image)
    coco = {"i2t": {int(images[i]): captions[owner == i].tolist() for i in range(n_images)},
            "t2i": {int(c): [int(images[owner[k]])] for k, c in enumerate(captions)}}

    def extra(queries, gallery, own, share, most):
        out = {}
        for q, mine in zip(queries, own):
            picks = rng.choice(gallery, size=int(rng.integers(0, most)), replace=False).tolist()
            out[int(q)] = list(dict.fromkeys([*mine, *picks]))
        return dict(list(out.items())[: int(share * len(out))])

    i2t_own = [captions[owner == i].tolist() for i in range(n_images)]
    t2i_own = [[int(images[o])] for o in owner]
    package = eccv_caption.Metrics.__new__(eccv_caption.Metrics)
    package.verbose = False
    package.coco_ids = captions
    package.coco_gts = coco
    package.cxc_gts = {"i2t": extra(images, captions, i2t_own, 1.0, 4), "t2i": extra(captions, images, t2i_own, 1.0, 3)}
    # ECCV: a subset of the queries, many positives, one positive outside the gallery
    eccv_i2t = extra(images, captions, i2t_own, 0.4, 20)
    first = next(iter(eccv_i2t))
    eccv_i2t[first] = [*eccv_i2t[first], 999_999_999]
    package.eccv_gts = {"i2t": eccv_i2t, "t2i": extra(captions, images, t2i_own, 0.3, 8)}
    package.pm_gts = {"i2t": extra(images, captions, i2t_own, 0.5, 30), "t2i": extra(captions, images, t2i_own, 0.5, 10)}
    return package, eccv.CocoIds(images, captions), owner


def _perfect(package, ids: eccv.CocoIds, direction: str) -> np.ndarray:
    """Scores that rank every ECCV positive of ``direction`` first."""
    rng = np.random.default_rng(1)
    scores = rng.uniform(0, 0.5, (len(ids.image_ids), len(ids.caption_ids)))
    row = {int(i): k for k, i in enumerate(ids.image_ids)}
    col = {int(c): k for k, c in enumerate(ids.caption_ids)}
    for q, positives in package.eccv_gts[direction].items():
        for p in positives:
            if direction == "i2t" and p in col:
                scores[row[q], col[p]] = 1.0 + rng.uniform()
            elif direction == "t2i" and p in row:
                scores[row[p], col[q]] = 1.0 + rng.uniform()
    return scores


@pytest.mark.parametrize("case", ["random", "perfect-i2t", "perfect-t2i", "perturbed", "ties"])
def test_figures_equal_the_package_evaluator_on_synthetic_ids(case):
    package, ids, owner = _synthetic_package()
    rng = np.random.default_rng(2)
    shape = (len(ids.image_ids), len(ids.caption_ids))
    if case == "random":
        scores = rng.normal(size=shape)
    elif case.startswith("perfect"):
        scores = _perfect(package, ids, case.split("-")[1])
    elif case == "perturbed":
        scores = _perfect(package, ids, "i2t") + rng.normal(scale=0.4, size=shape)
    else:  # coarse scores: many ties, which both sides must break the same way
        scores = np.round(rng.uniform(size=shape), 1)
    _assert_same(package, scores, ids)
    if case == "perfect-i2t":
        figures = eccv.eccv_caption_metrics(scores, ids, package)["i2t"]
        # every positive first, except the one outside the gallery (R counts it, nothing finds it)
        assert figures["r1"] == 100.0 and 95.0 < figures["map_at_r"] < 100.0


def test_r_precision_figures_by_hand():
    # R = 3; positives found at ranks 1, 3 and 7 (0-based 0, 2, 6): precision@1 = 1, @3 = 2/3
    figures = eccv.rprecision_figures(np.array([[0.0, 2.0, 6.0]]), np.array([3]))
    assert figures["map_at_r"] == pytest.approx(100 * (1 + 2 / 3) / 3)
    assert figures["rprecision"] == pytest.approx(100 * 2 / 3) and figures["r1"] == 100.0


def test_top_lists_break_ties_in_gallery_order():
    scores = np.array([[0.5, 0.9, 0.5, 0.9, 0.1], [0.0, 0.0, 0.0, 0.0, 0.0]])
    assert eccv.top_lists(scores, 4).tolist() == [[1, 3, 0, 2], [0, 1, 2, 3]]
    assert eccv.top_lists(scores, 9).shape == (2, 5)


# --- mapping a dataset onto the package's ids -----------------------------------------------


class _Split:
    def __init__(self, owner, caption_ids=None):
        self.caption_image = owner
        if caption_ids is not None:
            self.caption_ids = caption_ids


def test_coco_ids_map_captions_to_images_and_fail_clearly(tmp_path: Path):
    package, ids, owner = _synthetic_package()
    mapped = eccv.coco_ids(_Split(owner), ids.caption_ids, package)
    np.testing.assert_array_equal(mapped.image_ids, ids.image_ids)
    (tmp_path / "ids.txt").write_text("\n".join(map(str, ids.caption_ids)))
    np.testing.assert_array_equal(eccv.coco_ids(_Split(owner), tmp_path / "ids.txt", package).caption_ids, ids.caption_ids)
    assert eccv.coco_ids(_Split(owner, ids.caption_ids), None, package).image_ids.shape == (60,)
    with pytest.raises(ValueError, match="--caption-ids FILE"):
        eccv.coco_ids(_Split(owner), None, package)
    with pytest.raises(ValueError, match="299 caption ids for 300 captions"):
        eccv.coco_ids(_Split(owner), ids.caption_ids[:-1], package)
    with pytest.raises(ValueError, match="not COCO 5K test captions"):
        eccv.coco_ids(_Split(owner), ids.caption_ids + 10**7, package)
    swapped = ids.caption_ids.copy()
    swapped[[4, 5]] = swapped[[5, 4]]  # a caption of image 1 among image 0's
    with pytest.raises(ValueError, match="belong to different COCO images"):
        eccv.coco_ids(_Split(owner), swapped, package)
    with pytest.raises(ValueError, match="whole COCO 5K test split"):
        eccv.eccv_caption_metrics(np.zeros((30, 150)), eccv.CocoIds(ids.image_ids[30:], ids.caption_ids[150:]), package)


def test_pmrp_names_the_files_it_needs(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match="pm_image_to_caption.json, pm_caption_to_image.json"):
        eccv.load_package(tmp_path)
    package, ids, _ = _synthetic_package()
    package.pm_gts = {}
    with pytest.raises(FileNotFoundError, match="plausible-match files"):
        eccv.pmrp(np.zeros((60, 300)), ids, package)
    (tmp_path / "pm_image_to_caption.json").write_text(json.dumps({"1": [2]}))
    (tmp_path / "pm_caption_to_image.json").write_text(json.dumps({"2": [1]}))
    assert eccv.load_package(tmp_path).pm_gts["i2t"] == {1: [2]}


# --- the package's real COCO 5K ids (slow: 5,000 x 25,000 scores) ---------------------------


@pytest.fixture(scope="module")
def coco5k():
    package = eccv.load_package()
    captions = np.asarray(package.coco_ids, dtype=np.int64)
    images = np.array([package.coco_gts["t2i"][int(c)][0] for c in captions[::5]], dtype=np.int64)
    return package, eccv.CocoIds(images, captions)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["random", "perfect", "perturbed"])
def test_figures_equal_the_package_evaluator_on_the_coco_5k_ids(coco5k, case):
    package, ids = coco5k
    rng = np.random.default_rng(0)
    scores = rng.standard_normal((5000, 25000), dtype=np.float32)
    scores[np.arange(25000) // 5, np.arange(25000)] += 2.0
    if case != "random":
        row = {int(i): k for k, i in enumerate(ids.image_ids)}
        col = {int(c): k for k, c in enumerate(ids.caption_ids)}
        for q, positives in package.eccv_gts["t2i"].items():
            scores[[row[p] for p in positives], col[q]] += 20.0
        if case == "perturbed":
            scores += rng.standard_normal(scores.shape, dtype=np.float32) * 8.0
    _assert_same(package, scores, ids)
    if case == "perfect":
        assert eccv.eccv_caption_metrics(scores, ids, package)["t2i"]["map_at_r"] == 100.0
