"""The TERAN / TERN bottom-up feature layout (Messina et al., "Transformer Reasoning Network for
Image-Text Matching and Retrieval", ICPR 2020; "Fine-grained Visual Textual Alignment for
Cross-Modal Retrieval using Transformer Encoders", ACM TOMM 2021; mesnico/TERAN ``data.py``).

Per image, ``bu_att/<id>.npz`` (array ``feat``, ``[R, 2048]`` bottom-up features, used as
stored) and ``bu_box/<id>.npy`` (``[R, 4]`` pixel boxes x1, y1, x2, y2). Boxes are divided
by ``[W, H, W, H]`` of the image in float64 and cast to float32, as the original
``BottomUpFeaturesDataset.__getitem__`` does. Captions and splits come from either

- the original COCO set-up: caption annotations ``captions_{train,val}2014.json`` plus the
  VSE++ id files ``coco_{train,dev,test,restval}_ids.npy`` (annotation ids, 5 per image);
  image sizes are the annotations' ``width`` / ``height``, as in ``CocoDataset.get_raw_item``;
- a Karpathy split file (``dataset_coco.json``, ``dataset_flickr30k.json``) with the ``raw``
  sentences of each image (``FlickrDataset``); sizes then come from the file's own image
  entries when they record ``width`` / ``height`` (a dataset of your own), else from a sizes
  file (TERAN's ``sizes.pkl``, or a JSON) or from the image files' headers -- given explicitly.

``captions_per_image=0`` reads a split's images alone, without captions: what a search index of
the images needs (``xmatch index MODEL --data FOLDER``), e.g. of a folder ``xmatch extract``
made from pictures that have no captions. Training and evaluation refuse images without captions.
"""

from __future__ import annotations

import os
import zipfile
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from xmatch.data._io import (
    check_boxes,
    check_npz_member,
    check_regions,
    check_text_name,
    first_few,
    inside_root,
    integer_id,
    load_ids,
    load_json,
    load_npy,
    load_plain_pickle,
    normalize_pixel_boxes,
    plain_id,
    require_dir,
    require_file,
)
from xmatch.data.base import ImageTextDataset, check_index
from xmatch.data.errors import DataError, DataFileNotFoundError, NoCaptionsError
from xmatch.data.items import RegionImage

SPLITS = ("train", "val", "test")
# dataset_xmatch.json: the Karpathy-style file `xmatch extract` writes beside its features
KARPATHY_FILES = ("dataset_coco.json", "dataset_flickr30k.json", "dataset_flickr8k.json", "dataset_xmatch.json")
#: the original's COCO files per split (``data.py:get_paths``); val/test images are in val2014
COCO_ID_FILES = {"train": "coco_train_ids.npy", "val": "coco_dev_ids.npy", "test": "coco_test_ids.npy"}
COCO_RESTVAL_IDS = "coco_restval_ids.npy"
COCO_CAPTION_FILES = {
    "train": "captions_train2014.json",
    "val": "captions_val2014.json",
    "test": "captions_val2014.json",
}

PathArg = str | os.PathLike


