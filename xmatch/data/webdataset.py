"""WebDataset shards: the tar files img2dataset writes and open_clip trains from, read in place.

A shard is an uncompressed tar; the members of one sample are adjacent and share a key (the
member name up to the first dot of its file name, as the ``webdataset`` package cuts it):
``KEY.jpg`` / ``.jpeg`` / ``.png`` / ``.webp`` the picture, ``KEY.txt`` its caption (UTF-8),
``KEY.json`` its metadata. Shards are named by a brace pattern (``shards/{00000..00099}.tar``,
expanded by ``braceexpand``, the ``webdataset`` package's own dependency), one ``.tar`` file or a
folder of them.

Each shard is streamed once, in shard order then member order, without unpacking: the scan keeps
the byte range of every picture (:class:`~xmatch.io.archive.ArchiveMember`), reads the captions
and each picture's header, so a picture is read later by its offset, in any process. A sample is
named ``shard/key``, ``shard`` being the tar's path relative to the shards' common folder without
``.tar`` (``00000`` for ``shards/00000.tar``): hits and messages name it so.

Bad input is skipped and listed, never a crash and never a silent drop (:attr:`ShardScan.left_out`):
a damaged or truncated tar (the members before the damage are kept), a picture Pillow cannot
identify or over the pixel budget, a key with no picture, with no caption or a caption that is
not UTF-8 (where captions are needed), a name that cannot be an id. Keys are the samples'
identity (img2dataset makes them unique across shards): a key met again, in the same shard or a
later one, is left out and listed; the first one is kept.
"""

from __future__ import annotations

import logging
import os
import re
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from xmatch.data._io import first_few, plain_path
from xmatch.data.base import ImageTextDataset, check_index
from xmatch.data.errors import DataError, DataFileNotFoundError, NoCaptionsError
from xmatch.io.archive import ArchiveMember
from xmatch.io.pictures import MAX_PIXELS, ImageTooLargeError, check_pixels, unreadable_reason

if TYPE_CHECKING:
    from PIL.Image import Image

logger = logging.getLogger(__name__)

#: member extensions read as the sample's picture (lower case; the first one met is kept)
PICTURE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")
CAPTION_EXTENSION = "txt"
METADATA_EXTENSION = "json"
#: how a shard's path is told apart from a folder of pictures
SHARD_SUFFIX = ".tar"
#: the placeholder of a pattern that holds every split's shards
SPLIT_FIELD = "{split}"
#: webdataset's cut of a member name: the key is everything up to the first dot of the file name
_KEY_EXT = re.compile(r"^((?:.*/|)[^./]+)\.([^/]*)$")
BLOCK = 512  # a tar block: the archive ends in zero blocks


def is_shard_spec(spec: str | os.PathLike) -> bool:
    """Whether ``spec`` names WebDataset shards rather than a folder of pictures: a brace
    pattern, or a path ending in ``.tar``.

    Example:
        >>> is_shard_spec("shards/{00000..00009}.tar"), is_shard_spec("photos")
        (True, False)
    """
    text = os.fspath(spec)
    return text.endswith(SHARD_SUFFIX) or ("{" in text and "}" in text)


def names_shards(spec: str | os.PathLike) -> bool:
    """Whether ``spec``, given where a picture folder may be (``xmatch extract``, ``xmatch index
    --images``), names WebDataset shards: a pattern, a ``.tar`` file, or a folder with ``.tar``
    files at its top and no picture (a folder of pictures stays one).

    Example:
        >>> Path("photos").mkdir(); names_shards("photos"), names_shards("shards/{0..3}.tar")
        (False, True)
    """
    from xmatch.regions.images import find_images

    root = Path(os.path.expanduser(os.fspath(spec)))
    if root.is_dir():  # a folder is one of pictures unless it holds shards and no picture, whatever its name
        return any(root.glob(f"*{SHARD_SUFFIX}")) and not find_images(root)
    return is_shard_spec(spec)


