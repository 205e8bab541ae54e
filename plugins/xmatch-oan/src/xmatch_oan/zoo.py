"""OAN zoo entries: data in ``zoo.toml``, one entry point per entry (``xmatch_models``).

Each entry point names one of the :class:`xmatch.ZooEntry` objects below, read by
:func:`xmatch.plugin.zoo_entries_from_toml` (an entry may name a ``base`` entry and ``overrides`` of
its spec; the paper's figures, weights and parameter count are never inherited).

Example:
    >>> oan_f30k.spec["text_encoder"]["max_length"]
    80
"""

from __future__ import annotations

from xmatch import zoo_entries_from_toml

ENTRIES = zoo_entries_from_toml(__package__, "zoo.toml")

oan_coco = ENTRIES["oan-coco"]
oan_f30k = ENTRIES["oan-f30k"]
