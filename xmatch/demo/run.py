"""``xmatch demo``: TERAN end to end on the built-in ``scenes`` benchmark, offline.

Prepares the scenes data (generated once into the cache), loads the demo model shipped with
xmatch (or trains one from scratch with the shipped recipe), evaluates it with the papers'
protocol (Recall@K both ways, NDCG@25 with ROUGE-L relevance) and on the hard-negative twins,
then shows what the model does: typical successes *and* failures in both directions (labelled,
with where the right answer ranked and how far each score stands above the other candidates),
a retrieval grid that marks the right image and its twin, and, for models that score with the
region-word matrix, the alignment of one pair as the pooler reads it (after Figure 7 of TERAN:
Messina et al., "Fine-grained Visual Textual Alignment for Cross-Modal Retrieval using
Transformer Encoders", ACM TOMM 2021). See docs/demo.md.

Example:
    >>> from xmatch.demo import run_demo
    >>> result = run_demo(out="demo-out")  # runs the whole demo (minutes)  # doctest: +SKIP
    >>> result.figures.t2i["r1"], result.files["alignment"]  # doctest: +SKIP
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from xmatch.data import ImageCaptionsDataset, TeranDataset
from xmatch.scenes.dataset import scene_groups, twins
from xmatch.eval import (
    EvalResult,
    encode_dataset,
    evaluate_blocks,
    fold_layout,
    score_blocks,
)
from xmatch.eval.groups import score_groups
from xmatch.demo.staging import StagedOutput, check_new_folder
from xmatch.model.inputs import PixelInputs, input_type_of
from xmatch.model.model import MatchingModel

DEFAULT_MODEL = "teran-mrsw-scenes"
DEFAULT_RECIPE = "scenes-teran"
# The recipe each demo entry was trained with (docs/demo.md); other models use DEFAULT_RECIPE.
RECIPES = {"teran-mrsw-scenes": "scenes-teran", "tern-scenes": "scenes-tern", "teran-mrsw-grid-scenes": "scenes-teran"}
# The batch sizes of `xmatch eval` (--batch-size 64, captions 4x): the same figures to the digit.
IMAGE_BATCH, TEXT_BATCH = 64, 256

logger = logging.getLogger(__name__)


@dataclass
class Hit:
    """One retrieved item.

    Attributes:
        label: the image id or the caption.
        score: the model's similarity.
        correct: whether it is a right answer to the query.
        note: ``twin`` / ``twin's`` (the hard negative), ``the right one``...
        rank: its 1-based rank.
        z: how many standard deviations its score stands above the mean over every candidate
            of the query (comparable across queries, unlike the raw score).
    """

    label: str
    score: float
    correct: bool
    note: str = ""
    rank: int = 0
    z: float = 0.0

    def line(self) -> str:
        note = f"  ({self.note})" if self.note else ""
        return f"  {self.rank:2d}. {'*' if self.correct else ' '} {self.score:8.4f}  z {self.z:+5.2f}  {self.label}{note}"


@dataclass
class Ranking:
    """A query and its top-k results, best first.

    Attributes:
        direction: ``t2i`` (a caption queries the images) or ``i2t``.
        query: the caption (quoted) or the image's label.
        hits: the top-k, best first.
        outcome: ``success`` (a right answer ranks first) or ``failure``.
        truth_rank: the 1-based rank of the (best) right answer.
        truth: the right answer when it ranked below the top-k, else None.
        index: the query's index in the test split (caption for t2i, image for i2t).
    """

    direction: str  # "t2i" or "i2t"
    query: str
    hits: list[Hit]
    outcome: str = ""
    truth_rank: int = 0
    truth: Hit | None = None
    index: int = -1

    def headline(self) -> str:
        """``SUCCESS: ...`` or ``FAILURE: ...``, saying where the right answer ranked."""
        what = "image" if self.direction == "t2i" else "caption"
        where = f"the right {what} ranks {self.truth_rank}"
        twins = [h.rank for h in self.hits if h.note.startswith("twin")]
        if self.outcome == "failure" and twins and twins[0] < self.truth_rank:
            twin = "the twin" if self.direction == "t2i" else "a caption of the twin"
            where += f"; {twin} ranks {twins[0]}"
        return f"{self.outcome.upper()}: {where}" if self.outcome else where

    def text(self) -> str:
        """The ranking as printed by the demo: ``*`` marks a right result."""
        arrow = "text -> image" if self.direction == "t2i" else "image -> text"
        lines = [f"{arrow}  {self.headline()}", f"  query: {self.query}"]
        lines += [hit.line() for hit in self.hits]
        if self.truth is not None:
            lines += ["   ...", self.truth.line()]
        return "\n".join(lines)


@dataclass
class DemoResult:
    """What :func:`run_demo` measured and wrote.

    Attributes:
        figures: the evaluation (Recall@K, ranks, NDCG ROUGE-L, both directions).
        rankings: the text-to-image then image-to-text showcase queries.
        files: the pictures written: ``retrieval`` and, for models that score with the
            region-word matrix, ``alignment``.
        model: the model evaluated.
        groups: the hard-negative twins' figures (:class:`xmatch.eval.groups.GroupResult`).
    """

    figures: EvalResult
    rankings: list[Ranking]
    files: dict[str, Path]
    model: MatchingModel = field(repr=False)
    groups: Any = None


def prepare_scenes(
    split: str, size: str = "small", root: str | os.PathLike | None = None, progress: bool = True, **options: Any
) -> TeranDataset | ImageCaptionsDataset:
    """Open a split of the scenes benchmark, generating it into the cache the first time
    (``layout="images"`` for models that take pixels).

    Example:
        >>> prepare_scenes("test").num_images  # generates the scenes benchmark (minutes)  # doctest: +SKIP
        100
    """
    from xmatch.scenes.dataset import open_scenes

    return open_scenes(root, split, size=size, progress=progress, **options)


def scenes_layout(model: str | Mapping[str, Any] | MatchingModel) -> str:
    """The scenes layout a model reads: ``"images"`` when its image encoder takes pixels
    (``timm-grid``), else ``"regions"``.

    Args:
        model: a model, a spec, or any name ``xmatch.build`` takes (zoo entry, spec ``.toml``,
            ``local-dir:DIR``, ``hf-hub:ORG/NAME``).

    Example:
        >>> scenes_layout("teran-mrsw-grid-scenes")
        'images'
    """
    from xmatch.core.registry import RegistryError, image_encoders
    from xmatch.core.zoo import info
    from xmatch.model.factory import build

    if isinstance(model, MatchingModel):
        return "images" if input_type_of(model.image_encoder) is PixelInputs else "regions"
    if isinstance(model, str):
        try:
            spec = info(model).spec
        except RegistryError:  # not a zoo name: the spec is the one the built model carries
            spec = build(model).spec
    else:
        spec = model
    encoder = image_encoders.get(spec["image_encoder"]["name"])
    return "images" if input_type_of(encoder) is PixelInputs else "regions"


def load_trained_model(model: str) -> MatchingModel:
    """``model`` with its trained weights, for the demo: a zoo entry that has some
    (``xmatch models --pretrained``), a bundle (``local-dir:DIR``, ``hf-hub:ORG/NAME``).

    Raises:
        ValueError: ``model`` has no weights (a zoo entry without any, a spec ``.toml``): the
            message says what trains here, offline (``--train``, or a demo model's spec when
            ``model``'s own needs the Hub or region features the scenes benchmark lacks).

    Example:
        >>> net = load_trained_model("local-dir:my-model")  # needs a bundle of yours  # doctest: +SKIP
    """
    from xmatch.core.registry import RegistryError
    from xmatch.core.zoo import info
    from xmatch.model.factory import build

    spec = None
    try:
        entry = info(model)
        spec, weights = entry.spec, bool(entry.weights)
    except RegistryError:  # a bundle carries its weights; build() explains any other name
        weights = not model.endswith(".toml")
    if not weights:
        unfit = _why_not_trained_here(spec) if spec is not None else []
        advice = (
            f"or train it first: xmatch demo --model {model} --train." if not unfit else
            f"or train a model sized for the scenes benchmark, offline: xmatch demo --model {DEFAULT_MODEL} --train. "
            f"'{model}' itself does not train on it here: {'; '.join(unfit)}."
        )
        raise ValueError(
            f"'{model}' has no trained weights to show. Pick a model with weights (xmatch models --pretrained, "
            f"a local-dir: or hf-hub: bundle), {advice}"
        )
    return build(model, pretrained=True)


def _why_not_trained_here(spec: Mapping[str, Any]) -> list[str]:
    """Why ``xmatch demo --train`` cannot train the model of ``spec`` offline: a text encoder
    that starts from files of the Hugging Face Hub (a bare hub id, not a local folder,
    ``package:`` or ``zoo:``), or region features wider or narrower than the scenes benchmark's
    (those the demo model reads)."""
    from xmatch.core.sources import PACKAGE_PREFIX, ZOO_PREFIX
    from xmatch.core.zoo import info

    reasons = []
    text = spec.get("text_encoder", {})
    for key in ("backbone", "tokenizer"):
        source = text.get(key)
        local = not isinstance(source, str) or source.startswith((PACKAGE_PREFIX, ZOO_PREFIX)) or Path(source).expanduser().exists()
        if not local:
            reasons.append(f"its text encoder starts from '{source}', fetched from the Hugging Face Hub (the network, "
                           "or its cache)")
    width = spec.get("image_encoder", {}).get("feature_dim")
    scenes = info(DEFAULT_MODEL).spec["image_encoder"]["feature_dim"]
    if width is not None and width != scenes:
        reasons.append(f"it reads {width}-wide region features, the scenes benchmark's are {scenes}-wide")
    return reasons


def train_demo_model(
    model: str | Mapping[str, Any],
    run_dir: str | os.PathLike,
    *,
    recipe: str = DEFAULT_RECIPE,
    size: str = "small",
    root: str | os.PathLike | None = None,
    data_options: Mapping[str, Any] | None = None,
    train_settings: Mapping[str, Any] | None = None,
    progress: bool = True,
) -> MatchingModel:
    """Train ``model`` from scratch on the scenes train split with a shipped recipe, selecting
    on the val split, and return the best model (``run_dir/best``).

    This is what ``xmatch train MODEL --dataset scenes --recipe RECIPE`` does.

    Example:
        >>> net = train_demo_model("teran-mrsw-scenes", "runs/demo")  # trains a model (minutes)  # doctest: +SKIP
    """
    from xmatch.model.factory import build, is_bundle_name
    from xmatch.train import Trainer, load_recipe

    config = load_recipe(recipe)
    if train_settings:
        config = config.merged(dict(train_settings))
    options = dict(data_options or {})
    if "layout" not in options:
        options["layout"] = scenes_layout(model)
    train = prepare_scenes("train", size, root, progress, **options)
    val = prepare_scenes("val", size, root, progress, **options)
    torch.manual_seed(config.seed)
    net = build(model, pretrained=is_bundle_name(model))  # a bundle is trained further, a zoo entry from scratch
    run_dir = Path(run_dir)
    Trainer(net, train, config, val_data=val, run_dir=run_dir, progress=progress).fit()
    best = run_dir / "best" if (run_dir / "best").is_dir() else run_dir / "final"
    return build(f"local-dir:{best}", pretrained=True)


def rank_texts_to_images(
    scores: np.ndarray, caption_image: np.ndarray, queries: Sequence[int], k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` images of each query caption: ``(indices [Q, k], correct [Q, k])``.

    Example:
        >>> rank_texts_to_images(np.array([[0.9, 0.1], [0.2, 0.8]]), np.array([0, 1]), [1], 2)[0].tolist()
        [[1, 0]]
    """
    columns = scores[:, list(queries)].T  # [Q, images]
    top = np.argsort(-columns, axis=1, kind="stable")[:, :k]
    return top, top == caption_image[list(queries)][:, None]


def rank_images_to_texts(
    scores: np.ndarray, caption_image: np.ndarray, queries: Sequence[int], k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` captions of each query image: ``(indices [Q, k], correct [Q, k])``.

    Example:
        >>> rank_images_to_texts(np.array([[0.9, 0.1], [0.2, 0.8]]), np.array([0, 1]), [0], 2)[0].tolist()
        [[0, 1]]
    """
    rows = scores[list(queries)]  # [Q, captions]
    top = np.argsort(-rows, axis=1, kind="stable")[:, :k]
    return top, caption_image[top] == np.asarray(list(queries))[:, None]


def token_labels(model: MatchingModel, caption: str) -> list[str]:
    """The caption's tokens that take part in the alignment, as the text encoder reads them
    (words for Bi-GRU / Bi-LSTM, word pieces for BERT).

    Example:
        >>> token_labels(xmatch.build("teran-mrsw-scenes"), "a Red 7, left of a circle")
        ['a', 'red', '7', ',', 'left', 'of', 'a', 'circle']
    """
    batch = model.tokenize([caption])
    ids = batch.inputs["input_ids"][0][batch.content[0]].tolist()
    encoder = model.text_encoder
    if hasattr(encoder, "vocabulary"):
        return [encoder.vocabulary.words[i] for i in ids]
    if hasattr(encoder, "tokenizer"):
        return list(encoder.tokenizer.convert_ids_to_tokens(ids))
    return [f"#{k}" for k in range(len(ids))]


def _image_id(dataset: TeranDataset | ImageCaptionsDataset, index: int) -> int:
    """The scene id of image ``index`` (a feature id, or ``images/<id>.png`` in the images layout)."""
    return int(Path(dataset.image_names[index]).stem)


def _image_file(dataset: TeranDataset | ImageCaptionsDataset, index: int) -> Path:
    return Path(dataset.root) / "images" / f"{_image_id(dataset, index)}.png"


def figures_table(result: EvalResult) -> str:
    """Recall@1/5/10 and NDCG ROUGE-L in both directions, and rsum.

    Example:
        >>> print(figures_table(result))  # needs a demo result  # doctest: +SKIP
                          R@1     R@5    R@10   NDCG ROUGE-L
        image -> text   41.00   78.00   89.00         0.6612
    """
    lines = [f"{'':16s}{'R@1':>8s}{'R@5':>8s}{'R@10':>8s}{'NDCG ROUGE-L':>15s}"]
    for name, figures in (("image -> text", result.i2t), ("text -> image", result.t2i)):
        ndcg = figures.get("ndcg_rougel")
        tail = f"{ndcg:15.4f}" if ndcg is not None else f"{'-':>15s}"
        lines.append(f"{name:16s}{figures['r1']:8.2f}{figures['r5']:8.2f}{figures['r10']:8.2f}{tail}")
    lines.append(f"{'rsum':16s}{result.rsum:8.2f}")
    return "\n".join(lines)


#: what a pooler's score is, for the printout (keys: pooler class names without "Pooler")
SCORES_EXPLAINED = {
    "MrSw": "the sum over the caption's words of each word's best region cosine (it grows with the number of "
            "words, so compare scores within one query)",
    "MwSr": "the sum over the image's regions of each region's best word cosine (it grows with the number of "
            "regions, so compare scores within one query)",
    "Symm": "MrSw + MwSr: each word's best region plus each region's best word (it grows with both counts, "
            "so compare scores within one query)",
    "MrAvgw": "the mean over the caption's words of each word's best region cosine (in [-1, 1])",
    "GlobalCosine": "the cosine of the image's and the caption's global vectors (in [-1, 1])",
}
#: which cosines of the region-word matrix each pooler sums (see demo_draw.used_cells)
POOLER_MARKS = {"MrSw": "words", "MrAvgw": "words", "MwSr": "regions", "Symm": "both"}


def pick_queries(ranks: np.ndarray, margins: np.ndarray, count: int) -> tuple[list[int], list[int]]:
    """Typical successes and typical failures: ``count`` of each, spread over the middle of
    their distributions (successes by the margin of the right answer over the best other,
    failures by the rank of the right answer), so neither the easiest nor the hopeless show.

    Args:
        ranks: 0-based rank of each query's right answer.
        margins: each query's score margin (right answer minus best other).
        count: how many of each.

    Returns:
        (success query indices, failure query indices), fewer when there are not enough.

    Example:
        >>> pick_queries(np.array([0, 0, 0, 3, 1, 0]), np.array([.5, .1, .3, -.2, -.1, .2]), 1)
        ([5], [3])
    """
    picked = []
    for chosen, key in ((np.flatnonzero(ranks == 0), -margins), (np.flatnonzero(ranks > 0), ranks)):
        ordered = chosen[np.argsort(key[chosen], kind="stable")]
        spots = (np.arange(1, count + 1) * len(ordered)) // (count + 1)
        picked.append(list(dict.fromkeys(ordered[spots].tolist())) if len(ordered) else [])
    return picked[0], picked[1]


def _z(values: np.ndarray) -> np.ndarray:
    std = values.std()
    return (values - values.mean()) / (std if std > 0 else 1.0)


def _t2i_ranking(scores: np.ndarray, test: Any, caption: int, outcome: str, k: int, twin_of: dict[int, int]) -> Ranking:
    owner = int(test.caption_image[caption])
    column = scores[:, caption]
    z = _z(column)
    order = np.argsort(-column, kind="stable")
    rank = int(np.flatnonzero(order == owner)[0]) + 1

    def hit(j: int, r: int) -> Hit:
        note = "twin" if twin_of.get(owner) == j else ""
        return Hit(f"image #{_image_id(test, j)}", float(column[j]), j == owner, note, r, float(z[j]))

    hits = [hit(int(j), r) for r, j in enumerate(order[:k], start=1)]
    truth = hit(owner, rank) if rank > k else None
    if truth is not None:
        truth.note = "the right one"
    return Ranking("t2i", f'"{test.captions[caption]}"', hits, outcome, rank, truth, caption)


def _i2t_ranking(scores: np.ndarray, test: Any, image: int, outcome: str, k: int, twin_of: dict[int, int]) -> Ranking:
    owner = np.asarray(test.caption_image)
    row = scores[image]
    z = _z(row)
    order = np.argsort(-row, kind="stable")
    right = owner[order] == image
    rank = int(np.flatnonzero(right)[0]) + 1

    def hit(j: int, r: int) -> Hit:
        note = "twin's" if twin_of.get(image) == owner[j] else ""
        return Hit(test.captions[j], float(row[j]), bool(owner[j] == image), note, r, float(z[j]))

    hits = [hit(int(j), r) for r, j in enumerate(order[:k], start=1)]
    truth = hit(int(order[rank - 1]), rank) if rank > k else None
    if truth is not None:
        truth.note = "the best right one"
    return Ranking("i2t", f"image #{_image_id(test, image)}", hits, outcome, rank, truth, image)


def showcase(scores: np.ndarray, test: Any, figures: EvalResult, count: int, top_k: int,
             twin_of: dict[int, int]) -> list[Ranking]:
    """The demo's queries: ``count`` typical successes and failures as captions querying the
    images, then ``max(1, count // 2)`` of each as images querying the captions.

    Example:
        >>> [r.outcome for r in showcase(scores, test, figures, 2, 5, twins(test))]  # needs a trained model's scores on the scenes benchmark  # doctest: +SKIP
        ['success', 'success', 'failure', 'failure', 'success', 'failure']
    """
    owner = np.asarray(test.caption_image)
    columns = np.arange(scores.shape[1])
    own = scores[owner, columns]
    rivals = np.where(np.arange(scores.shape[0])[:, None] == owner[None, :], -np.inf, scores).max(axis=0)
    win, lose = pick_queries(np.asarray(figures.queries["t2i_ranks"]), own - rivals, count)
    k_img = min(top_k, scores.shape[0])
    rankings = [_t2i_ranking(scores, test, q, "success", k_img, twin_of) for q in win]
    rankings += [_t2i_ranking(scores, test, q, "failure", k_img, twin_of) for q in lose]

    is_own = owner[None, :] == np.arange(scores.shape[0])[:, None]
    margin = np.where(is_own, scores, -np.inf).max(axis=1) - np.where(is_own, -np.inf, scores).max(axis=1)
    win, lose = pick_queries(np.asarray(figures.queries["i2t_ranks"]), margin, max(1, count // 2))
    k_txt = min(top_k, scores.shape[1])
    rankings += [_i2t_ranking(scores, test, i, "success", k_txt, twin_of) for i in win]
    rankings += [_i2t_ranking(scores, test, i, "failure", k_txt, twin_of) for i in lose]
    return rankings


def run_demo(
    model: str | MatchingModel = DEFAULT_MODEL,
    *,
    size: str = "small",
    out: str | os.PathLike = "demo-out",
    train: bool = False,
    recipe: str | None = None,
    root: str | os.PathLike | None = None,
    data_options: Mapping[str, Any] | None = None,
    train_settings: Mapping[str, Any] | None = None,
    queries: int = 2,
    top_k: int = 5,
    pair: int | None = None,
    progress: bool = True,
    report: Callable[[str], None] | None = None,
) -> DemoResult:
    """Run the demo: data, model, evaluation table, showcase queries, pictures.

    Args:
        model: a model, or a name with weights (loaded with ``pretrained=True``): a zoo entry
            that has some, ``local-dir:DIR`` or ``hf-hub:ORG/NAME``; with ``train``, any name
            ``xmatch.build`` takes (a spec ``.toml`` too).
        size: scenes preset (``tiny``, ``small``, ``large``); the test split is evaluated.
        out: folder for ``retrieval.png``, ``alignment.png`` (and ``train/`` with ``train``).
            Each output is written beside it and moved in when finished, so a demo that fails
            leaves the folder as it was (a finished training run is moved in at once and kept).
        train: train the model from scratch first with ``recipe`` (the entry's own recipe by
            default, else ``scenes-teran``).
        recipe: the training recipe with ``train``.
        root: scenes cache folder (default ``$XMATCH_HOME/datasets/scenes``).
        data_options: more scenes options (``backbone``, ``weights``, ``seed``, ...).
        train_settings: recipe overrides, e.g. ``{"epochs": 1}``.
        queries: typical successes and failures shown of captions querying images (half as
            many of images querying captions).
        top_k: results per query.
        pair: test image whose first caption's alignment is drawn (default: the first
            success shown).
        progress: progress bars while generating data, training and encoding.
        report: called with each piece of the demo's report (a line, a table, a ranking) as it
            goes; ``xmatch demo`` prints them. Default: logged at INFO level (``xmatch.demo.run``).

    Returns:
        The figures, rankings, written files and the model.

    Raises:
        xmatch.demo.staging.OutputFolderError: before anything runs, ``out`` is a file, or
            with ``train`` ``out/train`` holds files.

    Example:
        >>> run_demo(size="small", out="demo-out").files["retrieval"]  # runs the whole demo (minutes)  # doctest: +SKIP
        PosixPath('demo-out/retrieval.png')
    """
    if train:
        check_new_folder(Path(out) / "train", "the training run")
    say = report or logger.info
    # Outputs are written beside `out` and moved in when finished: a failed demo leaves `out` as it was.
    with StagedOutput(out) as stage:
        # a name is loaded first: a model without weights is refused before the data are made
        loaded = load_trained_model(model) if isinstance(model, str) and not train else None
        options = dict(data_options or {})
        if "layout" not in options:  # a name outside the zoo is built to read its spec: only when needed
            options["layout"] = scenes_layout(loaded if loaded is not None else model)
        result = _run_steps(model, loaded, stage, size=size, train=train, recipe=recipe, root=root, options=options,
                            train_settings=train_settings, queries=queries, top_k=top_k, pair=pair,
                            progress=progress, say=say)
    for path in result.files.values():
        say(f"      wrote {path}")
    return result


def _run_steps(
    model: str | MatchingModel, loaded: MatchingModel | None, stage: StagedOutput, *, size: str, train: bool,
    recipe: str | None, root: str | os.PathLike | None, options: dict[str, Any], train_settings: Mapping[str, Any] | None,
    queries: int, top_k: int, pair: int | None, progress: bool, say: Callable[[str], None],
) -> DemoResult:
    """The demo's five steps, writing into ``stage``; each output is committed when complete."""
    from xmatch.eval.relevance import relevance_matrix
    from xmatch.io.hub import cache_dir

    say(f"[1/5] scenes benchmark ({size}): generated on first use, then read from the cache")
    test = prepare_scenes("test", size, root, progress, **options)
    say(f"      {test!r}")
    if train:
        recipe = recipe or (RECIPES.get(model, DEFAULT_RECIPE) if isinstance(model, str) else DEFAULT_RECIPE)
        say(f"[2/5] training {model if isinstance(model, str) else 'the given model'} from scratch, recipe '{recipe}'")
        net = train_demo_model(
            model.spec if isinstance(model, MatchingModel) else model, stage.path / "train", recipe=recipe,
            size=size, root=root, data_options=options, train_settings=train_settings, progress=progress,
        )
        say(f"      the training run is in {stage.commit('train')} (kept should a later step fail)")
    elif isinstance(model, MatchingModel):
        say("[2/5] model: the given model")
        net = model
    else:
        say(f"[2/5] model: {model} (pretrained=True)")
        net = loaded
    net.eval()

    say("[3/5] evaluating on the test split")
    c = test.captions_per_image
    encoded = encode_dataset(net, test, image_batch_size=IMAGE_BATCH, text_batch_size=TEXT_BATCH, progress=progress)
    scores = score_blocks(net, encoded, fold_layout(test.num_images, "full"), c, progress=progress)[0]
    relevance = {"rougel": relevance_matrix(
        test.captions, "rougel", c, cache_dir=cache_dir() / "relevance", progress=progress)}
    figures = evaluate_blocks([scores], "full", c, relevance)
    say(figures_table(figures))
    groups = score_groups(scores, scene_groups(test))
    g = groups.overall
    say(f"twins: {g['t2i']:.1f}% of the captions score their own scene above its twin (chance {g['t2i_chance']:.0f}%); "
        f"Winoground group score {g['group']:.1f}% (chance {g['group_chance']:.1f}%). "
        "`xmatch eval ... --protocol groups` breaks this down by kind of difference.")

    pooler = type(net.pooler).__name__.removesuffix("Pooler")
    try:  # the name a spec uses ("global-cosine"), else the class's
        shown = str(net.spec["pooler"]["name"])
    except (AttributeError, KeyError, TypeError):
        shown = pooler
    say("[4/5] typical successes and failures (* = a right answer)")
    say(f"      score: {shown}, {SCORES_EXPLAINED.get(pooler, 'the model similarity')}; z: how many standard "
        "deviations it stands above the mean score of all candidates of that query")
    twin_of = twins(test)
    rankings = showcase(scores, test, figures, queries, top_k, twin_of)
    for ranking in rankings:
        say(ranking.text())

    say(f"[5/5] pictures in {stage.out}/")
    t2i = [r for r in rankings if r.direction == "t2i"]
    files = {"retrieval": _write_grid(test, t2i, stage.path / "retrieval.png")}
    if getattr(net.pooler, "uses_tokens", True) and pooler in POOLER_MARKS:
        success = next((r.index for r in t2i if r.outcome == "success"), t2i[0].index if t2i else 0)
        caption = pair * c if pair is not None else success
        files["alignment"] = _write_alignment(net, test, encoded, caption, POOLER_MARKS[pooler],
                                              stage.path / "alignment.png")
    else:
        say(f"      no alignment picture: {shown} does not score with the region-word matrix (TERN's global-cosine "
            "compares two global vectors), so there is no alignment to show")
    files = {key: stage.commit(path.name) for key, path in files.items()}  # both drawn: both move in
    return DemoResult(figures, rankings, files, net, groups)


def _on_objects(test: Any, image: int, boxes: np.ndarray) -> np.ndarray | None:
    """Per box: does its centre lie on a drawn object of the scene (None when unknown)."""
    from xmatch.scenes.dataset import read_scenes

    try:
        record = {r["id"]: r for r in read_scenes(test.root)}[_image_id(test, image)]
        side = float(json.loads((Path(test.root) / "sizes.json").read_text())[str(record["id"])][0])
    except (FileNotFoundError, KeyError, ValueError):
        return None
    objects = np.array([o["box"] for o in record["objects"]], dtype=np.float64) / side
    centre = np.c_[(boxes[:, 0] + boxes[:, 2]) / 2, (boxes[:, 1] + boxes[:, 3]) / 2]
    inside = ((centre[:, None, 0] >= objects[None, :, 0]) & (centre[:, None, 0] <= objects[None, :, 2])
              & (centre[:, None, 1] >= objects[None, :, 1]) & (centre[:, None, 1] <= objects[None, :, 3]))
    return inside.any(axis=1)


def _write_alignment(
    net: MatchingModel, test: TeranDataset | ImageCaptionsDataset, encoded: Any, caption: int, marks: str, path: Path
) -> Path:
    from PIL import Image

    from xmatch.demo.draw import draw_alignment

    if not 0 <= caption < len(test.captions):
        raise ValueError(f"pair must be a test image index in [0, {test.num_images}).")
    image = int(test.caption_image[caption])
    with torch.inference_mode():
        img = encoded.images[image]
        matrix = net.alignment(img, encoded.captions[caption]).float().cpu().numpy()
    # Token t of the image is region t (padding, if any, comes last): keep the real ones' boxes.
    real = img.mask[0].cpu().numpy()
    carried = None if img.boxes is None else img.boxes[0].float().cpu().numpy()
    words = token_labels(net, test.captions[caption])
    grid = input_type_of(net.image_encoder) is PixelInputs
    with Image.open(_image_file(test, image)) as picture:
        if grid:  # grid cells, drawn where they lie in the original image
            boxes = net.image_encoder.image_boxes(*picture.size).numpy()[: len(real)][real]
        elif carried is not None:  # the regions' boxes, carried by the embeddings
            boxes = carried[real]
        else:
            boxes = test.image(image).boxes[: len(real)][real]
        pooler = type(net.pooler).__name__.removesuffix("Pooler")
        unit = "cell" if grid else "region"
        notes = [f"{pooler} sums the cosines marked with a dot: "
                 + {"words": f"each word's best {unit}", "regions": f"each {unit}'s best word",
                    "both": f"each word's best {unit} and each {unit}'s best word"}[marks]
                 + f". Rows: the {unit}s the score reads, numbered as on the image"
                 + ("." if marks == "words" else f" (of the {unit}s' best words, the 12 strongest shown).")]
        on_object = _on_objects(test, image, boxes)
        if on_object is not None:
            best = matrix.argmax(axis=0)
            notes.append(f"{int(on_object[best].sum())} of {len(words)} words read a {unit} whose centre lies on a "
                         f"drawn object; the others read background{' cells' if grid else ' proposals'}.")
        drawing = draw_alignment(
            picture, boxes, words, matrix, marks=marks, notes=notes,
            title=f"image #{_image_id(test, image)}: \"{test.captions[caption]}\"",
        )
    drawing.save(path)
    return path


def _write_grid(test: TeranDataset | ImageCaptionsDataset, rankings: Sequence[Ranking], path: Path) -> Path:
    from PIL import Image

    from xmatch.demo.draw import GridRow, draw_retrieval_grid

    by_label = {f"image #{_image_id(test, j)}": j for j in range(test.num_images)}

    def picture(label: str) -> Image.Image:
        with Image.open(_image_file(test, by_label[label])) as im:
            return im.convert("RGB")

    def caption(hit: Hit) -> str:
        return f"{hit.rank}. #{hit.label.split('#')[1]}  z {hit.z:+.1f}"

    rows = []
    for r in rankings:
        truth = (picture(r.truth.label), caption(r.truth)) if r.truth is not None else None
        rows.append(GridRow(r.query.strip('"'), [picture(h.label) for h in r.hits], [caption(h) for h in r.hits],
                            [h.correct for h in r.hits], [h.note == "twin" for h in r.hits], r.headline(), truth))
    draw_retrieval_grid(rows).save(path)
    return path