class TeranDataset(ImageTextDataset):
    """Bottom-up region features per image file (``bu_att`` / ``bu_box``) with COCO or
    Karpathy captions, read one image file at a time.

    Args:
        root: the dataset folder, e.g. ``data/coco`` (features in ``root`` or
            ``root/features_36``; caption files in ``root/annotations`` or ``root``).
        split: ``"train"``, ``"val"`` or ``"test"`` (COCO test = the 5K Karpathy test split;
            the 1K folds are the evaluation's business).
        captions: the caption file(s), COCO annotations or one Karpathy split file. Default:
            ``coco_<split>_ids.npy`` found in ``root/annotations`` or ``root`` selects the
            original COCO set-up with ``captions_train2014.json`` (train) or
            ``captions_val2014.json`` (val, test; also for restval) beside it; otherwise the one
            ``dataset_{coco,flickr30k,flickr8k}.json`` found there.
        ids: COCO set-up only: the annotation id file of the split (``.npy`` or text, one id a
            line). Default: ``coco_{train,dev,test}_ids.npy`` beside the caption file.
        features: the folder holding ``bu_att`` and ``bu_box`` (default: found as above).
        sizes: Karpathy set-up: file(s) with the image sizes: TERAN's ``sizes.pkl`` (a list
            of (width, height) in the order of the Karpathy file's images), COCO annotation
            JSONs (their ``images`` width / height by COCO id), a Karpathy-style JSON whose
            images have ``width`` / ``height``, or a JSON ``{"<id>": [w, h]}``. Without
            ``sizes`` and ``images``, the ``width`` / ``height`` of the caption file's own image
            entries are used when every image of the split has them.
        images: Karpathy set-up, instead of ``sizes``: the image folder; sizes are read from
            each image's header (``<images>/<filepath>/<filename>``) when the image is loaded.
            Each path must resolve (symbolic links followed) inside the folder.
        allow_outside_root: accept ``images`` paths of the Karpathy file that resolve outside
            the folder (absolute, ``..``, links out of it), for a file you trust.
        restval: add the ``restval`` images to ``train`` (after the train images, as the
            original does for COCO); no effect on val / test.
        captions_per_image: keep the first N captions of each image (the original's COCO id
            files keep Karpathy's first 5, dropping the 6th / 7th caption of a few COCO images);
            an image with fewer is an error. None keeps every caption. 0 reads the images
            alone, captions or not (an image search index needs no captions): the dataset has
            no captions and no training pairs, and each image is named by its picture's path
            (``filepath/filename`` of the Karpathy file: ``trip/beach.jpg``) where the file
            records one for every image, else by its id.
        max_images: keep the first N images (the original validates on the first 1,000 COCO
            val images).

    Raises:
        DataFileNotFoundError: a folder, caption, id, size or feature file is missing.
        NoCaptionsError: images without captions (unless ``captions_per_image=0``).
        DataError: a malformed file, an unknown split, a missing image size, too few or empty
            captions, an id that is not an integer or a plain name (ids name the feature
            files), an image path outside ``images``; at load time a corrupt feature / box
            file, NaN features, a width mismatch, a box count that differs from the region
            count, boxes outside the image.

    Example:
        >>> ds = TeranDataset("data/coco", "test")  # needs the COCO features on disk  # doctest: +SKIP
        >>> ds.num_images, ds.captions_per_image, ds.size_source  # doctest: +SKIP
        (5000, 5, 'COCO annotations data/coco/annotations/captions_val2014.json')
        >>> img = ds.image(0); img.regions.shape, img.boxes.max() <= 1  # doctest: +SKIP
        ((36, 2048), True)
        >>> photos = TeranDataset("feats", "test", captions_per_image=0)  # xmatch extract photos/ --out feats  # doctest: +SKIP
        >>> photos.image_names[:2], len(photos.captions)  # doctest: +SKIP
        (['beach.jpg', 'trip/cat.png'], 0)
    """

    def __init__(
        self,
        root: PathArg,
        split: str,
        *,
        captions: PathArg | Sequence[PathArg] | None = None,
        ids: PathArg | None = None,
        features: PathArg | None = None,
        sizes: PathArg | Sequence[PathArg] | None = None,
        images: PathArg | None = None,
        restval: bool = False,
        captions_per_image: int | None = 5,
        max_images: int | None = None,
        allow_outside_root: bool = False,
    ) -> None:
        self.root = require_dir(Path(root), "teran dataset root")
        if split not in SPLITS:
            alias = {"dev": "val", "testall": "test"}.get(split)
            hint = f" (the precomp layout's {split!r} is {alias!r} here)" if alias else ""
            raise DataError(f"unknown split {split!r} for the teran layout; splits: {', '.join(SPLITS)}{hint}.")
        if captions_per_image is not None and captions_per_image < 0:
            raise ValueError(
                f"captions_per_image must be at least 1, None (every caption) or 0 (the images alone), got {captions_per_image}."
            )
        if max_images is not None and max_images < 1:
            raise ValueError(f"max_images must be at least 1 or None, got {max_images}.")
        self.split = split
        self.restval = restval
        features_root = self._features_root(features)
        self._att = require_dir(features_root / "bu_att", "teran region features")
        self._box = require_dir(features_root / "bu_box", "teran boxes")

        caption_files, id_file = self._caption_sources(captions, ids)
        docs = [(path, load_json(path, "teran captions")) for path in caption_files]
        kinds = {path: _caption_format(doc, path) for path, doc in docs}
        self._image_files: list[Path] | None = None
        pictures: list[str] | None = None
        if set(kinds.values()) == {"coco"}:
            if sizes is not None or images is not None:
                raise DataError(
                    "with COCO caption annotations the image sizes are the annotations' width / height; "
                    "remove sizes= / images=."
                )
            entries, self._sizes = self._read_coco(docs, id_file, captions_per_image, max_images)
            self.size_source = "COCO annotations " + ", ".join(str(p) for p in caption_files)
        elif set(kinds.values()) == {"karpathy"} and len(docs) == 1:
            if id_file is not None:
                raise DataError(
                    f"ids= applies to COCO caption annotations, not to the Karpathy file {caption_files[0]}."
                )
            entries, positions = self._read_karpathy(*docs[0], captions_per_image, max_images)
            self._sizes, self._image_files, self.size_source = _karpathy_sizes(
                docs[0][1]["images"], positions, [key for key, _ in entries], sizes, images, self.root, caption_files[0],
                allow_outside_root,
            )
            if captions_per_image == 0:
                pictures = _picture_names(docs[0][1]["images"], positions)
        else:
            raise DataError(
                "captions= takes COCO caption annotation files or one Karpathy split file, got "
                + ", ".join(f"{p} ({k})" for p, k in kinds.items())
                + "."
            )

        # the ids name the feature files (and the captions' images); read alone, the images are
        # named by their pictures where the caption file records them, so a search hit names the file
        self._keys = [key for key, _ in entries]
        self._check_feature_files(self._keys)
        texts = [c for _, caps in entries for c in caps]
        owner = np.repeat(np.arange(len(entries)), [len(caps) for _, caps in entries])
        self._set_index(texts, owner, pictures or self._keys, images_only=captions_per_image == 0)
        reference = self._att / f"{self._keys[0]}.npz"
        first = self._load_features(reference)
        if first.ndim != 2:
            raise DataError(f"{reference}: 'feat' must be [regions, features], got shape {first.shape}.")
        self._feature_reference = str(reference)
        self.feature_dim = int(first.shape[1])

    # -- construction -------------------------------------------------------------------

    def _features_root(self, features: PathArg | None) -> Path:
        if features is not None:
            return require_dir(Path(features), "teran features")
        for candidate in (self.root, self.root / "features_36"):
            if (candidate / "bu_att").is_dir():
                return candidate
        raise DataFileNotFoundError(
            f"teran region features: neither {self.root / 'bu_att'} nor {self.root / 'features_36' / 'bu_att'} "
            "exists; pass features=<folder holding bu_att and bu_box>."
        )

    def _caption_sources(
        self, captions: PathArg | Sequence[PathArg] | None, ids: PathArg | None
    ) -> tuple[list[Path], Path | None]:
        """Caption files and, for COCO annotations, the id file of the split."""
        folders = (self.root / "annotations", self.root)
        if captions is None:
            for folder in folders:
                id_file = folder / COCO_ID_FILES[self.split]
                if id_file.is_file():
                    names = [COCO_CAPTION_FILES[self.split]]
                    if self.restval and self.split == "train":
                        names.append(COCO_CAPTION_FILES["val"])
                    return [folder / n for n in names], Path(ids) if ids is not None else id_file
            found = [folder / n for folder in folders for n in KARPATHY_FILES if (folder / n).is_file()]
            if len(found) > 1:
                raise DataError(
                    f"several Karpathy split files: {', '.join(map(str, found))}; pass captions=<one of them>."
                )
            if not found:
                looked = [f / COCO_ID_FILES[self.split] for f in folders]
                looked += [f / n for f in folders for n in KARPATHY_FILES]
                raise DataFileNotFoundError(
                    f"teran captions: none of {', '.join(map(str, looked))} exists; pass captions=<caption file(s)>."
                )
            return found, Path(ids) if ids is not None else None
        files = [Path(captions)] if isinstance(captions, (str, os.PathLike)) else [Path(c) for c in captions]
        if not files:
            raise DataError("captions= is an empty list; give at least one caption file.")
        for f in files:
            require_file(f, "teran captions")
        return files, Path(ids) if ids is not None else None

    def _read_coco(
        self,
        docs: list[tuple[Path, Any]],
        id_file: Path | None,
        captions_per_image: int | None,
        max_images: int | None,
    ) -> tuple[list[tuple[str, list[str]]], np.ndarray]:
        anns: dict[int, tuple[int, str]] = {}
        sizes: dict[int, tuple[Any, Any]] = {}
        for path, doc in docs:
            try:
                for pos, a in enumerate(doc["annotations"]):
                    where = f"teran captions: {path}: annotations[{pos}]"
                    anns[integer_id(a["id"], where)] = (integer_id(a["image_id"], where), a["caption"])
                for pos, im in enumerate(doc["images"]):
                    sizes[integer_id(im["id"], f"teran captions: {path}: images[{pos}]")] = (im.get("width"), im.get("height"))
            except (KeyError, TypeError) as exc:
                raise DataError(
                    f"teran captions: {path} is not a COCO caption annotation file (images with id / width / "
                    f"height, annotations with id / image_id / caption): {exc!r}"
                ) from None
        if id_file is None:
            id_file = docs[0][0].parent / COCO_ID_FILES[self.split]
        files = [id_file]
        if self.restval and self.split == "train":
            files.append(id_file.parent / COCO_RESTVAL_IDS)
        grouped: dict[int, list[str]] = {}
        for f in files:
            for ann_id in load_ids(f, "teran COCO annotation ids").tolist():
                if ann_id not in anns:
                    raise DataError(
                        f"{f} lists annotation id {ann_id}, which is in none of "
                        f"{', '.join(str(p) for p, _ in docs)} (restval ids need captions_val2014.json)."
                    )
                image_id, caption = anns[ann_id]
                grouped.setdefault(image_id, []).append(caption)
        where = ", ".join(str(f) for f in files)
        if not grouped:
            raise DataError(f"{where} lists no annotation ids; the {self.split} split would be empty.")
        labelled = [(str(k), caps, f"COCO image {k} (ids {where})") for k, caps in grouped.items()]
        entries = _select(labelled, captions_per_image, max_images, self.root)
        out = np.empty((len(entries), 2), dtype=np.float64)
        for i, (key, _) in enumerate(entries):
            w, h = sizes.get(int(key), (None, None))
            if not isinstance(w, (int, float)) or not isinstance(h, (int, float)):
                raise DataError(
                    f"COCO image {key} has no width / height in {', '.join(str(p) for p, _ in docs)}; "
                    "the boxes cannot be normalised without the image size."
                )
            out[i] = (w, h)
        return entries, out

    def _read_karpathy(
        self, path: Path, doc: Any, captions_per_image: int | None, max_images: int | None
    ) -> tuple[list[tuple[str, list[str]]], list[int]]:
        wanted = [self.split] + (["restval"] if self.restval and self.split == "train" else [])
        if not all(isinstance(im, dict) for im in doc["images"]):
            raise DataError(f"{path}: every entry of 'images' must be an object.")
        present = sorted({str(im.get("split")) for im in doc["images"]})
        chosen: list[tuple[int, Any]] = []
        for name in wanted:
            part = [(pos, im) for pos, im in enumerate(doc["images"]) if im.get("split") == name]
            if not part:
                raise DataError(
                    f"{path} has no images of split {name!r} (splits present: {', '.join(present)})"
                    + ("; restval exists only in the COCO Karpathy file." if name == "restval" else ".")
                )
            chosen += part
        raw = []
        for pos, im in chosen:
            key = im.get("cocoid", im.get("imgid"))
            if key is None or not isinstance(im.get("sentences"), list):
                raise DataError(f"{path}: image entry {pos} has no 'cocoid' / 'imgid' or no 'sentences' list.")
            try:
                caps = [s["raw"] for s in im["sentences"]]
            except (KeyError, TypeError):
                raise DataError(f"{path}: a sentence of image entry {pos} (id {key}) has no 'raw' text.") from None
            raw.append((plain_id(key, f"{path}: image entry {pos}"), caps, f"image {key} (entry {pos}) of {path}"))
        entries = _select(raw, captions_per_image, max_images, self.root)
        return entries, [pos for pos, _ in chosen[: len(entries)]]

    def _check_feature_files(self, names: list[str]) -> None:
        for folder, suffix in ((self._att, ".npz"), (self._box, ".npy")):
            present = set(os.listdir(folder))
            missing = [str(folder / f"{n}{suffix}") for n in names if f"{n}{suffix}" not in present]
            if missing:
                raise DataFileNotFoundError(
                    f"teran layout: {len(missing)} of {len(names)} {self.split} images have no file in {folder}: "
                    f"missing {first_few(missing)}."
                )

    # -- items --------------------------------------------------------------------------

    def _load_features(self, path: Path) -> np.ndarray:
        try:
            archive = np.load(path, allow_pickle=False)
            if not isinstance(archive, np.lib.npyio.NpzFile):
                raise DataError(f"{path} is a plain .npy array, expected an .npz archive with the array 'feat'.")
            with archive:
                if "feat" not in archive.files:
                    raise DataError(f"{path} has no array 'feat' (arrays: {', '.join(archive.files) or 'none'}).")
                check_npz_member(archive, "feat", str(path))
                return archive["feat"]
        except FileNotFoundError:
            raise DataFileNotFoundError(f"teran region features: file {path} does not exist.") from None
        except DataError:
            raise
        except (OSError, ValueError, EOFError, RuntimeError, zipfile.BadZipFile, zlib.error) as exc:
            # RuntimeError: an encrypted member; NotImplementedError (one): an unknown compression
            raise DataError(f"{path} is not a readable .npz archive: {exc!r}") from None

    def image_size(self, index: int) -> tuple[float, float]:
        """``(width, height)`` in pixels of image ``index`` (what its boxes are divided by)."""
        i = check_index(index, self.num_images, "image")
        if self._image_files is None:
            w, h = self._sizes[i]
            return float(w), float(h)
        from PIL import Image

        path = self._image_files[i]
        try:
            with Image.open(path) as im:
                return float(im.size[0]), float(im.size[1])
        except FileNotFoundError:
            raise DataFileNotFoundError(f"teran images (for image sizes): file {path} does not exist.") from None
        except (OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError) as exc:  # a broken header
            raise DataError(f"{path} is not a readable image (needed for its size): {exc!r}") from None

    def image(self, index: int) -> RegionImage:
        """Regions ``[R, F]`` and boxes ``[R, 4]`` (normalised to [0, 1]) of image ``index``."""
        i = check_index(index, self.num_images, "image")
        name = self._keys[i]
        feat_path, box_path = self._att / f"{name}.npz", self._box / f"{name}.npy"
        regions = self._load_features(feat_path)
        regions = check_regions(regions, str(feat_path), self.feature_dim, self._feature_reference)
        boxes = check_boxes(load_npy(box_path, "teran boxes", mmap=False), str(box_path), len(regions))
        return RegionImage(regions, normalize_pixel_boxes(boxes, self.image_size(i), str(box_path), self.size_source))

    def feature_files(self) -> list[Path]:
        """The files the split's images are read from, image by image: the region features,
        the boxes and, when the sizes come from the pictures' headers, the picture."""
        pictures = self._image_files or [None] * self.num_images
        return [path for name, picture in zip(self._keys, pictures)
                for path in (self._att / f"{name}.npz", self._box / f"{name}.npy", picture) if path is not None]