def expand_shards(spec: str | os.PathLike, split: str | None = None) -> list[Path]:
    """The shard files ``spec`` names, in order.

    Args:
        spec: a brace pattern (``shards/{00000..00099}.tar``, ``shards/{a,b}.tar``; ``{split}``
            stands for ``split``), one ``.tar`` file, or a folder: its ``<split>/*.tar`` when
            that sub-folder exists, else its own ``*.tar`` (sorted by name).
        split: what ``{split}`` stands for.

    Raises:
        DataFileNotFoundError: a shard the pattern names does not exist (the pattern and the
            missing shards named), or a folder without ``.tar`` files.
        DataError: a pattern with unbalanced braces, or ``{split}`` without a split.

    Example:
        >>> import tarfile
        >>> Path("shards").mkdir()
        >>> for k in range(3):
        ...     tarfile.open(f"shards/{k:05d}.tar", "w").close()
        >>> [p.name for p in expand_shards("shards/{00000..00002}.tar")]
        ['00000.tar', '00001.tar', '00002.tar']
        >>> expand_shards("shards/{00000..00003}.tar")
        Traceback (most recent call last):
        ...
        xmatch.data.errors.DataFileNotFoundError: shards/{00000..00003}.tar: 1 of its 4 shards do not exist: shards/00003.tar. ...
    """
    text = os.path.expanduser(os.fspath(spec))
    if SPLIT_FIELD in text:
        if split is None:
            raise DataError(f"{text}: the pattern holds {SPLIT_FIELD}; pass split= (--split) to say which split's shards to read.")
        text = text.replace(SPLIT_FIELD, split)
    folder = Path(text)
    if folder.is_dir():
        home = folder / split if split is not None and (folder / split).is_dir() else folder
        shards = sorted(home.glob(f"*{SHARD_SUFFIX}"))
        if not shards:
            raise DataFileNotFoundError(f"webdataset: {home} holds no {SHARD_SUFFIX} shards; name them with a pattern such as "
                                        f"'{home}/{{00000..00099}}.tar'.")
        return shards
    names = _braces(text) if "{" in text or "}" in text else [text]
    shards = [Path(n) for n in dict.fromkeys(names)]  # a shard named twice is read once
    missing = [str(p) for p in shards if not p.is_file()]
    if missing:
        raise DataFileNotFoundError(
            f"{text}: {len(missing)} of its {len(shards)} shards do not exist: {first_few(missing)}. Check the pattern "
            "(braces as the shell's: {00000..00099} keeps the zeros) and that every shard was written."
        )
    return shards


def _braces(pattern: str) -> list[str]:
    """``pattern`` expanded as ``braceexpand`` (hence ``webdataset``) expands it."""
    try:
        from braceexpand import UnbalancedBracesError, braceexpand
    except ImportError:
        raise ImportError(
            f"{pattern}: expanding a shard pattern needs the braceexpand package: pip install 'xmatch-zoo[webdataset]'."
        ) from None
    try:
        return list(braceexpand(pattern))
    except UnbalancedBracesError as exc:
        raise DataError(f"{pattern}: not a shard pattern ({exc}); write ranges as {{00000..00099}}, choices as {{a,b}}.") from None


def shard_names(shards: list[Path]) -> list[str]:
    """The name of each shard in ids and messages: its path relative to the shards' common
    folder, POSIX-style, without ``.tar``.

    Example:
        >>> shard_names([Path("cc3m/00000.tar"), Path("cc3m/00001.tar")])
        ['00000', '00001']
        >>> shard_names([Path("laion/a/0.tar"), Path("laion/b/0.tar")])
        ['a/0', 'b/0']
    """
    folders = [os.path.abspath(p.parent) for p in shards]
    common = os.path.commonpath(folders) if folders else ""
    names = []
    for p in shards:
        rel = Path(os.path.relpath(os.path.abspath(p), common)).as_posix()
        names.append(rel[: -len(SHARD_SUFFIX)] if rel.endswith(SHARD_SUFFIX) else rel)
    return names


@dataclass
class Sample:
    """One key of a shard.

    Attributes:
        shard: the shard's name (:func:`shard_names`).
        key: the sample's key.
        picture: its picture member, or None.
        caption: its caption, or None (no ``KEY.txt``, or one that cannot be used: see ``problem``).
        metadata: its ``KEY.json`` member, or None.
        size: the picture's ``(width, height)`` from its header, or None.
        bad_picture: why the picture cannot be read ('' when it can): Pillow cannot identify
            it, it is over the pixel budget, or the shard ends inside it.
        bad_caption: why ``KEY.txt`` cannot be used ('' when it can or there is none): not
            UTF-8, empty, or cut short.
    """

    shard: str
    key: str
    picture: ArchiveMember | None = None
    caption: str | None = None
    metadata: ArchiveMember | None = None
    size: tuple[int, int] | None = None
    bad_picture: str = ""
    bad_caption: str = ""

    @property
    def id(self) -> str:
        """``shard/key``: the sample's name in hits and messages."""
        return f"{self.shard}/{self.key}"


