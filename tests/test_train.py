"""The trainer: it learns, schedules and groups parameters as the recipe says, resumes a killed
run exactly, stops on a non-finite loss, and refuses data that does not fit the model."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import xmatch
from xmatch.data import open_dataset
from xmatch.train import (
    ConfigError, NonFiniteLossError, TrainConfig, Trainer, load_recipe, recipe_names,
)
from xmatch.train.optim import build_optimizer, build_scheduler, lr_factor, plan_groups
from xmatch.train.sampler import EpochBatches
from xmatch.train.selection import metric_value

from conftest import tiny_spec
from learnable import FEATURE_DIM, write_learnable

TESTS = Path(__file__).parent


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    return write_learnable(tmp_path_factory.mktemp("learnable"))


def learnable_model(fixture_bert: str, seed: int = 0, **spec_overrides) -> xmatch.MatchingModel:
    torch.manual_seed(seed)
    spec = tiny_spec(fixture_bert, **spec_overrides)
    spec["image_encoder"]["feature_dim"] = FEATURE_DIM
    spec["loss"] = {"name": "hinge", "max_violation": False}
    return xmatch.build(spec)


def splits(root: Path, **options):
    train = open_dataset("scan-precomp", root, split="train", boxes_normalized=True, **options)
    val = open_dataset("scan-precomp", root, split="dev", boxes_normalized=True)
    return train, val


# --- learning ---------------------------------------------------------------------------------


@pytest.mark.cpu_kernels  # a training run's outcome depends on the CPU's kernels (docs/testing.md)
def test_short_run_lowers_the_loss_and_lifts_recall_far_above_chance(fixture_bert, data_root, tmp_path):
    train, val = splits(data_root)
    model = learnable_model(fixture_bert)
    config = TrainConfig(epochs=5, batch_size=20, lr=1e-3, log_every_steps=1, tensorboard=True)
    result = Trainer(model, train, config, val_data=val, run_dir=tmp_path, progress=False).fit()

    rows = list(csv.DictReader((tmp_path / "train.csv").open()))
    losses = [float(r["loss"]) for r in rows]
    assert len(rows) == result.steps == 5 * 15
    assert np.mean(losses[-10:]) < 0.25 * np.mean(losses[:5])
    last = result.validations[-1]
    chance = 100 / val.num_images  # 5 %
    assert last["i2t_r1"] >= 8 * chance and last["t2i_r1"] >= 8 * chance, last
    # the best model is kept and loads as a bundle with the figures it was chosen for
    best = json.loads((tmp_path / "best" / "metrics.json").read_text())
    assert best["metric"] == result.best_metric == max(v["metric"] for v in result.validations)
    reloaded = xmatch.build(f"local-dir:{tmp_path / 'best'}", pretrained=True)
    assert reloaded.spec["pooler"] == model.spec["pooler"]
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert {"step", "epoch", "lr", "loss", "pairs_per_s"} <= set(rows[0])


def test_early_stopping_ends_the_run_after_validations_without_improvement(fixture_bert, data_root, tmp_path):
    train, val = splits(data_root, max_images=8)
    model = learnable_model(fixture_bert)
    config = TrainConfig(epochs=6, batch_size=20, lr=1e-12, early_stopping=2, tensorboard=False)
    result = Trainer(model, train, config, val_data=val, run_dir=tmp_path, progress=False).fit()
    # an lr of 1e-12 changes nothing: the first validation is the best, two more end the run
    assert result.stopped_early and result.epochs == 3 and result.best_step == 2
    assert [v["metric"] for v in result.validations] == [result.best_metric] * 3


# --- resuming ---------------------------------------------------------------------------------


def run_driver(data: Path, run: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, str(TESTS / "train_driver.py"), str(data), str(run), *extra],
        env=env, capture_output=True, text=True, timeout=300,
    )


@pytest.mark.slow
def test_resume_after_kill_9_mid_epoch_gives_the_weights_of_an_uninterrupted_run(data_root, tmp_path):
    whole = run_driver(data_root, tmp_path / "whole")
    assert whole.returncode == 0, whole.stderr

    killed = run_driver(data_root, tmp_path / "killed", "--kill-at", "14")
    assert killed.returncode == -9, killed.stderr  # SIGKILL: no clean-up ran
    assert not (tmp_path / "killed" / "final").exists()
    latest = (tmp_path / "killed" / "checkpoints" / "latest").read_text()
    assert latest == "step-00000012"  # epoch 2, batch 4 of 8: two steps done after it are lost

    resumed = run_driver(data_root, tmp_path / "killed", "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming from" in resumed.stdout and "epoch 2, batch 4, step 12" in resumed.stdout

    a = load_file(tmp_path / "whole" / "final" / "model.safetensors")
    b = load_file(tmp_path / "killed" / "final" / "model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    # the logs read as one run
    steps = [int(r["step"]) for r in csv.DictReader((tmp_path / "killed" / "train.csv").open())]
    assert steps == list(range(1, 17))


def test_resume_continues_the_schedule_and_the_data_position(fixture_bert, data_root, tmp_path):
    train, _ = splits(data_root, max_images=8)  # 40 pairs: 4 batches of 10 per epoch
    config = TrainConfig(epochs=2, batch_size=10, lr=1e-3, scheduler="cosine", max_steps=3, tensorboard=False)
    first = Trainer(learnable_model(fixture_bert), train, config, run_dir=tmp_path, progress=False).fit()
    assert first.steps == 3 and (tmp_path / "checkpoints" / "step-00000003").is_dir()

    seen: list[list[int]] = []
    model = learnable_model(fixture_bert, seed=5)  # other initial weights: the checkpoint's win
    trainer = Trainer(model, train, config.merged({"max_steps": 8}), run_dir=tmp_path, resume=True, progress=False)
    original_step = trainer._micro_step

    def spy(batch, *args):
        seen.append(batch.indices.tolist())
        return original_step(batch, *args)

    trainer._micro_step = spy
    result = trainer.fit()
    assert result.steps == 8
    order = EpochBatches(40, 10, seed=0)
    expected = list(order.epoch(0, start=3)) + list(order.epoch(1))
    assert seen == expected
    assert trainer.scheduler.last_epoch == 8
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(1e-3 * lr_factor(8, config, 4))


def test_resume_refuses_a_run_folder_of_another_spec(fixture_bert, data_root, tmp_path):
    train, _ = splits(data_root, max_images=4)
    config = TrainConfig(epochs=1, batch_size=10, max_steps=1, tensorboard=False)
    Trainer(learnable_model(fixture_bert), train, config, run_dir=tmp_path, progress=False).fit()
    other = learnable_model(fixture_bert, pooler="Symm")
    with pytest.raises(RuntimeError, match="another model spec"):
        Trainer(other, train, config, run_dir=tmp_path, resume=True, progress=False).fit()


def test_resume_of_a_run_recorded_before_a_setting_existed_takes_its_default(fixture_bert, data_root, tmp_path):
    """A run.json written by an older xmatch lacks settings added since (``no_decay_1d``): it
    ran at their defaults, so resuming with the defaults is the same run; another value is not."""
    train, _ = splits(data_root, max_images=4)
    config = TrainConfig(epochs=2, batch_size=10, max_steps=1, tensorboard=False)
    Trainer(learnable_model(fixture_bert), train, config, run_dir=tmp_path, progress=False).fit()
    record = json.loads((tmp_path / "run.json").read_text())
    del record["train"]["no_decay_1d"]
    (tmp_path / "run.json").write_text(json.dumps(record))
    resumed = Trainer(learnable_model(fixture_bert), train, config.merged({"max_steps": 2}), run_dir=tmp_path,
                      resume=True, progress=False).fit()
    assert resumed.steps == 2
    (tmp_path / "run.json").write_text(json.dumps(record))
    with pytest.raises(RuntimeError, match=r"train.no_decay_1d: .* -> True"):
        Trainer(learnable_model(fixture_bert), train, config.merged({"max_steps": 3, "no_decay_1d": True}),
                run_dir=tmp_path, resume=True, progress=False).fit()


# --- failures ---------------------------------------------------------------------------------


def test_a_non_finite_loss_stops_with_the_step_and_the_batch_and_keeps_the_checkpoint(fixture_bert, data_root, tmp_path):
    train, _ = splits(data_root, max_images=8)
    model = learnable_model(fixture_bert)
    calls = {"n": 0}
    original = model.loss.forward

    def poisoned(scores, image_ids=None):
        calls["n"] += 1
        out = original(scores, image_ids)
        if calls["n"] == 3:
            out.loss = out.loss * float("nan")
        return out

    model.loss.forward = poisoned
    config = TrainConfig(epochs=1, batch_size=10, checkpoint_every_steps=1, tensorboard=False)
    trainer = Trainer(model, train, config, run_dir=tmp_path, progress=False)
    with pytest.raises(NonFiniteLossError, match=r"loss is nan at step 3 \(epoch 1") as info:
        trainer.fit()
    assert info.value.step == 2 and len(info.value.caption_indices) == 10
    assert info.value.caption_indices == list(EpochBatches(40, 10).epoch(0))[2]
    assert (tmp_path / "checkpoints" / "latest").read_text() == "step-00000002"


def test_data_that_does_not_fit_the_spec_is_refused_before_training(fixture_bert, data_root, tmp_path):
    train, _ = splits(data_root, max_images=4)
    model = learnable_model(fixture_bert)
    model.image_encoder.feature_dim = 2048  # a spec for bottom-up features
    with pytest.raises(ValueError, match=r"12-wide but the spec's image encoder expects feature_dim = 2048"):
        Trainer(model, train, TrainConfig(), run_dir=tmp_path)


def test_amp_is_checked_against_the_device(fixture_bert, data_root, tmp_path):
    train, _ = splits(data_root, max_images=4)
    with pytest.raises(ConfigError, match="fp16 needs a GPU"):
        Trainer(learnable_model(fixture_bert), train, TrainConfig(amp="fp16"), run_dir=tmp_path, device="cpu")
    config = TrainConfig(amp="bf16", epochs=1, batch_size=10, max_steps=2, tensorboard=False)
    result = Trainer(learnable_model(fixture_bert), train, config, run_dir=tmp_path, device="cpu", progress=False).fit()
    assert result.steps == 2 and math.isfinite(result.last_loss)


@pytest.mark.parametrize("native", [True, False])
def test_bf16_on_a_cpu_without_bf16_instructions_warns(fixture_bert, data_root, tmp_path, monkeypatch, caplog, native):
    """Emulated bfloat16 matmuls are hundreds of times slower than float32 (measured on an
    AVX2-only CPU): say so instead of letting a run crawl."""
    from xmatch.train import trainer

    monkeypatch.setattr(trainer, "cpu_has_native_bf16", lambda: native)
    train, _ = splits(data_root, max_images=4)
    with caplog.at_level("WARNING", logger="xmatch.train.trainer"):
        Trainer(learnable_model(fixture_bert), train, TrainConfig(amp="bf16"), run_dir=tmp_path, device="cpu")
    warned = [r.getMessage() for r in caplog.records if "bfloat16 instructions" in r.getMessage()]
    assert len(warned) == (0 if native else 1)
    if not native:
        assert "use amp = 'none'" in warned[0]


def test_the_batch_loss_is_computed_in_float32_under_bf16_autocast(fixture_bert):
    """Encoders may run in bfloat16; the scores and the hinge do not (their resolution would be
    coarser than the margin)."""
    from xmatch.model.embeddings import Embeddings

    model = learnable_model(fixture_bert)
    g = torch.Generator().manual_seed(0)
    mask = torch.arange(7)[None] < torch.tensor([[7], [5], [3], [6]])
    img = Embeddings(torch.randn(4, 7, model.embed_dim, generator=g).bfloat16(), mask)
    txt = Embeddings(torch.randn(4, 7, model.embed_dim, generator=g).bfloat16(), mask.flip(0))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under_autocast = model.batch_loss(img, txt).loss
    reference = model.batch_loss(img.to(torch.float32), txt.to(torch.float32)).loss
    assert under_autocast.dtype == torch.float32
    assert torch.equal(under_autocast, reference)


# --- recipe, schedule, groups, order ----------------------------------------------------------


def test_recipes_hold_the_papers_settings():
    assert set(recipe_names()) >= {"teran-coco", "teran-f30k", "tern-coco"}
    teran = load_recipe("teran-coco")
    assert (teran.optimizer, teran.lr, teran.batch_size, teran.step_epochs, teran.gamma, teran.grad_clip,
            teran.warmup_steps, teran.epochs) == ("adam", 1e-5, 40, 20, 0.1, 2.0, 0, 30)
    tern = load_recipe("tern-coco")
    assert (tern.lr, tern.batch_size, tern.warmup_steps, tern.step_epochs) == (2e-6, 80, 1000, 30)
    assert load_recipe("teran-f30k").batch_size == 30


def test_small_teran_is_scenes_teran_at_four_times_its_rate():
    small, scenes = load_recipe("small-teran"), load_recipe("scenes-teran")
    differ = {f.name for f in dataclasses.fields(small) if getattr(small, f.name) != getattr(scenes, f.name)}
    assert differ == {"lr", "warmup_steps"}
    assert (small.lr, small.warmup_steps) == (4 * scenes.lr, 100)
    # 79 steps an epoch on 5,000 captions: the full rate from step 100, then the cosine to zero
    factors = [lr_factor(step, small, 79) for step in (0, 49, 99, 200, 394)]
    assert factors[0] == pytest.approx(0.01) and factors[1] == pytest.approx(0.5) and factors[2] == pytest.approx(1.0)
    assert 0.0 < factors[4] < factors[3] < 1.0


def test_config_errors_name_the_key_and_the_fix(tmp_path):
    with pytest.raises(ConfigError, match=r"train -> epoch: unknown training setting\. Did you mean 'epochs'"):
        TrainConfig.from_mapping({"epoch": 3})
    with pytest.raises(ConfigError, match=r"train -> epochs: expected int, got '3'"):
        TrainConfig.from_mapping({"epochs": "3"})
    with pytest.raises(ConfigError, match="amp: 'fp8' is not one of none, bf16, fp16"):
        TrainConfig(amp="fp8")
    with pytest.raises(ConfigError, match="no recipe named 'teran-cocoo'.*Did you mean 'teran-coco'"):
        load_recipe("teran-cocoo")
    with pytest.raises(ConfigError, match="param_groups -> 0 -> lr: unknown"):
        TrainConfig.from_mapping({"param_groups": [{"match": "text_encoder.*", "lr": 1.0}]})
    recipe = tmp_path / "r.toml"
    recipe.write_text("[train]\nlr = 3e-4\nepochs = 2\n")
    assert load_recipe(recipe).lr == 3e-4


def test_step_schedule_is_the_papers_steplr_read_per_iteration_with_warmup():
    config = TrainConfig(epochs=30, step_epochs=20, gamma=0.1, warmup_steps=1000)
    steps_per_epoch = 100
    assert lr_factor(0, config, steps_per_epoch) == pytest.approx(1 / 1000)
    assert lr_factor(499, config, steps_per_epoch) == pytest.approx(0.5)
    assert lr_factor(1999, config, steps_per_epoch) == 1.0  # epoch 19
    assert lr_factor(2000, config, steps_per_epoch) == pytest.approx(0.1)  # epoch 20
    cosine = TrainConfig(epochs=2, scheduler="cosine", min_lr_scale=0.1)
    assert lr_factor(0, cosine, 50) == 1.0
    assert lr_factor(50, cosine, 50) == pytest.approx(0.55)
    assert lr_factor(100, cosine, 50) == pytest.approx(0.1)
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    sched = build_scheduler(opt, TrainConfig(epochs=4, step_epochs=2, gamma=0.5, warmup_steps=2), steps_per_epoch=3)
    lrs = []
    for _ in range(12):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs == pytest.approx([0.25, 0.5, 0.5, 0.5, 0.5, 0.5, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25])


def test_parameter_groups_scale_and_freeze_by_name(fixture_bert):
    model = learnable_model(fixture_bert)
    config = TrainConfig.from_mapping({
        "lr": 1e-4,
        "param_groups": [
            {"match": "text_encoder.model.embeddings.*", "freeze": True},
            {"match": "text_encoder.*", "lr_scale": 0.1, "weight_decay": 0.01},
        ],
    })
    groups = plan_groups(model, config)
    optimizer = build_optimizer(groups, config)
    names = {n for g in groups for n in g.names}
    assert not any(n.startswith("text_encoder.model.embeddings.") for n in names)
    assert not model.text_encoder.model.embeddings.word_embeddings.weight.requires_grad
    lrs = {g["lr"] for g in optimizer.param_groups}
    assert lrs == {1e-4, 1e-5}
    text_group = next(g for g in optimizer.param_groups if g["lr"] == 1e-5)
    assert text_group["weight_decay"] == 0.01
    assert sum(p.numel() for g in groups for p in g.params) == sum(
        p.numel() for p in model.parameters() if p.requires_grad)
    with pytest.raises(ConfigError, match="'bert.*' matches no parameter"):
        plan_groups(model, TrainConfig.from_mapping({"param_groups": [{"match": "bert.*"}]}))


def test_batch_order_is_seeded_resumable_and_split_across_processes():
    one = EpochBatches(23, 8, seed=3)
    assert len(one) == 3 and [len(b) for b in one.epoch(0)] == [8, 8, 7]
    assert list(one.epoch(0)) == list(EpochBatches(23, 8, seed=3).epoch(0))
    assert list(one.epoch(0)) != list(one.epoch(1))
    assert list(one.epoch(1, start=1)) == list(one.epoch(1))[1:]
    shares = [EpochBatches(23, 8, seed=3, rank=r, world_size=2) for r in range(2)]
    for whole, a, b in zip(one.epoch(2), shares[0].epoch(2), shares[1].epoch(2)):
        assert a + b == whole and abs(len(a) - len(b)) <= 1
    # a last batch smaller than the number of processes is dropped so no process idles
    assert len(EpochBatches(17, 8, rank=0, world_size=2)) == 2
    with pytest.raises(ValueError, match="smaller than the 4 processes"):
        EpochBatches(10, 2, world_size=4)


def test_select_metric_reads_directions_and_means():
    figures = {"rsum": 400.0, "i2t": {"r1": 50.0, "r5": 70.0, "r10": 80.0, "medr": 2.0, "ndcg_rougel": 0.6},
               "t2i": {"r1": 40.0, "r5": 70.0, "r10": 90.0, "medr": 3.0, "ndcg_rougel": 0.5}}
    assert metric_value(figures, "rsum") == 400.0
    assert metric_value(figures, "t2i_rsum") == 200.0
    assert metric_value(figures, "i2t_medr") == 2.0
    assert metric_value(figures, "ndcg_rougel") == pytest.approx(0.55)
    with pytest.raises(KeyError, match="ndcg_spice"):
        metric_value(figures, "t2i_ndcg_spice")
