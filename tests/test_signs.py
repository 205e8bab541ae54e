"""The ``signs`` world: boards, twins, captions, pictures and the generated files."""

from __future__ import annotations

import json
import re
import sys

import numpy as np
import pytest

pytest.importorskip("matplotlib")
pytest.importorskip("skimage")

from xmatch.data import open_dataset  # noqa: E402
from xmatch.eval.groups import GroupSet  # noqa: E402
from xmatch.signs.captions import RELATION_PHRASES, captions  # noqa: E402
from xmatch.signs.dataset import open_signs, read_signs  # noqa: E402
from xmatch.signs.world import COLOURS, ICONS, OPPOSITE, SIDE, holds, plain_grey, render, sample_group, sign_mask  # noqa: E402

GROUPS = [sample_group(np.random.default_rng([7, g])) for g in range(40)]
PHRASES = sorted(((p, r) for r, ps in RELATION_PHRASES.items() for p in ps), key=lambda x: -len(x[0]))


def _mention(text: str) -> tuple[str, str]:
    """(colour, name) of a sign as a caption names it."""
    colour = next(c for c in COLOURS if re.search(rf"\b{c}\b", text))
    # letters and words are capitals; the article is lower case
    name = next(w for w in re.findall(r"\w+", text) if w.isupper() or w in ICONS)
    return colour, name


def _statement(caption: str) -> tuple[tuple[str, str], str, tuple[str, str]]:
    """The core a caption states: (first sign, relation, second sign)."""
    text = re.sub(r"^on a picture of [^,]+, ", "", caption)
    text = re.sub(r", (with|and) .*$", "", text)
    text = re.sub(r"^there is ", "", text)
    phrase, relation = next((p, r) for p, r in PHRASES if f" {p} " in text)
    first, second = text.split(f" {phrase} ", 1)
    first = re.sub(r" is$", "", first)
    return _mention(first), relation, _mention(second)


def _true_of(board, statement) -> bool:
    first, relation, second = statement
    a = [s for s in board.signs if (s.colour, s.name) == first]
    b = [s for s in board.signs if (s.colour, s.name) == second]
    return any(holds(relation, x.box, y.box) for x in a for y in b)


def test_every_caption_is_true_of_its_board_and_false_of_its_twin():
    for g, (base, twin) in enumerate(GROUPS):
        rng = np.random.default_rng(g)
        for board, other in ((base, twin), (twin, base)):
            for caption in captions(board, rng, 5):
                statement = _statement(caption)
                assert _true_of(board, statement), caption
                assert not _true_of(other, statement), (caption, other.variant)


def test_twins_differ_in_exactly_the_declared_detail():
    kinds = set()
    for base, twin in GROUPS:
        kinds.add(twin.variant)
        (a, b, *rest), (ta, tb, *trest) = base.signs, twin.signs
        assert rest == trest and base.backdrop == twin.backdrop and base.clutter == twin.clutter
        if twin.variant == "colour":
            assert (ta.colour, tb.colour) == (b.colour, a.colour) != (a.colour, b.colour)
            assert (ta.box, tb.box) == (a.box, b.box)
        elif twin.variant == "roles":
            assert twin.relation == OPPOSITE[base.relation]
            assert (ta.name, tb.name, ta.colour, tb.colour) == (a.name, b.name, a.colour, b.colour)
            assert holds(twin.relation, ta.box, tb.box) and not holds(base.relation, ta.box, tb.box)
        else:
            assert twin.variant == "glyph" and ta.name != a.name
            assert (ta.kind, ta.colour, ta.style, tb) == (a.kind, a.colour, a.style, b)
    assert kinds == {"colour", "roles", "glyph"}


def test_signs_fit_the_canvas_apart_and_sized_as_documented():
    sides = []
    for base, twin in GROUPS:
        assert holds(base.relation, base.signs[0].box, base.signs[1].box)
        for board in (base, twin):
            boxes = [s.box for s in board.signs]
            for i, p in enumerate(boxes):
                assert 2 <= p[0] < p[2] <= 254 and 2 <= p[1] < p[3] <= 254
                for q in boxes[i + 1 :]:
                    assert p[2] <= q[0] or q[2] <= p[0] or p[3] <= q[1] or q[3] <= p[1], (p, q)
        sides += [max(s.box[2] - s.box[0], s.box[3] - s.box[1]) for s in base.signs]
    assert SIDE[0] - 1 <= min(sides) and max(sides) <= SIDE[1] + 1
    assert np.median(sides) < 45


def test_pictures_show_each_sign_in_its_colour_where_its_ink_is():
    base, twin = GROUPS[0]
    image = render(base).astype(np.float64)
    for sign in base.signs:
        x1, y1, x2, y2 = sign.box
        ink = sign_mask(sign) > 0.95
        assert ink.sum() >= 3, sign
        drawn = image[y1:y2, x1:x2][ink].mean(0)
        assert np.abs(drawn - COLOURS[sign.colour]).max() < 20, (sign, drawn)
    # the twin changes pixels only inside the core signs' boxes
    changed = np.abs(render(twin).astype(np.float64) - image).max(2) > 0
    inside = np.zeros_like(changed)
    for s in (*base.signs[:2], *twin.signs[:2]):
        inside[s.box[1] : s.box[3], s.box[0] : s.box[2]] = True
    assert changed.any() and not (changed & ~inside).any()


