"""Files written atomically (a temporary file, then a rename) with the permissions of a plain ``open()``.

Writers that make their own temporary file create it private (``tempfile.mkstemp`` and the
safetensors writer give mode 0600), and a rename keeps that mode, so a saved bundle or
embeddings file would be unreadable to the group and to other users even where the umask
allows it. Every atomic write of a file xmatch saves for users goes through
:func:`move_into_place`, which gives the file the mode ``open()`` would have (0666 less the
umask) before the rename.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

_PROC_STATUS = Path("/proc/self/status")


def current_umask() -> int:
    """The process's umask, read without changing it where the system says it (Linux).

    Elsewhere it is read by setting and restoring it, which a thread creating a file at that
    very moment could observe.

    Example:
        >>> 0 <= current_umask() <= 0o777
        True
    """
    try:
        for line in _PROC_STATUS.read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass  # no /proc (macOS, Windows) or an old kernel without the field
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def new_file_mode() -> int:
    """The mode ``open(path, "w")`` gives a new file: 0666 less the umask (0644 under umask 022).

    Example:
        >>> oct(new_file_mode() | 0o022)
        '0o666'
    """
    return 0o666 & ~current_umask()


def move_into_place(tmp: str | os.PathLike, path: str | os.PathLike) -> None:
    """Give the finished temporary file ``tmp`` the mode of a plain ``open()`` and rename it to
    ``path`` (atomically, replacing what is there).

    Example:
        >>> import tempfile
        >>> folder = Path(tempfile.mkdtemp())
        >>> fd, tmp = tempfile.mkstemp(dir=folder)  # created private: 0600
        >>> os.close(fd)
        >>> move_into_place(tmp, folder / "result.bin")
        >>> (folder / "result.bin").stat().st_mode & 0o777 == new_file_mode()
        True
    """
    os.chmod(tmp, new_file_mode())
    os.replace(tmp, path)


def sha256_file(path: str | os.PathLike, chunk_bytes: int = 1 << 20) -> str:
    """The sha256 of a file's bytes, read ``chunk_bytes`` at a time (bounded memory for any size).

    Example:
        >>> _ = Path("hello.txt").write_bytes(b"hello")
        >>> sha256_file("hello.txt")[:16]
        '2cf24dba5fb0a30e'
    """
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk_bytes):
            digest.update(block)
    return digest.hexdigest()
