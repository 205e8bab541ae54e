"""The `webdataset` dataset layout (issue 39, item 1): WebDataset tar shards as img2dataset writes
them (``KEY.png`` + ``KEY.txt`` + ``KEY.json``), named by a brace pattern, read in place. Samples
are named ``shard/key`` in shard then member order; a damaged member, a key with no picture or no
caption, a caption that is not UTF-8, a truncated tar and a key met in two shards are skipped and
listed, never a crash; every batch is split across processes without overlap; `xmatch train` and
`xmatch eval` run on shards as on the same pictures in a folder, and a stopped run resumes
exactly."""

from __future__ import annotations

import io
import json
import logging
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import xmatch
from xmatch.cli.main import main
from xmatch.data import DataError, DataFileNotFoundError, open_dataset
from xmatch.data.layouts import guess_layouts
from xmatch.data.webdataset import WebDataset, expand_shards
from xmatch.eval import evaluate
from xmatch.testing import one_torch_thread  # noqa: F401  (a fixture: one torch thread per test)
from xmatch.train import TrainConfig, Trainer
from xmatch.train.sampler import EpochBatches

from test_clip_eval_cli import COLOURS, tiny


def png(rgb: tuple[int, int, int], size: tuple[int, int] = (44, 36), square: bool = True) -> bytes:
    """A white picture with a coloured square (or a wide bar: a car), as PNG bytes."""
    picture = np.full((size[1], size[0], 3), 255, dtype=np.uint8)
    picture[6:30, 8 if square else 20 : 32 if square else 40] = rgb
    out = io.BytesIO()
    Image.fromarray(picture).save(out, "PNG")
    return out.getvalue()


