"""The CUDA paths: a model moved to a GPU encodes, scores and evaluates as on the CPU, and the
trainer runs there under each mixed-precision mode with fused Adam and the gradient scaler.

Every test here is marked ``gpu`` and skipped (with the reason) where torch sees no CUDA device;
they were run on an H100 (see docs/training.md, Throughput).
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest
import torch

import xmatch
from xmatch.data import open_dataset
from xmatch.model.embeddings import Embeddings
from xmatch.eval import evaluate
from xmatch.train import TrainConfig, Trainer

from conftest import random_regions, tiny_spec
from learnable import FEATURE_DIM, write_learnable

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (torch sees none)"),
]


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    return write_learnable(tmp_path_factory.mktemp("learnable"))


@pytest.fixture(autouse=True)
def exact_float32_matmuls():
    """TF32 would make GPU scores differ from the CPU's by ~1e-3; these tests compare float32."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def learnable_model(fixture_bert: str, seed: int = 0) -> xmatch.MatchingModel:
    torch.manual_seed(seed)
    spec = tiny_spec(fixture_bert)
    spec["image_encoder"]["feature_dim"] = FEATURE_DIM
    spec["loss"] = {"name": "hinge", "max_violation": False}
    return xmatch.build(spec)


@pytest.mark.parametrize("pooler", ["MrSw", "MwSr", "Symm", "MrAvgw"])
def test_a_model_on_the_gpu_encodes_and_scores_as_on_the_cpu(fixture_bert, pooler):
    torch.manual_seed(0)
    cpu = xmatch.build(tiny_spec(fixture_bert, pooler=pooler)).eval()
    gpu = xmatch.build(tiny_spec(fixture_bert, pooler=pooler)).eval()
    gpu.load_state_dict(cpu.state_dict())
    gpu.to("cuda")
    regions, boxes, mask = random_regions(6, 9, 12)
    texts = ["a dog on a bench", "two red buses", "a man", "a cat sleeping next to a very small window"]
    with torch.inference_mode():
        img_c, txt_c = cpu.encode_images(xmatch.RegionInputs(regions, boxes, mask)), cpu.encode_texts(texts)
        img_g, txt_g = gpu.encode_images(xmatch.RegionInputs(regions, boxes, mask)), gpu.encode_texts(texts)
        assert img_g.tokens.device.type == "cuda" and txt_g.tokens.device.type == "cuda"
        torch.testing.assert_close(img_g.tokens.cpu(), img_c.tokens, atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(txt_g.tokens.cpu(), txt_c.tokens, atol=2e-5, rtol=1e-4)
        assert torch.equal(img_g.mask.cpu(), img_c.mask) and torch.equal(txt_g.mask.cpu(), txt_c.mask)
        scores_g = gpu.similarity(img_g, txt_g)
        scores_c = cpu.similarity(img_c, txt_c)
    assert scores_g.device.type == "cuda" and scores_g.dtype == torch.float32
    torch.testing.assert_close(scores_g.cpu(), scores_c, atol=1e-4, rtol=1e-4)


def test_evaluation_on_the_gpu_ranks_as_on_the_cpu(fixture_bert, data_root):
    val = open_dataset("scan-precomp", data_root, split="dev", boxes_normalized=True)
    cpu = learnable_model(fixture_bert)
    gpu = learnable_model(fixture_bert).to("cuda")
    on_cpu = evaluate(cpu, val, "full", progress=False)
    on_gpu = evaluate(gpu, val, "full", progress=False)
    # random weights give near-ties; a score differing in the 6th digit may swap two of them
    for direction in ("i2t", "t2i"):
        same = on_cpu.queries[f"{direction}_ranks"] == on_gpu.queries[f"{direction}_ranks"]
        assert same.mean() > 0.95, direction
    assert abs(on_cpu.rsum - on_gpu.rsum) <= 10.0, (on_cpu.table(), on_gpu.table())


@pytest.mark.parametrize("amp", ["none", "bf16", "fp16"])
def test_the_trainer_learns_on_the_gpu_under_each_precision(fixture_bert, data_root, tmp_path, amp):
    train = open_dataset("scan-precomp", data_root, split="train", boxes_normalized=True)
    val = open_dataset("scan-precomp", data_root, split="dev", boxes_normalized=True)
    model = learnable_model(fixture_bert)
    config = TrainConfig(epochs=5, batch_size=20, lr=1e-3, log_every_steps=1, tensorboard=False, amp=amp)
    trainer = Trainer(model, train, config, val_data=val, run_dir=tmp_path, device="cuda", progress=False)
    result = trainer.fit()
    assert (trainer.scaler is not None) == (amp == "fp16")

    assert next(model.parameters()).device.type == "cuda"
    losses = [float(r["loss"]) for r in csv.DictReader((tmp_path / "train.csv").open())]
    assert all(math.isfinite(v) for v in losses)
    assert np.mean(losses[-10:]) < 0.25 * np.mean(losses[:5])
    chance = 100 / val.num_images
    last = result.validations[-1]
    assert last["i2t_r1"] >= 8 * chance and last["t2i_r1"] >= 8 * chance, last
    # the checkpoint written on the GPU loads on the CPU
    reloaded = xmatch.build(f"local-dir:{tmp_path / 'best'}", pretrained=True)
    assert next(reloaded.parameters()).device.type == "cpu"


def test_the_batch_loss_is_float32_under_cuda_autocast(fixture_bert):
    model = learnable_model(fixture_bert).to("cuda")
    g = torch.Generator().manual_seed(0)
    mask = torch.arange(7)[None] < torch.tensor([[7], [5], [3], [6]])
    img = Embeddings(torch.randn(4, 7, model.embed_dim, generator=g), mask).to("cuda")
    txt = Embeddings(torch.randn(4, 7, model.embed_dim, generator=g), mask.flip(0)).to("cuda")
    for dtype in (torch.bfloat16, torch.float16):
        with torch.autocast("cuda", dtype=dtype):
            loss = model.batch_loss(img.to(dtype), txt.to(dtype)).loss
        reference = model.batch_loss(img.to(dtype).to(torch.float32), txt.to(dtype).to(torch.float32)).loss
        assert loss.dtype == torch.float32
        torch.testing.assert_close(loss, reference)


def test_embeddings_saved_from_the_gpu_load_on_the_cpu(tmp_path):
    mask = torch.arange(5)[None] < torch.tensor([[5], [2], [4]])
    emb = Embeddings(torch.randn(3, 5, 8), mask).to("cuda")
    emb.save(tmp_path / "e.safetensors")
    back = Embeddings.load(tmp_path / "e.safetensors")
    assert back.tokens.device.type == "cpu"
    assert torch.equal(back.tokens, emb.tokens.cpu()) and torch.equal(back.mask, emb.mask.cpu())
