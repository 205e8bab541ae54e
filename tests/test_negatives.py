"""Structural hard negatives: the makers, their determinism, the loss term and the trainer wiring."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import xmatch
from xmatch.core.registry import RegistryError
from xmatch.eval.probes import WordListTagger, split_words
from xmatch.scenes.tagger import scenes_tagger
from xmatch.train import TrainConfig
from xmatch.train.config import ConfigError, NegativesConfig
from xmatch.train.negatives import (
    CaptionNegatives,
    ChangeCount,
    ReplaceRelation,
    SwapBoundAttributes,
    SwapRoles,
    build_makers,
    converse,
    noun_phrases,
    structural_hinge,
    tagger_for,
    training_groups,
)
from xmatch.train.sampler import EpochBatches, group_units

CAPTION = "a small red 7 to the left of a large blue circle"

#: a general-English word list, not the scenes grammar's
COCO_LIKE = WordListTagger({
    "noun": ["man", "horse", "fence", "dog", "dogs", "cat", "table", "grass"],
    "adjective": ["brown", "white", "black", "tall", "small"],
    "relation": ["riding", "next to", "on", "under", "chasing", "behind", "in front of"],
})


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def test_noun_phrases_take_the_attributes_before_the_noun() -> None:
    words = split_words(CAPTION)
    assert [" ".join(words[s:e]) for s, e in noun_phrases(words, scenes_tagger())] == ["small red 7", "large blue circle"]


def test_swap_roles_swaps_whole_noun_phrases_joined_by_a_relation() -> None:
    maker = SwapRoles(scenes_tagger())
    assert maker(CAPTION, rng()) == "a large blue circle to the left of a small red 7"
    # the distractor phrase is not linked to the pair by a relation: only the pair swaps
    with_extra = CAPTION + ", and there is also a big green star"
    for seed in range(10):
        assert maker(with_extra, rng(seed)).startswith("a large blue circle to the left of a small red 7")
    assert maker("a red 7", rng()) is None
    assert maker("a red 7 above a red 7", rng()) is None  # the same phrase twice: nothing changes


def test_swap_roles_on_general_captions() -> None:
    out = SwapRoles(COCO_LIKE)("a tall man riding a brown horse", rng())
    assert out == "a brown horse riding a tall man"


def test_swap_attributes_binds_another_noun() -> None:
    maker = SwapBoundAttributes(scenes_tagger())
    made = {maker(CAPTION, rng(seed)) for seed in range(20)}
    assert made == {"a small blue 7 to the left of a large red circle", "a large red 7 to the left of a small blue circle"}
    assert maker("a small red 7 to the left of a little red circle", rng()) is None  # synonyms and equal colours


def test_replace_relation_takes_the_converse_or_another_relation() -> None:
    maker = ReplaceRelation(scenes_tagger())
    assert maker(CAPTION, rng()) == "a small red 7 to the right of a large blue circle"
    assert maker("a red 7 beneath a blue circle", rng()) == "a red 7 above a blue circle"
    general = ReplaceRelation(COCO_LIKE)
    assert general("a dog in front of a fence", rng()) == "a dog behind a fence"
    other = general("a man riding a horse", rng(3))
    assert other != "a man riding a horse" and other.startswith("a man ") and other.endswith(" a horse")
    assert maker("a red 7", rng()) is None
    assert converse(["next", "to"]) is None


def test_change_count_leaves_names_alone() -> None:
    maker = ChangeCount(COCO_LIKE)
    out = maker("two dogs on the grass", rng())
    assert out is not None and out.endswith(" dogs on the grass") and not out.startswith("two")
    assert maker("3 dogs", rng()).split()[0] in {str(n) for n in range(1, 11)} - {"3"}
    # "digit 7" and "number seven" are names of the scenes' objects, not counts
    assert ChangeCount(scenes_tagger())("a red digit 7 above a blue number seven", rng()) is None


def test_negatives_are_a_function_of_seed_epoch_and_index() -> None:
    makers = build_makers(["swap-roles", "swap-attributes", "replace-relation", "change-count"], scenes_tagger())
    negatives = CaptionNegatives(makers, per_caption=2, seed=5)
    texts = [CAPTION, "a big green star above a tiny white 3", "a red circle"]
    first = negatives.draw(texts, [7, 8, 9], epoch=1)
    again = CaptionNegatives(makers, per_caption=2, seed=5).draw(texts, torch.tensor([7, 8, 9]), epoch=1)
    assert first.texts == again.texts and first.owner.tolist() == again.owner.tolist()
    # the same caption alone (another batch) gets the same negatives: nothing depends on the batch
    assert negatives.draw([texts[1]], [8], epoch=1).texts == [t for t, o in zip(first.texts, first.owner) if o == 1]
    assert first.owner.tolist() == [0, 0, 1, 1]  # the lone "a red circle" has no structure to change
    assert all(n != texts[o] for n, o in zip(first.texts, first.owner.tolist()))
    other_epochs = {tuple(negatives.draw(texts, [7, 8, 9], epoch=e).texts) for e in range(6)}
    assert len(other_epochs) > 1
    other_seeds = {tuple(CaptionNegatives(makers, per_caption=2, seed=s).draw(texts, [7, 8, 9], epoch=1).texts) for s in range(6)}
    assert len(other_seeds) > 1


def test_unknown_maker_and_bad_settings_are_refused() -> None:
    with pytest.raises(RegistryError, match="swap-rols"):
        build_makers(["swap-rols"], scenes_tagger())
    with pytest.raises(ValueError, match="at least one maker"):
        CaptionNegatives([], per_caption=1)
    with pytest.raises(ConfigError, match="per_caption"):
        TrainConfig.from_mapping({"negatives": {"per_caption": 0}})
    with pytest.raises(ConfigError, match="per_captio: unknown"):
        TrainConfig.from_mapping({"negatives": {"per_captio": 2}})
    with pytest.raises(ConfigError, match="kinds"):
        TrainConfig.from_mapping({"negatives": {"kinds": []}})


def test_negatives_table_round_trips_and_merges() -> None:
    config = TrainConfig.from_mapping({"negatives": {"kinds": ["swap-roles"], "weight": 0.5}})
    assert isinstance(config.negatives, NegativesConfig)
    again = TrainConfig.from_mapping(config.to_mapping())
    assert again.negatives == config.negatives
    assert config.merged({"negatives.per_caption": 4}).negatives.per_caption == 4
    assert TrainConfig().negatives is None and "negatives" not in TrainConfig().to_mapping()


def test_structural_hinge_values() -> None:
    scores = torch.tensor([[1.0, 0.95, 0.1], [0.9, 1.0, 0.2], [0.0, 0.0, 1.0]])
    negative_scores = torch.tensor([0.9, 0.5])  # each negative with its own caption's image
    owner = torch.tensor([0, 1])
    loss, logs = structural_hinge(scores, negative_scores, owner, margin=0.2)
    assert logs["negatives_captions"].item() == pytest.approx(0.1)  # only 1.0 - 0.9 < 0.2 violates
    assert logs["negatives_groups"].item() == 0.0
    groups = torch.tensor([3, 3, -1])
    loss, logs = structural_hinge(scores, None, None, 0.2, groups, torch.tensor([10, 11, 12]))
    # image side: S(0,1)=0.95 vs S(1,1)=1 -> 0.15; S(1,0)=0.9 vs S(0,0) -> 0.1; caption side:
    # S(0,1) vs S(0,0) -> 0.15, S(1,0) vs S(1,1) -> 0.1
    assert logs["negatives_groups"].item() == pytest.approx(0.5)
    assert loss.item() == pytest.approx(0.5)
    # two captions of one image in one group are not each other's negatives
    _, logs = structural_hinge(scores, None, None, 0.2, groups, torch.tensor([10, 10, 12]))
    assert logs["negatives_groups"].item() == 0.0


def test_group_units_keep_members_together_and_cover_everything() -> None:
    caption_image = np.repeat(np.arange(5), 2)
    units = group_units(caption_image, [(0, 3), (1, 2)])
    assert sorted(c for u in units for c in u) == list(range(10))
    assert [0, 6] in units and [1, 7] in units and [2, 4] in units and [8] in units
    batches = EpochBatches(10, 4, seed=1, units=units)
    order = batches.order(3)
    for unit in (u for u in units if len(u) == 2):
        k = int(np.flatnonzero(order == unit[0])[0])
        assert order[k + 1] == unit[1]
    assert np.array_equal(batches.order(3), EpochBatches(10, 4, seed=1, units=units).order(3))
    with pytest.raises(ValueError, match="exactly once"):
        EpochBatches(10, 4, units=[[0, 1]])


def test_tagger_for_names_the_fix_when_the_data_declares_no_word_classes() -> None:
    class Plain:
        pass

    with pytest.raises(ValueError, match="--word-classes FILE"):
        tagger_for("dataset", Plain())
    declared = Plain()
    declared.word_classes = scenes_tagger
    assert tagger_for("dataset", declared).classes[0] == "noun"
    assert training_groups(Plain()) == []


@pytest.fixture(scope="module")
def tiny_scenes(tmp_path_factory):
    from xmatch.data import open_dataset

    root = tmp_path_factory.mktemp("scenes")
    return open_dataset("scenes", root, split="train", size="tiny", weights="random", progress=False)


def test_trainer_adds_the_terms_and_batches_twins_together(tiny_scenes, tmp_path) -> None:
    from xmatch.train import Trainer

    torch.manual_seed(0)
    spec = xmatch.build("teran-mrsw-scenes", pretrained=False).spec
    spec["image_encoder"]["feature_dim"] = int(tiny_scenes.image(0).regions.shape[1])
    model = xmatch.build(spec)
    config = TrainConfig.from_mapping({
        "epochs": 1, "batch_size": 8, "lr": 1e-4, "seed": 3, "fused": False, "log_every_steps": 1,
        "negatives": {"per_caption": 2},
    })
    seen: list[dict[str, float]] = []

    class Record(xmatch.train.Callback):
        def on_step_end(self, trainer, step, logs):
            seen.append(dict(logs))

    trainer = Trainer(model, tiny_scenes, config, run_dir=tmp_path / "run", progress=False, device="cpu",
                      callbacks=[Record()])
    assert trainer.units is not None and any(len(u) == 2 for u in trainer.units)
    trainer.fit()
    assert seen and all("negatives_captions" in logs and "negatives_groups" in logs for logs in seen)
    assert any(logs["negatives_captions"] > 0 for logs in seen)
    assert any(logs["negatives_groups"] > 0 for logs in seen)


def test_trainer_refuses_negatives_without_word_classes(tmp_path) -> None:
    from xmatch.train import Trainer

    class Captions(torch.utils.data.Dataset):
        captions = ["a dog"] * 4

    config = TrainConfig.from_mapping({"negatives": {}})
    trainer = object.__new__(Trainer)  # the plan alone: no model or data checks needed
    trainer.config, trainer.train_data = config, Captions()
    with pytest.raises(ConfigError, match="declares none"):
        trainer._plan_negatives()
