"""Progress bars that are drawn on a terminal and stay out of logs.

A tqdm bar redraws itself many times a second; written to a file (a CI log, ``nohup``, a
batch job's output, ``2> log``) every redraw becomes a line and floods it. Every bar xmatch
draws goes through :func:`progress_bar`, which shows it only when the caller asks for one
*and* the bar's stream is a terminal (tqdm's ``disable=None``); notebooks keep their widget
bars (``tqdm.auto``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

from tqdm.auto import tqdm

T = TypeVar("T")

#: the bar type, for annotations (``bar: ProgressBar``)
ProgressBar = tqdm


def progress_bar(iterable: Iterable[T] | None = None, *, show: bool = True, **options: Any) -> tqdm:
    """A tqdm bar, drawn only when ``show`` is true and its stream is a terminal.

    Args:
        iterable: what to iterate over, as with ``tqdm(iterable)``; None for a bar updated by hand.
        show: False never draws the bar (``--no-progress``); True draws it on a terminal only.
        **options: tqdm's options (``total``, ``desc``, ``unit``, ``file``, ``leave``...);
            ``disable`` is decided here.

    Returns:
        The bar (a context manager and an iterator, as tqdm's).

    Example:
        >>> with progress_bar(total=3, desc="encode", show=False) as bar:
        ...     bar.update(3)
        >>> bar.disable
        True
    """
    if "disable" in options:
        raise TypeError("progress_bar() decides disable itself: pass show=False for no bar.")
    return tqdm(iterable, disable=None if show else True, **options)