def write_shard(path: Path, members: list[tuple[str, bytes]]) -> Path:
    """A tar of ``(member name, bytes)`` in this order, as img2dataset writes it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def sample(key: str, picture: bytes | None, caption: bytes | None, ext: str = "png") -> list[tuple[str, bytes]]:
    members = [(f"{key}.{ext}", picture)] if picture is not None else []
    members += [(f"{key}.txt", caption)] if caption is not None else []
    return [*members, (f"{key}.json", b'{"url": "https://example.org/%s"}' % key.encode())]


def four_pictures(root: Path) -> tuple[Path, list[tuple[str, bytes, str]]]:
    """The four pictures of test_clip_eval_cli's folder (a red or blue square or car), one
    caption each, two per shard: ``(shards folder, [(key, png, caption)])``."""
    items = [(f"{k:06d}", png(rgb, square=shape == "square"), f"a {colour} {shape}")
             for k, (colour, rgb, shape) in enumerate((c, rgb, s) for c, rgb in COLOURS.items() for s in ("square", "car"))]
    for shard in range(2):
        members = [m for key, data, caption in items[2 * shard : 2 * shard + 2] for m in sample(key, data, caption.encode())]
        write_shard(root / f"{shard:05d}.tar", members)
    return root, items


def unpacked(items: list[tuple[str, bytes, str]], folder: Path) -> Path:
    """The same pictures and captions as an image-captions folder (``test.csv``)."""
    folder.mkdir(parents=True, exist_ok=True)
    for key, data, _ in items:
        (folder / f"{key}.png").write_bytes(data)
    (folder / "test.csv").write_text("image,caption\n" + "".join(f"{k}.png,{c}\n" for k, _, c in items))
    return folder


PATTERN = "{00000..00001}.tar"


def test_samples_are_named_shard_slash_key_in_shard_then_member_order(tmp_path):
    shards, items = four_pictures(tmp_path / "shards")
    ds = open_dataset("webdataset", f"{shards}/{PATTERN}", split="train")
    assert isinstance(ds, WebDataset) and ds.left_out == []
    assert ds.image_names == ["00000/000000", "00000/000001", "00001/000002", "00001/000003"]
    assert ds.captions == [c for _, _, c in items] and ds.captions_per_image == 1
    assert np.array_equal(np.asarray(ds.image(2)), np.asarray(Image.open(io.BytesIO(items[2][1])).convert("RGB")))
    assert ds[3].text == "a blue car" and ds[3].image_index == 3
    alone = open_dataset("webdataset", f"{shards}/{PATTERN}", split="test", captions_per_image=0)
    assert alone.image_names == ds.image_names and alone.captions == []


def test_a_missing_shard_and_a_bad_pattern_are_named(tmp_path):
    shards, _ = four_pictures(tmp_path / "shards")
    with pytest.raises(DataFileNotFoundError, match=r"00002\}\.tar: 1 of its 3 shards do not exist: .*00002\.tar"):
        open_dataset("webdataset", f"{shards}/{{00000..00002}}.tar", split="train")
    with pytest.raises(DataError, match=r"not a shard pattern .*\{00000\.\.00099\}"):
        expand_shards(f"{shards}/{{00000..00001.tar")
    with pytest.raises(DataError, match=r"holds \{split\}; pass split="):
        expand_shards(f"{shards}/{{split}}-{{0..1}}.tar")
    with pytest.raises(DataFileNotFoundError, match="holds no .tar shards"):
        expand_shards(tmp_path)


def test_splits_come_from_a_split_placeholder_or_split_folders_and_folders_of_shards_are_recognised(tmp_path):
    shards, _ = four_pictures(tmp_path / "flat")
    (tmp_path / "by-split" / "train").mkdir(parents=True)
    (tmp_path / "by-split" / "val").mkdir()
    for name, split in (("00000.tar", "train"), ("00001.tar", "val")):
        (tmp_path / "named").mkdir(exist_ok=True)
        (tmp_path / "named" / f"{split}-0.tar").write_bytes((shards / name).read_bytes())
        (tmp_path / "by-split" / split / "0.tar").write_bytes((shards / name).read_bytes())
    placeholder = open_dataset("webdataset", tmp_path / "named" / "{split}-{0..0}.tar", split="val")
    folders = open_dataset("webdataset", tmp_path / "by-split", split="val")
    assert placeholder.captions == folders.captions == ["a blue square", "a blue car"]
    assert folders.image_names == ["0/000002", "0/000003"]
    assert open_dataset("webdataset", shards, split="train").num_images == 4  # a folder's own shards: split a label
    assert guess_layouts(shards) == guess_layouts(tmp_path / "by-split") == ["webdataset"]
    assert guess_layouts(f"{shards}/{PATTERN}") == guess_layouts(shards / "00000.tar") == ["webdataset"]


def test_damaged_members_are_skipped_and_listed_never_a_crash(tmp_path, caplog):
    good = png((220, 30, 30))
    write_shard(tmp_path / "s" / "00000.tar", [
        *sample("a", good, b"a red square"),
        *sample("broken", b"\x89PNG not really a picture", b"a broken picture"),
        *sample("silent", good, None),
        *sample("latin1", good, "un caf\xe9".encode("latin-1")),
        *sample("empty", good, b"  \n"),
        *sample("nopicture", None, b"a caption alone"),
        *sample("b", good, b"another red square", ext="jpg"),
    ])
    # a shard cut in the middle of its second picture: the sample before it is kept
    whole = write_shard(tmp_path / "s" / "00001.tar", [*sample("c", good, b"c"), *sample("cut", good * 4, b"cut")])
    data = whole.read_bytes()
    whole.write_bytes(data[: data.index(good * 4) + len(good)])
    # a shard whose second header is garbage
    garbage = write_shard(tmp_path / "s" / "00002.tar", [*sample("d", good, b"d"), *sample("lost", good, b"lost")])
    data = bytearray(garbage.read_bytes())
    second = data.index(b"lost.png")
    data[second : second + 512] = b"\x07" * 512
    garbage.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="xmatch.data.webdataset"):
        ds = open_dataset("webdataset", tmp_path / "s" / "{00000..00002}.tar", split="train")
    assert ds.image_names == ["00000/a", "00000/b", "00001/c", "00002/d"]
    why = dict(ds.left_out)
    assert set(why) == {"00000/broken", "00000/silent", "00000/latin1", "00000/empty", "00000/nopicture", "00001/cut", "00002"}
    assert "00000/broken" in why["00000/broken"] and "not a readable image" in why["00000/broken"]
    assert why["00000/silent"] == "no caption (a KEY.txt member)"
    assert "latin1.txt is not UTF-8" in why["00000/latin1"] and "empty.txt is empty" in why["00000/empty"]
    assert why["00000/nopicture"].startswith("no picture")
    assert "cut short" in why["00001/cut"] and "truncated" in why["00001/cut"]
    assert "00002.tar is damaged after member d.json" in why["00002"] and "rest of the shard is not read" in why["00002"]
    assert all(f"left out {where}" in caplog.text for where in why)
    # the pictures alone (an index needs no captions): the uncaptioned ones come back
    alone = open_dataset("webdataset", tmp_path / "s" / "{00000..00002}.tar", split="train", captions_per_image=0)
    assert alone.image_names == ["00000/a", "00000/silent", "00000/latin1", "00000/empty", "00000/b", "00001/c", "00002/d"]


def test_a_key_in_two_shards_keeps_the_first_and_lists_the_second(tmp_path):
    write_shard(tmp_path / "00000.tar", [*sample("k1", png((220, 30, 30)), b"first"), *sample("k2", png((30, 30, 220)), b"two")])
    write_shard(tmp_path / "00001.tar", [*sample("k1", png((30, 220, 30)), b"again"), *sample("k3", png((9, 9, 9)), b"three")])
    ds = open_dataset("webdataset", tmp_path / "{00000..00001}.tar", split="train")
    assert ds.image_names == ["00000/k1", "00000/k2", "00001/k3"] and ds.captions == ["first", "two", "three"]
    assert ds.left_out == [("00001/k1", "the key k1 was met in shard 00000, whose sample is kept; this one is left out")]


def test_ranks_split_every_batch_of_shards_without_overlap_and_the_order_is_the_same_for_any_world(tmp_path):
    shards = tmp_path / "shards"
    for s in range(3):
        write_shard(shards / f"{s:05d}.tar", [m for k in range(5) for m in sample(f"{s}-{k}", png((k * 40, s * 80, 9)), b"x")])
    ds = open_dataset("webdataset", f"{shards}/{{00000..00002}}.tar", split="train")
    for world in (2, 3):
        ranks = [EpochBatches(len(ds), 6, seed=4, rank=r, world_size=world) for r in range(world)]
        for b, shares in enumerate(zip(*(r.epoch(1) for r in ranks), strict=True)):
            items = [ds.image_names[ds[k].image_index] for share in shares for k in share]
            assert len(items) == len(set(items)), f"batch {b}: a sample on two processes"
            whole = list(EpochBatches(len(ds), 6, seed=4).epoch(1))[b]
            assert sorted(k for share in shares for k in share) == sorted(whole)  # one process's batch, shared out
        assert sum(len(k) for r in ranks for batch in r.epoch(1) for k in [batch]) == len(ds)


def test_train_and_eval_on_shards_give_the_image_captions_figures(tmp_path):
    shards, items = four_pictures(tmp_path / "shards")
    folder = unpacked(items, tmp_path / "folder")
    pattern = f"{shards}/{PATTERN}"
    bundle = xmatch.save_pretrained(tiny("clip"), tmp_path / "bundle")
    out = tmp_path / "eval.json"
    assert main(["eval", f"local-dir:{bundle}", "--dataset", "webdataset", "--data", pattern, "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    want = evaluate(tiny("clip"), open_dataset("image-captions", folder, split="test"), "full", progress=False)
    assert got["rsum"] == want.rsum and got["i2t"]["r1"] == want.i2t["r1"]
    assert main(["train", f"local-dir:{bundle}", "--recipe", "clip-finetune", "--dataset", "webdataset", "--data", pattern,
                 "--val-split", "", "--set", "epochs=1", "--set", "batch_size=2", "--set", "tensorboard=false",
                 "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    assert (tmp_path / "run" / "final" / "model.safetensors").is_file()


def test_a_stopped_run_on_shards_resumes_to_the_weights_of_an_uninterrupted_run(tmp_path):
    shards, _ = four_pictures(tmp_path / "shards")
    train = open_dataset("webdataset", f"{shards}/{PATTERN}", split="train")
    config = TrainConfig(epochs=1, batch_size=2, optimizer="adamw", lr=1e-3, tensorboard=False)
    whole = tiny("clip").train()
    Trainer(whole, train, config, run_dir=tmp_path / "whole", progress=False).fit()
    Trainer(tiny("clip").train(), train, config.merged({"max_steps": 1}), run_dir=tmp_path / "stopped", progress=False).fit()
    resumed = tiny("clip", seed=7).train()  # other initial weights: the checkpoint's win
    Trainer(resumed, train, config, run_dir=tmp_path / "stopped", resume=True, progress=False).fit()
    for (name, a), b in zip(whole.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
