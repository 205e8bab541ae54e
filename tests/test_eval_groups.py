"""Hard-negative groups: hand-computed group accuracies and Winoground scores, group files,
the scenes twins declared through the groups interface, `--protocol groups`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest


from xmatch.eval import groups as groups_module
from xmatch.eval.groups import Group, GroupResult, GroupSet, PairScores, dataset_groups, score_groups

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
    mixed = score_groups(scores, GroupSet([Group((0, 1), "pair"), Group((2, 3, 4), "trio")], owner), resamples=0)
    lines = mixed.table().splitlines()
    trio = next(line for line in lines if line.startswith("trio")).split()
    assert trio[1:] == ["1", "100.0", "100.0", "n/a", "n/a", "n/a"]
    assert next(line for line in lines if line.startswith("pair")).split()[-3:] == ["100.0", "100.0", "100.0"]
    assert lines[-1].startswith("n/a: no groups of two (pairs)")
    only_trios = score_groups(scores, GroupSet([Group((2, 3, 4), "trio")], owner), resamples=0).table().splitlines()
    chance = next(line for line in only_trios if line.startswith("chance")).split()
    assert chance[-3:] == ["n/a", "n/a", "n/a"]  # not 0.0: there is no chance level without pairs


# --- bootstrap intervals ---------------------------------------------------------------------


def _twins(n_groups: int, captions: int = 5) -> GroupSet:
    kinds = ("relation", "colour", "size")
    return GroupSet([Group((2 * g, 2 * g + 1), kinds[g % 3]) for g in range(n_groups)],
                    np.repeat(np.arange(2 * n_groups), captions))


def _noisy_scores(n_groups: int, signal: float, seed: int = 0, captions: int = 5) -> np.ndarray:
    rng = np.random.default_rng(seed)
    scores = rng.normal(size=(2 * n_groups, captions * 2 * n_groups))
    scores[np.repeat(np.arange(2 * n_groups), captions), np.arange(captions * 2 * n_groups)] += signal
    return scores


def test_intervals_are_the_percentiles_of_figures_recomputed_on_resampled_groups():
    """A loop reference: resample the groups with the same draws, recompute each figure from
    the groups' own outcomes (queries weighted by group, Winoground by pair), take percentiles."""
    owner = np.repeat(np.arange(12), 2)
    groups = GroupSet([Group((0, 1), "a"), Group((2, 3, 4), "a"), Group((5, 6), "a"), Group((7, 8), "a"),
                       Group((9, 10, 11), "a")], owner)
    scores = np.random.default_rng(1).normal(size=(12, 24))
    result = score_groups(scores, groups, resamples=200, seed=3)
    alone = [score_groups(scores, GroupSet([g], owner), resamples=0).overall for g in groups.groups]
    rng = np.random.default_rng([3, __import__("zlib").crc32(b"all")])
    draws = rng.integers(0, len(alone), size=(200, len(alone)))
    for figure in ("t2i", "i2t", "group"):
        stats = []
        for draw in draws:
            rows = [alone[k] for k in draw if alone[k][figure] is not None]
            weight = [r["queries"] if figure in ("t2i", "i2t") else 1 for r in rows]
            stats.append(np.average([r[figure] for r in rows], weights=weight) if rows else np.nan)
        expected = np.nanpercentile(stats, [2.5, 97.5])
        np.testing.assert_allclose(result.overall[f"{figure}_ci"], expected, rtol=1e-12)
        low, high = result.overall[f"{figure}_ci"]
        assert low <= result.overall[figure] <= high


