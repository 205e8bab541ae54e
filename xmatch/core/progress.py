"""Progress bars that are drawn on a terminal, and plain periodic lines in logs.

A tqdm bar redraws itself many times a second; written to a file (a CI log, ``nohup``, a
batch job's output, ``2> log``) every redraw becomes a line and floods it. Every bar xmatch
draws goes through :func:`progress_bar`, which shows it only when the caller asks for one
*and* the bar's stream is a terminal (tqdm's ``disable=None``); notebooks keep their widget
bars (``tqdm.auto``).

A long job written to a log still says how it goes: where the stream is not a terminal, the bar
is a :class:`LogLines`, which draws nothing but writes a plain line (no carriage return) every
``every`` seconds, 60 by default or ``XMATCH_PROGRESS_EVERY`` in the environment::

    extract: 1200/5000 img, 3.1 img/s, 20 min left

A job shorter than the interval leaves the log as it was.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

from tqdm.asyncio import tqdm as terminal_tqdm
from tqdm.auto import tqdm

T = TypeVar("T")

#: the bar type, for annotations (``bar: ProgressBar``)
ProgressBar = tqdm
#: seconds between two lines of a bar written to a log, unless ``XMATCH_PROGRESS_EVERY`` says otherwise
LOG_EVERY = 60.0
#: the environment variable that sets the interval of every command's log lines
EVERY_VARIABLE = "XMATCH_PROGRESS_EVERY"


def progress_bar(
    iterable: Iterable[T] | None = None, *, show: bool = True, every: float | None = None, **options: Any
) -> tqdm:
    """A tqdm bar, drawn only when ``show`` is true and its stream is a terminal; written to a log
    (a file, a pipe), a plain line every ``every`` seconds instead (:class:`LogLines`).

    Args:
        iterable: what to iterate over, as with ``tqdm(iterable)``; None for a bar updated by hand.
        show: False never draws the bar nor writes a line (``--no-progress``); True draws it on
            a terminal, and writes lines to a log.
        every: seconds between two lines in a log (0: a line at every update); None:
            ``XMATCH_PROGRESS_EVERY`` from the environment, else :data:`LOG_EVERY` (60).
        **options: tqdm's options (``total``, ``desc``, ``unit``, ``file``, ``leave``...);
            ``disable`` is decided here.

    Returns:
        The bar (a context manager and an iterator, as tqdm's).

    Raises:
        ValueError: a negative interval, or an ``XMATCH_PROGRESS_EVERY`` that is not a number of seconds.

    Example:
        >>> with progress_bar(total=3, desc="encode", show=False) as bar:
        ...     bar.update(3)
        >>> bar.disable
        True
        >>> import io
        >>> log = io.StringIO()
        >>> with progress_bar(total=4, desc="encode", unit="img", file=log, every=0) as bar:
        ...     printed = bar.update(4)
        >>> log.getvalue().split(",")[0]
        'encode: 4/4 img'
    """
    if "disable" in options:
        raise TypeError("progress_bar() decides disable itself: pass show=False for no bar.")
    every = _interval(every)
    stream = options.get("file") or sys.stderr
    # a notebook's bar (tqdm.auto) is a widget, drawn whatever the stream; elsewhere tqdm draws
    # on a terminal only, so a log gets the lines
    if show and tqdm is terminal_tqdm and stream is not None and not (hasattr(stream, "isatty") and stream.isatty()):
        return LogLines(iterable, every=every, **options)
    return tqdm(iterable, disable=None if show else True, **options)


def _interval(every: float | None) -> float:
    if every is None:
        text = os.environ.get(EVERY_VARIABLE, "").strip()
        if not text:
            return LOG_EVERY
        try:
            every = float(text)
        except ValueError:
            raise ValueError(
                f"{EVERY_VARIABLE}={text!r} is not a number of seconds; set it to e.g. 60, or unset it."
            ) from None
    if not every >= 0:  # also refuses NaN
        raise ValueError(f"progress interval must be 0 seconds or more, got {every:g}.")
    return float(every)


class LogLines(tqdm):
    """A progress bar for a log: tqdm's bar is not drawn (``disable`` is true), and every
    ``every`` seconds an update writes one plain line to the bar's stream::

        extract: 1200/5000 img, 3.1 img/s, 20 min left

    (``desc``, done / total, the rate since the bar started, the time left at that rate, and
    ``set_postfix``'s values); the count alone where the total is unknown. Closing the bar
    writes a last line when lines were written and the count moved since the last one.
    Built by :func:`progress_bar`.

    Args:
        iterable: what to iterate over; None for a bar updated by hand.
        every: seconds between two lines (0: a line at every update).
        **options: tqdm's options; ``desc``, ``total``, ``initial``, ``unit``, ``unit_scale``,
            ``unit_divisor`` and ``file`` shape the lines, the others only the terminal's bar.

    Example:
        >>> import io
        >>> log = io.StringIO()
        >>> for _ in LogLines(range(2), every=0, desc="probes", unit="probe", file=log):
        ...     pass
        >>> [line.split(",")[0] for line in log.getvalue().splitlines()]
        ['probes: 1/2 probe', 'probes: 2/2 probe']
    """

    def __init__(self, iterable: Iterable[Any] | None = None, *, every: float, **options: Any) -> None:
        super().__init__(iterable, disable=True, **options)
        desc = options.get("desc")
        self.desc = f"{desc}: " if desc else ""  # as tqdm keeps it, so that set_description works
        self.postfix: str | None = None
        self.unit = options.get("unit", "it")
        self.unit_scale = options.get("unit_scale", False)
        self.unit_divisor = options.get("unit_divisor", 1000)
        self.every = every
        self._stream = options.get("file") or sys.stderr
        self._lines = 0
        self._closed = False
        self._restart()

    def _restart(self) -> None:
        self._start_t = self._last_t = time.monotonic()
        self._start_n = self._last_n = self.n

    def update(self, n: float | None = 1) -> bool | None:
        """Count ``n`` more; True when a line was written."""
        self.n += 1 if n is None else n
        return self._line_if_due()

    def __iter__(self) -> Iterator[Any]:
        for item in self.iterable:
            yield item
            self.n += 1
            self._line_if_due()

    def reset(self, total: float | None = None) -> None:
        """Start again from 0 (of ``total``, when given): the rate counts from here."""
        super().reset(total)
        self._restart()

    def close(self) -> None:
        """The last line, when lines were written and the count moved since the last one."""
        if getattr(self, "_closed", True):  # (tqdm's __del__ may come after a failed __init__)
            return
        self._closed = True
        if self._lines and self.n != self._last_n:
            self._write(time.monotonic())

    def _line_if_due(self) -> bool:
        now = time.monotonic()
        if now - self._last_t < self.every:
            return False
        self._write(now)
        return True

    def _write(self, now: float) -> None:
        self._last_t, self._last_n = now, self.n
        self._lines += 1
        done, elapsed = self.n - self._start_n, now - self._start_t
        rate = done / elapsed if done > 0 and elapsed > 0 else None
        parts = [self._count(self.n) + (f"/{self._count(self.total)}" if self.total else "") + self._unit()]
        if rate is not None:
            parts.append(f"{self._count(rate)}{self._unit()}/s")
        if self.total:
            if self.n >= self.total:
                parts.append("0 s left")
            elif rate is not None:
                parts.append(f"{_duration((self.total - self.n) / rate)} left")
            else:
                parts.append("time left unknown")
        if self.postfix:
            parts.append(self.postfix)
        try:
            self._stream.write(f"{self.desc}{', '.join(parts)}\n")
            self._stream.flush()
        except ValueError:  # a stream closed under us (the end of a test's capture): the line has no reader
            pass

    def _count(self, x: float) -> str:
        if self.unit_scale:
            return self.format_sizeof(x, divisor=self.unit_divisor)
        if float(x).is_integer():
            return str(int(x))
        return f"{x:.0f}" if x >= 100 else f"{x:.1f}" if x >= 1 else f"{x:.2g}"

    def _unit(self) -> str:
        return self.unit if self.unit_scale else f" {self.unit}"


def _duration(seconds: float) -> str:
    """``45 s``, ``20 min``, ``3.2 h``: the time left, as rounded as a log reader needs."""
    if seconds < 90:
        return f"{round(seconds)} s"
    if seconds < 90 * 60:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"
