"""The `clip-finetune` recipe: open_clip's optimizer (AdamW 0.9 / 0.98 / 1e-6, weight decay 0.2 on
the weight matrices only, warm-up then cosine) with the entry's own loss; `xmatch train` fine-tunes a
CLIP or SigLIP model from its weights (a bundle, NAME=WEIGHTS) on a folder of captioned pictures,
the loss falls, the run folder holds the model and `xmatch eval` reads it; the FILIP-style variant
swaps the pooler for a token pooler. Tiny random towers, offline tokenizers."""

from __future__ import annotations

import csv
import hashlib
import json
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

import xmatch
from xmatch.cli.main import main
from xmatch.core.registry import models
from xmatch.io import hub
from xmatch.testing import one_torch_thread  # noqa: F401  (a fixture: one torch thread per test)
from xmatch.train import TrainConfig, load_recipe
from xmatch.train.optim import build_optimizer, lr_factor, plan_groups

from test_clip_eval_cli import photo_folder, saved_tiny, tiny

LOSS = {"clip": "infonce", "siglip": "sigmoid"}


def train_cli(reference: str, folder: Path, out: Path, *options: str) -> int:
    """`xmatch train REFERENCE --recipe clip-finetune` on the folder's train.csv, with the larger
    steps random tiny towers need to learn four pictures in a few steps."""
    return main(["train", reference, "--recipe", "clip-finetune", "--dataset", "image-captions", "--data", str(folder),
                 "--val-split", "", "--set", "lr=1e-3", "--set", "epochs=12", "--set", "warmup_steps=2",
                 "--set", "log_every_steps=1", "--set", "tensorboard=false", "--out", str(out), "--no-progress", *options])


def losses(run: Path) -> list[float]:
    return [float(row["loss"]) for row in csv.DictReader((run / "train.csv").open())]


def test_the_recipe_is_open_clips_optimizer_and_schedule():
    config = load_recipe("clip-finetune")
    assert (config.optimizer, config.betas, config.eps, config.weight_decay, config.lr) == ("adamw", (0.9, 0.98), 1e-6, 0.2, 1e-5)
    assert config.no_decay_1d and config.scheduler == "cosine" and config.warmup_steps > 0
    # linear warm-up to the full rate, then cosine to zero at the last step
    steps = [lr_factor(s, config, 100) for s in range(config.epochs * 100)]
    assert steps[0] == pytest.approx(1 / config.warmup_steps) and steps[config.warmup_steps - 1] == 1.0
    assert all(a >= b for a, b in zip(steps[config.warmup_steps :], steps[config.warmup_steps + 1 :]))
    assert steps[-1] == pytest.approx(0.0, abs=1e-5)


@pytest.mark.parametrize("kind", ["clip", "siglip"])
def test_no_weight_decay_on_biases_norms_and_the_learned_temperature(kind):
    model = tiny(kind).train()
    config = load_recipe("clip-finetune")
    optimizer = build_optimizer(plan_groups(model, config), config)
    assert type(optimizer) is torch.optim.AdamW
    decay = {id(p): g["weight_decay"] for g in optimizer.param_groups for p in g["params"]}
    named = dict(model.named_parameters())
    assert set(decay) == {id(p) for p in named.values()}  # every parameter once
    for name, param in named.items():
        vector = name.endswith(".bias") or "norm" in name or name.startswith("loss.logit_")
        assert decay[id(param)] == (0.0 if vector or param.ndim < 2 else 0.2), name
        assert vector <= (param.ndim < 2), name
    assert decay[id(named["loss.logit_scale"])] == 0.0
    assert decay[id(named["text_encoder.text_model.embeddings.token_embedding.weight"])] == 0.2  # as open_clip
    assert {g["lr"] for g in optimizer.param_groups} == {1e-5}
    assert all(g["betas"] == (0.9, 0.98) and g["eps"] == 1e-6 for g in optimizer.param_groups)


def test_no_decay_1d_keeps_each_groups_learning_rate_and_off_by_default_changes_nothing():
    model = tiny("clip")
    rules = [{"match": "text_encoder.*", "lr_scale": 0.1}]
    plain = plan_groups(model, TrainConfig(optimizer="adamw", weight_decay=0.2, param_groups=rules))
    assert [(g.lr_scale, g.weight_decay) for g in plain] == [(1.0, 0.2), (0.1, 0.2)]
    split = plan_groups(model, TrainConfig(optimizer="adamw", weight_decay=0.2, param_groups=rules, no_decay_1d=True))
    assert [(g.lr_scale, g.weight_decay) for g in split] == [(1.0, 0.2), (1.0, 0.0), (0.1, 0.2), (0.1, 0.0)]
    assert sorted(n for g in split for n in g.names) == sorted(n for g in plain for n in g.names)