def _karpathy_sizes(
    images_meta: list[Any],
    positions: list[int],
    keys: list[str],
    sizes: PathArg | Sequence[PathArg] | None,
    images: PathArg | None,
    root: Path,
    caption_file: Path,
    allow_outside_root: bool = False,
) -> tuple[np.ndarray, list[Path] | None, str]:
    """Image sizes for a Karpathy split file: ``(sizes [N, 2], image files or None, source)``;
    with ``images`` the sizes are NaN and read from each file's header at load time. Without
    ``sizes`` / ``images``, the ``width`` / ``height`` of the file's image entries."""
    out = np.full((len(keys), 2), np.nan)
    if sizes is not None and images is not None:
        raise DataError("pass either sizes= (a sizes file) or images= (read sizes from the images), not both.")
    if images is not None:
        folder = require_dir(Path(images), "teran images (for image sizes)")
        files = []
        for p in positions:
            where = f"{caption_file}: image entry {p}"
            filepath, filename = images_meta[p].get("filepath") or "", images_meta[p].get("filename")
            rel = Path(check_text_name(filepath, where, "filepath") if filepath else "") / check_text_name(
                filename, where, "filename")
            files.append(inside_root(folder / rel, folder, where, allow_outside=allow_outside_root))
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise DataFileNotFoundError(
                f"teran images (for image sizes): {len(missing)} image files are missing: {first_few(missing)}."
            )
        return out, files, f"image headers in {folder}"
    if sizes is None:
        recorded = [_width_height(images_meta[p]) for p in positions]
        missing = [key for key, size in zip(keys, recorded, strict=True) if size is None]
        if not missing:
            return np.asarray(recorded, dtype=np.float64), None, f"width / height of the images in {caption_file}"
        if len(missing) < len(keys):
            raise DataError(
                f"{caption_file}: {len(missing)} of the {len(keys)} images of the split have no numeric 'width' and "
                f"'height' (ids {first_few(missing)}); add them, or pass sizes= / images= for every image."
            )
        cached = root / "images" / "sizes.pkl"
        found = f" ({cached} exists: TERAN's cache, pass sizes={cached})" if cached.is_file() else ""
        raise DataError(
            "the teran layout needs each image's width and height to normalise the pixel boxes, and the "
            f"images of {caption_file} have no 'width' / 'height': add them to its image entries, or pass "
            "sizes=<TERAN sizes.pkl, COCO captions_*2014.json, or a JSON {id: [w, h]}> or images=<image folder> "
            f"(sizes from the image headers){found}."
        )
    files = [Path(sizes)] if isinstance(sizes, (str, os.PathLike)) else [Path(s) for s in sizes]
    by_key: dict[str, Any] = {}
    by_position: list[Any] = []
    for f in files:
        if f.suffix == ".pkl":
            table = load_plain_pickle(f, "teran image sizes")
            if not isinstance(table, (list, tuple)):
                raise DataError(
                    f"teran image sizes: {f} must hold a list of (width, height), got {type(table).__name__}."
                )
            by_position = list(table)
            continue
        doc = load_json(f, "teran image sizes")
        if isinstance(doc, dict) and isinstance(doc.get("images"), list):
            # COCO annotations key images by "id", Karpathy files by "cocoid" or "imgid"
            by_key.update({
                str(im.get("id", im.get("cocoid", im.get("imgid")))): (im.get("width"), im.get("height"))
                for im in doc["images"] if isinstance(im, dict)
            })
        elif isinstance(doc, dict):
            by_key.update({str(k): v for k, v in doc.items()})
        else:
            raise DataError(f"teran image sizes: {f} must be a COCO annotation file or a JSON object {{id: [w, h]}}.")
    for i, (key, pos) in enumerate(zip(keys, positions, strict=True)):
        size = by_key.get(key, by_position[pos] if pos < len(by_position) else None)
        try:
            w, h = (float(v) for v in size)
        except (TypeError, ValueError):
            raise DataError(
                f"no image size (width, height) for image {key} (position {pos} in the Karpathy file) in "
                f"{', '.join(map(str, files))}; got {size!r}."
            ) from None
        out[i] = (w, h)
    return out, None, "sizes file " + ", ".join(map(str, files))


