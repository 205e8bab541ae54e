"""`xmatch extract` and `xmatch index --images` from WebDataset shards (issue 39, item 1): the
pictures are read from the tars in place, in shard then member order; the region features are
byte for byte those of the same pictures unpacked into a folder under the same ids; a damaged
member is left out and listed, a key met in a second shard is left out and logged; an
interrupted extraction resumes to the same files; an index of shards names its hits
``shard/key``."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import xmatch
from xmatch.cli.main import main
from xmatch.data import open_dataset
from xmatch.extract import extract
from xmatch.extract.captions import CaptionsError, read_records
from xmatch.regions import read_manifest
from xmatch.testing import one_torch_thread  # noqa: F401  (a fixture: one torch thread per test)

from conftest import tiny_spec
from test_extract import CLI_PIPE, PIPE, extract_killed_at_the_second_chunk, files_of
from test_webdataset_layout import sample, write_shard

SIZES = [(64, 48), (50, 70), (90, 40), (33, 33), (64, 48), (48, 64)]


def picture(k: int, size: tuple[int, int], kind: str = "PNG") -> bytes:
    out = io.BytesIO()
    rng = np.random.default_rng(k)
    Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(out, kind)
    return out.getvalue()


def shards_and_folder(root: Path) -> tuple[str, Path]:
    """Six pictures with a caption each, three per shard, and the same pictures unpacked into
    a folder whose Karpathy file gives them the shards' keys as ids: ``(pattern, folder)``."""
    items = [(f"{k:06d}", picture(k, size, "JPEG" if k == 1 else "PNG"), f"picture {k}") for k, size in enumerate(SIZES)]
    folder = root / "folder"
    folder.mkdir(parents=True)
    entries = []
    for k, (key, data, caption) in enumerate(items):
        ext = "jpg" if k == 1 else "png"
        (folder / f"{key}.{ext}").write_bytes(data)
        entries.append({"split": "test", "imgid": key, "filename": f"{key}.{ext}", "sentences": [{"raw": caption}]})
    (folder / "dataset_unpacked.json").write_text(json.dumps({"images": entries}))
    for shard in range(2):
        write_shard(root / "shards" / f"{shard:05d}.tar", [
            m for k, (key, data, caption) in enumerate(items[3 * shard : 3 * shard + 3], 3 * shard)
            for m in sample(key, data, caption.encode(), "jpg" if k == 1 else "png")])
    return f"{root / 'shards'}/{{00000..00001}}.tar", folder


def features(out: Path) -> dict[str, bytes]:
    return {name: data for name, data in files_of(out).items() if name.startswith(("bu_att/", "bu_box/"))}


def test_records_follow_the_shards_and_their_members(tmp_path):
    pattern, _ = shards_and_folder(tmp_path)
    records, source = read_records(pattern, None, "train")
    assert [(r.key, r.name, r.split, r.captions) for r in records[:4]] == [
        ("000000", "00000/000000", "train", ["picture 0"]), ("000001", "00000/000001", "train", ["picture 1"]),
        ("000002", "00000/000002", "train", ["picture 2"]), ("000003", "00001/000003", "train", ["picture 3"])]
    assert source.startswith(f"WebDataset shards {pattern} (2 shards")
    with pytest.raises(CaptionsError, match="carry their captions"):
        read_records(pattern, tmp_path / "captions.csv", "train")


def test_extracting_shards_gives_the_bytes_of_the_same_pictures_in_a_folder(tmp_path):
    pattern, folder = shards_and_folder(tmp_path)
    from_shards = extract(pattern, tmp_path / "a", PIPE, batch_size=4, workers=0, progress=False)
    from_folder = extract(folder, tmp_path / "b", PIPE, batch_size=4, workers=0, progress=False)
    assert from_shards.images == from_folder.images == 6 and from_shards.unreadable == []
    ours = features(tmp_path / "a")
    assert len(ours) == 12 and ours == features(tmp_path / "b")
    test = open_dataset("teran", tmp_path / "a", split="test", captions_per_image=0)
    assert test.image_names[:2] == ["00000/000000", "00000/000001"]  # hits of an index of them name shard/key


