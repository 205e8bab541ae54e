"""Caption relevance matrices for NDCG@25: compute, cache, load the authors' files.

NDCG@25 in TERAN (Messina et al., "Fine-grained Visual Textual Alignment for Cross-Modal
Retrieval using Transformer Encoders", TOMM 2021, `evaluate_utils/`) grades a retrieved image
by how well its captions match the query caption. ``rel[q, j]`` is the relevance of image j for
caption query q, shape ``(n_captions, n_images)``, float32; image j owns the captions
``j * c .. j * c + c - 1`` (``c = captions_per_image``, 5 for COCO and Flickr30k). This is the
layout `xmatch.eval.metrics` and `xmatch.eval.protocol` consume (REFERENCE.md B8).

Methods (``relevance_matrix(method=...)``):

- ``rougel``: the original ROUGE-L (`evaluate_utils/rouge.py`), bit-equal to the authors'
  scorer; token-level LCS in C++ through ``rapidfuzz``.
- ``rouge-score``: the ``rouge-score`` package's ROUGE-L F-measure, maximum over the image's
  captions. Pure Python, slow.
- ``spice``: the Java SPICE 1.0 F-score (`xmatch.eval.spice`).

Results can be cached on disk (``cache_dir``), and the authors' raw float32 files read and
written (`load_original_relevance`, `save_original_relevance`, `original_relevance_path`).
"""

from __future__ import annotations

import difflib
import hashlib
import inspect
import json
import math
import os
import tempfile
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from xmatch.io.files import move_into_place
from xmatch.core.optional import require
from xmatch.eval.captions import check_captions
from xmatch.eval.spice import spice_relevance
from xmatch.core.progress import progress_bar

EVAL_EXTRA = "xmatch-zoo[eval]"
ORIGINAL_METHODS = {"rougel": "rougeL", "spice": "spice"}
# LCS values (queries x all captions) in flight over all threads: 25M int32 plus the float64
# temporaries of the reduction stay under 1 GB.
_BLOCK_ELEMENTS = 25_000_000
_CACHE_FORMAT = 1


def _tokens(caption: str) -> list[str]:
    # the original tokenizer: no punctuation stripping, "a  b" and "a b " give empty tokens
    return caption.lower().split(" ")


def _combine(p_max: Any, r_max: Any, beta: float) -> Any:
    # the original's expression and evaluation order, so float64 results are bit-equal
    b2 = beta**2
    return ((1 + b2) * p_max * r_max) / (r_max + b2 * p_max)


def _lcs(a: Sequence[str], b: Sequence[str]) -> int:
    previous = [0] * (len(b) + 1)
    for x in a:
        current = [0]
        for j, y in enumerate(b):
            current.append(previous[j] + 1 if x == y else max(previous[j + 1], current[j]))
        previous = current
    return previous[-1]


def rougel_score(query: str, references: Sequence[str], beta: float = 1.2) -> float:
    """ROUGE-L of one query caption against one image's captions, as the original computes it.

    The definitional (pure Python) version of ``method="rougel"``: tokens are
    ``caption.lower().split(" ")``; for each reference, P = LCS/len(query) and
    R = LCS/len(reference); P_max and R_max are taken separately over the references and
    ``score = (1 + beta²) P_max R_max / (R_max + beta² P_max)``, 0 if either is 0.

    Example:
        >>> rougel_score("a dog runs", ["a dog runs", "a cat"])
        1.0
        >>> round(rougel_score("a dog.", ["a dog"]), 4)
        0.5
    """
    q = _tokens(query)
    lcs = [_lcs(q, _tokens(ref)) for ref in references]
    p_max = max(n / len(q) for n in lcs)
    r_max = max(n / len(_tokens(ref)) for n, ref in zip(lcs, references))
    return float(_combine(p_max, r_max, beta)) if p_max and r_max else 0.0


