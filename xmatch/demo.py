"""``xmatch demo``: TERAN end to end on the built-in ``scenes`` benchmark, offline.

Prepares the scenes data (generated once into the cache), loads the demo model shipped with
xmatch (or trains one from scratch with the shipped recipe), evaluates it with the papers'
protocol (Recall@K both ways, NDCG@25 with ROUGE-L relevance), prints text-to-image and
image-to-text rankings, and draws the region-word alignment of one pair (as Figure 7 of
TERAN: Messina et al., "Fine-grained Visual Textual Alignment for Cross-Modal Retrieval using
Transformer Encoders", ACM TOMM 2021) and a retrieval grid. See docs/demo.md.

Example:
    >>> from xmatch.demo import run_demo
    >>> result = run_demo(out="demo-out")  # doctest: +SKIP
    >>> result.figures.t2i["r1"], result.files["alignment"]  # doctest: +SKIP
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import torch

from xmatch.data import ImageCaptionsDataset, TeranDataset
from xmatch.data.scenes import twins
from xmatch.eval import (
    EvalResult,
    encode_dataset,
    evaluate_blocks,
    fold_layout,
    score_blocks,
)
from xmatch.model import MatchingModel

DEFAULT_MODEL = "teran-mrsw-scenes"
DEFAULT_RECIPE = "scenes-teran"
# The recipe each demo entry was trained with (docs/demo.md); other models use DEFAULT_RECIPE.
RECIPES = {"teran-mrsw-scenes": "scenes-teran", "tern-scenes": "scenes-tern", "teran-mrsw-grid-scenes": "scenes-teran"}
# The batch sizes of `xmatch eval` (--batch-size 64, captions 4x): the same figures to the digit.
IMAGE_BATCH, TEXT_BATCH = 64, 256


@dataclass
class Hit:
    """One retrieved item: its label (image id or caption), score, and whether it is right."""

    label: str
    score: float
    correct: bool
    note: str = ""


@dataclass
class Ranking:
    """A query and its top-k results, best first."""

    direction: str  # "t2i" or "i2t"
    query: str
    hits: list[Hit]

    def text(self) -> str:
        """The ranking as printed by the demo: ``*`` marks a correct result."""
        arrow = "text -> image" if self.direction == "t2i" else "image -> text"
        lines = [f"{arrow}: {self.query}"]
        for k, hit in enumerate(self.hits, start=1):
            note = f"  ({hit.note})" if hit.note else ""
            lines.append(f"  {k:2d}. {'*' if hit.correct else ' '} {hit.score:7.4f}  {hit.label}{note}")
        return "\n".join(lines)


@dataclass
class DemoResult:
    """What :func:`run_demo` measured and wrote.

    Attributes:
        figures: the evaluation (Recall@K, ranks, NDCG ROUGE-L, both directions).
        rankings: the text-to-image then image-to-text queries.
        files: ``{"alignment": path, "retrieval": path}``, the pictures written.
        model: the model evaluated.
    """

    figures: EvalResult
    rankings: list[Ranking]
    files: dict[str, Path]
    model: MatchingModel = field(repr=False)


def prepare_scenes(
    split: str, size: str = "small", root: str | os.PathLike | None = None, progress: bool = True, **options: Any
) -> TeranDataset | ImageCaptionsDataset:
    """Open a split of the scenes benchmark, generating it into the cache the first time
    (``layout="images"`` for models that take pixels).

    Example:
        >>> prepare_scenes("test").num_images  # doctest: +SKIP
        100
    """
    from xmatch.data.scenes import open_scenes

    return open_scenes(root, split, size=size, progress=progress, **options)


def scenes_layout(model: str | Mapping[str, Any] | MatchingModel) -> str:
    """The scenes layout a model reads: ``"images"`` when its image encoder takes pixels
    (``timm-grid``), else ``"regions"``.

    Example:
        >>> scenes_layout("teran-mrsw-grid-scenes")
        'images'
    """
    import xmatch
    from xmatch.registry import image_encoders

    if isinstance(model, MatchingModel):
        return "images" if model.image_encoder.takes_pixels else "regions"
    spec = xmatch.info(model).spec if isinstance(model, str) else model
    encoder = image_encoders.get(spec["image_encoder"]["name"])
    return "images" if getattr(encoder, "takes_pixels", False) else "regions"


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
        >>> net = train_demo_model("teran-mrsw-scenes", "runs/demo")  # doctest: +SKIP
    """
    import xmatch
    from xmatch.train import Trainer, load_recipe

    config = load_recipe(recipe)
    if train_settings:
        config = config.merged(dict(train_settings))
    options = dict(data_options or {})
    options.setdefault("layout", scenes_layout(model))
    train = prepare_scenes("train", size, root, progress, **options)
    val = prepare_scenes("val", size, root, progress, **options)
    torch.manual_seed(config.seed)
    net = xmatch.build(model)
    run_dir = Path(run_dir)
    Trainer(net, train, config, val_data=val, run_dir=run_dir, progress=progress).fit()
    best = run_dir / "best" if (run_dir / "best").is_dir() else run_dir / "final"
    return xmatch.build(f"local-dir:{best}", pretrained=True)


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
        >>> token_labels(model, "a Red 7, left of a circle")  # doctest: +SKIP
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
        >>> print(figures_table(result))  # doctest: +SKIP
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
    queries: int = 3,
    top_k: int = 5,
    pair: int = 0,
    progress: bool = True,
    stream: TextIO | None = None,
) -> DemoResult:
    """Run the demo: data, model, evaluation table, ranked queries, pictures.

    Args:
        model: a zoo entry with weights (loaded with ``pretrained=True``), or a model.
        size: scenes preset (``tiny``, ``small``, ``large``); the test split is evaluated.
        out: folder for ``alignment.png``, ``retrieval.png`` (and ``train/`` with ``train``).
        train: train ``model`` (a zoo name or spec) from scratch with ``recipe`` instead of
            loading its weights.
        recipe: the training recipe (default: the one the entry was trained with, else
            ``scenes-teran``).
        root: scenes cache folder (default ``$XMATCH_HOME/datasets/scenes``).
        data_options: more scenes options (``backbone``, ``weights``, ``seed``, ...).
        train_settings: recipe overrides, e.g. ``{"epochs": 1}``.
        queries: how many queries of each direction to print.
        top_k: results per query.
        pair: test image whose first caption's alignment is drawn.
        progress: progress bars while generating data, training and encoding.
        stream: where to print (default stdout).

    Returns:
        The figures, rankings, written files and the model.

    Example:
        >>> run_demo(size="small", out="demo-out").files["alignment"]  # doctest: +SKIP
        PosixPath('demo-out/alignment.png')
    """
    import xmatch
    from xmatch.eval.relevance import relevance_matrix
    from xmatch.hub import cache_dir

    stream = stream or sys.stdout
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    options = dict(data_options or {})
    options.setdefault("layout", scenes_layout(model))

    def say(text: str) -> None:
        print(text, file=stream, flush=True)

    say(f"[1/5] scenes benchmark ({size}): generated on first use, then read from the cache")
    test = prepare_scenes("test", size, root, progress, **options)
    say(f"      {test!r}")
    if train:
        recipe = recipe or (RECIPES.get(model, DEFAULT_RECIPE) if isinstance(model, str) else DEFAULT_RECIPE)
        say(f"[2/5] training {model if isinstance(model, str) else 'the given model'} from scratch, recipe '{recipe}'")
        net = train_demo_model(
            model.spec if isinstance(model, MatchingModel) else model, out / "train", recipe=recipe, size=size,
            root=root, data_options=options, train_settings=train_settings, progress=progress,
        )
    elif isinstance(model, MatchingModel):
        say("[2/5] model: the given model")
        net = model
    else:
        say(f"[2/5] model: {model} (pretrained=True)")
        net = xmatch.build(model, pretrained=True)
    net.eval()

    say("[3/5] evaluating on the test split")
    c = test.captions_per_image
    encoded = encode_dataset(net, test, image_batch_size=IMAGE_BATCH, text_batch_size=TEXT_BATCH, progress=progress)
    scores = score_blocks(net, encoded, fold_layout(test.num_images, "full"), c, progress=progress)[0]
    relevance = {"rougel": relevance_matrix(
        test.captions, "rougel", c, cache_dir=cache_dir() / "relevance", progress=progress)}
    figures = evaluate_blocks([scores], "full", c, relevance)
    say(figures_table(figures))

    say("[4/5] queries (* = correct)")
    caption_image = np.asarray(test.caption_image)
    images = np.unique(np.linspace(0, test.num_images - 1, min(queries, test.num_images)).round().astype(int))
    twin_of = twins(test)
    rankings: list[Ranking] = []
    k_img = min(top_k, test.num_images)
    top, right = rank_texts_to_images(scores, caption_image, [int(i) * c for i in images], k_img)
    for image, row, ok in zip(images, top, right):
        hits = [Hit(f"image #{_image_id(test, j)}", float(scores[j, image * c]), bool(o),
                    "twin" if twin_of.get(int(image)) == j else "") for j, o in zip(row, ok)]
        rankings.append(Ranking("t2i", f'"{test.captions[image * c]}"', hits))
    top, right = rank_images_to_texts(scores, caption_image, list(images), min(top_k, len(test.captions)))
    for image, row, ok in zip(images, top, right):
        hits = [Hit(test.captions[j], float(scores[image, j]), bool(o),
                    "twin's" if twin_of.get(int(image)) == caption_image[j] else "") for j, o in zip(row, ok)]
        rankings.append(Ranking("i2t", f"image #{_image_id(test, image)}", hits))
    for ranking in rankings:
        say(ranking.text())

    say(f"[5/5] pictures in {out}/")
    files = {
        "alignment": _write_alignment(net, test, encoded, pair, out / "alignment.png"),
        "retrieval": _write_grid(test, scores, caption_image, images, k_img, out / "retrieval.png"),
    }
    for path in files.values():
        say(f"      wrote {path}")
    return DemoResult(figures, rankings, files, net)


