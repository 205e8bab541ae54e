"""``xmatch extract``: region features for a folder of images, written in the TERAN bottom-up
or the SCAN precomp layout with a manifest (``extract.json``); the proposers, RoI features and
the pipeline it runs are :mod:`xmatch.regions`.

Example:
    >>> from xmatch.extract import extract
    >>> extract("my_photos", "feats", {"proposer": "windows"})  # needs the user's photos  # doctest: +SKIP
"""

from __future__ import annotations

from xmatch.extract.run import ExtractError, ExtractResult, extract

__all__ = ["ExtractError", "ExtractResult", "extract"]
