"""``xmatch demo``: TERAN end to end on the built-in ``scenes`` benchmark, offline.

- :mod:`xmatch.demo.run`: data, model, evaluation, showcase queries (:func:`run_demo`);
- :mod:`xmatch.demo.draw`: the pictures (alignment heat map, retrieval grid), with Pillow.

Example:
    >>> from xmatch.demo import run_demo
    >>> result = run_demo(out="demo-out")  # runs the whole demo (minutes)  # doctest: +SKIP
"""

from xmatch.demo.run import DemoResult, run_demo

__all__ = ["DemoResult", "run_demo"]