def _write_alignment(
    net: MatchingModel, test: TeranDataset | ImageCaptionsDataset, encoded: Any, pair: int, path: Path
) -> Path:
    from PIL import Image

    from xmatch.demo_draw import draw_alignment

    if not 0 <= pair < test.num_images:
        raise ValueError(f"pair must be a test image index in [0, {test.num_images}), got {pair}.")
    caption = pair * test.captions_per_image
    with torch.inference_mode():
        img = encoded.images[pair]
        matrix = net.alignment(img, encoded.captions[caption]).float().cpu().numpy()
    # Token t of the image is region t (padding, if any, comes last): keep the real ones' boxes.
    real = img.mask[0].cpu().numpy()
    words = token_labels(net, test.captions[caption])
    with Image.open(_image_file(test, pair)) as picture:
        if net.image_encoder.takes_pixels:  # grid cells, drawn where they lie in the original image
            boxes = net.image_encoder.image_boxes(*picture.size).numpy()[: len(real)][real]
        else:
            boxes = test.image(pair).boxes[: len(real)][real]
        drawing = draw_alignment(
            picture, boxes, words, matrix, title=f"image #{_image_id(test, pair)}: \"{test.captions[caption]}\""
        )
    drawing.save(path)
    return path


def _write_grid(
    test: TeranDataset | ImageCaptionsDataset, scores: np.ndarray, caption_image: np.ndarray, images: np.ndarray, k: int, path: Path
) -> Path:
    from PIL import Image

    from xmatch.demo_draw import GridRow, draw_retrieval_grid

    c = test.captions_per_image
    top, right = rank_texts_to_images(scores, caption_image, [int(i) * c for i in images], k)
    rows = []
    for image, row, ok in zip(images, top, right):
        pictures = []
        for j in row:
            with Image.open(_image_file(test, int(j))) as im:
                pictures.append(im.convert("RGB"))
        labels = [f"#{_image_id(test, j)} {scores[j, image * c]:.3f}" for j in row]
        rows.append(GridRow(test.captions[image * c], pictures, labels, [bool(o) for o in ok]))
    draw_retrieval_grid(rows).save(path)
    return path
