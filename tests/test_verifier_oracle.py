"""benchmarks/verifier_oracle.py: the grounded head on the tabletop's tables with every object word on
its exact box (the measurement behind docs/training.md, "Why the head misses the tabletop's relations")."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from scripts import load_script

PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "verifier_oracle.py"


@pytest.fixture(scope="module")
def bench():
    return load_script(PATH)


@pytest.fixture(scope="module")
def world(bench):
    pictures, caps = bench.twin_groups(range(12))
    return bench.World(pictures, caps, *bench.word_vectors(pictures, caps, dim=16), regions=12, seed=0)


def test_captions_pair_each_picture_with_its_twin(bench, world):
    assert len(world.caps) == 12 * 2 * 5
    for c in world.caps:
        assert c.twin == c.picture ^ 1  # the two pictures of a group sit side by side
        assert c.kind in ("roles", "colour", "pattern", "count") or c.kind.startswith("relation:")


def test_forced_words_take_their_objects_boxes_in_both_pictures(bench, world):
    head = bench.OracleGroundedVerifier(dim=16)
    rows = torch.arange(len(world.caps))
    for pictures in ([c.picture for c in world.caps], [c.twin for c in world.caps]):
        img, txt, head.forced = world.pairs(rows, torch.tensor(pictures))
        weights, _, _ = head.ground(img, txt)
        boxes = weights @ img.boxes
        checked = 0
        for row, position, region in head.forced.T.tolist():
            c = world.caps[row]
            obj = world.targets[row][position]
            named = world.pictures[c.picture][obj]
            there = world.pictures[pictures[row]][region]
            assert there["kind"] == named["kind"]
            assert torch.allclose(boxes[row, position] * bench.CANVAS, torch.tensor(there["box"], dtype=torch.float32))
            checked += 1
        assert checked > len(world.caps)  # several words a caption


def test_a_roles_twin_puts_the_word_on_the_object_that_moved(bench):
    pictures = [[{"kind": "cup"}, {"kind": "book"}], [{"kind": "book"}, {"kind": "cup"}], [{"kind": "cup"}, {"kind": "cup"}]]
    assert bench.referent_in(pictures, 1, 0, 0) == 1
    assert bench.referent_in(pictures, 2, 0, 1) is None  # two cups: no referent


def test_the_pair_readout_reads_geometry_only_between_boxed_words(bench):
    readout = bench.PairReadout(width=8)
    x = torch.randn(1, 3, 8)
    boxes = torch.tensor([[[0.1, 0.1, 0.2, 0.2], [0.5, 0.5, 0.6, 0.6], [0.0, 0.0, 0.0, 0.0]]])
    out = readout(x, torch.ones(1, 3, dtype=torch.bool), boxes)
    moved = x.clone()
    moved[0, 2] += 5.0  # the boxless word takes part in no pair
    assert torch.allclose(out, readout(moved, torch.ones(1, 3, dtype=torch.bool), boxes))


def test_a_short_run_reports_every_kind(bench, capsys):
    bench.main(["--train-groups", "6", "--test-groups", "6", "--steps", "2", "--eval-every", "2", "--dim", "16"])
    out = capsys.readouterr().out
    assert "t2i within twins:" in out and "colour" in out


def test_a_kind_without_captions_is_refused(bench):
    with pytest.raises(SystemExit, match="no training caption"):
        bench.main(["--train-groups", "2", "--test-groups", "2", "--steps", "1", "--only", "nothing"])


def test_one_kind_a_batch_and_the_pair_readout_with_edges_run(bench, capsys):
    bench.main(["--train-groups", "6", "--test-groups", "4", "--steps", "2", "--eval-every", "2", "--dim", "16",
                "--one-kind-a-batch", "--pairs", "--edges"])
    assert "pair readout and edge features" in capsys.readouterr().out


def test_edges_without_the_pair_readout_are_refused(bench):
    with pytest.raises(SystemExit):
        bench.main(["--edges", "--steps", "1"])


def test_a_shift_moves_a_picture_but_keeps_its_geometry(bench, world):
    shifted = bench.World(world.pictures, world.caps, *bench.word_vectors(world.pictures, world.caps, dim=16), regions=12,
                          seed=0, shift=0.5)
    moved = shifted.boxes - world.boxes
    assert moved.abs().max() > 0.05
    assert torch.allclose(moved, moved[:, :1].expand_as(moved))  # one offset for every box of a picture
    assert torch.allclose(moved[..., :2], moved[..., 2:])
    assert torch.allclose(bench.relative_box_features(shifted.boxes), bench.relative_box_features(world.boxes), atol=1e-5)


def test_the_head_with_its_layout_likelihood_runs(bench, capsys):
    bench.main(["--train-groups", "6", "--test-groups", "4", "--steps", "2", "--eval-every", "2", "--dim", "16", "--layout"])
    assert "with its layout likelihood" in capsys.readouterr().out
