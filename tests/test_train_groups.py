"""Hard-negative groups from a file for training (``xmatch train --groups FILE``,
``negatives.groups_file``), the warning when ``groups = true`` finds none, and the warning for a
schedule that is mostly warm-up."""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

import pytest
import torch

import xmatch
from xmatch.cli.main import main
from xmatch.data import open_dataset
from xmatch.eval.groups import GroupsFileError
from xmatch.io.run_folder import RunFolderError
from xmatch.train import ConfigError, TrainConfig, Trainer
from xmatch.train.negatives import training_groups

from conftest import tiny_spec
from learnable import CONCEPTS, FEATURE_DIM, write_learnable
from test_data import coco_root, photos  # noqa: F401 (fixtures: the teran and image-captions layouts)

TRAINER_LOG = "xmatch.train.trainer"


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    return write_learnable(tmp_path_factory.mktemp("learnable"), n_train=12, n_val=6)


@pytest.fixture(scope="module")
def word_classes(tmp_path_factory) -> Path:
    """The learnable captions' nouns ("a dog with a giraffe and a puppy"): swap-roles has work."""
    path = tmp_path_factory.mktemp("classes") / "word_classes.json"
    path.write_text(json.dumps({"noun": CONCEPTS}))
    return path


def groups_file(folder: Path, groups: list[list[object]], name: str = "groups.json") -> Path:
    path = folder / name
    path.write_text(json.dumps({"groups": [{"images": g, "kind": "relation"} for g in groups]}))
    return path


def tiny_model(fixture_bert: str) -> xmatch.MatchingModel:
    torch.manual_seed(0)
    spec = tiny_spec(fixture_bert)
    spec["image_encoder"]["feature_dim"] = FEATURE_DIM
    return xmatch.build(spec)


def precomp(root: Path, split: str = "train"):
    return open_dataset("scan-precomp", root, split=split, boxes_normalized=True)


def config(word_classes: Path, **negatives) -> TrainConfig:
    return TrainConfig.from_mapping({
        "epochs": 1, "batch_size": 10, "lr": 1e-3, "fused": False, "log_every_steps": 1, "tensorboard": False,
        "negatives": {"word_classes": str(word_classes), "per_caption": 1, **negatives},
    })


# --- the file's groups reach the batches and the loss ---------------------------------------------


def test_a_groups_file_batches_its_members_together_and_the_group_term_trains(fixture_bert, data_root, word_classes,
                                                                               tmp_path) -> None:
    path = groups_file(tmp_path, [[0, 1], ["3", 5, 7]])  # an image by index or by name
    seen: list[dict[str, float]] = []

    class Record(xmatch.train.Callback):
        def on_step_end(self, trainer, step, logs):
            seen.append(dict(logs))

    train = precomp(data_root)
    trainer = Trainer(tiny_model(fixture_bert), train, config(word_classes, groups_file=str(path)),
                      run_dir=tmp_path / "run", progress=False, device="cpu", callbacks=[Record()])
    owner = train.caption_image
    units = [sorted({int(owner[c]) for c in unit}) for unit in trainer.units if len(unit) > 1]
    assert [0, 1] in units and [3, 5, 7] in units  # the k-th caption of every member in one unit
    assert trainer.group_of_image[[0, 1, 3, 5, 7, 2]].tolist() == [0, 0, 1, 1, 1, -1]
    trainer.fit()
    assert any(logs["negatives_groups"] > 0 for logs in seen)
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["train"]["negatives"]["groups_file"] == str(path)
    assert record["data"]["groups"]["groups"] == 2


@pytest.fixture(scope="module")
def tiny_scenes(tmp_path_factory):
    return open_dataset("scenes", tmp_path_factory.mktemp("scenes"), split="train", size="tiny", weights="random",
                        progress=False)


@pytest.mark.parametrize("layout", ["scan-precomp", "teran", "image-captions", "scenes"])
def test_a_groups_file_fits_every_layout(layout, data_root, request, tmp_path) -> None:
    if layout == "scan-precomp":
        dataset, listed, expected = precomp(data_root), ["2", 4], (2, 4)
    elif layout == "teran":
        root = request.getfixturevalue("coco_root")
        dataset, listed, expected = open_dataset("teran", root, split="train", restval=True), ["12", 0], (2, 0)
    elif layout == "scenes":  # the file replaces the twins the benchmark declares
        dataset, listed, expected = request.getfixturevalue("tiny_scenes"), ["1", 2], (1, 2)
        assert training_groups(dataset)[:2] == [(0, 1), (2, 3)]
    else:
        root = request.getfixturevalue("photos")
        # a file name, or its stem
        dataset, listed, expected = open_dataset("image-captions", root / "captions.csv"), ["a.jpg", "b"], (0, 1)
    assert training_groups(dataset, groups_file(tmp_path, [listed])) == [expected]


