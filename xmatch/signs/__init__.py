"""The built-in ``signs`` world: letters, words and icons on photographs, a third procedural
image-caption dataset for region features on pixels (``open_dataset("signs", ...)``, docs/signs.md).

- :mod:`xmatch.signs.world`: boards of signs with a stated relation, in hard-negative twin pairs, drawn;
- :mod:`xmatch.signs.captions`: the captions' grammar;
- :mod:`xmatch.signs.dataset`: generation into the cache as pictures, with the twins as a
  groups file beside each split.

Example:
    >>> from xmatch.signs import sample_boards
    >>> base, twin = sample_boards(0, 0)
    >>> base.relation in ("left", "right", "above", "below")
    True
"""

from xmatch.signs.dataset import open_signs, read_signs, sample_boards

__all__ = ["open_signs", "read_signs", "sample_boards"]