@dataclass
class ShardScan:
    """What a scan of shards found.

    Attributes:
        shards: the shard files, in order.
        samples: every sample with a picture member, first of its key, in shard then member
            order (those with a ``bad_picture`` or ``bad_caption`` too: a reader decides what
            it needs).
        left_out: ``(shard/key or shard, why)`` of what is not a sample: a damaged tar's rest,
            a key met again, a key without a picture, a key that cannot be an id; and of a
            sample's second picture (the first is read).
    """

    shards: list[Path]
    samples: list[Sample] = field(default_factory=list)
    left_out: list[tuple[str, str]] = field(default_factory=list)


def scan_shards(shards: list[Path], *, max_pixels: int = MAX_PIXELS) -> ShardScan:
    """Stream every shard once and list its samples (nothing unpacked, no picture decoded).

    Args:
        shards: the shard files (:func:`expand_shards`).
        max_pixels: a picture whose header declares more pixels gets a ``problem``.

    Example:
        >>> import io, tarfile
        >>> from PIL import Image
        >>> def member(tar, name, data):
        ...     info = tarfile.TarInfo(name); info.size = len(data); tar.addfile(info, io.BytesIO(data))
        >>> png = io.BytesIO(); Image.new("RGB", (32, 24)).save(png, "PNG")
        >>> with tarfile.open("00000.tar", "w") as tar:
        ...     member(tar, "000.png", png.getvalue()); member(tar, "000.txt", b"a dog on a bench")
        ...     member(tar, "001.txt", b"a caption without its picture")
        >>> scan = scan_shards([Path("00000.tar")])
        >>> [(s.id, s.caption, s.size) for s in scan.samples], scan.left_out
        ([('00000/000', 'a dog on a bench', (32, 24))], [('00000/001', 'no picture (a KEY.jpg, .jpeg, .png or .webp member)')])
    """
    scan = ShardScan(list(shards))
    seen: dict[str, str] = {}  # key -> the shard where it was first met
    for path, name in zip(shards, shard_names(shards), strict=True):
        _scan_one(path, name, max_pixels, seen, scan)
    return scan


def _scan_one(path: Path, shard: str, max_pixels: int, seen: dict[str, str], scan: ShardScan) -> None:
    """Add one shard's samples and refusals to ``scan``."""
    try:
        size = path.stat().st_size
        tar = tarfile.open(path, mode="r:")
    except (OSError, tarfile.TarError) as exc:
        scan.left_out.append((shard, f"{path} is not a readable tar file ({exc}); the shard is not read"))
        return
    current: Sample | None = None
    skipping = ""  # the key of a sample being left out whole (met before, or no id)
    last = "its first member"
    with tar:
        while True:
            try:
                info = tar.next()
            except (OSError, EOFError, tarfile.TarError) as exc:
                scan.left_out.append((shard, f"{path} is damaged after {last} ({exc}); the rest of the shard is not read"))
                break
            if info is None:
                tail = _damaged_tail(tar, path, size)
                if tail:
                    scan.left_out.append((shard, f"{path} is damaged after {last} ({tail}); the rest of the shard is not read"))
                break
            if not info.isfile():
                continue
            last = f"member {info.name}"
            cut = _KEY_EXT.match(info.name)
            if cut is None:
                scan.left_out.append((f"{shard}/{info.name}", "a member name without KEY.EXTENSION; it is not read"))
                continue
            key, ext = cut.group(1), cut.group(2).lower()
            if key == skipping:
                continue
            if current is None or key != current.key:
                _close(current, scan)
                current, skipping = None, ""
                why = _key_refusal(shard, key, seen)
                if why:
                    scan.left_out.append((f"{shard}/{key}", why))
                    skipping = key
                    continue
                seen[key] = shard
                current = Sample(shard, key)
            member = ArchiveMember(path, info.name, info.offset_data, info.size, f"{shard}/{key}")
            short = info.offset_data + info.size > size
            note = _take(current, ext, member, tar, info, short, max_pixels)
            if note:
                scan.left_out.append((current.id, note))
            if short:
                break  # nothing follows a member the file ends in
        _close(current, scan)


