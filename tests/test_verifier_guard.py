"""A verifier head that cannot silently hurt (issue 43): its own validation picks ``best/`` and
is kept in the bundle, ``--rerank`` with a head that has no such record or one near chance
warns, and re-ranking reports the pooler's figures beside its own and says when it lowers them."""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

import xmatch
from xmatch.train.optim import lr_factor
from xmatch.eval.rerank import lowered_figures, rerank_figures, rerank_table, validation_warning
from xmatch.io.bundle import read_verifier_validation
from xmatch.train import ConfigError, Trainer, load_recipe

from test_verifier import FAST, small_spec

HEAD = {"name": "grounded", "width": 16, "heads": 2, "layers": 1}


@pytest.fixture(scope="module")
def scenes_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("scenes")


@pytest.fixture(scope="module")
def scenes(scenes_root):
    pytest.importorskip("timm")
    from xmatch.scenes.dataset import open_scenes

    return {split: open_scenes(scenes_root, split, size="tiny", backbone="test_efficientnet", weights="random",
                               progress=False) for split in ("train", "val")}


def head_recipe(**changes):
    """The scenes-verifier recipe cut to a few steps of the tiny preset."""
    recipe = load_recipe("scenes-verifier")
    return dataclasses.replace(recipe, batch_size=8, warmup_steps=0, log_every_steps=1, tensorboard=False, **changes)


def untrained(tmp_path: Path, name: str = "untrained") -> str:
    torch.manual_seed(0)
    xmatch.save_pretrained(xmatch.build(small_spec(verifier=HEAD)), tmp_path / name)
    return f"local-dir:{tmp_path / name}"


def test_a_head_trained_a_few_steps_is_picked_by_its_own_validation_and_recorded_in_its_bundles(scenes, tmp_path):
    torch.manual_seed(0)
    model = xmatch.build(small_spec(verifier=HEAD))
    recipe = head_recipe(epochs=2)
    assert recipe.select_metric == "verifier_accuracy"
    result = Trainer(model, scenes["train"], recipe, val_data=scenes["val"], run_dir=tmp_path / "run", progress=False).fit()

    rows = list(csv.DictReader((tmp_path / "run" / "val.csv").open()))
    assert len(rows) == len(result.validations) == 2
    for row, validation in zip(rows, result.validations):
        # the head's own figures pick best/, the pooler's and the re-ranked rsum are kept beside them
        assert float(row["metric"]) == pytest.approx(validation["verifier_accuracy"]) == pytest.approx(validation["metric"])
        assert {"rsum", "rerank_rsum", "verifier_twins", "verifier_structural", "verifier_image"} <= set(row)
        assert float(row["verifier_chance"]) == 50.0
    best = json.loads((tmp_path / "run" / "best" / "metrics.json").read_text())
    assert best["metric"] == result.best_metric == max(v["metric"] for v in result.validations)
    record = read_verifier_validation(tmp_path / "run" / "best" / "model.safetensors")
    assert record["accuracy"] == pytest.approx(result.best_metric) and record["step"] == result.best_step
    assert record["chance"] == 50.0 and record["split"] == "val" and record["pairs"] > 0
    assert record["twins"] is not None and record["rerank_rsum"] is not None and record["pooler_rsum"] is not None
    final = read_verifier_validation(tmp_path / "run" / "final" / "model.safetensors")
    assert final["step"] == result.steps and final["accuracy"] == pytest.approx(result.validations[-1]["metric"])


def test_a_verifier_only_run_refuses_to_select_on_the_frozen_models_figures(scenes, tmp_path):
    torch.manual_seed(0)
    model = xmatch.build(small_spec(verifier=HEAD))
    with pytest.raises(ConfigError, match="'rsum' is a figure of the frozen model.*verifier_accuracy"):
        Trainer(model, scenes["train"], head_recipe(select_metric="rsum"), val_data=scenes["val"],
                run_dir=tmp_path / "run", progress=False)
    with pytest.raises(ConfigError, match="'verifier_accuracy' is a figure of a verifier head and this model has none"):
        Trainer(xmatch.build(small_spec()), scenes["train"], head_recipe(param_groups=[]), val_data=scenes["val"],
                run_dir=tmp_path / "plain", progress=False)