def _picture_names(images_meta: list[Any], positions: list[int]) -> list[str] | None:
    """``filepath/filename`` of each chosen image entry (POSIX, as ``xmatch index --images``
    names pictures), or None unless every entry has a filename and the paths are distinct."""
    names = []
    for p in positions:
        filepath, filename = images_meta[p].get("filepath") or "", images_meta[p].get("filename")
        if not isinstance(filename, str) or not filename or not isinstance(filepath, str):
            return None
        names.append(f"{filepath.strip('/')}/{filename}" if filepath.strip("/") else filename)
    return names if len(set(names)) == len(names) else None


def _width_height(entry: Any) -> tuple[float, float] | None:
    """An image entry's numeric, positive ``(width, height)``, or None."""
    w, h = entry.get("width"), entry.get("height")
    ok = all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in (w, h))
    return (float(w), float(h)) if ok else None


def _caption_format(doc: Any, path: Path) -> str:
    if isinstance(doc, dict) and isinstance(doc.get("images"), list):
        if isinstance(doc.get("annotations"), list):
            return "coco"
        if all(isinstance(im, dict) and "split" in im for im in doc["images"][:10]):
            return "karpathy"
    raise DataError(
        f"teran captions: {path} is neither a COCO caption annotation file ('images' and 'annotations') "
        "nor a Karpathy split file ('images' with 'split' and 'sentences')."
    )