def rougel_relevance(
    captions: Sequence[str],
    captions_per_image: int = 5,
    *,
    beta: float = 1.2,
    block_size: int | None = None,
    workers: int | None = None,
    progress: bool = True,
) -> np.ndarray:
    """The original TERAN ROUGE-L relevance matrix, ``(n_captions, n_images)`` float32.

    Same definition as `rougel_score` for every (caption, image) pair, vectorised: captions are
    mapped to integer token ids, rapidfuzz computes the token-level LCS of every caption pair in
    C++ (``process.cdist`` with ``LCSseq.similarity``), and numpy reduces each image's group of
    captions to P_max / R_max in float64, as Python does, before the final cast to float32.
    The result is bit-equal to the authors' file for the eval-small fixture (1250 captions).

    Args:
        captions: all captions, image by image.
        captions_per_image: captions of each image.
        beta: the F-measure weight; the original uses 1.2.
        block_size: query captions per block (default: about 25M LCS values in flight over
            all threads, 500 queries per block for COCO 5K on 2 cores); the result does not
            depend on it.
        workers: threads, each computing one block (default: all cores).
        progress: show a tqdm bar over the blocks.

    Example:
        >>> rougel_relevance(["a dog", "the dog", "a cat", "two cats"], 2, progress=False)
        array([[1. , 0.5],
               [1. , 0. ],
               [0.5, 1. ],
               [0. , 1. ]], dtype=float32)
    """
    process = require("rapidfuzz.process", EVAL_EXTRA, "relevance method 'rougel'")
    LCSseq = require("rapidfuzz.distance", EVAL_EXTRA, "relevance method 'rougel'").LCSseq
    captions = check_captions(captions, captions_per_image)
    vocabulary: dict[str, int] = {}
    sequences = [[vocabulary.setdefault(t, len(vocabulary)) for t in _tokens(c)] for c in captions]
    lengths = np.array([len(s) for s in sequences], dtype=np.float64)
    n, c = len(captions), captions_per_image
    if block_size is not None and block_size < 1:
        raise ValueError(f"block_size must be positive, got {block_size}.")
    threads = workers or os.cpu_count() or 1
    step = block_size or max(1, _BLOCK_ELEMENTS // (n * threads))
    out = np.empty((n, n // c), dtype=np.float32)
    ref_lengths = lengths.reshape(1, -1, c)

    def block(start: int) -> None:
        stop = min(start + step, n)
        lcs = process.cdist(sequences[start:stop], sequences, scorer=LCSseq.similarity, dtype=np.int32)
        lcs = lcs.reshape(stop - start, -1, c)
        # P_max = max(lcs) / len(query): dividing by a positive constant is monotone, so this
        # equals the original max of the quotients bit for bit
        p_max = lcs.max(axis=2) / lengths[start:stop, None]
        r_max = (lcs / ref_lengths).max(axis=2)
        with np.errstate(divide="ignore", invalid="ignore"):
            score = _combine(p_max, r_max, beta)
        out[start:stop] = np.where((p_max != 0) & (r_max != 0), score, 0.0)

    # one block per thread: rapidfuzz and numpy release the GIL, so LCS and reductions overlap
    starts = range(0, n, step)
    with ThreadPoolExecutor(threads) as pool:
        for _ in progress_bar(pool.map(block, starts), total=len(starts), desc="ROUGE-L", unit="block", show=progress):
            pass
    return out


class _RougeScoreRows:
    """Rows of the rouge-score relevance matrix (a picklable worker for the process pool)."""

    def __init__(self, captions: list[str], captions_per_image: int, use_stemmer: bool) -> None:
        from rouge_score import rouge_scorer

        self.captions = captions
        self.c = captions_per_image
        self.scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=use_stemmer)

    def __call__(self, start: int, stop: int) -> np.ndarray:
        groups = [self.captions[j : j + self.c] for j in range(0, len(self.captions), self.c)]
        rows = np.empty((stop - start, len(groups)), dtype=np.float64)
        for i, query in enumerate(self.captions[start:stop]):
            # score_multi keeps the reference with the largest F-measure
            rows[i] = [self.scorer.score_multi(refs, query)["rougeL"].fmeasure for refs in groups]
        return rows


_WORKER: _RougeScoreRows | None = None


def _init_worker(captions: list[str], captions_per_image: int, use_stemmer: bool) -> None:
    global _WORKER
    _WORKER = _RougeScoreRows(captions, captions_per_image, use_stemmer)


def _worker_rows(bounds: tuple[int, int]) -> tuple[int, np.ndarray]:
    assert _WORKER is not None, "the pool initializer did not run"
    return bounds[0], _WORKER(*bounds)


def rouge_score_relevance(
    captions: Sequence[str],
    captions_per_image: int = 5,
    *,
    use_stemmer: bool = False,
    block_size: int = 16,
    workers: int | None = None,
    progress: bool = True,
) -> np.ndarray:
    """ROUGE-L relevance from the ``rouge-score`` package, ``(n_captions, n_images)`` float32.

    ``rel[q, j]`` is the largest ``RougeScorer(["rougeL"]).score(ref, query).fmeasure`` over the
    captions ``ref`` of image j (``RougeScorer.score_multi``). rouge-score lowercases, replaces
    non-alphanumeric characters by spaces and uses beta = 1 (plain F1), so it differs from the
    original TERAN ROUGE-L (``method="rougel"``). Pure Python: about 0.15 ms per (query, image)
    pair and core, 47 s for 1,250 captions on one core and some 5 core-hours for COCO 5K.

    Args:
        captions: all captions, image by image.
        captions_per_image: captions of each image.
        use_stemmer: Porter stemming in rouge-score's tokenizer.
        block_size: query captions per task.
        workers: processes (default: all cores; 1 computes in this process).
        progress: show a tqdm bar over the queries.

    Example:
        >>> rouge_score_relevance(["a dog", "the dog", "a cat", "two cats"], 2, progress=False)[0]
        array([1. , 0.5], dtype=float32)
    """
    require("rouge_score.rouge_scorer", EVAL_EXTRA, "relevance method 'rouge-score'")
    captions = check_captions(captions, captions_per_image)
    if block_size < 1:
        raise ValueError(f"block_size must be positive, got {block_size}.")
    n = len(captions)
    out = np.empty((n, n // captions_per_image), dtype=np.float32)
    bounds = [(s, min(s + block_size, n)) for s in range(0, n, block_size)]
    workers = (os.cpu_count() or 1) if workers is None else workers
    bar = progress_bar(total=n, desc="rouge-score", unit="caption", show=progress)
    with bar:
        if workers <= 1:
            rows = _RougeScoreRows(captions, captions_per_image, use_stemmer)
            for start, stop in bounds:
                out[start:stop] = rows(start, stop)
                bar.update(stop - start)
        else:
            init = (captions, captions_per_image, use_stemmer)
            with ProcessPoolExecutor(workers, initializer=_init_worker, initargs=init) as pool:
                for start, block in pool.map(_worker_rows, bounds):
                    out[start : start + len(block)] = block
                    bar.update(len(block))
    return out


@dataclass(frozen=True)
class _Method:
    compute: Callable[..., np.ndarray]
    # options that change the numbers, hence the cache key (the others only change how fast)
    result_options: tuple[str, ...]


_METHODS: dict[str, _Method] = {
    "rougel": _Method(rougel_relevance, ("beta",)),
    "rouge-score": _Method(rouge_score_relevance, ("use_stemmer",)),
    "spice": _Method(spice_relevance, ("nan_value",)),
}


def _method(name: str) -> tuple[str, _Method]:
    key = name.lower().replace("_", "-")
    if key not in _METHODS:
        close = difflib.get_close_matches(key, _METHODS, n=2)
        hint = f" Did you mean {close}?" if close else ""
        raise ValueError(f"unknown relevance method '{name}'. Available: {sorted(_METHODS)}.{hint}")
    return key, _METHODS[key]


def _options(key: str, method: _Method, options: dict[str, Any]) -> dict[str, Any]:
    parameters = inspect.signature(method.compute).parameters
    accepted = [p for p in parameters if p not in ("captions", "captions_per_image", "workers", "progress")]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for method '{key}'. Accepted: {accepted}.")
    return {name: options.get(name, parameters[name].default) for name in method.result_options}


def relevance_cache_path(
    captions: Sequence[str],
    cache_dir: str | os.PathLike,
    method: str = "rougel",
    captions_per_image: int = 5,
    **method_options: Any,
) -> Path:
    """Where `relevance_matrix` caches a result: ``<cache_dir>/<method>-<Q>x<N>-<hash>.npy``.

    The hash (sha256, 16 hex digits) covers the method, the options that change the numbers
    (defaults filled in), ``captions_per_image`` and every caption, so editing one caption or
    one option gives a new file.

    Example:
        >>> relevance_cache_path(["a dog", "a cat"], "/tmp/rel", captions_per_image=1).name[:11]
        'rougel-2x2-'
    """
    key, method_ = _method(method)
    captions = check_captions(captions, captions_per_image)
    header = {"format": _CACHE_FORMAT, "method": key, "captions_per_image": captions_per_image}
    header["options"] = _options(key, method_, method_options)
    digest = hashlib.sha256(json.dumps(header, sort_keys=True).encode())
    for caption in captions:
        encoded = caption.encode("utf-8", "surrogatepass")
        digest.update(len(encoded).to_bytes(8, "little") + encoded)
    n = len(captions)
    return Path(cache_dir) / f"{key}-{n}x{n // captions_per_image}-{digest.hexdigest()[:16]}.npy"


def _atomic_write(path: Path, write: Callable[[Any], None]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        move_into_place(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def relevance_matrix(
    captions: Sequence[str],
    method: str = "rougel",
    captions_per_image: int = 5,
    cache_dir: str | os.PathLike | None = None,
    workers: int | None = None,
    progress: bool = True,
    **method_options: Any,
) -> np.ndarray:
    """Relevance of every image for every caption query, ``(n_captions, n_images)`` float32.

    Args:
        captions: all captions, image by image (caption k belongs to image
            ``k // captions_per_image``).
        method: ``rougel`` (the original TERAN ROUGE-L, also spelled ``rougeL``),
            ``rouge-score`` (the rouge-score package) or ``spice`` (Java SPICE 1.0).
        captions_per_image: captions of each image.
        cache_dir: if given, the result is stored there as a standard ``.npy`` file named by
            `relevance_cache_path` (written atomically) and later calls load it.
        workers: parallelism: rapidfuzz threads (``rougel``), processes (``rouge-score``) or
            SPICE's ``-threads`` (``spice``); default all cores.
        progress: show a tqdm progress bar.
        **method_options: options of `rougel_relevance`, `rouge_score_relevance` or
            `xmatch.eval.spice.spice_relevance` (``beta``, ``use_stemmer``, ``jar``, ...).

    Example:
        >>> caps = ["a dog runs", "the dog runs", "a red car", "two cars"]
        >>> relevance_matrix(caps, captions_per_image=2, progress=False).tolist()[0]
        [1.0, 0.3333333432674408]
    """
    key, method_ = _method(method)
    captions = check_captions(captions, captions_per_image)
    _options(key, method_, method_options)
    expected = (len(captions), len(captions) // captions_per_image)
    path = None
    if cache_dir is not None:
        path = relevance_cache_path(captions, cache_dir, key, captions_per_image, **method_options)
        if path.is_file():
            try:
                cached = np.load(path)
            except (OSError, ValueError, EOFError) as e:
                warnings.warn(f"ignoring unreadable relevance cache {path} ({e}); recomputing.", stacklevel=2)
            else:
                if cached.shape == expected and cached.dtype == np.float32:
                    return cached
                warnings.warn(
                    f"ignoring relevance cache {path}: {cached.shape} {cached.dtype}, expected {expected} "
                    "float32; recomputing.",
                    stacklevel=2,
                )
    relevance = method_.compute(captions, captions_per_image, workers=workers, progress=progress, **method_options)
    if path is not None:
        _atomic_write(path, lambda f: np.save(f, relevance))
    return relevance


def original_relevance_path(data_root: str | os.PathLike, name: str, split: str, method: str) -> Path:
    """Path of the authors' relevance file: ``<data>/<name>/relevances/<name>-<split>-<method>.npy``.

    ``method`` is ``rougeL`` or ``spice`` (case-insensitive; written as the original spells it).

    Example:
        >>> original_relevance_path("data", "coco", "test", "rougel").as_posix()
        'data/coco/relevances/coco-test-rougeL.npy'
    """
    spelled = ORIGINAL_METHODS.get(method.lower())
    if spelled is None:
        raise ValueError(
            f"the original relevance files are for methods {sorted(ORIGINAL_METHODS.values())}, not '{method}'."
        )
    return Path(data_root) / name / "relevances" / f"{name}-{split}-{spelled}.npy"


def load_original_relevance(
    path: str | os.PathLike, n_captions: int | None = None, n_images: int | None = None
) -> np.ndarray:
    """Read an authors' relevance file (raw float32, C order, no npy header despite ``.npy``).

    Returns a read-only ``np.memmap`` of shape ``(n_captions, n_images)``, reshaped as the
    original ``DCG.__init__`` does (``(n_queries, -1)``). Give ``n_captions`` (the number of
    caption queries) or ``n_images``; with neither, 5 captions per image are assumed
    (``n_captions = 5 n_images``), which is the case for the COCO and Flickr30k files.

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: the byte size is not a whole number of float32 values or does not divide
            into the requested shape.

    Example:
        >>> rel = load_original_relevance("coco/relevances/coco-test-rougeL.npy", n_captions=25000)
        ... # needs the authors' relevance file  # doctest: +SKIP
        >>> rel.shape  # doctest: +SKIP
        (25000, 5000)
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"no relevance file at {path}; expected a raw float32 (n_captions x n_images) file, as "
            "the original writes to <data>/<name>/relevances/<name>-<split>-<rougeL|spice>.npy "
            "(compute one with xmatch.eval.relevance.relevance_matrix and save_original_relevance)."
        )
    size = path.stat().st_size
    if size == 0 or size % 4:
        raise ValueError(f"{path} has {size} bytes, not a whole, non-zero number of float32 values.")
    values = size // 4
    if n_captions is None and n_images is None:
        n_images = math.isqrt(values // 5)
        if 5 * n_images * n_images != values:
            raise ValueError(
                f"{path} holds {values} float32 values, not 5 n² for 5 captions per image; "
                "pass n_captions (the number of caption queries) or n_images."
            )
        n_captions = 5 * n_images
    elif n_captions is None:
        n_captions = values // n_images if n_images else 0
    elif n_images is None:
        n_images = values // n_captions if n_captions else 0
    if not n_captions or not n_images or n_captions * n_images != values:
        raise ValueError(
            f"{path} holds {values} float32 values ({size} bytes), which is not "
            f"n_captions x n_images = {n_captions} x {n_images}; check the split and its caption count."
        )
    return np.memmap(path, dtype=np.float32, mode="r", shape=(n_captions, n_images))


def save_original_relevance(path: str | os.PathLike, relevance: np.ndarray) -> Path:
    """Write a relevance matrix in the authors' format (raw float32, C order, no header).

    The write is atomic (temporary file, then ``os.replace``); parent folders are created.

    Example:
        >>> save_original_relevance("data/coco/relevances/coco-test-rougeL.npy", rel)
        ... # needs a relevance matrix  # doctest: +SKIP
    """
    relevance = np.asarray(relevance)
    if relevance.ndim != 2:
        raise ValueError(f"relevance must be (n_captions, n_images), got shape {relevance.shape}.")
    path = Path(path)
    data = np.ascontiguousarray(relevance, dtype=np.float32)
    _atomic_write(path, lambda f: f.write(data.tobytes()))
    return path
