"""The built-in ``tabletop`` world: a second procedural image-caption dataset, unlike ``scenes``,
that plays a new user's data (``open_dataset("tabletop", ...)``, docs/tabletop.md).

- :mod:`xmatch.tabletop.world`: tables of household objects with relations and counts, in
  hard-negative twin pairs, drawn;
- :mod:`xmatch.tabletop.captions`: the captions' grammar;
- :mod:`xmatch.tabletop.dataset`: generation into the cache, in the layouts xmatch reads, with
  the twins as a groups file beside each split.

Example:
    >>> from xmatch.tabletop import tabletop_captions
    >>> len(tabletop_captions(5))
    5
"""

from xmatch.tabletop.dataset import groups_file, open_tabletop, read_tables, tabletop_captions

__all__ = ["groups_file", "open_tabletop", "read_tables", "tabletop_captions"]
