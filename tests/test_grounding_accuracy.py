"""benchmarks/grounding_accuracy.py: which object each word names, and whether the word's most
similar region lies on it (the measurement behind docs/evaluation.md, "Does the model ground
the words?")."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from xmatch.tabletop.captions import captions
from xmatch.tabletop.dataset import sample_tables

from scripts import load_script

PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "grounding_accuracy.py"


@pytest.fixture(scope="module")
def bench():
    return load_script(PATH)


def _tables(n: int) -> list:
    return [t for g in range(n) for t in sample_tables(0, g)]


def test_every_target_names_its_object_on_the_tabletop_grammar(bench):
    targets = 0
    for k, table in enumerate(_tables(20)):
        things = [dataclasses.asdict(t) for t in table.things]
        for caption in captions(table, np.random.default_rng(k)):
            words = bench.caption_words(caption)
            for p, obj, cls in bench.word_targets(words, things):
                thing = things[obj]
                targets += 1
                if cls == "noun":
                    assert words[p].startswith(thing["kind"]), (caption, p)
                elif cls == "colour":
                    assert words[p] == thing["colour"] and words[p + 1].startswith(thing["kind"]), (caption, p)
                else:  # a pattern or size word: its phrase's colour and noun follow
                    rest = words[p + 1:]
                    colour = next(i for i, w in enumerate(rest) if w == thing["colour"])
                    assert all(w in bench.PATTERN_WORDS | bench.SIZE_WORDS for w in rest[:colour]), (caption, p)
    assert targets > 300


def test_a_noun_shared_by_two_objects_names_neither(bench):
    things = [{"kind": "cup", "colour": "red"}, {"kind": "cup", "colour": "blue"}]
    assert bench.word_targets("a cup and a blue cup".split(), things) == [(4, 1, "colour")]


def test_grounded_words_score_every_hit_and_shuffled_ones_near_chance(bench):
    rng = np.random.default_rng(0)
    objects = np.array([[10 + 40 * j, 10, 40 + 40 * j, 40] for j in range(4)], float)
    regions = np.concatenate([objects, objects + 2, [[0, 0, 200, 60]]])  # the objects, jittered copies, the picture
    targets = [(w, w % 4, "noun") for w in range(400)]
    right = np.zeros((400, len(regions)))
    right[np.arange(400), np.arange(400) % 4] = 1.0
    hits = bench.grounding_hits(right, regions, objects, targets)
    assert all(h.grounded and h.tight for h in hits)
    chance = np.mean([h.chance for h in hits])
    # each object is covered best by itself and its copy, the picture (equal overlaps) by object 0: (3 + 2 + 2 + 2) / 4 / 9
    assert chance == pytest.approx(0.25)
    assert np.mean([h.tight_chance for h in hits]) == pytest.approx(2 / 9)  # the picture is no object's box
    shuffled = bench.grounding_hits(rng.random((400, len(regions))), regions, objects, targets)
    assert abs(np.mean([h.grounded for h in shuffled]) - chance) < 0.08
    on_the_picture = np.zeros((400, len(regions)))
    on_the_picture[:, -1] = 1.0
    picture = bench.grounding_hits(on_the_picture, regions, objects, targets)
    assert not any(h.tight for h in picture)
    assert [h.grounded for h in picture[:4]] == [True, False, False, False]  # object 0 owns the picture


def test_token_starts_refuses_a_text_side_that_splits_words_unevenly(bench):
    class Split:
        def tokenize(self, texts):  # counts characters: "ab cd" is 5 tokens, "ab" + "cd" only 4
            mask = np.ones((1, len(texts[0])), bool)
            return type("Batch", (), {"mask": mask})()

    assert bench.token_starts(Split(), ["ab", "cd"]) is None

    class Words:
        def tokenize(self, texts):
            return type("Batch", (), {"mask": np.ones((1, len(texts[0].split())), bool)})()

    assert bench.token_starts(Words(), ["a", "red", "cup"]) == [0, 1, 2]