def test_a_groups_file_replaces_the_groups_a_dataset_declares(tmp_path) -> None:
    class Declares:
        image_names = ["0", "1", "2", "3"]
        caption_image = [0, 1, 2, 3]

        def hard_negative_groups(self):
            raise AssertionError("the file's groups are used, not the dataset's")

    assert training_groups(Declares(), groups_file(tmp_path, [[2, 3]])) == [(2, 3)]


def test_a_groups_file_that_does_not_fit_the_training_split_is_refused_before_training(
        fixture_bert, data_root, word_classes, tmp_path) -> None:
    model = tiny_model(fixture_bert)
    train = precomp(data_root)
    path = groups_file(tmp_path, [[0, 40]])
    with pytest.raises(GroupsFileError, match=rf"groups file {path}, group 0: image index 40 is outside the split's 12 images") as info:
        Trainer(model, train, config(word_classes, groups_file=str(path)), run_dir=tmp_path / "run", device="cpu")
    assert "--split" in str(info.value)  # the fix: a file of this split's images
    with pytest.raises(FileNotFoundError, match="nope.json does not exist"):
        Trainer(model, train, config(word_classes, groups_file=str(tmp_path / "nope.json")), run_dir=tmp_path / "run",
                device="cpu")
    assert not (tmp_path / "run").exists()
    with pytest.raises(ConfigError, match="groups_file.*groups = false"):
        config(word_classes, groups_file=str(path), groups=False)


def test_resuming_with_another_groups_file_is_refused(fixture_bert, data_root, word_classes, tmp_path) -> None:
    path = groups_file(tmp_path, [[0, 1]])
    run = tmp_path / "run"
    first = config(word_classes, groups_file=str(path)).merged({"max_steps": 1})
    Trainer(tiny_model(fixture_bert), precomp(data_root), first, run_dir=run, progress=False, device="cpu").fit()
    # the same path with other groups: the file's content is recorded, not only its name
    groups_file(tmp_path, [[0, 2]])
    with pytest.raises(RunFolderError, match="data.groups.groups_sha256"):
        Trainer(tiny_model(fixture_bert), precomp(data_root), first, run_dir=run, resume=True, progress=False,
                device="cpu").fit()
    other = groups_file(tmp_path, [[0, 1]], name="other.json")
    with pytest.raises(RunFolderError, match="train.negatives"):
        Trainer(tiny_model(fixture_bert), precomp(data_root), config(word_classes, groups_file=str(other)).merged(
            {"max_steps": 1}), run_dir=run, resume=True, progress=False, device="cpu").fit()


def test_a_negatives_table_without_a_groups_file_is_recorded_as_before() -> None:
    assert "groups_file" not in TrainConfig.from_mapping({"negatives": {}}).to_mapping()["negatives"]


# --- the command line ------------------------------------------------------------------------------


def test_train_groups_option_turns_on_the_negatives_and_records_the_file(fixture_bert, data_root, word_classes,
                                                                         tmp_path, capsys) -> None:
    spec = tmp_path / "spec.toml"
    model = tiny_spec(fixture_bert)
    model["image_encoder"]["feature_dim"] = FEATURE_DIM
    spec.write_text("\n".join(_toml(model)))
    path = groups_file(tmp_path, [[0, 1], [2, 3]])
    out = tmp_path / "run"
    args = ["train", str(spec), "--data", str(data_root), "--dataset", "scan-precomp", "--data-option",
            "boxes_normalized=true", "--val-split", "", "--set", "epochs=1", "--set", "batch_size=10", "--set",
            "log_every_steps=1", "--set", "tensorboard=false", "--no-progress", "--out", str(out)]
    assert main([*args, "--groups", str(path), "--word-classes", str(word_classes)]) == 0
    record = json.loads((out / "run.json").read_text())["train"]["negatives"]
    assert (record["groups"], record["groups_file"], record["kinds"][0]) == (True, str(path), "swap-roles")
    rows = list(csv.DictReader((out / "train.csv").open()))
    assert any(float(r["negatives_groups"]) > 0 for r in rows)
    # without word classes the default table is refused, naming the fix
    assert main([*args, "--groups", str(path), "--overwrite"]) == 2
    assert "--word-classes" in capsys.readouterr().err
    assert main([*args, "--groups", str(tmp_path / "nope.json"), "--overwrite", "--word-classes", str(word_classes)]) == 2
    assert "nope.json does not exist" in capsys.readouterr().err