def test_the_same_seed_gives_the_same_bytes(tmp_path):
    one = open_signs(tmp_path / "a", "test", size="tiny", progress=False, generate=True)
    two = open_signs(tmp_path / "b", "test", size="tiny", progress=False, generate=True)
    for a, b in zip(sorted((one.root / "images").iterdir()), sorted((two.root / "images").iterdir())):
        assert a.read_bytes() == b.read_bytes()
    assert (one.root / "dataset_signs.json").read_bytes() == (two.root / "dataset_signs.json").read_bytes()
    other = open_signs(tmp_path / "c", "test", size="tiny", seed=1, progress=False, generate=True)
    assert other.captions != one.captions


def test_the_files_fit_together(tmp_path):
    test = open_dataset("signs", tmp_path, split="test", size="tiny", layout="images", progress=False, generate=True)
    assert test.num_images == 2 and len(test.captions) == 10
    records = read_signs(test.root)
    assert [r["split"] for r in records] == ["train"] * 8 + ["val"] * 2 + ["test"] * 2
    groups = GroupSet.from_json(test.root / "groups_test.json", test)
    assert len(groups) == 1 and groups.kinds[0] == records[-1]["variant"]
    karpathy = json.loads((test.root / "dataset_signs.json").read_text())
    assert [len(e["sentences"]) for e in karpathy["images"]] == [5] * 12
    item = records[0]["items"][0]
    assert set(item) == {"kind", "name", "colour", "style", "box"}


def test_plain_boards_are_the_same_signs_on_one_grey_without_photo_or_clutter():
    for base, twin in GROUPS[:10]:
        assert plain_grey(base) == plain_grey(twin)
        for board in (base, twin):
            image = render(board, backdrop="plain").astype(np.float64)
            ground = np.ones(image.shape[:2], dtype=bool)
            for sign in board.signs:
                x1, y1, x2, y2 = sign.box
                ground[y1:y2, x1:x2] = False
                ink = sign_mask(sign) > 0.95
                if ink.sum() >= 3:  # a thin small glyph may have no pixel wholly inked
                    assert np.abs(image[y1:y2, x1:x2][ink].mean(0) - COLOURS[sign.colour]).max() < 20, sign
            # outside the signs' boxes: one grey, nothing of the photograph or the clutter
            assert np.unique(image[ground]).tolist() == [round(plain_grey(board))]
    greys = [plain_grey(b) for b, _ in GROUPS]
    assert max(greys) - min(greys) > 30  # the canvases are not all one grey


def test_a_plain_set_holds_the_photo_sets_boards_and_captions_without_photographs(tmp_path):
    photos = open_signs(tmp_path, "train", size="tiny", progress=False, generate=True)
    plain = open_dataset("signs", tmp_path, split="train", size="tiny", backdrop="plain", progress=False)
    assert plain.root.name == "signs-tiny-256px-seed0-plain-v1" and photos.root.name == "signs-tiny-256px-seed0-v1"
    a, b = read_signs(photos.root), read_signs(plain.root)
    assert [r["items"] for r in a] == [r["items"] for r in b] and [r["variant"] for r in a] == [r["variant"] for r in b]
    assert all(set(r["backdrop"]) == {"plain"} and r["clutter"] is None for r in b)
    assert (plain.root / "groups_train.json").read_bytes() == (photos.root / "groups_train.json").read_bytes()
    assert any("on a picture of" in c for c in photos.captions)
    assert not any("on a picture of" in c for c in plain.captions)
    assert json.loads((plain.root / "signs.json").read_text())["params"]["backdrop"] == "plain"


def test_bad_options_and_a_mistyped_folder_are_refused(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="unknown signs backdrop 'white'; use one of 'photos', 'plain'"):
        open_signs(tmp_path, "test", size="tiny", backdrop="white")
    with pytest.raises(ValueError, match="pictures only.*xmatch extract"):
        open_signs(tmp_path, "test", size="tiny", layout="regions")
    with pytest.raises(ValueError, match="unknown signs size 'huge'; presets: tiny"):
        open_signs(tmp_path, "test", size="huge")
    with pytest.raises(ValueError, match="unknown split"):
        open_signs(tmp_path, "dev", size="tiny")
    with pytest.raises(ValueError, match="canvas must be at least 192"):
        open_signs(tmp_path, "test", size="tiny", canvas=100)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "photo.jpg").write_bytes(b"x")
    with pytest.raises(FileNotFoundError, match="holds no signs sets.*generate=true"):
        open_signs(tmp_path / "mine", "test", size="tiny", progress=False)
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == ["photo.jpg"]
    with pytest.raises(FileNotFoundError, match="generate=false"):
        open_signs(tmp_path / "empty", "test", size="tiny", generate=False)


def test_a_missing_font_package_is_named(monkeypatch):
    from xmatch.signs import world

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match=r"pip install 'xmatch-zoo\[report\]'"):
        world.font_path("DejaVuSans.ttf")
