"""The built-in ``scenes`` benchmark: procedural, seeded, compositional image-caption data
(``open_dataset("scenes", ...)``, docs/scenes.md).

- :mod:`xmatch.scenes.render`: scenes of digits and shapes in hard-negative twin pairs, drawn
  (``objects="standard"``, or ``"small"``: every object 16-40 px on the 224-px canvas);
- :mod:`xmatch.scenes.captions`: the captions' grammar;
- :mod:`xmatch.scenes.features`: region features of an ImageNet CNN over detector-like boxes;
- :mod:`xmatch.scenes.dataset`: generation into the cache, in the layouts xmatch reads, and
  the twins' figures.

Example:
    >>> from xmatch.scenes import open_scenes
    >>> test = open_scenes(split="test", size="tiny")  # generates the tiny preset once (seconds)  # doctest: +SKIP
"""

from xmatch.scenes.dataset import open_scenes, read_scenes, scene_groups, twin_accuracy, twins

__all__ = ["open_scenes", "read_scenes", "scene_groups", "twin_accuracy", "twins"]