def _select(
    images: list[tuple[str, list[str], str]], captions_per_image: int | None, max_images: int | None, root: Path
) -> list[tuple[str, list[str]]]:
    """Keep the first ``max_images`` images and the first ``captions_per_image`` captions of each
    (0: none, whatever the images have); ``root``, the dataset folder, for the messages."""
    images = images[:max_images]
    if captions_per_image == 0:
        return [(key, []) for key, _, _ in images]
    bare = [where for _, caps, where in images if not caps]
    if bare:
        raise NoCaptionsError(
            f"{len(bare)} of the {len(images)} images have no captions (first: {bare[0]}). Training and evaluation "
            f"need captions for every image: give them when extracting (xmatch extract PICTURES --out {root} --captions "
            "FILE) or add them to the caption file. To search these images by text, index them without captions "
            f"(xmatch index MODEL --data {root} --out INDEX; in Python captions_per_image=0 reads the images alone).",
            len(bare), len(images),
        )
    out = []
    for key, caps, where in images:
        if any(not isinstance(c, str) or not c.strip() for c in caps):
            raise DataError(f"{where} has an empty caption.")
        if captions_per_image is not None:
            if len(caps) < captions_per_image:
                raise DataError(
                    f"{where} has {len(caps)} captions, fewer than captions_per_image={captions_per_image}; "
                    "pass captions_per_image=None to keep every caption."
                )
            caps = caps[:captions_per_image]
        out.append((key, caps))
    return out