@pytest.mark.parametrize("kind", ["clip", "siglip"])
def test_xmatch_train_fine_tunes_a_weights_file_with_the_entrys_loss_and_eval_reads_the_result(kind, tmp_path, capsys):
    folder, model, bundle, spec = saved_tiny(kind, tmp_path)
    run = tmp_path / "run"
    # the entry's spec with a weights file: the towers start from those weights, not random ones
    assert train_cli(f"{spec}={bundle / 'model.safetensors'}", folder, run) == 0
    assert f"(weights of {bundle / 'model.safetensors'})" in capsys.readouterr().out
    record = json.loads((run / "run.json").read_text())
    assert record["spec"]["loss"]["name"] == LOSS[kind]  # the recipe keeps the entry's own loss
    assert record["train"]["optimizer"] == "adamw" and record["train"]["no_decay_1d"] is True
    curve = losses(run)
    assert len(curve) == 12 and curve[-1] < 0.8 * curve[0]
    assert (run / "final" / "model.safetensors").is_file()
    assert main(["eval", f"local-dir:{run / 'final'}", "--dataset", "image-captions", "--data", str(folder),
                 "--json", str(tmp_path / "r.json")]) == 0
    assert json.loads((tmp_path / "r.json").read_text())["rsum"] > 0


def test_the_starting_weights_are_the_named_ones(tmp_path):
    folder, model, bundle, spec = saved_tiny("clip", tmp_path, seed=5)
    # one step at a learning rate too small to move a float32 weight: the saved model is the start
    assert train_cli(f"{spec}={bundle / 'model.safetensors'}", folder, tmp_path / "run", "--set", "lr=1e-30",
                     "--set", "max_steps=1") == 0
    trained = xmatch.build(f"local-dir:{tmp_path / 'run' / 'final'}", pretrained=True)
    name = "image_encoder.vision_model.encoder.layers.0.mlp.fc1.weight"
    assert torch.equal(trained.state_dict()[name], model.state_dict()[name])
    assert main(["train", f"{spec}={bundle / 'model.safetensors'}", "--pretrained", "--data", str(folder)]) == 2


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def test_pretrained_starts_a_zoo_entry_from_its_published_weights(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XMATCH_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("XMATCH_OFFLINE", raising=False)
    monkeypatch.setattr(hub, "_DIGESTS", {})
    folder = photo_folder(tmp_path / "photos")
    model = tiny("clip", seed=6)
    bundle = xmatch.save_pretrained(model, tmp_path / "published")
    body = (bundle / "model.safetensors").read_bytes()
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(QuietHandler, directory=str(bundle)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    weights = {"source": f"http://127.0.0.1:{server.server_address[1]}/model.safetensors",
               "sha256": hashlib.sha256(body).hexdigest(), "size": len(body)}
    try:
        with models.restored():
            models.register("clip-tiny-published", xmatch.ZooEntry(
                name="clip-tiny-published", spec=model.spec, description="tiny CLIP", weights=[weights], origin="127.0.0.1"))
            name = "image_encoder.vision_model.encoder.layers.0.mlp.fc1.weight"
            for flags, published in (([], False), (["--pretrained"], True)):
                run = tmp_path / f"run-{published}"
                assert train_cli("clip-tiny-published", folder, run, *flags, "--set", "lr=1e-30", "--set", "max_steps=1") == 0
                assert ("(its own weights)" if published else "(random weights)") in capsys.readouterr().out
                start = xmatch.build(f"local-dir:{run / 'final'}", pretrained=True).state_dict()[name]
                assert torch.equal(start, model.state_dict()[name]) is published
    finally:
        server.shutdown()
        server.server_close()


def test_filip_style_late_interaction_fine_tunes_with_a_token_pooler(tmp_path):
    folder = photo_folder(tmp_path / "photos")
    bundle = xmatch.save_pretrained(tiny("clip"), tmp_path / "start")
    run = tmp_path / "run"
    # FILIP's token-wise similarity: each word's best patch, averaged over the caption's words
    assert train_cli(f"local-dir:{bundle}", folder, run, "--model-set", "pooler.name=MrAvgw") == 0
    curve = losses(run)
    assert curve[-1] < 0.8 * curve[0]
    late = xmatch.build(f"local-dir:{run / 'final'}", pretrained=True)
    assert type(late.pooler).__name__ == "MrAvgwPooler" and late.spec["loss"]["name"] == "infonce"
    assert main(["eval", f"local-dir:{run / 'final'}", "--dataset", "image-captions", "--data", str(folder),
                 "--json", str(tmp_path / "r.json")]) == 0


def test_a_validation_split_with_uneven_captions_is_refused_before_training_with_the_option(tmp_path, capsys):
    folder, _, bundle, _ = saved_tiny("clip", tmp_path)
    rows = (folder / "test.csv").read_text().splitlines()
    (folder / "test.csv").write_text("\n".join([*rows, "red-car.png,a red car again"]) + "\n")  # 3 captions for one
    run = tmp_path / "run"
    assert train_cli(f"local-dir:{bundle}", folder, run, "--val-split", "test") == 2
    assert "--val-option captions_per_image=N (N at most 2" in capsys.readouterr().err
    assert not (run / "checkpoints").exists(), "refused before the first step"
    assert train_cli(f"local-dir:{bundle}", folder, tmp_path / "run2", "--val-split", "test",
                     "--val-option", "captions_per_image=2", "--set", "epochs=1") == 0