def _toml(spec: dict, prefix: str = "") -> list[str]:
    lines = [f"{k} = {json.dumps(v)}" for k, v in spec.items() if not isinstance(v, dict)]
    for k, v in spec.items():
        if isinstance(v, dict):
            lines += [f"[{prefix}{k}]", *_toml(v, f"{prefix}{k}.")]
    return lines


# --- warnings ------------------------------------------------------------------------------------


def test_groups_true_on_a_set_without_groups_warns_naming_the_option(fixture_bert, data_root, word_classes, tmp_path,
                                                                     caplog) -> None:
    with caplog.at_level("WARNING", logger=TRAINER_LOG):
        Trainer(tiny_model(fixture_bert), precomp(data_root), config(word_classes), run_dir=tmp_path / "a", device="cpu")
    warned = [r.getMessage() for r in caplog.records if "hard-negative groups" in r.getMessage()]
    assert len(warned) == 1 and "--groups FILE" in warned[0] and "groups = false" in warned[0]
    caplog.clear()
    with caplog.at_level("WARNING", logger=TRAINER_LOG):
        Trainer(tiny_model(fixture_bert), precomp(data_root), config(word_classes, groups=False), run_dir=tmp_path / "b",
                device="cpu")
        Trainer(tiny_model(fixture_bert), precomp(data_root), config(word_classes, groups_file=str(
            groups_file(tmp_path, [[0, 1]]))), run_dir=tmp_path / "c", device="cpu")
    assert not [r for r in caplog.records if "hard-negative groups" in r.getMessage()]


def schedule_warnings(fixture_bert, data_root, tmp_path, caplog, cfg: TrainConfig, about: str) -> list[str]:
    """The warnings about ``about`` that preparing a run of ``cfg`` on the precomp fixture logs."""
    cfg = dataclasses.replace(cfg, fused=False, tensorboard=False)
    trainer = Trainer(tiny_model(fixture_bert), precomp(data_root), cfg, run_dir=tmp_path, device="cpu")
    with caplog.at_level("WARNING", logger=TRAINER_LOG):
        trainer._prepare()
    return [r.getMessage() for r in caplog.records if about in r.getMessage()]


@pytest.mark.parametrize(("scheduler", "max_steps", "warned"), [("cosine", 3, "still at 9"), ("cosine", 11, None),
                                                                 ("cosine", None, None), ("constant", 3, None)])
def test_a_cosine_schedule_that_max_steps_cuts_short_warns(fixture_bert, data_root, tmp_path, caplog, scheduler,
                                                            max_steps, warned) -> None:
    # 60 captions in batches of 10, two epochs: the cosine runs over 12 optimizer steps
    cfg = TrainConfig(epochs=2, batch_size=10, warmup_steps=0, max_steps=max_steps, scheduler=scheduler)
    messages = schedule_warnings(fixture_bert, data_root, tmp_path, caplog, cfg, "max_steps")
    if warned is None:
        assert not messages
        return
    assert len(messages) == 1 and f"{warned}" in messages[0] and "over the recipe's 2 epochs (12 optimizer steps)" in messages[0]
    assert "--set epochs=1" in messages[0] and "constant" in messages[0]


@pytest.mark.parametrize(("warmup", "max_steps", "warned"), [(6, None, "all 6"), (4, None, "4 of the 6"),
                                                              (40, 3, "all 3"), (3, None, None), (0, None, None)])
def test_a_schedule_that_is_mostly_warm_up_warns(fixture_bert, data_root, tmp_path, caplog, warmup, max_steps,
                                                 warned) -> None:
    # 60 captions in batches of 10: 6 optimizer steps
    cfg = TrainConfig(epochs=1, batch_size=10, warmup_steps=warmup, max_steps=max_steps, scheduler="cosine")
    messages = schedule_warnings(fixture_bert, data_root, tmp_path, caplog, cfg, "warm-up")
    if warned is None:
        assert not messages
        return
    assert len(messages) == 1 and f"covers {warned} optimizer steps" in messages[0]
    assert "--set warmup_steps=" in messages[0] and "--set epochs=" in messages[0]