def test_a_damaged_member_is_left_out_and_listed_and_a_repeated_key_is_logged(tmp_path, caplog):
    good = picture(0, (40, 30))
    write_shard(tmp_path / "s" / "00000.tar", [*sample("a", good, b"a"), *sample("bad", b"\x89PNG garbage", b"bad"),
                                             *sample("b", good, b"b")])
    write_shard(tmp_path / "s" / "00001.tar", [*sample("a", picture(1, (40, 30)), b"a again"), *sample("c", good, b"c")])
    with caplog.at_level(logging.WARNING, logger="xmatch.extract.captions"):
        result = extract(tmp_path / "s" / "{00000..00001}.tar", tmp_path / "out", PIPE, workers=0, progress=False)
    assert result.images == 3 and [name for name, _ in result.unreadable] == ["00000/bad"]
    assert "00000/bad (" in result.unreadable[0][1] and "not a readable image" in result.unreadable[0][1]
    assert read_manifest(tmp_path / "out")["unreadable"][0][0] == "00000/bad"
    assert "00001/a: the key a was met in shard 00000, whose sample is kept" in caplog.text
    first_only = extract(tmp_path / "s" / "00000.tar", tmp_path / "first", PIPE, workers=0, progress=False)
    assert first_only.images == 2 and features(tmp_path / "out")["bu_att/a.npz"] == features(tmp_path / "first")["bu_att/a.npz"]


def test_an_interrupted_extraction_of_shards_resumes_to_the_same_files(tmp_path, monkeypatch):
    pattern, _ = shards_and_folder(tmp_path)
    clean = tmp_path / "clean"
    extract(pattern, clean, PIPE, batch_size=2, workers=0, progress=False)
    extract_killed_at_the_second_chunk(pattern, tmp_path / "crashed", monkeypatch)
    result = extract(pattern, tmp_path / "crashed", PIPE, batch_size=2, workers=0, progress=False, resume=True)
    assert (result.extracted, result.skipped) == (4, 2)
    assert files_of(tmp_path / "crashed") == files_of(clean)


def test_the_command_line_extracts_a_shard_pattern(tmp_path, capsys):
    pattern, _ = shards_and_folder(tmp_path)
    assert main(["extract", pattern, "--out", str(tmp_path / "out"), *CLI_PIPE]) == 0
    assert "6 images (test 6)" in capsys.readouterr().out


def test_an_index_of_shards_names_its_hits_shard_slash_key(tmp_path, fixture_bert):
    pytest.importorskip("faiss")
    from xmatch.index import create
    from xmatch.index.photos import index_images

    from test_index_pictures_folder import SMALL

    pattern, folder = shards_and_folder(tmp_path)
    write_shard(tmp_path / "shards" / "00002.tar", [*sample("broken", b"GIF89a nothing", b"x")])
    torch.manual_seed(0)
    model = xmatch.build(tiny_spec(fixture_bert, image_encoder=SMALL)).eval()
    index = create(tmp_path / "idx", model)
    pattern = pattern.replace("00001}", "00002}")
    added, skipped = index_images(index, pattern, batch_size=4, shard_size=4, progress=False)
    assert added == 6 and index.ids[:4] == ["00000/000000", "00000/000001", "00000/000002", "00001/000003"]
    assert [name for name, _ in skipped] == ["00002/broken"] and index.pictures is None
    again, _ = index_images(index, pattern, progress=False, resume=True)
    assert again == 0
    unpacked = create(tmp_path / "idx2", model)
    index_images(unpacked, folder, batch_size=4, shard_size=4, progress=False)
    names = [f"{k:06d}.{'jpg' if k == 1 else 'png'}" for k in range(6)]
    assert torch.equal(index.get(index.ids).tokens, unpacked.get(names).tokens)  # the same pictures, the same vectors
    assert set(index.search_texts(["picture"], k=3)[0].ids) <= set(index.ids)
