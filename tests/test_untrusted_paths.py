"""Names and paths from data files, and decoded-pixel budgets (issue 29).

A captions file, a Karpathy split file or a COCO annotation file comes from elsewhere: its
split names and ids become output file names, its image paths are read. Whatever it says,
nothing is written outside ``--out``, nothing is read outside the image folder (unless
``allow_outside_root``), no layout is silently shifted by a newline or a NaN id, and a small
file declaring a huge picture is never decoded.
"""

from __future__ import annotations

import csv
import io
import json
import os
import struct
import subprocess
import sys
import textwrap
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from xmatch.cli.main import main as cli
from xmatch.core.errors import XmatchError
from xmatch.components.image.backbone import to_pil
from xmatch.data import ImageCaptionsDataset, PrecompDataset, TeranDataset
from xmatch.data.errors import DataError
from xmatch.extract import extract
from xmatch.extract.captions import CaptionsError
from xmatch.extract.run import ExtractError
from xmatch.io.pictures import ImageTooLargeError
from xmatch.regions import RegionPipeline, read_manifest
from xmatch.regions.images import load_image

from test_extract import CLI_PIPE, PIPE, files_of, make_photos

ROOT = Path(__file__).resolve().parents[1]


def write_captions(path: Path, rows: list[tuple[str, str, str]]) -> Path:
    """A captions CSV of ``(image, caption, split)`` rows, 5 captions per row."""
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["image", "caption", "split"])
        for image, caption, split in rows:
            for k in range(5):
                writer.writerow([image, f"{caption} {k}", split])
    return path


def karpathy(path: Path, entries: list[dict]) -> Path:
    images = [{"split": "test", "filepath": "", "sentences": [{"raw": f"caption {k}"} for k in range(5)], **e} for e in entries]
    path.write_text(json.dumps({"images": images}))
    return path


