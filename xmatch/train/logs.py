"""Training logs: CSV files always, TensorBoard when the package is installed."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from xmatch.io.run_folder import refuse_link


class CsvLog:
    """Rows appended to a CSV file; new columns extend the header (the file is rewritten).

    A resumed run appends to the same file after dropping rows past the resume step, so the
    log reads as one uninterrupted run; a log that is a symbolic link is refused
    (:class:`~xmatch.io.run_folder.RunFolderError`) rather than read through.

    Example:
        >>> log = CsvLog(Path("train.csv"))
        >>> log.write({"step": 1, "loss": 0.5})
        >>> Path("train.csv").read_text().splitlines()
        ['step,loss', '1,0.5']
    """

    def __init__(self, path: Path, resume_step: int | None = None) -> None:
        self.path = path
        self.columns: list[str] = []
        self.rows: list[dict[str, Any]] = []
        if resume_step is not None:
            refuse_link(path)
        if resume_step is not None and path.is_file():
            with path.open(newline="", encoding="utf-8") as f:
                reader = csv.DictReader(f)
                self.columns = list(reader.fieldnames or [])
                self.rows = [r for r in reader if int(float(r.get("step") or 0)) <= resume_step]
            self._rewrite()
        elif path.exists():
            path.unlink()

    def write(self, row: dict[str, Any]) -> None:
        new = [k for k in row if k not in self.columns]
        self.rows.append(row)
        if new:
            self.columns += new
            self._rewrite()
            return
        with self.path.open("a", newline="", encoding="utf-8") as f:
            csv.DictWriter(f, self.columns).writerow(row)

    def _rewrite(self) -> None:
        tmp = self.path.with_name(self.path.name + ".partial")
        tmp.unlink(missing_ok=True)  # a leftover, or a link planted there, is replaced and never written through
        with tmp.open("w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, self.columns)
            writer.writeheader()
            writer.writerows(self.rows)
        tmp.replace(self.path)


class TensorBoardLog:
    """Scalars to TensorBoard event files (``torch.utils.tensorboard``)."""

    def __init__(self, folder: Path, resume_step: int | None = None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(folder), purge_step=resume_step)

    def write(self, step: int, values: dict[str, float], prefix: str) -> None:
        for key, value in values.items():
            self.writer.add_scalar(f"{prefix}/{key}", value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def tensorboard_available() -> bool:
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        return False
    return True
