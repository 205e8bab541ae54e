"""The SCAN and OAN plugins train on the built-in ``scenes`` benchmark with
xmatch's own trainer, and lifts R@1 on the scenes test split far above chance.

Small widths keep the run short; the architectures are the plugins' zoo entries otherwise.
VSE++ (one global vector per side) stays near chance after two epochs with these settings and
is left out here; its own tests train it on learnable data made in the test.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

import xmatch
from xmatch.data import open_dataset
from xmatch.eval import evaluate
from xmatch.train import TrainConfig, Trainer

WIDTH = 256

CASES = {
    "scan-t2i-avg-f30k": ("xmatch_scan", {
        "embed_dim": WIDTH,
        "image_encoder": {"feature_dim": 1280},
        "text_encoder": {"word_dim": 64, "hidden_dim": WIDTH, "min_count": 1},
        "loss": {"max_violation": False},
    }),
    "oan-coco": ("xmatch_oan", {
        "embed_dim": WIDTH,
        "image_encoder": {"feature_dim": 1280},
        "text_encoder": {"word_dim": 64, "channels": WIDTH, "min_count": 1},
    }),
}


@pytest.fixture(scope="module")
def scenes(tmp_path_factory):
    train = open_dataset("scenes", None, split="train", progress=False)
    test = open_dataset("scenes", None, split="test", progress=False)
    captions = tmp_path_factory.mktemp("vocab") / "train_captions.txt"
    captions.write_text("\n".join(train.captions) + "\n", encoding="utf-8")
    return train, test, captions


@pytest.mark.slow
@pytest.mark.parametrize("entry", sorted(CASES))
def test_plugin_model_learns_the_scenes_benchmark(entry, scenes, tmp_path):
    package, overrides = CASES[entry]
    if importlib.util.find_spec(package) is None:
        pytest.skip(f"plugin {package} is not installed")
    train, test, captions = scenes
    overrides = {**overrides, "text_encoder": {**overrides["text_encoder"], "vocab": str(captions)}}
    torch.manual_seed(0)
    model = xmatch.build(entry, **overrides)
    config = TrainConfig(epochs=2, batch_size=64, lr=2e-4, scheduler="constant", tensorboard=False, log_every_steps=20)
    Trainer(model, train, config, run_dir=Path(tmp_path), progress=False).fit()
    result = evaluate(model, test, "full", progress=False)
    chance = 100 / test.num_images  # 1 %: one image (or its 5 captions among 500) out of 100
    assert result.t2i["r1"] > 5 * chance and result.i2t["r1"] > 5 * chance, result.table()
