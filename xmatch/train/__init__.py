"""Training: one :class:`Trainer` for every model (kept out of ``import xmatch``).

Example:
    >>> from xmatch.train import Trainer, load_recipe
    >>> model = xmatch.build("teran-mrsw-coco")  # trains on COCO (hours)  # doctest: +SKIP
    >>> train = xmatch.data.open_dataset("teran", "data/coco", split="train", restval=True)  # doctest: +SKIP
    >>> Trainer(model, train, load_recipe("teran-coco"), run_dir="runs/teran").fit()  # doctest: +SKIP
"""

from xmatch.train.config import ConfigError, ParamGroup, TrainConfig, load_recipe, recipe_names
from xmatch.train.trainer import Callback, NonFiniteLossError, Trainer, TrainingError, TrainResult, check_data_fits

__all__ = [
    "Callback", "ConfigError", "NonFiniteLossError", "ParamGroup", "TrainConfig", "TrainResult", "Trainer",
    "TrainingError", "check_data_fits", "load_recipe", "recipe_names",
]
