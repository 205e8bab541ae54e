"""The built-in ``tabletop`` world: captions true of their pictures, twins that differ in the declared
detail, seeded bytes, the groups file beside each split, and opening by name in both layouts."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from xmatch.core.registry import datasets
from xmatch.data import ImageCaptionsDataset, TeranDataset, open_dataset
from xmatch.eval.groups import GroupSet
from xmatch.tabletop.captions import captions
from xmatch.tabletop.dataset import (
    PRESETS,
    groups_file,
    open_tabletop,
    read_tables,
    sample_tables,
    table_from_record,
    tabletop_captions,
    tabletop_folder,
)
from xmatch.tabletop.world import KINDS, SYMMETRIC, Table, Thing, render

timm = pytest.importorskip("timm")

FAST = {"size": "tiny", "backbone": "test_efficientnet", "weights": "random", "progress": False}
#: twin pairs read by the grammar tests (no pictures drawn)
GROUPS_READ = 300


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tabletop")
    open_tabletop(root, "train", **FAST)
    return root


@pytest.fixture(scope="module")
def folder(cache) -> Path:
    return tabletop_folder(cache, "tiny", 0, 224)


# -- an independent reading of the grammar and of the pictures' geometry ----------------------

SIZE = {"small": "small", "little": "small", "tiny": "small", "large": "large", "big": "large"}
PATTERN = {"striped": "striped", "stripy": "striped", "with stripes": "striped", "dotted": "dotted",
           "spotted": "dotted", "polka-dot": "dotted", "with dots": "dotted", "with polka dots": "dotted",
           "plain": "plain"}
COLOUR = "teal|navy|maroon|olive|beige|violet|gold|pink"
NOUN = "|".join(KINDS)
NOUNS = "|".join(("boxes" if k == "box" else k + "s") for k in KINDS)
ATTRS = r"(?:(small|little|tiny|large|big) )?(?:(striped|stripy|dotted|spotted|polka-dot|plain) )?"
AFTER = r"(?: (with stripes|with dots|with polka dots))?"
OBJECT = rf"(?:a|an|the) {ATTRS}({COLOUR}) ({NOUN}){AFTER}"
COPIES = rf"(two|a pair of|three) {ATTRS}({COLOUR}) ({NOUNS}){AFTER}"
#: any object phrase (checked by OBJECT once the sentence is split)
PHRASE = r"((?:a|an|the) [a-z -]+?)"
RELATION = {
    "to the left of": "left", "left of": "left", "on the left of": "left",
    "to the right of": "right", "right of": "right", "on the right of": "right",
    "on top of": "on_top", "on": "on_top", "resting on": "on_top",
    "under": "under", "beneath": "under", "underneath": "under", "below": "under",
    "inside": "inside", "in": "inside", "in front of": "front", "behind": "behind",
    "next to": "next_to", "beside": "next_to", "alongside": "next_to",
    "near": "near", "close to": "near", "far from": "far", "far away from": "far",
}
WITH = {"to its left": "left", "on its left": "left", "to its right": "right", "on its right": "right",
        "on top": "on_top", "on it": "on_top", "under it": "under", "beneath it": "under", "inside": "inside",
        "in it": "inside", "in front of it": "front", "behind it": "behind", "next to it": "next_to",
        "beside it": "next_to", "near it": "near", "close by": "near"}
REL = "|".join(sorted(map(re.escape, RELATION), key=len, reverse=True))
WITH_REL = "|".join(sorted(map(re.escape, WITH), key=len, reverse=True))
EXTRAS = (r"^(.*), and there (?:is|are) also (.*)$", r"^(.*); (.*) (?:is|are) also on the table$",
          r"^(.*), with (.*) elsewhere$")


def parse(caption: str) -> tuple[str, list[str], list[str]]:
    """(relation, its object phrases in role order, distractor phrases) of a caption; ``count``
    gives [copies phrase, other phrase]."""
    extra: list[str] = []
    for pattern in EXTRAS:
        m = re.match(pattern, caption)
        if m:
            caption, extra = m.group(1), m.group(2).split(" and ")
            break
    caption = re.sub(r"^on (?:the|a) table, ", "", caption)
    for form in (rf"^(?:there are |a table with )?({COPIES}) and {PHRASE}$", rf"^{PHRASE} and ({COPIES})$"):
        m = re.match(form, caption)
        if m:
            copies = next(g for g in m.groups() if g and re.fullmatch(COPIES, g))
            other = next(g for g in m.groups() if g and re.fullmatch(OBJECT, g))
            return "count", [copies, other], extra
    m = re.match(rf"^(?:there is )?{PHRASE}(?: is| sits| stands)?(?: in)? between {PHRASE} and {PHRASE}$", caption)
    if m:
        return "between", list(m.groups()), extra
    m = re.match(rf"^{PHRASE} and {PHRASE} with {PHRASE} between them$", caption)
    if m:
        return "between", [m.group(3), m.group(1), m.group(2)], extra
    m = re.match(rf"^{PHRASE} (?:contains|holds) {PHRASE}$", caption)
    if m:
        return "inside", [m.group(2), m.group(1)], extra
    m = re.match(rf"^{PHRASE} with {PHRASE} ({WITH_REL})$", caption)
    if m:
        return WITH[m.group(3)], [m.group(2), m.group(1)], extra
    m = re.match(rf"^(?:there is )?{PHRASE}(?: is| sits| stands)? ({REL}) {PHRASE}$", caption)
    if m:
        return RELATION[m.group(2)], [m.group(1), m.group(3)], extra
    raise AssertionError(f"caption outside the grammar: {caption!r}")


def referents(phrase: str, things: tuple[Thing, ...]) -> list[int]:
    """The things an object phrase describes (size and pattern only when said)."""
    m = re.fullmatch(OBJECT, phrase)
    assert m, f"not an object phrase: {phrase!r}"
    size, before, colour, kind, after = m.groups()
    pattern = PATTERN.get(before or after or "")
    return [i for i, t in enumerate(things) if t.kind == kind and t.colour == colour
            and (size is None or t.size == SIZE[size]) and (pattern is None or t.pattern == pattern)]


def related(relation: str, a: Thing, b: Thing) -> bool:
    """The relation read off the boxes and drawing order, as a person reads the picture."""
    (ax1, ay1, ax2, ay2), (bx1, by1, bx2, by2) = a.box, b.box
    x_overlap, y_overlap = min(ax2, bx2) - max(ax1, bx1), min(ay2, by2) - max(ay1, by1)
    apart = np.hypot(max(bx1 - ax2, ax1 - bx2, 0), max(by1 - ay2, ay1 - by2, 0))
    if relation in ("right", "under", "behind"):
        return related({"right": "left", "under": "on_top", "behind": "front"}[relation], b, a)
    return {
        "left": ax2 <= bx1,
        "on_top": abs(ay2 - by1) <= 1 and x_overlap > 0,
        "inside": bx1 <= ax1 and by1 <= ay1 and ax2 <= bx2 and ay2 <= by2 and a.depth > b.depth,
        "front": x_overlap > 0 and y_overlap > 0 and a.depth > b.depth and ay2 > by2,
        "next_to": y_overlap > 0 and 0 < max(bx1 - ax2, ax1 - bx2) <= 10,
        "near": 0 < apart <= 16,
        "far": apart >= 80,
    }[relation]


def true_of(caption: str, table: Table) -> bool:
    """Whether a caption is true of a table: every phrase names one object (the copies: all of
    their kind), and the stated relation holds between them."""
    relation, phrases, extra = parse(caption)
    things = table.things
    if not all(len(referents(p, things)) == 1 for p in extra):
        return False
    if relation == "count":
        m = re.fullmatch(COPIES, phrases[0])
        number, size, before, colour, nouns, after = m.groups()
        kind = "box" if nouns == "boxes" else nouns[:-1]
        pattern = PATTERN.get(before or after or "")
        copies = [t for t in things if t.kind == kind]
        return (len(copies) == {"two": 2, "a pair of": 2, "three": 3}[number] and len(referents(phrases[1], things)) == 1
                and all(t.colour == colour and (size is None or t.size == SIZE[size])
                        and (pattern is None or t.pattern == pattern) for t in copies))
    found = [referents(p, things) for p in phrases]
    if any(len(f) != 1 for f in found):
        return False
    objs = [things[f[0]] for f in found]
    if relation == "between":
        left, right = sorted(objs[1:], key=lambda t: t.box[0])
        return related("left", left, objs[0]) and related("left", objs[0], right)
    return related(relation, *objs)


def groups(count: int = GROUPS_READ) -> list[tuple[Table, Table]]:
    return [sample_tables(0, g) for g in range(count)]


# -- the grammar and the twins -----------------------------------------------------------------


def test_every_caption_is_true_of_its_table_and_false_of_its_twin():
    seen = set()
    for g, pair in enumerate(groups()):
        rng = np.random.default_rng([0, g, 1])
        for table, twin in (pair, pair[::-1]):
            for caption in captions(table, rng):
                assert true_of(caption, table), f"group {g} ({table.relation}, {table.variant}): {caption!r} is false"
                assert not true_of(caption, twin), f"group {g}: {caption!r} is true of the {twin.variant} twin as well"
                seen.add(parse(caption)[0])
    assert seen == {"left", "right", "on_top", "under", "inside", "front", "behind", "next_to", "near", "far",
                    "between", "count"}


def test_captions_vary_article_form_and_paraphrase():
    text = tabletop_captions(1500)
    assert any(re.search(r"\ban (olive|egg)\b", c) for c in text) and any(c.startswith("the ") for c in text)
    for phrase in ("on top of", "inside", "in front of", "to the left of", "under", "next to", "near",
                   "between", "with stripes", "contains", "two ", "three ", " with "):
        assert any(phrase in c for c in text), phrase
    assert not any(re.search(r"\ba [aeiou]|\ban [^aeiou]", c) for c in text), "an article that does not agree"


def test_relation_geometry_holds_in_every_table():
    for base, twin in groups():
        for table in (base, twin):
            a, b = table.things[:2]
            if table.relation == "between":
                left, right = sorted(table.things[1:3], key=lambda t: t.box[0])
                assert related("left", left, a) and related("left", a, right)
            elif table.relation != "count":
                assert related(table.relation, a, b), table
                if table.relation in SYMMETRIC:
                    assert related(table.relation, b, a), "a symmetric relation read from the other side"
            boxes = [t.box for t in table.things]
            assert all(0 <= x1 < x2 <= 224 and 0 <= y1 < y2 <= 224 for x1, y1, x2, y2 in boxes)
            assert all(20 <= max(x2 - x1, y2 - y1) <= 70 for x1, y1, x2, y2 in boxes), "objects are 20-70 px"


def identity(t: Thing) -> tuple[str, str, str, str]:
    return t.kind, t.colour, t.pattern, t.size


def test_twins_differ_in_exactly_the_declared_detail():
    kinds = set()
    for base, twin in groups():
        n = base.core
        kinds.add(twin.variant)
        assert base.variant == "base" and base.background == twin.background
        assert base.things[n:] == twin.things[twin.core:], "the distractors changed"
        core, other = base.things[:n], twin.things[:twin.core]
        if twin.variant == "colour":
            if base.relation == "count":
                swapped = tuple(replace(t, colour=core[-1].colour if i < n - 1 else core[0].colour) for i, t in enumerate(core))
            else:
                swapped = (replace(core[0], colour=core[1].colour), replace(core[1], colour=core[0].colour), *core[2:])
            assert other == swapped and core[0].colour != core[1 if base.relation != "count" else -1].colour
        elif twin.variant == "pattern":
            assert other == (replace(core[0], pattern=core[1].pattern), replace(core[1], pattern=core[0].pattern), *core[2:])
            assert core[0].pattern != core[1].pattern
        elif twin.variant == "roles":
            assert twin.relation == base.relation
            assert [identity(t) for t in other] == [identity(core[1]), identity(core[0]), *map(identity, core[2:])]
        elif twin.variant == "relation":
            assert twin.relation != base.relation and [identity(t) for t in other] == [identity(t) for t in core]
            assert [t.box[2] - t.box[0] for t in other] == [t.box[2] - t.box[0] for t in core], "resized"
        else:
            assert twin.variant == "count" and abs(twin.count - base.count) == 1
            assert {identity(t) for t in other} == {identity(t) for t in core}
    assert kinds == {"roles", "colour", "pattern", "relation", "count"}


def test_symmetric_relations_get_no_roles_twin():
    for base, twin in groups():
        if base.relation in SYMMETRIC:
            assert twin.variant != "roles"


def test_boxes_are_the_drawn_objects():
    background = (190, 0, 8.0, 0.0, 1)
    empty = render(Table((), "left", "base", background, 0))[0].astype(int)
    for kind in KINDS:
        thing = Thing(kind, "navy", "striped", "large", (40, 50, 100, 90))
        image, boxes = render(Table((thing,), "left", "base", background, 0))
        rows, cols = np.nonzero(np.abs(image.astype(int) - empty).sum(axis=2) > 30)
        assert boxes.tolist() == [[40, 50, 100, 90]]
        assert (cols.min(), rows.min(), cols.max() + 1, rows.max() + 1) == (40, 50, 100, 90), kind


# -- the generated set ---------------------------------------------------------------------------


def tree_digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_the_same_seed_gives_the_same_bytes(tmp_path):
    images = dict(FAST, layout="images", generate=True)
    a = open_tabletop(tmp_path / "a", "test", **images).root
    b = open_tabletop(tmp_path / "b", "test", **images).root
    c = open_tabletop(tmp_path / "c", "test", seed=1, **images).root
    assert tree_digest(a) == tree_digest(b)
    assert tree_digest(a)["images/0.png"] != tree_digest(c)["images/0.png"]


def test_captions_without_pictures_are_the_train_split(folder):
    lines = (folder / "train.csv").read_text(encoding="utf-8").splitlines()[1:]
    train = [line.split(",", 1)[1].strip('"') for line in lines]
    assert tabletop_captions(len(train)) == train and len(train) == 5 * PRESETS["tiny"][0]
    assert tabletop_captions(7, seed=3) == tabletop_captions(12, seed=3)[:7]


def test_records_rebuild_the_tables(folder):
    records = read_tables(folder)
    assert len(records) == sum(PRESETS["tiny"])
    for r in records[:4]:
        table = table_from_record(r)
        assert table == sample_tables(0, r["group"])[r["variant"] != "base"]


@pytest.mark.parametrize("layout", ["regions", "images"])
@pytest.mark.parametrize("split", ["train", "val", "test"])
def test_the_groups_file_fits_its_split(cache, folder, layout, split):
    ds = open_dataset("tabletop", cache, split=split, layout=layout, **FAST)
    path = groups_file(ds)
    assert path == folder / f"groups_{split}.json"
    gs = GroupSet.from_json(path, ds)
    assert len(gs) == ds.num_images // 2 and sorted(gs.member_image.tolist()) == list(range(ds.num_images))
    by_id = {r["id"]: r for r in read_tables(folder)}
    for group in json.loads(path.read_text(encoding="utf-8"))["groups"]:
        first, second = (by_id[int(i)] for i in group["images"])
        assert first["split"] == second["split"] == split and first["group"] == second["group"]
        assert (first["variant"], second["variant"]) == ("base", group["kind"])


@pytest.mark.parametrize("layout, kind", [("regions", TeranDataset), ("images", ImageCaptionsDataset)])
def test_the_tiny_preset_opens_by_name_in_both_layouts(cache, layout, kind):
    assert datasets.get("tabletop") is open_tabletop
    ds = open_dataset("tabletop", cache, split="val", layout=layout, **dict(FAST, progress="false"))
    assert isinstance(ds, kind) and ds.num_images == PRESETS["tiny"][1] and len(ds.captions) == 5 * ds.num_images
    if layout == "regions":
        assert ds.image(0).regions.shape[0] == 36
    # a new user's dataset: nothing declared beyond the layout
    assert not hasattr(ds, "word_classes") and not hasattr(ds, "hard_negative_groups")


def test_bad_options_and_a_mistyped_folder_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"unknown tabletop size 'huge'; presets: tiny \(12 images\)"):
        open_tabletop(tmp_path, "test", size="huge")
    with pytest.raises(ValueError, match="unknown split 'groups' for tabletop; splits: train, val, test"):
        open_tabletop(tmp_path, "groups")
    with pytest.raises(FileNotFoundError, match="no tabletop data at .*typo: the folder does not exist"):
        open_tabletop(tmp_path / "typo", "test", size="tiny")
    assert not (tmp_path / "typo").exists()