def huge_png(path: Path, width: int = 12000, height: int = 12000) -> Path:
    """A 1-bit grey PNG of ``width x height`` black pixels: a few KB on disk, 432 MB as RGB."""
    row = b"\x00" + bytes((width + 7) // 8)
    packer = zlib.compressobj(9)
    data = b"".join(packer.compress(row) for _ in range(height)) + packer.flush()

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", data) + chunk(b"IEND", b""))
    return path


def all_files(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*")}


@pytest.fixture()
def photos(tmp_path: Path) -> Path:
    return make_photos(tmp_path / "photos", captions=False)


# -- writes outside --out -------------------------------------------------------------------


@pytest.mark.parametrize("split", ["../../x", "/abs/x", "..", "a\\b", "C:x"])
def test_a_split_that_is_a_path_is_refused_before_anything_is_written(photos, tmp_path, split):
    split = split.replace("/abs", str(tmp_path / "abs"))
    before = all_files(tmp_path)
    captions = write_captions(tmp_path / "caps.csv", [("photos/a.png", "a", "train"), ("photos/b.jpg", "b", split)])
    with pytest.raises(CaptionsError, match=rf"caps.csv:7: the split '.*' is not a plain name"):
        extract(photos, tmp_path / "deep" / "er" / "out", PIPE, layout="precomp", captions=captions, workers=0, progress=False)
    assert all_files(tmp_path) == before | {"caps.csv"}


def test_split_names_and_ids_from_every_source_are_plain_names(photos, tmp_path):
    with pytest.raises(CaptionsError, match=r"--split\): the split '../up' is not a plain name"):
        extract(photos, tmp_path / "out", PIPE, split="../up", workers=0, progress=False)
    k = karpathy(tmp_path / "k.json", [{"filename": "a.png", "imgid": 1, "split": "../../x"}])
    with pytest.raises(CaptionsError, match=r"k.json: image entry 0: the split '../../x' is not a plain name"):
        extract(photos, tmp_path / "out", PIPE, captions=k, workers=0, progress=False)
    k = karpathy(tmp_path / "k.json", [{"filename": "a.png", "imgid": 1}, {"filename": "b.jpg", "imgid": "../../evil"}])
    with pytest.raises(CaptionsError, match=r"k.json: image entry 1: the id '../../evil' is not a plain name"):
        extract(photos, tmp_path / "out", PIPE, captions=k, workers=0, progress=False)
    coco = tmp_path / "coco.json"
    coco.write_text(json.dumps({"images": [{"id": "/etc/x", "file_name": "a.png"}],
                                "annotations": [{"image_id": "/etc/x", "caption": "a"}]}))
    with pytest.raises(CaptionsError, match=r"coco.json: images\[0\] \(id '/etc/x'\): the id '/etc/x' is not a plain name"):
        extract(photos, tmp_path / "out", PIPE, captions=coco, workers=0, progress=False)
    assert not (tmp_path / "out").exists()


# -- silent corruption of a layout ------------------------------------------------------------


@pytest.mark.parametrize(("imgid", "message"), [
    (float("nan"), "the id nan is not an integer"), (float("inf"), "the id inf is not an integer"),
    (7.5, r"the id 7.5 is not an integer"), (True, "the id True is not an integer"),
    (10**300, r"the id '1000000000.*'... is longer than a file name can be"),
])
def test_ids_that_cannot_name_a_file_are_refused_naming_the_entry(photos, tmp_path, imgid, message):
    k = karpathy(tmp_path / "k.json", [{"filename": "a.png", "imgid": 0}, {"filename": "b.jpg", "imgid": imgid}])
    with pytest.raises(CaptionsError, match=rf"k.json: image entry 1: {message}"):
        extract(photos, tmp_path / "out", PIPE, captions=k, workers=0, progress=False)
    assert not (tmp_path / "out").exists()


def test_an_integral_float_id_names_the_same_file_in_the_writer_and_the_reader(photos, tmp_path):
    k = karpathy(tmp_path / "k.json", [{"filename": "a.png", "imgid": 7.0}, {"filename": "b.jpg", "imgid": 8}])
    extract(photos, tmp_path / "out", PIPE, captions=k, workers=0, progress=False)
    assert sorted(os.listdir(tmp_path / "out" / "bu_att")) == ["7.npz", "8.npz"]
    assert TeranDataset(tmp_path / "out", "test").image_names == ["7", "8"]


def test_a_newline_in_an_image_name_is_refused_not_written(photos, tmp_path):
    (photos / "a\nb.png").write_bytes((photos / "a.png").read_bytes())
    captions = write_captions(tmp_path / "caps.csv", [("photos/a.png", "a", "test"), ("photos/a\nb.png", "ab", "test")])
    with pytest.raises(CaptionsError, match=r"caps.csv:8: the image path 'photos/a\\nb.png' holds the control character '\\n'"):
        extract(photos, tmp_path / "out", PIPE, layout="precomp", captions=captions, workers=0, progress=False)
    # found in the folder, without a captions file
    with pytest.raises(CaptionsError, match=r"image 'a\\nb.png': the file name 'a\\nb.png' holds the control character"):
        extract(photos, tmp_path / "out", PIPE, workers=0, progress=False)
    k = karpathy(tmp_path / "k.json", [{"filename": "a.png\u2028", "imgid": 0}])
    with pytest.raises(CaptionsError, match=r"k.json: image entry 0: the filename .* holds the control character '\\u2028'"):
        extract(photos, tmp_path / "out", PIPE, captions=k, workers=0, progress=False)
    assert not (tmp_path / "out").exists()


# -- reads outside the image folder ----------------------------------------------------------


def test_paths_outside_the_image_folder_are_refused_unless_allowed(photos, tmp_path):
    secret = tmp_path / "secret.png"
    Image.new("RGB", (40, 30), "red").save(secret)
    cases = {
        "dotdot": karpathy(tmp_path / "k1.json", [{"filename": "a.png", "imgid": 0}, {"filepath": "..", "filename": "secret.png", "imgid": 1}]),
        "absolute": karpathy(tmp_path / "k2.json", [{"filename": "a.png", "imgid": 0}, {"filename": str(secret), "imgid": 1}]),
        "csv": write_captions(tmp_path / "caps.csv", [("photos/a.png", "a", "test"), ("secret.png", "s", "test")]),
    }
    where = {"dotdot": r"k1.json: image entry 1", "absolute": r"k2.json: image entry 1", "csv": r"caps.csv:7"}
    for name, captions in cases.items():
        with pytest.raises(CaptionsError, match=rf"{where[name]}: .*secret.png resolves to {secret}, outside the folder {photos} .*allow-outside-root"):
            extract(photos, tmp_path / name, PIPE, captions=captions, workers=0, progress=False)
        assert not (tmp_path / name).exists()
        result = extract(photos, tmp_path / name, PIPE, captions=captions, workers=0, progress=False, allow_outside_root=True)
        assert result.images == 2


def test_a_symbolic_link_out_of_the_folder_is_refused(photos, tmp_path):
    secret = tmp_path / "secret.png"
    Image.new("RGB", (40, 30), "red").save(secret)
    (photos / "link.png").symlink_to(secret)
    (photos / "inside.png").symlink_to(photos / "b.jpg")  # a link that stays inside is fine
    with pytest.raises(CaptionsError, match=rf"image 'link.png': .*link.png resolves to {secret}, outside the folder"):
        extract(photos, tmp_path / "out", PIPE, workers=0, progress=False)
    captions = write_captions(photos / "captions.csv", [("a.png", "a", "test"), ("link.png", "l", "test")])
    with pytest.raises(CaptionsError, match=r"captions.csv:7: .*link.png resolves to .*secret.png, outside"):
        extract(photos, tmp_path / "out", PIPE, workers=0, progress=False)
    write_captions(captions, [("a.png", "a", "test"), ("inside.png", "i", "test")])
    assert extract(photos, tmp_path / "out", PIPE, workers=0, progress=False).images == 2


def test_the_cli_refuses_and_allows_outside_paths(photos, tmp_path, capsys):
    Image.new("RGB", (40, 30), "red").save(tmp_path / "secret.png")
    captions = write_captions(tmp_path / "caps.csv", [("photos/a.png", "a", "test"), ("secret.png", "s", "test")])
    argv = ["extract", str(photos), "--out", str(tmp_path / "out"), "--captions", str(captions), "--workers", "0", *CLI_PIPE]
    assert cli(argv) == 2
    assert "caps.csv:7: " in capsys.readouterr().err and not (tmp_path / "out").exists()
    assert cli([*argv, "--allow-outside-root"]) == 0


# -- the dataset readers ------------------------------------------------------------------------


def test_image_captions_reads_only_inside_its_folder(tmp_path):
    folder = make_photos(tmp_path / "photos", captions=False)
    Image.new("RGB", (40, 30)).save(tmp_path / "secret.png")
    (folder / "link.png").symlink_to(tmp_path / "secret.png")
    for image, line in (("../secret.png", 3), (str(tmp_path / "secret.png"), 3), ("link.png", 3)):
        (folder / "captions.csv").write_text(f"image,caption\na.png,a dog\n{image},a secret\n")
        with pytest.raises(DataError, match=rf"captions.csv:{line}: .* resolves to .*secret.png, outside the folder .*allow_outside_root=True"):
            ImageCaptionsDataset(folder / "captions.csv")
        ds = ImageCaptionsDataset(folder / "captions.csv", allow_outside_root=True)
        assert ds.image(1).size == (40, 30)
    (folder / "captions.csv").write_text("image,caption\na.png,a dog\na\x1bb.png,a cat\n")
    with pytest.raises(DataError, match=r"captions.csv:3: the image path 'a\\x1bb.png' holds the control character '\\x1b'"):
        ImageCaptionsDataset(folder / "captions.csv")


def test_image_captions_refuses_a_picture_over_its_budget_undecoded(tmp_path):
    huge_png(tmp_path / "huge.png", 300, 200)
    (tmp_path / "captions.csv").write_text("image,caption\nhuge.png,a black picture\n")
    with pytest.raises(ImageTooLargeError, match=r"huge.png is 300x200 = 0.06 megapixels, over the budget of 0.05 megapixels; .*max_pixels=60000"):
        ImageCaptionsDataset(tmp_path / "captions.csv", max_pixels=50_000).image(0)
    assert ImageCaptionsDataset(tmp_path / "captions.csv").image(0).size == (300, 200)


def teran_folder(root: Path, entries: list[dict]) -> Path:
    for d in ("bu_att", "bu_box"):
        (root / d).mkdir(parents=True, exist_ok=True)
    for e in entries:
        key = e["imgid"]
        if isinstance(key, int):
            np.savez(root / "bu_att" / f"{key}.npz", feat=np.ones((2, 4), np.float32))
            np.save(root / "bu_box" / f"{key}.npy", np.float32([[0, 0, 4, 4], [1, 1, 2, 2]]))
    karpathy(root / "dataset_xmatch.json", [{"width": 8, "height": 8, **e} for e in entries])
    return root


@pytest.mark.parametrize(("imgid", "message"), [
    ("../../bu_box/0", r"image entry 1: the id '../../bu_box/0' is not a plain name"),
    (float("nan"), r"image entry 1: the id nan is not an integer"),
])
def test_teran_ids_name_files_inside_its_folders(tmp_path, imgid, message):
    root = teran_folder(tmp_path / "feats", [{"filename": "a.png", "imgid": 0}, {"filename": "b.png", "imgid": imgid}])
    with pytest.raises(DataError, match=rf"dataset_xmatch.json: {message}"):
        TeranDataset(root, "test")


def test_teran_image_sizes_are_read_inside_the_image_folder(tmp_path):
    photos = make_photos(tmp_path / "photos", captions=False)
    Image.new("RGB", (40, 30)).save(tmp_path / "secret.png")
    root = teran_folder(tmp_path / "feats", [{"filename": "a.png", "imgid": 0}, {"filepath": "..", "filename": "secret.png", "imgid": 1}])
    doc = json.loads((root / "dataset_xmatch.json").read_text())
    for im in doc["images"]:
        del im["width"], im["height"]
    (root / "dataset_xmatch.json").write_text(json.dumps(doc))
    with pytest.raises(DataError, match=r"dataset_xmatch.json: image entry 1: .*secret.png resolves to .*, outside the folder"):
        TeranDataset(root, "test", images=photos)
    assert TeranDataset(root, "test", images=photos, allow_outside_root=True).image_size(1) == (40.0, 30.0)


# -- decoded-pixel budgets ------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")
def test_huge_pictures_are_refused_before_they_are_decoded(tmp_path):
    path = huge_png(tmp_path / "huge.png")
    assert path.stat().st_size < 100_000
    with pytest.raises(ImageTooLargeError, match=r"huge.png is 12000x12000 = 144 megapixels, over the budget of 50 .*--max-pixels 144000000"):
        load_image(path)
    with pytest.raises(ImageTooLargeError, match=r"image 2: .*huge.png is 12000x12000"):
        to_pil(path, 2)
    with Image.open(path) as lazy, pytest.raises(ImageTooLargeError, match=r"image 0 is 12000x12000"):
        to_pil(lazy)
    with pytest.raises(ImageTooLargeError, match="over the budget"):
        RegionPipeline.from_table(PIPE).regions_of([path])
    bomb = huge_png(tmp_path / "bomb.png", 20000, 10000)  # over Pillow's own limit: refused when opened
    with pytest.raises(ValueError, match=r"image 0: .*bomb.png is not a readable image: Image size \(200000000 pixels\) exceeds"):
        to_pil(bomb)
    assert to_pil(Image.new("RGB", (64, 48))).size == (64, 48)  # a picture in memory is already decoded
    wide = huge_png(tmp_path / "wide.png", 300, 200)
    assert load_image(wide, max_pixels=60_000).size == (300, 200)
    with pytest.raises(ImageTooLargeError):
        load_image(wide, max_pixels=59_999)


READERS = textwrap.dedent("""
    import json, resource, sys
    from pathlib import Path
    from PIL import Image
    from xmatch.components.image.backbone import to_pil
    from xmatch.data import ImageCaptionsDataset
    from xmatch.io.pictures import ImageTooLargeError
    from xmatch.regions.images import load_image

    folder = Path(sys.argv[1])
    load_image(folder / "a.png")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    refused = 0
    for attempt in (lambda: load_image(folder / "huge.png"), lambda: to_pil(folder / "huge.png"),
                    lambda: to_pil(Image.open(folder / "huge.png")),
                    lambda: ImageCaptionsDataset(folder / "captions.csv").image(0)):
        try:
            attempt()
        except ImageTooLargeError:
            refused += 1
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    print(json.dumps({"grown_kb": grown, "refused": refused}))
""")


def measure(script: str, *args: Path) -> dict:
    """Run ``script`` in a fresh Python (its peak RSS is its own) and return its JSON report."""
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", script, *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_picture_readers_stay_small_on_a_huge_picture(tmp_path):
    """A 12000 x 12000 PNG of a few KB would take 432 MB decoded to RGB; every reader refuses
    it from its header, and the process's peak memory does not move."""
    folder = make_photos(tmp_path / "photos", captions=False)
    huge_png(folder / "huge.png")
    (folder / "captions.csv").write_text("image,caption\nhuge.png,a black picture\n")
    report = measure(READERS, folder)
    assert report["refused"] == 4 and report["grown_kb"] < 50_000, report


MEASURE = textwrap.dedent("""
    import json, resource, sys
    from pathlib import Path
    from PIL import Image
    from xmatch.extract import extract
    from xmatch.regions.images import load_image

    folder, out = Path(sys.argv[1]), Path(sys.argv[2])
    pipe = {"proposer": {"name": "windows", "regions": 6}, "roi": {"backbone": "test_efficientnet", "weights": "random", "image_size": 64}}
    load_image(folder / "a.png")
    extract(folder, out / "warm", pipe, workers=0, progress=False, captions=folder / "warm.csv")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = extract(folder, out / "run", pipe, workers=0, progress=False)
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    print(json.dumps({"grown_kb": grown, "images": result.images, "left_out": result.unreadable}))
""")


@pytest.mark.slow
def test_extract_leaves_a_huge_picture_out_with_low_memory(tmp_path):
    """The whole extraction on a folder with the 12000 x 12000 PNG: listed as left out, and the
    process grows by far less than the 432 MB its RGB decoding would take."""
    folder = make_photos(tmp_path / "photos", captions=False)
    huge_png(folder / "huge.png")
    (folder / "warm.csv").write_text("image,caption\na.png,a picture\n")
    report = measure(MEASURE, folder, tmp_path)
    assert report["images"] == 6 and [name for name, _ in report["left_out"]] == ["huge.png"]
    assert "huge.png is 12000x12000 = 144 megapixels, over the budget of 50 megapixels" in report["left_out"][0][1]
    assert report["grown_kb"] < 100_000, report


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")
def test_extract_lists_a_picture_over_the_budget_and_records_the_budget(tmp_path):
    folder = make_photos(tmp_path / "photos", captions=False)
    huge_png(folder / "huge.png")
    result = extract(folder, tmp_path / "out", PIPE, workers=1, progress=False)
    assert result.images == 6 and [name for name, _ in result.unreadable] == ["huge.png"]
    assert "huge.png is 12000x12000 = 144 megapixels, over the budget of 50 megapixels; it was not decoded" in result.unreadable[0][1]
    assert "6 images" in result.summary() and "1 left out (unreadable or too large)" in result.summary()
    assert read_manifest(tmp_path / "out")["pixels"] == {"max": 50_000_000, "max_batch": 100_000_000}
    with pytest.raises(ExtractError, match=r"other settings \(pixels.max: 50000000 -> 144000000\)"):
        extract(folder, tmp_path / "out", PIPE, workers=0, progress=False, max_pixels=144_000_000, resume=True)
    assert extract(folder, tmp_path / "out", PIPE, workers=0, progress=False, resume=True).extracted == 0
    with pytest.raises(ValueError, match="max_pixels and max_batch_pixels must be at least 1"):
        extract(folder, tmp_path / "o", PIPE, max_pixels=0)


def test_a_batch_over_the_pixel_budget_runs_in_parts(tmp_path, monkeypatch):
    """A proposer that looks at pixels keeps a chunk's pictures: a chunk over the batch budget
    runs in parts cut by the header sizes, the same parts (and bytes) on every run."""
    folder = make_photos(tmp_path / "photos", captions=False)
    batches: list[list[tuple[int, int]]] = []
    real = RegionPipeline.forward

    def recording(self, prepared):
        batches.append([(p.width, p.height) for p in prepared])
        assert all(p.picture is not None for p in prepared)
        return real(self, prepared)

    monkeypatch.setattr(RegionPipeline, "forward", recording)

    def run(out: str, **budget) -> dict[str, bytes]:
        pipe = RegionPipeline.from_table(PIPE)
        pipe.proposer.needs_pixels = True  # as a detector: the loader keeps whole pictures
        extract(folder, tmp_path / out, pipe, batch_size=3, workers=1, progress=False, **budget)
        return files_of(tmp_path / out)

    whole = run("whole")
    assert [len(b) for b in batches] == [3, 3]
    batches.clear()
    # pictures in id order: a 64x48, b 50x70, d 90x40 | e 33x33, f 64x48, sub/c 64x48
    parts = run("parts", max_batch_pixels=7000)
    assert batches == [[(64, 48), (50, 70)], [(90, 40)], [(33, 33), (64, 48)], [(64, 48)]]
    assert parts.keys() == whole.keys()
    batches.clear()
    assert run("again", max_batch_pixels=7000) == parts and len(batches) == 4


# -- hostile files: an XmatchError naming the file, never another exception ----------------------


def test_hostile_caption_and_feature_files_give_errors_naming_them(tmp_path):
    photos = make_photos(tmp_path / "photos", captions=False)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(CaptionsError, match=r"deep.json is not a readable JSON file: maximum recursion depth"):
        extract(photos, tmp_path / "out", PIPE, captions=deep, progress=False)
    lines = tmp_path / "big.jsonl"
    lines.write_text('{"image": "a.png", "caption": "x", "n": ' + "1" * 5000 + "}\n")
    with pytest.raises(DataError, match=r"big.jsonl:1: not a JSON object: Exceeds the limit"):
        ImageCaptionsDataset(lines)
    lines.write_text("[" * 100_000 + "\n")
    with pytest.raises(DataError, match=r"big.jsonl:1: not a JSON object: maximum recursion depth"):
        ImageCaptionsDataset(lines)
    root = teran_folder(tmp_path / "feats", [{"filename": "a.png", "imgid": 1}])
    (root / "dataset_xmatch.json").rename(tmp_path / "good.json")
    (root / "dataset_xmatch.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(DataError, match=r"dataset_xmatch.json is not valid JSON: maximum recursion depth"):
        TeranDataset(root, "test")
    (tmp_path / "good.json").replace(root / "dataset_xmatch.json")
    archive = bytearray((root / "bu_att" / "1.npz").read_bytes())
    for signature, offset in ((b"PK\x03\x04", 8), (b"PK\x01\x02", 10)):  # an unknown compression method
        at = archive.find(signature) + offset
        archive[at : at + 2] = (99).to_bytes(2, "little")
    (root / "bu_att" / "1.npz").write_bytes(bytes(archive))
    with pytest.raises(DataError, match=r"1.npz is not a readable .npz archive: NotImplementedError"):
        TeranDataset(root, "test")


def test_precomp_sizes_must_be_real_numbers(tmp_path):
    np.save(tmp_path / "test_ims.npy", np.ones((1, 2, 3), np.float32))
    (tmp_path / "test_caps.txt").write_text("a caption\n" * 5)
    np.save(tmp_path / "test_boxes.npy", np.zeros((1, 2, 4), np.float32))
    np.save(tmp_path / "test_img_sizes.npy", np.ones((1, 2), np.complex64))
    with pytest.raises(DataError, match=r"test_img_sizes.npy must be a real numeric array \[1, 2\]"):
        PrecompDataset(tmp_path, "test")


def npy_declaring(shape: tuple[int, ...]) -> bytes:
    """A ``.npy`` header declaring ``shape`` float32, followed by 64 bytes of data."""
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": "<f4", "fortran_order": False, "shape": shape})
    return buffer.getvalue() + bytes(64)


def test_arrays_declaring_more_than_their_file_holds_are_refused_unallocated(tmp_path):
    np.save(tmp_path / "test_ims.npy", np.ones((1, 2, 3), np.float32))
    (tmp_path / "test_caps.txt").write_text("a caption\n" * 5)
    np.save(tmp_path / "test_boxes.npy", np.zeros((1, 2, 4), np.float32))
    (tmp_path / "test_img_sizes.npy").write_bytes(npy_declaring((10**6, 10**6)))  # 4 TB, read whole
    with pytest.raises(DataError, match=r"test_img_sizes.npy: the header declares a float32 array of shape \(1000000, 1000000\) "
                                        r"\(4,000,000,000,000 bytes\) but the file holds 64 bytes"):
        PrecompDataset(tmp_path, "test")
    header = npy_declaring((1, 2, 4))
    (tmp_path / "test_img_sizes.npy").write_bytes(header.replace(b"}", b"|"))
    with pytest.raises(DataError, match=r"test_img_sizes.npy is not a readable .npy array: the .npy header is not a valid"):
        PrecompDataset(tmp_path, "test")
    np.save(tmp_path / "test_img_sizes.npy", np.full((1, 2), 8.0))
    np.save(tmp_path / "test_boxes.npy", np.zeros((1, 2, 4)).astype(str))
    with pytest.raises(DataError, match=r"test_boxes.npy must be \[rows, regions, 4\] = \(1, 2, 4\) numbers .*got <U32"):
        PrecompDataset(tmp_path, "test")
    root = teran_folder(tmp_path / "feats", [{"filename": "a.png", "imgid": 1}])
    with zipfile.ZipFile(root / "bu_att" / "1.npz", "w") as archive:
        archive.writestr("feat.npy", npy_declaring((10**6, 10**6)))
    with pytest.raises(DataError, match=r"1.npz: the header declares a float32 array of shape \(1000000, 1000000\)"):
        TeranDataset(root, "test")


def test_a_missing_image_is_an_xmatch_error_that_is_a_file_not_found_error(tmp_path):
    photos = make_photos(tmp_path / "photos", captions=False)
    captions = write_captions(tmp_path / "caps.csv", [("photos/a.png", "a", "test"), ("photos/gone.png", "g", "test")])
    with pytest.raises(XmatchError, match=r"caps.csv names 1 image files that do not exist: .*gone.png") as caught:
        extract(photos, tmp_path / "out", PIPE, captions=captions, progress=False)
    assert isinstance(caught.value, FileNotFoundError)


def test_a_missing_picture_or_folder_is_an_xmatch_error_naming_it(tmp_path):
    from xmatch.core.errors import XmatchError
    from xmatch.regions.images import find_images, load_image

    for call, name in ((lambda: load_image(tmp_path / "gone.jpg"), "gone.jpg"), (lambda: find_images(tmp_path / "nowhere"), "nowhere")):
        with pytest.raises(XmatchError, match=name) as info:
            call()
        assert isinstance(info.value, FileNotFoundError)  # callers catching FileNotFoundError still do
