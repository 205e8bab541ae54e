"""The training recipe: plain data (a ``[train]`` TOML table, a dict), checked field by field.

A recipe says how to train, never what to train: the model is its spec. The defaults are
TERAN's COCO recipe (REFERENCE.md B9): Adam (0.9, 0.999, 1e-8), lr 1e-5 for every parameter
(BERT included), batch 40, 30 epochs with the learning rate divided by 10 after 20, gradient
clipping at a global L2 norm of 2.0, no warm-up.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal, get_args

from xmatch.core.errors import XmatchError

OptimizerName = Literal["adam", "adamw", "sgd"]
SchedulerName = Literal["step", "cosine", "constant"]
AmpMode = Literal["none", "bf16", "fp16"]
FLOAT32_MAX = 3.4028234663852886e38


class ConfigError(XmatchError, ValueError):
    """A recipe that cannot be used; the message names the key and the fix."""


@dataclass
class ParamGroup:
    """Parameters whose names match a glob, with their own learning rate or frozen.

    Args:
        match: ``fnmatch`` pattern over parameter names, e.g. ``"text_encoder.*"``.
        lr_scale: this group's learning rate is ``lr * lr_scale``.
        weight_decay: this group's weight decay (default: the recipe's).
        freeze: do not train these parameters at all (no gradient is computed).

    Example:
        >>> ParamGroup(match="text_encoder.*", lr_scale=0.1)
        ParamGroup(match='text_encoder.*', lr_scale=0.1, weight_decay=None, freeze=False)
    """

    match: str
    lr_scale: float = 1.0
    weight_decay: float | None = None
    freeze: bool = False


#: the structural negatives a ``[train.negatives]`` table uses unless it names others
DEFAULT_NEGATIVES = ("swap-roles", "swap-attributes", "replace-relation", "change-count")


@dataclass
class NegativesConfig:
    """Structural hard negatives (a ``[train.negatives]`` table; docs/training.md, "Hard
    negatives"): captions made from each training caption by changing its structure, and the
    other images of a caption's hard-negative group, pushed below the true pair by a hinge.

    Attributes:
        kinds: registered negative makers (registry ``negatives``), tried in a random order.
        per_caption: negatives per training caption (fewer when no maker can change it).
        margin: the hinge margin of the negatives' term.
        weight: the term's weight beside the model's own loss.
        word_classes: where the makers' word classes come from: ``"dataset"`` (the lists the
            training set declares, e.g. the scenes grammar's), ``"spacy"`` (the optional spaCy
            tagger, ``pip install 'xmatch-zoo[spacy]'``), ``"nltk"``, or a JSON file of word lists.
        groups: when the training set has hard-negative groups (``groups_file``, or the ones it
            declares with ``hard_negative_groups()``), batch each group's members together and
            add the in-group terms; a set without groups is warned about.
        groups_file: a JSON file of hard-negative groups over the training split, the format
            ``xmatch eval --groups`` reads (:meth:`xmatch.eval.groups.GroupSet.from_json`;
            ``xmatch train --groups FILE``); it replaces the groups the set declares.

    Example:
        >>> NegativesConfig(kinds=["swap-roles"], per_caption=1).word_classes
        'dataset'
    """

    kinds: list[str] = field(default_factory=lambda: list(DEFAULT_NEGATIVES))
    per_caption: int = 2
    margin: float = 0.2
    weight: float = 1.0
    word_classes: str = "dataset"
    groups: bool = True
    groups_file: str | None = None

    def __post_init__(self) -> None:
        if not self.kinds or not all(isinstance(k, str) and k for k in self.kinds):
            raise ConfigError(f"train -> negatives -> kinds: name at least one negative maker, got {self.kinds!r}.")
        if self.per_caption < 1:
            raise ConfigError(f"train -> negatives -> per_caption: must be at least 1, got {self.per_caption}.")
        if not math.isfinite(self.margin) or self.margin < 0:
            raise ConfigError(f"train -> negatives -> margin: a non-negative number, got {self.margin}.")
        if not math.isfinite(self.weight) or self.weight <= 0:
            raise ConfigError(f"train -> negatives -> weight: a positive number, got {self.weight}.")
        if self.groups_file is not None and not self.groups:
            raise ConfigError(
                f"train -> negatives -> groups_file: {self.groups_file} is set but groups = false turns the groups "
                "off: set groups = true to train with the file's groups, or leave groups_file out."
            )


@dataclass
class TrainConfig:
    """How to train a model (a ``[train]`` table; every field optional).

    Attributes:
        epochs: passes over the training captions.
        batch_size: pairs per optimizer step over all processes (the global batch; each of N
            processes takes ``batch_size / N``).
        optimizer, lr, betas, eps, weight_decay, momentum: the optimizer (``adam``, ``adamw``,
            ``sgd``) and its settings.
        param_groups: ``[[train.param_groups]]`` tables (:class:`ParamGroup`); the first
            matching rule wins, unmatched parameters use ``lr``.
        no_decay_1d: no weight decay on parameters of fewer than two dimensions (biases,
            normalisation gains, a learned temperature or logit bias, a class embedding) in any
            group: open_clip's and timm's rule; the weight matrices and embedding tables keep it.
        scheduler: ``step`` (lr x ``gamma`` every ``step_epochs`` epochs, as the papers),
            ``cosine`` (to ``lr * min_lr_scale`` at the last step) or ``constant``.
        warmup_steps: linear warm-up over the first optimizer steps (0: none).
        amp: mixed precision ``none``, ``bf16`` or ``fp16`` (fp16 uses a gradient scaler).
        grad_clip: clip the global L2 norm of all gradients to this (None: no clipping).
        accumulate: micro-batches per optimizer step (in-batch negatives stay per micro-batch).
        seed: seeds the weights' random state, dropout and the data order.
        drop_last: skip the last, smaller batch of an epoch.
        num_workers: data-loading processes.
        global_negatives: in multi-process training, mine the hardest negatives over the
            global batch (embeddings are all-gathered) instead of each process's share.
        val_every_steps: validate every N optimizer steps as well as after every epoch.
        val_protocol: the evaluation protocol of validation (``full``, ``coco-1k``, ...).
        val_relevance: caption relevances for validation NDCG (``rougel``, ``spice``, ...).
        select_metric: the validation figure that picks the best model: ``rsum``,
            ``i2t_r1``, ``t2i_ndcg_spice``, ``ndcg_rougel`` (mean of both directions), ...;
            ranks (``*_medr``, ``*_meanr``) are minimised, everything else maximised.
        early_stopping: stop after this many validations without improvement (None: never).
        checkpoint_every_steps: also write a resumable checkpoint every N optimizer steps.
        keep_checkpoints: how many step checkpoints to keep.
        log_every_steps: CSV / TensorBoard log period.
        tensorboard: write TensorBoard logs (None: when the package is installed).
        max_steps: stop after this many optimizer steps (a budget, e.g. for benchmarks).
        fused: the optimizer's fused kernel (one pass over all parameters; on the CPU 5x to 9x
            faster than the default per-tensor loop). None: wherever the parameters allow
            it. It rounds differently in the last bit, so a run resumed or repeated with
            another setting is not bit-identical (the scenes recipes pin ``false``: they
            reproduce the shipped demo weights).
        build_text_side: ``xmatch train`` builds the word vocabulary / word-level tokenizer
            from the training captions into ``<run>/text_side`` (:mod:`xmatch.data.vocab`).
        text_min_count: with ``build_text_side``, keep words seen this often (None: the text
            encoder's ``min_count``).
        allow_unknown_words: train even when more than 20 % of the caption tokens are unknown
            to the text side (a warning instead of the error).
        negatives: structural hard negatives (:class:`NegativesConfig`, a ``[train.negatives]``
            table; None: none, the papers' training).

    Example:
        >>> TrainConfig.from_mapping({"lr": 1e-4, "epochs": 2}).lr
        0.0001
    """

    epochs: int = 30
    batch_size: int = 40
    optimizer: OptimizerName = "adam"
    lr: float = 1e-5
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    momentum: float = 0.9
    param_groups: list[ParamGroup] = field(default_factory=list)
    no_decay_1d: bool = False
    scheduler: SchedulerName = "step"
    step_epochs: int = 20
    gamma: float = 0.1
    min_lr_scale: float = 0.0
    warmup_steps: int = 0
    amp: AmpMode = "none"
    grad_clip: float | None = 2.0
    accumulate: int = 1
    seed: int = 0
    drop_last: bool = False
    num_workers: int = 0
    global_negatives: bool = False
    val_every_steps: int | None = None
    val_protocol: str = "full"
    val_relevance: list[str] = field(default_factory=list)
    select_metric: str = "rsum"
    early_stopping: int | None = None
    checkpoint_every_steps: int | None = None
    keep_checkpoints: int = 2
    log_every_steps: int = 10
    tensorboard: bool | None = None
    max_steps: int | None = None
    fused: bool | None = None
    build_text_side: bool = False
    text_min_count: int | None = None
    allow_unknown_words: bool = False
    negatives: NegativesConfig | None = None

    def __post_init__(self) -> None:
        self.betas = tuple(self.betas)  # TOML gives a list
        if self.negatives is not None and not isinstance(self.negatives, NegativesConfig):
            self.negatives = _negatives(self.negatives)
        self.param_groups = [g if isinstance(g, ParamGroup) else _param_group(g, i) for i, g in enumerate(self.param_groups)]
        positive = ("epochs", "batch_size", "accumulate", "keep_checkpoints", "log_every_steps")
        for name in positive:
            if getattr(self, name) < 1:
                raise ConfigError(f"train -> {name}: must be at least 1, got {getattr(self, name)}.")
        for name in ("val_every_steps", "checkpoint_every_steps", "max_steps", "early_stopping", "step_epochs",
                     "text_min_count"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"train -> {name}: must be at least 1 (or left out), got {value}.")
        if not math.isfinite(self.lr) or self.lr <= 0:
            raise ConfigError(f"train -> lr: must be a positive finite number, got {self.lr}.")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ConfigError(f"train -> betas: two numbers in [0, 1), got {list(self.betas)}.")
        largest = self.lr * max([1.0, *(g.lr_scale for g in self.param_groups)])
        if self.optimizer in ("adam", "adamw") and largest / (1 - self.betas[0]) > FLOAT32_MAX:
            # Adam's first step is lr / (1 - beta1), computed in float32 by torch
            raise ConfigError(
                f"train -> lr: {largest:g} is too large: Adam's first step (lr / (1 - beta1) = "
                f"{largest / (1 - self.betas[0]):.3g}) overflows float32 (max {FLOAT32_MAX:.3g}); use a learning rate "
                "in the usual range (1e-6 to 1e-2)."
            )
        if self.warmup_steps < 0 or self.num_workers < 0:
            raise ConfigError("train -> warmup_steps / num_workers: must not be negative.")
        if self.grad_clip is not None and self.grad_clip <= 0:
            raise ConfigError(f"train -> grad_clip: must be positive or left out, got {self.grad_clip}.")
        for name, kind in (("optimizer", OptimizerName), ("scheduler", SchedulerName), ("amp", AmpMode)):
            choices = get_args(kind)
            if getattr(self, name) not in choices:
                raise ConfigError(f"train -> {name}: {getattr(self, name)!r} is not one of {', '.join(choices)}.")

    @classmethod
    def from_mapping(cls, table: dict[str, Any], path: str = "train") -> TrainConfig:
        """A recipe from a ``[train]`` table; unknown keys and wrong types are errors naming
        the key (with close matches)."""
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: expected a table of training settings, got {table!r}.")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for key, value in table.items():
            if key == "negatives" and value is not None:
                continue  # a table of its own, checked by _negatives
            if key not in fields:
                close = difflib.get_close_matches(key, list(fields), n=3)
                hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
                raise ConfigError(f"{path} -> {key}: unknown training setting.{hint}")
            _check_type(f"{path} -> {key}", value, fields[key].default, fields[key].type)
        return cls(**table)

    def merged(self, overrides: dict[str, Any]) -> TrainConfig:
        """A copy with some settings replaced (checked like :meth:`from_mapping`); a key
        ``negatives.KEY`` sets one setting of the negatives table (``--set negatives.per_caption=3``)."""
        table = self.to_mapping()
        for key, value in overrides.items():
            head, dot, rest = key.partition(".")
            if head == "negatives" and dot:
                table["negatives"] = {**(table.get("negatives") or {}), rest: value}
            else:
                table[key] = value
        return TrainConfig.from_mapping(table)

    def to_mapping(self) -> dict[str, Any]:
        """Plain data (TOML-writable: ``None`` values are left out)."""
        data = dataclasses.asdict(self)
        data["betas"] = list(self.betas)
        data["param_groups"] = [{k: v for k, v in g.items() if v is not None} for g in data["param_groups"]]
        if data["negatives"] is not None:  # a table without a groups file is recorded as before it had one
            data["negatives"] = {k: v for k, v in data["negatives"].items() if v is not None}
        return {k: v for k, v in data.items() if v is not None}


def _negatives(table: Any) -> NegativesConfig:
    path = "train -> negatives"
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: expected a table of negatives settings, got {table!r}.")
    fields = {f.name: f for f in dataclasses.fields(NegativesConfig)}
    for key, value in table.items():
        if key not in fields:
            raise ConfigError(f"{path} -> {key}: unknown; the negatives table has {', '.join(fields)}.")
        _check_type(f"{path} -> {key}", value, fields[key].default, fields[key].type)
    return NegativesConfig(**table)


def _param_group(table: Any, index: int) -> ParamGroup:
    path = f"train -> param_groups -> {index}"
    if not isinstance(table, dict) or "match" not in table:
        raise ConfigError(f"{path}: expected a table with a 'match' glob, got {table!r}.")
    known = {f.name for f in dataclasses.fields(ParamGroup)}
    for key in table:
        if key not in known:
            raise ConfigError(f"{path} -> {key}: unknown; a parameter group has {', '.join(sorted(known))}.")
    return ParamGroup(**table)


def _check_type(path: str, value: Any, default: Any, hint: Any) -> None:
    text = str(hint)
    if "list" in text or "tuple" in text:
        ok = isinstance(value, (list, tuple))
    elif "float" in text:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif "bool" in text:
        ok = isinstance(value, bool)
    elif "int" in text:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, str)
    if value is None:
        ok = "None" in text
    if not ok:
        raise ConfigError(f"{path}: expected {text.replace('typing.', '')}, got {value!r}.")


def recipe_names() -> list[str]:
    """The recipes shipped with xmatch (``xmatch train --recipe NAME``).

    Example:
        >>> "teran-coco" in recipe_names()
        True
    """
    return sorted(p.name[:-5] for p in resources.files("xmatch.train.recipes").iterdir() if p.name.endswith(".toml"))


def load_recipe(source: str | os.PathLike) -> TrainConfig:
    """A shipped recipe by name (``teran-coco``, ``teran-f30k``, ``tern-coco``) or a TOML file
    (its ``[train]`` table, or the whole file when it has none).

    Example:
        >>> load_recipe("tern-coco").lr
        2e-06
    """
    text = os.fspath(source)
    if text.endswith(".toml") or os.sep in text:
        path = Path(text)
        if not path.is_file():
            raise ConfigError(f"recipe file {path} does not exist.")
        where = str(path)
    else:
        if text not in recipe_names():
            close = difflib.get_close_matches(text, recipe_names(), n=3)
            raise ConfigError(f"no recipe named '{text}'. Available: {', '.join(recipe_names())}." + (
                f" Did you mean {', '.join(map(repr, close))}?" if close else ""))
        path = resources.files("xmatch.train.recipes") / f"{text}.toml"
        where = f"recipe '{text}'"
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{where} is not valid TOML: {exc}") from exc
    table = data.get("train", data)
    return TrainConfig.from_mapping({k: v for k, v in table.items() if k != "description"}, path=f"{where} -> train")