def _key_refusal(shard: str, key: str, seen: dict[str, str]) -> str:
    """Why a new key is not a sample ('' when it is): met before, or no plain id."""
    if key in seen:
        where = "earlier in this shard" if seen[key] == shard else f"in shard {seen[key]}"
        return f"the key {key} was met {where}, whose sample is kept; this one is left out"
    try:
        plain_path(f"{shard}/{key}", shard, "sample id")
    except DataError as exc:
        return f"{exc} (the sample is left out)"
    return ""


def _take(sample: Sample, ext: str, member: ArchiveMember, tar: tarfile.TarFile, info: tarfile.TarInfo,
          short: bool, max_pixels: int) -> str:
    """Record member ``ext`` of ``sample``: the picture (its header read), the caption (read),
    the metadata (its place); other members (``.cls``, ``.npy``...) are not xmatch's. Returns
    what to list about a member that is not read ('' when it is)."""
    if ext in PICTURE_EXTENSIONS:
        if sample.picture is not None:
            return f"a second picture {member.name} is not read (the first, {sample.picture.name}, is)"
        sample.picture = member
        if short:
            sample.bad_picture = f"{member} is cut short: the shard ends inside it (a truncated tar)"
        else:
            sample.size, sample.bad_picture = _header(tar, info, member, max_pixels)
    elif ext == CAPTION_EXTENSION:
        if short:
            sample.bad_caption = f"its caption {member.name} is cut short (a truncated tar)"
            return ""
        data = tar.extractfile(info).read()  # type: ignore[union-attr]  # a regular file
        try:
            text = data.decode("utf-8").strip()
        except UnicodeDecodeError as exc:
            sample.bad_caption = f"its caption {member.name} is not UTF-8 text ({exc})"
            return ""
        if text:
            sample.caption = text
        else:
            sample.bad_caption = f"its caption {member.name} is empty"
    elif ext == METADATA_EXTENSION:
        sample.metadata = member
    return ""


def _header(tar: tarfile.TarFile, info: tarfile.TarInfo, member: ArchiveMember, max_pixels: int) -> tuple[tuple[int, int] | None, str]:
    """The picture's size from its header, and why it cannot be used ('' when it can)."""
    import warnings

    from PIL import Image

    try:
        with warnings.catch_warnings():  # Pillow's bomb warning: the budget below decides
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(tar.extractfile(info)) as im:  # type: ignore[arg-type]  # a regular file
                size = im.size
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        return None, f"{member} is not a readable image: {unreadable_reason(exc)}"
    try:
        check_pixels(size, str(member), max_pixels, "raise the budget (--data-option max_pixels=N, --max-pixels N)")
    except ImageTooLargeError as exc:
        return size, str(exc)
    return size, ""


def _close(sample: Sample | None, scan: ShardScan) -> None:
    """Keep a finished sample that has a picture; list one that has none."""
    if sample is None:
        return
    if sample.picture is None:
        scan.left_out.append((sample.id, "no picture (a KEY.jpg, .jpeg, .png or .webp member)"))
    else:
        scan.samples.append(sample)


def _damaged_tail(tar: tarfile.TarFile, path: Path, size: int) -> str:
    """What follows the last member, when it is not the archive's end (zero blocks): tarfile
    stops quietly at a damaged or cut header."""
    start = tar.offset
    with open(path, "rb") as f:
        f.seek(start)
        rest = f.read(64 * BLOCK)
    if rest.strip(b"\0"):
        return f"byte {start} of {size} starts no valid member header"
    return ""