def test_rerank_with_an_untrained_head_warns_naming_the_figure_and_the_fix(scenes, scenes_root, tmp_path, capsys):
    from xmatch.cli.main import main
    from xmatch.train.verifier_validation import validate_verifier

    data = ["--dataset", "scenes", "--data", str(scenes_root), *FAST, "--split", "val", "--protocol", "full"]
    reference = untrained(tmp_path)
    assert main(["eval", reference, *data, "--rerank", "3"]) == 0
    err = capsys.readouterr().err
    assert f"--rerank 3: {reference}'s verifier has no recorded validation" in err and "leave out --rerank" in err

    # the same head, measured at its initialisation: its recorded accuracy is near chance
    model = xmatch.build(reference, pretrained=True)
    measured = validate_verifier(model, scenes["val"], k=3, groups=None)
    assert abs(measured.accuracy - 50.0) < 10.0
    xmatch.save_pretrained(model, tmp_path / "measured", verifier_validation=measured.record("val", 0))
    assert main(["eval", f"local-dir:{tmp_path / 'measured'}", *data, "--rerank", "3"]) == 0
    err = capsys.readouterr().err
    assert "near chance (50.0 %)" in err and f"{measured.accuracy:.1f} % on its validation pairs (val split" in err
    # a head that learned re-ranks without a word
    learned = {**measured.record("val", 0), "accuracy": 97.0, "rerank_rsum": measured.record("val", 0)["pooler_rsum"]}
    xmatch.save_pretrained(model, tmp_path / "learned", verifier_validation=learned)
    assert main(["eval", f"local-dir:{tmp_path / 'learned'}", *data, "--rerank", "3"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_near_chance_is_within_ten_points():
    record = {"accuracy": 59.9, "chance": 50.0, "split": "val", "pairs": 120}
    assert "near chance" in validation_warning(record, "m", 20)
    assert validation_warning({**record, "accuracy": 60.0}, "m", 20) is None
    assert "no recorded validation" in validation_warning(None, "m", 20)


def test_a_head_whose_reranking_lowered_its_validation_rsum_is_named():
    record = {"accuracy": 67.5, "chance": 50.0, "split": "val", "pairs": 867, "k": 20, "pooler_rsum": 479.6,
              "rerank_rsum": 425.4}
    warning = validation_warning(record, "local-dir:runs/verifier/best", 10)
    assert "re-ranking the top 20 with local-dir:runs/verifier/best's verifier lowered its validation rsum (val split)" in warning
    assert "from the pooler's 479.6 to 425.4" in warning and "67.5 %" in warning
    assert validation_warning({**record, "rerank_rsum": 479.6}, "m", 20) is None  # not lowered: no word
    assert validation_warning({k: v for k, v in record.items() if k != "rerank_rsum"}, "m", 20) is None
    assert "near chance" in validation_warning({**record, "accuracy": 55.0}, "m", 20)  # the first thing to say


def test_rerank_reports_the_poolers_figures_of_the_same_pass_beside_its_own(scenes):
    from xmatch.eval import evaluate
    from xmatch.eval.groups import dataset_groups

    torch.manual_seed(0)
    model = xmatch.build(small_spec(verifier=HEAD)).eval()
    train = scenes["train"]
    figures = rerank_figures(model, train, 3, groups=dataset_groups(train), progress=False)
    own = evaluate(model, train, "full", progress=False).figures()
    assert {k: v for k, v in figures["pooler"]["recall"].items() if k != "timings"} == \
        {k: v for k, v in own.items() if k != "timings"}
    assert figures["pooler"]["groups"]["overall"]["groups"] == figures["groups"]["overall"]["groups"]
    assert figures["lowered"] == lowered_figures(figures)
    table = rerank_table(figures, "m")
    assert f"rsum {figures['recall']['rsum']:.1f} re-ranked beside the pooler's {figures['pooler']['recall']['rsum']:.1f}" in table
    assert "beside the pooler's: t2i" in table


def test_a_reranking_that_lowers_the_poolers_figures_is_said():
    from xmatch.eval.protocol import evaluate_scores

    recall = evaluate_scores(np.eye(2).repeat(5, axis=1)).figures()
    figures = {"k": 20, "recall": {**recall, "rsum": 110.0}, "pooler": {"recall": {**recall, "rsum": 169.5}},
               "groups": {"overall": {"groups": 4, "t2i": 60.0, "i2t": 70.0, "group": 30.0}}}
    figures["pooler"]["groups"] = {"overall": {"groups": 4, "t2i": 50.0, "i2t": 75.0, "group": 30.0}}
    lowered = lowered_figures(figures)
    assert lowered == [{"figure": "rsum", "pooler": 169.5, "reranked": 110.0},
                       {"figure": "groups i2t", "pooler": 75.0, "reranked": 70.0}]
    figures |= {"lowered": lowered, "pairs": 10, "timings": {"encode_s": 1.0, "similarity_s": 1.0, "rerank_s": 1.0,
                                                              "without_s": 2.0, "with_s": 3.0, "ratio": 1.5}}
    table = rerank_table(figures, "m")
    assert "WARNING: re-ranking lowers rsum from the pooler's 169.5 to 110.0" in table
    assert "WARNING: re-ranking lowers groups i2t from the pooler's 75.0 to 70.0" in table


def test_search_rerank_with_a_head_that_has_no_record_warns(tmp_path, capsys):
    pytest.importorskip("faiss")
    import xmatch.index
    from test_search import DIM, TEXTS, regions
    from xmatch.cli.main import main
    from xmatch.index.synthetic import scoring_model

    index = xmatch.index.create(tmp_path / "idx", scoring_model("MrSw", DIM, verifier="grounded"), dtype="float32")
    feats, boxes, mask = regions(6)
    index.add(xmatch.RegionInputs(feats, boxes, mask))
    index.close()
    assert main(["search", str(index.root), "--text", TEXTS[0], "-k", "2", "--rerank", "3"]) == 0
    err = capsys.readouterr().err
    assert f"--rerank 3: local-dir:{index.root / 'model'}'s verifier has no recorded validation" in err
    assert main(["search", str(index.root), "--text", TEXTS[0], "-k", "2"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_the_verifier_recipe_counts_steps_not_epochs_and_leaves_the_warm_up_early():
    # a head needs steps at a learning rate that leaves the chance plateau, whatever the data's size
    recipe = load_recipe("verifier")
    assert [(g.match, g.freeze) for g in recipe.param_groups] == [("verifier.*", False), ("*", True)]
    assert recipe.max_steps == 400 and recipe.lr == 2e-3 and recipe.select_metric == "verifier_accuracy"
    assert recipe.warmup_steps <= recipe.max_steps // 10 and recipe.max_steps % recipe.val_every_steps == 0
    assert recipe.negatives is not None and recipe.negatives.groups
    # the rate stays at 2e-3 after the warm-up: a schedule over the epochs bound would not end with the steps
    assert recipe.scheduler == "constant" and lr_factor(recipe.max_steps - 1, recipe, 40) == 1.0
    for captions in (2_000, 5_000, 100_000):  # the epochs only bound the run
        assert recipe.epochs * -(-captions // recipe.batch_size) >= recipe.max_steps


def test_the_verifier_recipe_stops_at_its_steps_and_validates_on_the_way(scenes, tmp_path):
    torch.manual_seed(0)
    model = xmatch.build(small_spec(verifier=HEAD))
    recipe = dataclasses.replace(load_recipe("verifier"), batch_size=4, max_steps=6, val_every_steps=3, warmup_steps=1,
                                 log_every_steps=1, tensorboard=False)
    steps_per_epoch = -(-len(scenes["train"]) // 4)
    assert steps_per_epoch > 6  # the run ends inside its first epoch, after two validations
    result = Trainer(model, scenes["train"], recipe, val_data=scenes["val"], run_dir=tmp_path / "run", progress=False).fit()
    assert result.steps == 6
    assert [v["step"] for v in result.validations] == [3, 6]
    record = read_verifier_validation(tmp_path / "run" / "best" / "model.safetensors")
    assert record["step"] == result.best_step and record["accuracy"] == pytest.approx(result.best_metric)
