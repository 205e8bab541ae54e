"""``xmatch demo``: TERAN end to end on the built-in ``scenes`` benchmark, offline.

- :mod:`xmatch.demo.run`: data, model, evaluation, showcase queries (:func:`run_demo`);
- :mod:`xmatch.demo.draw`: the pictures (alignment heat map, retrieval grid), with Pillow.

Example:
    >>> from xmatch.demo import run_demo
    >>> result = run_demo(out="demo-out")  # runs the whole demo (minutes)  # doctest: +SKIP
"""

from xmatch.demo.run import DemoResult, run_demo
from xmatch.deprecation import moved_names

__all__ = ["DemoResult", "run_demo"]

# what `from xmatch.demo import ...` gave when the demo was one module
__getattr__ = moved_names(__name__, "xmatch.demo.run", {
    "DEFAULT_MODEL", "DEFAULT_RECIPE", "RECIPES", "IMAGE_BATCH", "TEXT_BATCH", "Hit", "Ranking", "prepare_scenes",
    "scenes_layout", "load_trained_model", "train_demo_model", "rank_texts_to_images", "rank_images_to_texts",
    "token_labels", "figures_table", "SCORES_EXPLAINED", "POOLER_MARKS", "pick_queries", "showcase",
})
