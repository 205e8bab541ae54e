"""Device names checked before anything is moved: a missing GPU is a one-line error, not a
driver traceback."""

from __future__ import annotations

import torch

from xmatch.core.errors import XmatchError


class DeviceError(XmatchError, ValueError):
    """A device that does not exist here; the message names it and what to use instead."""


def resolve_device(device: str | torch.device | None, default: str = "cpu") -> torch.device:
    """The ``torch.device`` for a name, checked against this machine.

    Args:
        device: ``cpu``, ``cuda``, ``cuda:1``, ``mps`` or a ``torch.device``; None: ``default``.
        default: the device when none is named (``"auto"``: CUDA when available, else the CPU).

    Raises:
        DeviceError: an unknown name, or a device this machine does not have.

    Example:
        >>> resolve_device("cpu")
        device(type='cpu')
        >>> resolve_device(None, default="cpu")
        device(type='cpu')
    """
    if device is None:
        device = ("cuda" if torch.cuda.is_available() else "cpu") if default == "auto" else default
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError):
        raise DeviceError(f"'{device}' is not a device name; use cpu, cuda, cuda:N or mps.") from None
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(f"device '{device}' was asked for but torch sees no CUDA device here; use --device cpu.")
        count = torch.cuda.device_count()
        if resolved.index is not None and resolved.index >= count:
            raise DeviceError(f"device '{device}' does not exist: this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}.")
    elif resolved.type == "mps" and not torch.backends.mps.is_available():
        raise DeviceError(f"device '{device}' was asked for but MPS is not available here; use --device cpu.")
    elif resolved.type not in ("cpu", "cuda", "mps", "meta"):
        raise DeviceError(f"device '{device}' is not supported by xmatch; use cpu, cuda, cuda:N or mps.")
    return resolved
