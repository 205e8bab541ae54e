"""An output folder that receives only finished outputs.

A run writes into a hidden temporary folder (``.<out>.<random>.partial``) made in ``out`` when
it exists, else in its nearest existing parent, so that every move into ``out`` is a rename on
one file system; each output is moved into ``out`` when it is complete
(:meth:`StagedOutput.commit`). A run that fails, or is interrupted, removes the temporary
folder with whatever it held and leaves ``out`` as it was: a folder it did not have is not
created, a folder the user had keeps its files. Only a ``kill -9`` can leave the hidden
temporary folder behind (delete it).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from types import TracebackType

from xmatch.core.errors import XmatchError


class OutputFolderError(XmatchError, ValueError):
    """An output folder that cannot take the outputs (a file, or a folder already holding what
    would be written); raised before anything is written."""


class StagedOutput:
    """A temporary folder for a run's outputs, moved into ``out`` one finished output at a time.

    Args:
        out: the output folder (need not exist; it is created, with its parents, by the first
            :meth:`commit`).

    Raises:
        OutputFolderError: ``out`` is a file.

    Example:
        >>> with StagedOutput("pictures") as stage:
        ...     _ = (stage.path / "grid.png").write_bytes(b"...")  # written where `pictures` cannot see it
        ...     stage.commit("grid.png")
        PosixPath('pictures/grid.png')
        >>> sorted(p.name for p in Path("pictures").iterdir()), stage.path.exists()
        (['grid.png'], False)
    """

    def __init__(self, out: str | os.PathLike) -> None:
        self.out = Path(out)
        if self.out.exists() and not self.out.is_dir():
            raise OutputFolderError(f"the output folder {self.out} is a file; choose a folder (--out DIR).")
        base = Path(os.path.abspath(out))
        while not base.is_dir():  # the first folder that exists: where the first commit creates `out`
            base = base.parent
        name = Path(os.path.abspath(out)).name or "out"
        self.path = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".partial", dir=base))

    def commit(self, name: str) -> Path:
        """Move the finished output ``name`` (a file or a folder in :attr:`path`) into ``out``,
        replacing a file of that name, and return its new path."""
        self.out.mkdir(parents=True, exist_ok=True)
        target = self.out / name
        os.replace(self.path / name, target)
        return target

    def discard(self) -> None:
        """Remove the temporary folder and every output not committed."""
        shutil.rmtree(self.path, ignore_errors=True)

    def __enter__(self) -> StagedOutput:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None:
        self.discard()


def check_new_folder(path: str | os.PathLike, what: str) -> None:
    """Refuse now, before a run writes anything, when ``path`` (to be committed into an output
    folder) already exists and is not an empty folder.

    Raises:
        OutputFolderError: naming the path, what it holds and the fix.

    Example:
        >>> check_new_folder("no-such-folder/train", "the training run")
    """
    path = Path(path)
    if not path.exists():
        return
    held = sorted(p.name for p in path.iterdir()) if path.is_dir() else None
    if held == []:
        return
    shown = "a file" if held is None else "not empty (" + ", ".join(held[:6]) + (", ..." if len(held) > 6 else "") + ")"
    raise OutputFolderError(
        f"{path} would receive {what} but is {shown}; choose another --out, or move {path} away first."
    )


__all__ = ["OutputFolderError", "StagedOutput", "check_new_folder"]
