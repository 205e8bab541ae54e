"""Hard-negative groups: hand-computed group accuracies and Winoground scores, group files,
the scenes twins declared through the groups interface, `--protocol groups`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from xmatch.eval.groups import Group, GroupResult, GroupSet, dataset_groups, score_groups

# 4 images, 2 captions each: caption k belongs to image k // 2
OWNER = np.repeat(np.arange(4), 2)


def test_a_pair_by_hand():
    groups = GroupSet([Group((0, 1), "relation")], OWNER)
    scores = np.zeros((4, 8))
    # image 0 vs image 1 on the captions 0, 1 (of image 0) and 2, 3 (of image 1)
    scores[0, :4] = [0.9, 0.5, 0.6, 0.4]
    scores[1, :4] = [0.2, 0.7, 0.8, 0.3]
    r = score_groups(scores, groups).overall
    # t2i, per caption: c0 0.9>0.2 yes, c1 0.5>0.7 no, c2 0.8>0.6 yes, c3 0.3>0.4 no
    assert r["t2i"] == 50.0 and r["queries"] == 4
    # i2t, per (image, own caption): image 0 with c0: 0.9 > max(0.6, 0.4) yes; with c1: 0.5 > 0.6 no;
    # image 1 with c2: 0.8 > max(0.2, 0.7) yes; with c3: 0.3 no
    assert r["i2t"] == 50.0
    # Winoground over the 4 pairings (k of image 0, l of image 1): (c0, c2) (c0, c3) (c1, c2) (c1, c3)
    # text: s(0,k) > s(0,l) and s(1,l) > s(1,k): (c0,c2) .9>.6, .8>.2 yes; (c0,c3) .9>.4, .3>.2 yes;
    #       (c1,c2) .5>.6 no; (c1,c3) .5>.4, .3>.7 no  -> 2 / 4
    # image: s(0,k) > s(1,k) and s(1,l) > s(0,l): (c0,c2) .9>.2, .8>.6 yes; (c0,c3) .3>.4 no;
    #        (c1,c2) .5>.7 no; (c1,c3) no -> 1 / 4; group: (c0,c2) only -> 1 / 4
    assert (r["text"], r["image"], r["group"]) == (50.0, 25.0, 25.0)
    # chance: 1 of 2 images; 1 of 3 captions (the own one against the 2 of the other image)
    chances = (r["t2i_chance"], r["i2t_chance"], r["text_chance"], r["group_chance"])
    assert chances == pytest.approx((50.0, 100 / 3, 25.0, 100 / 6))


def test_winoground_on_single_caption_pairs_is_the_papers_definition():
    owner = np.arange(4)  # one caption per image, as in Winoground
    groups = GroupSet([Group((0, 1), "a"), Group((2, 3), "b")], owner)
    scores = np.array([
        [0.9, 0.1, 0.0, 0.0],  # pair 1: both images prefer their captions, both captions their images
        [0.2, 0.8, 0.0, 0.0],
        [0.0, 0.0, 0.6, 0.7],  # pair 2: image 2 prefers caption 3 (text fails), captions prefer their images
        [0.0, 0.0, 0.5, 0.9],
    ])
    r = score_groups(scores, groups)
    assert (r.by_kind["a"]["text"], r.by_kind["a"]["image"], r.by_kind["a"]["group"]) == (100.0, 100.0, 100.0)
    assert (r.by_kind["b"]["text"], r.by_kind["b"]["image"], r.by_kind["b"]["group"]) == (0.0, 100.0, 0.0)
    assert (r.overall["text"], r.overall["image"], r.overall["group"]) == (50.0, 100.0, 50.0)
    assert r.overall["groups"] == 2 and r.by_kind["b"]["groups"] == 1


def test_ties_count_as_wrong_and_perfect_scores_win_everything():
    groups = GroupSet([Group((0, 1, 2), "triple"), Group((2, 3), "pair")], OWNER)
    tied = score_groups(np.ones((4, 8)), groups).overall
    assert all(tied[f] == 0.0 for f in ("t2i", "i2t", "text", "image", "group"))
    perfect = np.where(OWNER[None, :] == np.arange(4)[:, None], 1.0, 0.0)
    result = score_groups(perfect, groups)
    assert all(result.overall[f] == 100.0 for f in ("t2i", "i2t", "text", "image", "group"))
    # Winoground counts the pair only; the chance of t2i mixes 1/3 (triple) and 1/2 (pair)
    assert result.overall["pairs"] == 1 and result.by_kind["triple"]["text"] is None
    assert result.by_kind["triple"]["t2i_chance"] == pytest.approx(100 / 3)
    assert "triple" in result.table() and "chance" in result.table()


def test_group_figures_match_a_loop_reference_on_random_scores():
    rng = np.random.default_rng(0)
    owner = np.repeat(np.arange(30), 3)
    members = [tuple(rng.choice(30, size=int(rng.integers(2, 5)), replace=False)) for _ in range(12)]
    groups = GroupSet([Group(m, "k") for m in members], owner)
    scores = rng.normal(size=(30, 90))
    t2i, i2t = [], []
    for m in members:
        for image in m:
            others = [i for i in m if i != image]
            for q in np.flatnonzero(owner == image):
                t2i.append(scores[image, q] > max(scores[o, q] for o in others))
                rivals = [q2 for o in others for q2 in np.flatnonzero(owner == o)]
                i2t.append(scores[image, q] > max(scores[image, q2] for q2 in rivals))
    r = score_groups(scores, groups).overall
    assert r["t2i"] == pytest.approx(100 * np.mean(t2i)) and r["i2t"] == pytest.approx(100 * np.mean(i2t))


def test_caption_selection_and_bad_groups():
    groups = GroupSet([Group((0, 1), "x", captions=((1,), (2,)))], OWNER)
    assert groups.unit_caption.tolist() == [1, 2]
    with pytest.raises(ValueError, match="at least two different images"):
        GroupSet([Group((1, 1))], OWNER)
    with pytest.raises(ValueError, match="outside the split's 4 images"):
        GroupSet([Group((0, 7))], OWNER)
    with pytest.raises(ValueError, match="caption 5 is not a caption of image 0"):
        GroupSet([Group((0, 1), captions=((5,), (2,)))], OWNER)
    with pytest.raises(ValueError, match="pass the \\[images, captions\\] scores"):
        score_groups(np.zeros((2, 8)), GroupSet([Group((0, 3))], OWNER))


class _Split:
    image_names = ["images/10.png", "images/11.png", "images/12.png", "images/13.png"]
    caption_image = OWNER


def test_groups_from_a_json_file(tmp_path: Path):
    path = tmp_path / "groups.json"
    path.write_text(json.dumps({"groups": [
        {"kind": "swap", "images": ["10", "images/11.png"]},
        {"kind": "count", "images": [2, 3], "captions": [[1], [0]]},
    ]}))
    groups = GroupSet.from_json(path, _Split())
    assert groups.kinds == ["swap", "count"] and groups.member_image.tolist() == [0, 1, 2, 3]
    assert groups.unit_caption.tolist() == [0, 1, 2, 3, 5, 6]
    assert dataset_groups(_Split(), path).kinds == ["swap", "count"]
    path.write_text(json.dumps([{"images": ["10", "99"]}]))
    with pytest.raises(ValueError, match="no image named '99'"):
        GroupSet.from_json(path, _Split())
    path.write_text(json.dumps({"groups": [{"images": [0, 1], "captions": [[0], [4]]}]}))
    with pytest.raises(ValueError, match="caption position 4 of image 'images/11.png', which has 2 captions"):
        GroupSet.from_json(path, _Split())
    with pytest.raises(ValueError, match="declares no hard-negative groups; .* --groups FILE"):
        dataset_groups(_Split())


def test_group_result_round_trips_as_plain_data():
    r = score_groups(np.eye(4).repeat(2, axis=1), GroupSet([Group((0, 1), "a"), Group((2, 3), "b")], OWNER))
    again = GroupResult.from_dict(json.loads(json.dumps(r.as_dict())))
    assert again == r


def test_group_table_says_n_a_where_a_kind_has_no_pairs():
    """A group of three has no Winoground scores: its kind shows n/a (with why), never a bare
    '-' or a chance of 0.0."""
    owner = np.repeat(np.arange(5), 2)
    scores = np.eye(5).repeat(2, axis=1)
    mixed = score_groups(scores, GroupSet([Group((0, 1), "pair"), Group((2, 3, 4), "trio")], owner))
    lines = mixed.table().splitlines()
    trio = next(line for line in lines if line.startswith("trio")).split()
    assert trio[1:] == ["1", "100.0", "100.0", "n/a", "n/a", "n/a"]
    assert next(line for line in lines if line.startswith("pair")).split()[-3:] == ["100.0", "100.0", "100.0"]
    assert lines[-1].startswith("n/a: no groups of two (pairs)")
    only_trios = score_groups(scores, GroupSet([Group((2, 3, 4), "trio")], owner)).table().splitlines()
    chance = next(line for line in only_trios if line.startswith("chance")).split()
    assert chance[-3:] == ["n/a", "n/a", "n/a"]  # not 0.0: there is no chance level without pairs


# --- the scenes twins, declared through the interface --------------------------------------


@pytest.fixture(scope="module")
def tiny_scenes(tmp_path_factory):
    pytest.importorskip("sklearn")
    pytest.importorskip("timm")
    from xmatch.scenes.dataset import open_scenes

    root = tmp_path_factory.mktemp("scenes")
    return open_scenes(root, "train", size="tiny", backbone="test_efficientnet", weights="random", progress=False)


def test_scenes_declare_their_twins_as_groups(tiny_scenes):
    from xmatch.scenes.dataset import read_scenes, twin_accuracy, twins

    groups = dataset_groups(tiny_scenes)
    assert len(groups) == 4 and set(groups.kinds) <= {"relation", "colour", "size"}
    records = {r["id"]: r for r in read_scenes(tiny_scenes.root)}
    for k, members in enumerate(groups.group_members):
        a, b = (int(tiny_scenes.image_names[i]) for i in members)
        assert records[a]["group"] == records[b]["group"]
        assert groups.kinds[k] == records[b]["variant"] != "base" and records[a]["variant"] == "base"
    assert {i: j for i, j in twins(tiny_scenes).items()} == {
        int(a): int(b) for a, b in groups.group_members.tolist()} | {int(b): int(a) for a, b in groups.group_members.tolist()}
    rng = np.random.default_rng(0)
    scores = rng.normal(size=(tiny_scenes.num_images, len(tiny_scenes.captions)))
    accuracy, count = twin_accuracy(scores, tiny_scenes)
    assert accuracy == pytest.approx(score_groups(scores, groups).overall["t2i"] / 100) and count == 40