def test_intervals_are_reproducible_and_as_wide_as_the_sampling_error():
    groups, scores = _twins(600), _noisy_scores(600, 1.0)
    first, again = score_groups(scores, groups), score_groups(scores, groups)
    assert first == again and first.bootstrap == {
        "resamples": 1000, "confidence": 0.95, "seed": 0,
        "method": "percentile; groups resampled with replacement (per kind within the kind)"}
    assert score_groups(scores, groups, seed=1).overall["t2i_ci"] != first.overall["t2i_ci"]
    for name, row in [*first.by_kind.items(), ("all", first.overall)]:
        for figure in ("t2i", "i2t", "text", "image", "group"):
            low, high = row[f"{figure}_ci"]
            assert low < row[figure] < high, (name, figure)
    # with one caption per image the Winoground group score of a pair is 0 or 1: the 95% interval
    # spans about 2 x 1.96 standard errors of a mean over the kind's 200 pairs
    row = score_groups(_noisy_scores(600, 1.0, captions=1), _twins(600, captions=1)).by_kind["relation"]
    p, n = row["group"] / 100, row["groups"]
    standard = 2 * 1.96 * 100 * np.sqrt(p * (1 - p) / n)
    assert 0.85 * standard < row["group_ci"][1] - row["group_ci"][0] < 1.15 * standard
    wide = first.by_kind["relation"]["group_ci"]
    narrower = score_groups(scores, groups, confidence=0.5).by_kind["relation"]["group_ci"]
    assert narrower[1] - narrower[0] < wide[1] - wide[0]
    perfect = score_groups(np.eye(8).repeat(2, axis=1), _twins(4, captions=2))
    assert perfect.overall["t2i_ci"] == [100.0, 100.0] and perfect.overall["group_ci"] == [100.0, 100.0]


def test_intervals_in_the_table_and_round_trips(monkeypatch):
    groups, scores = _twins(30), _noisy_scores(30, 1.0)
    result = score_groups(scores, groups)
    again = GroupResult.from_dict(json.loads(json.dumps(result.as_dict())))
    assert again == result
    row = next(line for line in result.table().splitlines() if line.startswith("relation"))
    low, high = result.by_kind["relation"]["t2i_ci"]
    assert f"{result.by_kind['relation']['t2i']:.1f} [{low:.1f}, {high:.1f}]" in row and " 10 " in row
    assert "95% bootstrap interval (1000 resamples of the groups" in result.table()
    # results written before the intervals load and print without them
    old = result.as_dict()
    del old["bootstrap"]
    for row in [old["overall"], *old["by_kind"].values()]:
        for figure in groups_module.FIGURES:
            del row[f"{figure}_ci"]
    plain = GroupResult.from_dict(old)
    assert plain.bootstrap is None and "[" not in plain.table()
    # the resampling is drawn in chunks of resamples when the groups are many: the same draws
    monkeypatch.setattr(groups_module, "BOOTSTRAP_CELLS", 7 * 30)
    assert score_groups(scores, groups) == result


def test_pair_scores_give_the_figures_of_the_whole_matrix():
    """The groups protocol without the whole matrix: only the blocks of GroupSet.blocks()."""
    rng = np.random.default_rng(0)
    owner = np.repeat(np.arange(20), 3)
    order = rng.permutation(20)
    groups = GroupSet([Group(tuple(order[:2]), "a"), Group(tuple(order[2:5]), "b"),
                       Group(tuple(order[5:7]), "a", captions=((int(3 * order[5] + 1),), (int(3 * order[6]),))),
                       Group((18, 19), "b")], owner)
    scores = rng.normal(size=(20, 60)).astype(np.float32)
    scores[:, ::7] = 0.5  # ties count as wrong either way
    for per_block in (1, 2, 8):
        blocks = groups.blocks(per_block)
        pairs = PairScores(blocks, [scores[np.ix_(i, c)] for i, c in blocks], scores.shape)
        assert score_groups(pairs, groups) == score_groups(scores, groups)
    with pytest.raises(KeyError, match="image 0 with caption 59 was not scored"):
        pairs[np.array([0]), np.array([59])]
    with pytest.raises(ValueError, match="groups_per_block must be at least 1"):
        groups.blocks(0)


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
