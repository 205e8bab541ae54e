"""The ``Embeddings`` type: what flows between encoders, poolers, the index and disk."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from xmatch.io.files import move_into_place

_FORMAT = "xmatch.embeddings/1"


@dataclass
class Embeddings:
    """A batch of padded, L2-normalised token sets with their mask and optional global vectors.

    Attributes:
        tokens: ``[N, T, D]`` element embeddings (regions or words).
        mask: ``[N, T]`` boolean, ``True`` where an element takes part in the matching.
        pooled: optional ``[N, D]`` global vector per item (TERN's CLS outputs).
        boxes: optional ``[N, T, 4]`` box of each image token (x1, y1, x2, y2 normalised to its
            picture), when the image encoder chose the regions itself (``pixel-regions``).

    Example:
        >>> e = Embeddings(torch.randn(4, 3, 8), torch.ones(4, 3, dtype=torch.bool))
        >>> e[1:3].tokens.shape
        torch.Size([2, 3, 8])
    """

    tokens: torch.Tensor
    mask: torch.Tensor
    pooled: torch.Tensor | None = None
    boxes: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.tokens.dim() != 3:
            raise ValueError(f"Embeddings.tokens must be [N, T, D], got shape {tuple(self.tokens.shape)}.")
        if self.mask.shape != self.tokens.shape[:2] or self.mask.dtype != torch.bool:
            raise ValueError(
                f"Embeddings.mask must be a bool tensor of shape {tuple(self.tokens.shape[:2])}, "
                f"got {self.mask.dtype} {tuple(self.mask.shape)}."
            )
        if self.pooled is not None and self.pooled.shape != (self.tokens.shape[0], self.tokens.shape[2]):
            raise ValueError(
                f"Embeddings.pooled must be [N, D] = {(self.tokens.shape[0], self.tokens.shape[2])}, "
                f"got {tuple(self.pooled.shape)}."
            )
        if self.boxes is not None and self.boxes.shape != (*self.tokens.shape[:2], 4):
            raise ValueError(
                f"Embeddings.boxes must be [N, T, 4] = {(*self.tokens.shape[:2], 4)}, got {tuple(self.boxes.shape)}."
            )

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def __getitem__(self, index: int | slice | torch.Tensor) -> Embeddings:
        if isinstance(index, int):
            index = slice(index, index + 1 if index != -1 else None)
        return Embeddings(
            self.tokens[index],
            self.mask[index],
            None if self.pooled is None else self.pooled[index],
            None if self.boxes is None else self.boxes[index],
        )

    @property
    def dim(self) -> int:
        return self.tokens.shape[2]

    @property
    def lengths(self) -> torch.Tensor:
        """Number of real elements per item."""
        return self.mask.sum(dim=1)

    def to(self, *args, **kwargs) -> Embeddings:
        """Move/cast like ``Tensor.to`` (the mask keeps its bool dtype)."""
        tokens = self.tokens.to(*args, **kwargs)
        return Embeddings(
            tokens,
            self.mask.to(tokens.device),
            None if self.pooled is None else self.pooled.to(*args, **kwargs),
            None if self.boxes is None else self.boxes.to(tokens.device),
        )

    def detach(self) -> Embeddings:
        return Embeddings(
            self.tokens.detach(), self.mask, None if self.pooled is None else self.pooled.detach(), self.boxes
        )

    def trimmed(self) -> Embeddings:
        """Drop trailing columns that are padding in every row."""
        keep = self.mask.any(dim=0).nonzero()
        width = int(keep.max()) + 1 if keep.numel() else 0
        boxes = None if self.boxes is None else self.boxes[:, :width]
        return Embeddings(self.tokens[:, :width], self.mask[:, :width], self.pooled, boxes)

    @staticmethod
    def cat(items: list[Embeddings]) -> Embeddings:
        """Concatenate along the batch axis, padding the token axis to the widest."""
        if not items:
            raise ValueError("Embeddings.cat needs at least one Embeddings.")
        width = max(e.tokens.shape[1] for e in items)
        tokens, masks = [], []
        for e in items:
            pad = width - e.tokens.shape[1]
            tokens.append(torch.nn.functional.pad(e.tokens, (0, 0, 0, pad)))
            masks.append(torch.nn.functional.pad(e.mask, (0, pad), value=False))
        pooled_present = {e.pooled is not None for e in items}
        if len(pooled_present) != 1:
            raise ValueError("Embeddings.cat: either every part has pooled vectors or none has.")
        pooled = torch.cat([e.pooled for e in items]) if pooled_present.pop() else None
        boxes_present = {e.boxes is not None for e in items}
        if len(boxes_present) != 1:
            raise ValueError("Embeddings.cat: either every part has region boxes or none has.")
        boxes = None
        if boxes_present.pop():
            boxes = torch.cat([torch.nn.functional.pad(e.boxes, (0, 0, 0, width - e.boxes.shape[1])) for e in items])
        return Embeddings(torch.cat(tokens), torch.cat(masks), pooled, boxes)

    def save(self, path: str | os.PathLike, metadata: dict[str, str] | None = None) -> None:
        """Write to a ``.safetensors`` file (tokens, mask, pooled, boxes, and string metadata).

        Example:
            >>> e = Embeddings(torch.randn(4, 3, 8), torch.ones(4, 3, dtype=torch.bool))
            >>> e.save("corpus.safetensors")
            >>> Embeddings.load("corpus.safetensors").tokens.shape
            torch.Size([4, 3, 8])
        """
        tensors = {"tokens": self.tokens.detach(), "mask": self.mask}
        if self.pooled is not None:
            tensors["pooled"] = self.pooled.detach()
        if self.boxes is not None:
            tensors["boxes"] = self.boxes.detach()
        write_safetensors(path, tensors, {"format": _FORMAT, "user": json.dumps(metadata or {})})

    @classmethod
    def load(cls, path: str | os.PathLike, device: str | torch.device = "cpu") -> Embeddings:
        """Read a file written by :meth:`save`."""
        with read_safetensors(path, device, "embeddings") as (f, meta):
            if meta.get("format") != _FORMAT:
                raise ValueError(
                    f"{path} is a safetensors file but not xmatch embeddings "
                    f"(format {meta.get('format')!r}); write it with Embeddings.save."
                )
            keys = set(f.keys())
            pooled = f.get_tensor("pooled") if "pooled" in keys else None
            boxes = f.get_tensor("boxes") if "boxes" in keys else None
            return cls(f.get_tensor("tokens"), f.get_tensor("mask"), pooled, boxes)


def write_safetensors(path: str | os.PathLike, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    """Write ``tensors`` to ``path`` atomically: a reader sees the old file or the whole new one."""
    from safetensors.torch import save_file

    path = Path(path)
    tmp = path.with_name(path.name + ".partial")
    save_file({k: v.contiguous().cpu() for k, v in tensors.items()}, str(tmp), metadata=metadata)
    move_into_place(tmp, path)


@contextmanager
def read_safetensors(path: str | os.PathLike, device: str | torch.device, what: str) -> Iterator[tuple[Any, dict[str, str]]]:
    """Open a safetensors file of ``what`` for reading; yields the open file and its metadata.
    A missing file is a FileNotFoundError, an unreadable or incomplete one a ValueError naming it."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no {what} file at {path}.")
    try:
        with safe_open(str(path), framework="pt", device=str(device)) as f:
            yield f, f.metadata() or {}
    except (OSError, RuntimeError, KeyError) as exc:
        raise ValueError(f"{path} is not a readable safetensors file of {what} ({exc}); it may be truncated.") from exc