class WebDataset(ImageTextDataset):
    """WebDataset shards as pictures with their captions (``KEY.txt``); items are PIL images.

    Args:
        root: a shard pattern (``shards/{00000..00099}.tar``; ``{split}`` stands for the split),
            a ``.tar`` file, or a folder (its ``<split>/*.tar``, else its ``*.tar``): see
            :func:`expand_shards`. Without ``{split}`` or a split sub-folder, the shards are the
            dataset whatever the split, which is then only a label.
        split: the split (fills ``{split}``, picks the folder's sub-folder).
        max_pixels: the largest picture read (width x height, from its header; default
            :data:`xmatch.io.pictures.MAX_PIXELS`); a larger one is left out and listed.
        captions_per_image: None or 1: one caption per picture (its ``KEY.txt``), a sample
            without one left out and listed; 0: the pictures alone, captions or not (to index
            them for text search).

    The samples are read in shard order then member order; an image is named ``shard/key``
    (:attr:`image_names`). What is left out is in :attr:`left_out` and logged as a warning.
    Pictures are read by their byte range in the shard, only when an item is loaded, so the
    dataset is map-style: the trainer's seeded order, its split of every batch across
    processes and its exact resumption work as on a folder. The shards must stay where the scan
    found them (a local or shared file system).

    Attributes:
        shards: the shard files.
        samples: the samples read, one per image.
        left_out: ``(shard/key or shard, why)`` of everything skipped.

    Raises:
        DataFileNotFoundError: a shard the pattern names is missing, a folder without shards.
        DataError: a bad pattern, ``captions_per_image`` above 1, no usable sample at all.
        NoCaptionsError: pictures without captions (unless ``captions_per_image=0``), when
            none has a caption.

    Example:
        >>> import io, tarfile
        >>> from PIL import Image
        >>> def member(tar, name, data):
        ...     info = tarfile.TarInfo(name); info.size = len(data); tar.addfile(info, io.BytesIO(data))
        >>> png = io.BytesIO(); Image.new("RGB", (32, 24)).save(png, "PNG")
        >>> Path("shards").mkdir()
        >>> with tarfile.open("shards/00000.tar", "w") as tar:
        ...     member(tar, "000.png", png.getvalue()); member(tar, "000.txt", b"a dog on a bench")
        >>> ds = WebDataset("shards/{00000..00000}.tar", "train")
        >>> ds.image_names, ds.captions, ds.image(0).size
        (['00000/000'], ['a dog on a bench'], (32, 24))
    """

    def __init__(
        self, root: str | os.PathLike, split: str | None = None, *, max_pixels: int = MAX_PIXELS,
        captions_per_image: int | None = None,
    ) -> None:
        if captions_per_image is not None and captions_per_image not in (0, 1):
            raise DataError(
                f"webdataset: captions_per_image={captions_per_image}, but a sample holds one caption (its KEY.txt); "
                "pass 1, or 0 to read the pictures alone."
            )
        self.root, self.split, self.max_pixels = Path(os.fspath(root)), split, max_pixels
        self.shards = expand_shards(root, split)
        scan = scan_shards(self.shards, max_pixels=max_pixels)
        alone = captions_per_image == 0
        self.left_out = list(scan.left_out)
        readable = [s for s in scan.samples if not s.bad_picture]
        self.left_out += [(s.id, s.bad_picture) for s in scan.samples if s.bad_picture]
        if not alone and readable and all(s.caption is None and not s.bad_caption for s in readable):
            raise NoCaptionsError(f"webdataset: none of the {len(readable)} pictures of {root} has a caption (KEY.txt); "
                                  "read them alone with captions_per_image=0 to index them.", len(readable), len(readable))
        samples = readable if alone else [s for s in readable if s.caption is not None]
        if not alone:
            self.left_out += [(s.id, s.bad_caption or "no caption (a KEY.txt member)") for s in readable if s.caption is None]
        if not samples:
            raise DataError(f"webdataset: no usable sample in {root} ({len(self.shards)} shards); "
                            f"left out: {first_few([f'{i}: {why}' for i, why in self.left_out])}.")
        for where, why in self.left_out:
            logger.warning("webdataset: left out %s: %s", where, why)
        self.samples = samples
        names = [s.id for s in samples]
        if alone:
            self._set_index([], np.zeros(0, np.int64), names, images_only=True)
        else:
            self._set_index([s.caption for s in samples], np.arange(len(samples)), names)  # type: ignore[misc]

    def image(self, index: int) -> Image:
        """Image ``index`` as an RGB ``PIL.Image.Image``, read from its shard now."""
        from xmatch.regions.images import UnreadableImageError, load_image

        sample = self.samples[check_index(index, self.num_images, "image")]
        try:
            return load_image(sample.picture, self.max_pixels)  # type: ignore[arg-type]  # kept samples have one
        except UnreadableImageError as exc:
            raise DataError(f"webdataset: {exc}") from None

    def feature_files(self) -> list[Path]:
        """The shard files (what an evaluation's fingerprint samples)."""
        return list(self.shards)
