"""The base class of every error xmatch raises.

Each specific error (``SpecError``, ``RegistryError``, ``ChecksumError``, ``DataError``, ...)
derives from :class:`XmatchError` and also from the built-in exception it has always been
(``ValueError``, ``KeyError``, ``OSError``, ...), so ``except ValueError`` keeps working and
``except xmatch.XmatchError`` catches every failure xmatch itself reports.

Example:
    >>> import xmatch
    >>> try:
    ...     xmatch.build("no-such-model")
    ... except xmatch.XmatchError as exc:
    ...     print(type(exc).__name__, isinstance(exc, ValueError))
    SpecError True
"""

from __future__ import annotations


class XmatchError(Exception):
    """Base class of the errors xmatch raises (plugins derive theirs from it too)."""
