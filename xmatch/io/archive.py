"""A file stored in a tar archive, read in place by its offset (nothing is unpacked).

WebDataset shards (:mod:`xmatch.data.webdataset`) keep their pictures as tar members; a
member found once by streaming the archive is read again later, in any process, from its
byte range alone.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from pathlib import Path

from xmatch.core.errors import XmatchError


class ArchiveMemberError(XmatchError, ValueError):
    """A member whose bytes are not all in the archive (a truncated or replaced file)."""


@dataclass(frozen=True)
class ArchiveMember:
    """The byte range of one member of an uncompressed tar archive.

    Attributes:
        archive: the tar file.
        name: the member's name in the archive.
        offset: where its data starts in the archive (``TarInfo.offset_data``).
        size: its size in bytes.
        label: how messages name it (e.g. the sample ``shard/key``); empty: ``archive:name``.

    Example:
        >>> import tarfile
        >>> _ = Path("note.txt").write_text("a dog on a bench")
        >>> with tarfile.open("notes.tar", "w") as tar:
        ...     tar.add("note.txt", arcname="000.txt")
        >>> info = tarfile.open("notes.tar").getmember("000.txt")
        >>> ArchiveMember(Path("notes.tar"), info.name, info.offset_data, info.size).read()
        b'a dog on a bench'
    """

    archive: Path
    name: str
    offset: int
    size: int
    label: str = ""

    def read(self) -> bytes:
        """The member's bytes.

        Raises:
            FileNotFoundError: the archive is gone.
            ArchiveMemberError: the archive ends before the member does.
        """
        with open(self.archive, "rb") as f:
            f.seek(self.offset)
            data = f.read(self.size)
        if len(data) != self.size:
            raise ArchiveMemberError(
                f"{self}: the archive ends {len(data)} bytes into this member of {self.size} bytes (a truncated "
                "or rewritten file); read the archive again or replace it."
            )
        return data

    def open(self) -> io.BytesIO:
        """The member's bytes as a binary file object (what ``PIL.Image.open`` takes)."""
        return io.BytesIO(self.read())

    def __str__(self) -> str:
        where = f"{os.fspath(self.archive)}: {self.name}"
        return f"{self.label} ({where})" if self.label else where
