"""`xmatch eval ENTRY --dataset image-captions --data FOLDER` with a CLIP or SigLIP entry, zero-shot,
through the whole command line: the figures it prints and writes are the Python evaluation's on the
same model and pictures, bit for bit; a model that matches the folder's pictures to their captions
scores R@1 = 100 and the same model on shuffled captions does not; a folder whose pictures have
different numbers of captions is refused with the option that evaluates it. Tiny random towers,
offline tokenizers (tests/clip_assets.py)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import tomli_w
import torch
from PIL import Image

import xmatch
from xmatch.cli.main import main
from xmatch.data import open_dataset
from xmatch.eval import evaluate
from xmatch.testing import one_torch_thread  # noqa: F401  (a fixture: one torch thread per test)
from xmatch.train import TrainConfig, Trainer

from clip_assets import tiny_tower_overrides

ENTRY = {"clip": "clip-vit-b-32", "siglip": "siglip-base-patch16-224"}
COLOURS = {"red": (220, 30, 30), "blue": (30, 30, 220)}


def photo_folder(root: Path, shuffled: bool = False) -> Path:
    """Four pictures (a red or blue square or car) with two captions each, as ``test.csv`` and
    ``train.csv``; ``shuffled`` gives each picture another picture's captions."""
    root.mkdir(parents=True, exist_ok=True)
    names, captions = [], []
    for colour, rgb in COLOURS.items():
        for shape in ("square", "car"):
            picture = np.full((36, 44, 3), 255, dtype=np.uint8)
            picture[6:30, 8 if shape == "square" else 20 : 32 if shape == "square" else 40] = rgb
            names.append(f"{colour}-{shape}.png")
            Image.fromarray(picture).save(root / names[-1])
            captions.append([f"a {colour} {shape}", f"the {colour} {shape} on a bench"])
    if shuffled:
        captions = captions[1:] + captions[:1]
    rows = ["image,caption", *(f"{name},{c}" for name, caps in zip(names, captions) for c in caps)]
    for split in ("train", "test"):
        (root / f"{split}.csv").write_text("\n".join(rows) + "\n")
    return root


def tiny(kind: str, seed: int = 0) -> xmatch.MatchingModel:
    torch.manual_seed(seed)
    return xmatch.build(ENTRY[kind], **tiny_tower_overrides(kind)).eval()


def spec_toml(spec: dict, path: Path) -> Path:
    """A spec dict as a TOML file (None values left out: they are the builders' defaults)."""

    def plain(table: dict) -> dict:
        return {k: plain(v) if isinstance(v, dict) else v for k, v in table.items() if v is not None}

    path.write_text(tomli_w.dumps(plain(spec)), encoding="utf-8")
    return path


def saved_tiny(kind: str, root: Path, seed: int = 0) -> tuple[Path, xmatch.MatchingModel, Path, Path]:
    """A captioned photo folder and a tiny model of ``kind`` saved two ways: (folder, model,
    bundle folder, spec TOML whose weights are the bundle's model.safetensors)."""
    model = tiny(kind, seed)
    bundle = Path(xmatch.save_pretrained(model, root / "bundle"))
    return photo_folder(root / "photos"), model, bundle, spec_toml(model.spec, root / "tiny.toml")


def eval_cli(reference: str, folder: Path, out: Path, *options: str) -> dict:
    code = main(["eval", reference, "--dataset", "image-captions", "--data", str(folder), "--json", str(out), *options])
    assert code == 0
    return json.loads(out.read_text())


@pytest.mark.parametrize("kind", ["clip", "siglip"])
def test_zero_shot_eval_of_an_entry_prints_and_writes_the_python_evaluations_figures(kind, tmp_path, capsys):
    # the same model named two ways: a bundle, and the entry's spec with a weights file (ENTRY=WEIGHTS)
    folder, model, bundle, spec = saved_tiny(kind, tmp_path)
    references = [f"local-dir:{bundle}", f"{spec}={bundle / 'model.safetensors'}"]
    want = evaluate(xmatch.build(f"local-dir:{bundle}", pretrained=True).eval(),
                    open_dataset("image-captions", folder, split="test"), "full", progress=False)
    for k, reference in enumerate(references):
        got = eval_cli(reference, folder, tmp_path / f"r{k}.json")
        printed = capsys.readouterr().out
        assert got["protocol"] == "full"
        assert got["i2t"] == want.i2t and got["t2i"] == want.t2i and got["rsum"] == want.rsum
        assert want.table() in printed


def test_a_model_that_matches_the_pictures_scores_r1_100_and_shuffled_captions_do_not(tmp_path):
    model = tiny("clip", seed=1).train()
    planted = photo_folder(tmp_path / "photos")
    config = TrainConfig(epochs=15, batch_size=8, optimizer="adamw", lr=1e-3, warmup_steps=2, tensorboard=False)
    Trainer(model, open_dataset("image-captions", planted, split="train"), config, run_dir=tmp_path / "run",
            progress=False).fit()
    bundle = xmatch.save_pretrained(model.eval(), tmp_path / "bundle")
    matched = eval_cli(f"local-dir:{bundle}", planted, tmp_path / "matched.json")
    assert matched["i2t"]["r1"] == matched["t2i"]["r1"] == 100.0 and matched["rsum"] == 600.0
    shuffled = eval_cli(f"local-dir:{bundle}", photo_folder(tmp_path / "shuffled", shuffled=True), tmp_path / "s.json")
    assert shuffled["i2t"]["r1"] < 100.0 and shuffled["t2i"]["r1"] < 100.0


def test_pictures_with_different_caption_counts_are_refused_with_the_option_that_evaluates_them(tmp_path, capsys):
    folder = photo_folder(tmp_path / "photos")
    rows = (folder / "test.csv").read_text().splitlines()
    (folder / "test.csv").write_text("\n".join([*rows, "red-car.png,a red car again"]) + "\n")  # 3 captions for one
    bundle = xmatch.save_pretrained(tiny("clip"), tmp_path / "bundle")
    args = ["eval", f"local-dir:{bundle}", "--dataset", "image-captions", "--data", str(folder)]
    assert main(args) == 2
    assert "have 2 to 3. Evaluate the first N captions of each with --data-option captions_per_image=N (N at most 2" in capsys.readouterr().err
    assert main([*args, "--data-option", "captions_per_image=3"]) == 2
    err = capsys.readouterr().err
    assert "captions_per_image=3, but 3 images have fewer captions: red-square.png (2)" in err and "pass captions_per_image=2" in err
    got = eval_cli(f"local-dir:{bundle}", folder, tmp_path / "r.json", "--data-option", "captions_per_image=2")
    want = evaluate(tiny("clip"), open_dataset("image-captions", folder, split="test", captions_per_image=2), "full", progress=False)
    assert got["rsum"] == want.rsum


def test_captions_per_image_keeps_the_first_captions_of_each_picture_in_file_order(tmp_path):
    folder = photo_folder(tmp_path / "photos")
    header, *rows = (folder / "test.csv").read_text().splitlines()
    random.Random(0).shuffle(rows)
    (folder / "test.csv").write_text("\n".join([header, *rows]) + "\n")
    whole = open_dataset("image-captions", folder, split="test")
    first = open_dataset("image-captions", folder, split="test", captions_per_image=1)
    assert first.captions_per_image == 1 and first.num_images == whole.num_images == 4
    assert first.captions == [whole.captions[int(np.flatnonzero(whole.caption_image == i)[0])] for i in range(4)]
