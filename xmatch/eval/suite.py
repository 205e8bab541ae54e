"""Several protocols in one run: the papers' Recall@K plus ECCV Caption, CxC, hard-negative
groups and perturbation probes, recorded with where every number came from.

:func:`run_protocols` encodes the dataset once per model, scores it once, and hands the
similarity blocks to each protocol; the result is a :class:`RunRecord` (figures, per-query
ranks, provenance) that ``xmatch eval --json`` writes and ``--report`` draws. Several models
given together form one ensemble (their scores averaged); a comparison is several records.

Protocol names (comma-separated in one string): at most one Recall@K protocol of
:data:`xmatch.eval.PROTOCOLS` (``full`` by default, ``coco-5k`` with ``eccv-caption`` /
``cxc``) and any of :data:`EXTRA_PROTOCOLS`.

Example:
    >>> record = run_protocols(model, test, "full,groups,probes", name="teran-mrsw-scenes")  # evaluates a model on the scenes benchmark (minutes)  # doctest: +SKIP
    >>> record.extras["groups"]["overall"]["t2i"], record.provenance["dataset"]["fingerprint"]  # doctest: +SKIP
    (66.8, '3f1c0a9b2d4e')
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import logging
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from xmatch.core.errors import XmatchError
from xmatch.io.safe_load import MAX_JSON_DEPTH, JsonDepthError, load_json
from xmatch.model.buckets import BucketedEmbeddings
from xmatch.eval.evaluate import Encoded, RetrievalSet, ensemble_blocks, score_blocks
from xmatch.eval.protocol import PROTOCOLS, EvalResult, evaluate_blocks, fold_layout
from xmatch.eval.rerank import RERANK, check_rerank_models, rerank_figures
from xmatch.model.model import MatchingModel

logger = logging.getLogger(__name__)

#: protocols computed beside the Recall@K one, from the same scores
EXTRA_PROTOCOLS = ("eccv-caption", "cxc", "groups", "probes")
#: the extras that read the whole [images, captions] matrix (groups reads it when it is scored
#: anyway, else only the pairs within its groups)
WHOLE_MATRIX = ("eccv-caption", "cxc")
#: the Recall@K choice that computes none: only the extras beside it (not with probes, which
#: measure what a perturbation costs in R@K)
NO_RECALL = "none"
RECORD_FORMAT = "xmatch-eval/1"
#: what a result file is, for messages
RESULT_FILE = "the JSON that xmatch eval --json or --report writes (results.json)"


class ResultFileError(XmatchError, ValueError):
    """An eval result file that cannot be read back: not UTF-8 JSON, or not the layout
    ``xmatch eval --json`` writes (the message names the file and what is wrong)."""


def parse_protocols(text: str | Sequence[str], default: str | None = None) -> tuple[str, tuple[str, ...]]:
    """``"full,groups"`` -> ``("full", ("groups",))``: the Recall@K protocol and the extras.

    Args:
        text: the protocol names, comma-separated; ``none`` as the Recall@K protocol computes
            only the extras.
        default: the Recall@K protocol when ``text`` names none (a split's declared
            ``recall_protocol``); ``none`` applies only beside extras other than ``probes``.
            Without it: ``full``, or ``coco-5k`` beside ``eccv-caption`` / ``cxc``.

    Example:
        >>> parse_protocols("eccv-caption,cxc")
        ('coco-5k', ('eccv-caption', 'cxc'))
        >>> parse_protocols("groups", default="none")
        ('none', ('groups',))
    """
    names = [p.strip().lower() for p in (text.split(",") if isinstance(text, str) else text) if p.strip()]
    unknown = [p for p in names if p not in PROTOCOLS and p != NO_RECALL and p not in EXTRA_PROTOCOLS]
    if unknown:
        raise ValueError(
            f"unknown protocol {unknown[0]!r}; Recall@K protocols: {', '.join(PROTOCOLS)} (or {NO_RECALL}); "
            f"beside them (comma-separated): {', '.join(EXTRA_PROTOCOLS)}."
        )
    recall = [p for p in names if p in PROTOCOLS or p == NO_RECALL]
    if len(recall) > 1:
        raise ValueError(f"choose one Recall@K protocol, got {recall}.")
    extras = tuple(dict.fromkeys(p for p in names if p in EXTRA_PROTOCOLS))
    if recall == [NO_RECALL] and (not extras or "probes" in extras):
        raise ValueError(
            f"protocol {NO_RECALL!r} computes no Recall@K, so it needs an extra protocol beside it "
            f"({', '.join(p for p in EXTRA_PROTOCOLS if p != 'probes')}); probes measure what a perturbation "
            "costs in R@K and need a Recall@K protocol (e.g. full)."
        )
    if default is not None and default not in PROTOCOLS and default != NO_RECALL:
        raise ValueError(f"unknown default Recall@K protocol {default!r}; one of {', '.join(PROTOCOLS)}, {NO_RECALL}.")
    if recall:
        return recall[0], extras
    if default is not None and (default != NO_RECALL or (extras and "probes" not in extras)):
        return default, extras
    return ("coco-5k" if {"eccv-caption", "cxc"} & set(extras) else "full"), extras


@dataclass
class RunRecord:
    """One evaluated model (or ensemble): its figures and how they were computed.

    Attributes:
        name: the label in tables and plots.
        result: the Recall@K figures (:class:`~xmatch.eval.EvalResult`; its ``queries`` hold
            at least ``i2t_ranks`` and ``t2i_ranks``).
        extras: per extra protocol, its figures as plain data (``groups``, ``probes``,
            ``eccv-caption``, ``cxc``).
        provenance: ``protocol``, ``split``, ``dataset`` (name, fingerprint, sizes),
            ``models`` (name, fingerprint each), ``ensemble``, ``xmatch`` version, ``created``.
    """

    name: str
    result: EvalResult
    extras: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)

    def ranks(self, direction: str) -> np.ndarray | None:
        """0-based rank of each query's (best) ground truth, ``direction`` = ``i2t``/``t2i``."""
        ranks = self.result.queries.get(f"{direction}_ranks")
        return None if ranks is None else np.asarray(ranks)

    def to_dict(self) -> dict[str, Any]:
        """Plain data: the :meth:`EvalResult.figures` keys at the top level (as ``--json``
        always wrote them), plus ``name``, ``provenance``, ``ranks`` and the extras."""
        data = {"format": RECORD_FORMAT, "name": self.name, "provenance": self.provenance, **self.result.figures()}
        data["ranks"] = {d: r.astype(int).tolist() for d in ("i2t", "t2i") if (r := self.ranks(d)) is not None}
        data.update(self.extras)
        return data

    def save_json(self, path: str | os.PathLike, with_queries: bool = False) -> None:
        """Write the record (and, if asked, every per-query array of the result) as JSON."""
        data = self.to_dict()
        if with_queries:
            data["queries"] = {k: np.asarray(v).tolist() for k, v in self.result.queries.items()}
        Path(path).write_text(json.dumps(data, indent=1), encoding="utf-8")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "") -> RunRecord:
        """A record from :meth:`to_dict`'s data; also reads a plain result JSON
        (:meth:`EvalResult.save_json`: no provenance; ranks only if written ``with_queries``).

        Raises:
            ResultFileError: ``data`` is not in that layout (the message names ``source``).
        """
        _check_record(data, source or "the data")
        queries = {f"{d}_ranks": np.asarray(r) for d, r in (data.get("ranks") or {}).items()}
        for key in ("i2t_ranks", "t2i_ranks"):
            if key not in queries and key in (data.get("queries") or {}):
                queries[key] = np.asarray(data["queries"][key])
        result = EvalResult(
            protocol=str(data.get("protocol", "?")), i2t=dict(data["i2t"]), t2i=dict(data["t2i"]),
            rsum=float(data.get("rsum", float("nan"))), folds=list(data.get("folds", [])), queries=queries,
            timings=dict(data.get("timings", {})),
        )
        extras = {k: data[k] for k in (*EXTRA_PROTOCOLS, RERANK) if k in data}
        provenance = dict(data.get("provenance") or {"source": source, "protocol": result.protocol})
        name = str(data.get("name") or Path(source).stem or "run")
        return cls(name, result, extras, provenance)


def load_records(path: str | os.PathLike) -> list[RunRecord]:
    """The records of a JSON file written by ``xmatch eval --json`` or ``--report``
    (``results.json``): one record, or ``{"runs": [...]}``.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ResultFileError: the file is not UTF-8 JSON, or not in that layout (the message names the
            file, and the run within it).

    Example:
        >>> [r.name for r in load_records("out/results.json")]  # needs a results file  # doctest: +SKIP
        ['teran-mrsw-scenes', 'tern-scenes']
    """
    path = Path(path)
    try:
        data = load_json(path.read_text(encoding="utf-8"), f"result file {path}")
    except FileNotFoundError:
        raise FileNotFoundError(f"result file {path} does not exist.") from None
    except JsonDepthError:
        raise ResultFileError(
            f"result file {path} is not UTF-8 JSON that xmatch reads: it is nested more than {MAX_JSON_DEPTH} levels "
            f"deep; expected {RESULT_FILE}."
        ) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ResultFileError(f"result file {path} is not UTF-8 JSON ({exc}); expected {RESULT_FILE}.") from None
    if isinstance(data, Mapping) and isinstance(data.get("runs"), list):
        return [RunRecord.from_dict(d, f"{path}[{k}]") for k, d in enumerate(data["runs"])]
    return [RunRecord.from_dict(data, str(path))]


def _check_record(data: Any, source: str) -> None:
    """Refuse data that :meth:`RunRecord.from_dict` cannot read as a record, naming the field."""

    def refuse(problem: str) -> ResultFileError:
        return ResultFileError(f"{source} is not an xmatch eval result: {problem}; expected {RESULT_FILE}.")

    if not isinstance(data, Mapping) or "i2t" not in data or "t2i" not in data:
        raise refuse("no 'i2t' / 't2i' figures")
    for direction in ("i2t", "t2i"):
        figures = data[direction]
        if not isinstance(figures, Mapping):
            raise refuse(f"'{direction}' is {type(figures).__name__}, not an object of figures")
        odd = [k for k, v in figures.items() if v is not None and not _is_number(v)]
        if odd:
            raise refuse(f"'{direction}' -> '{odd[0]}' is {figures[odd[0]]!r}, not a number")
    if data.get("rsum") is not None and not _is_number(data["rsum"]):
        raise refuse(f"'rsum' is {data['rsum']!r}, not a number")
    for key, kind in (("ranks", Mapping), ("queries", Mapping), ("timings", Mapping), ("provenance", Mapping), ("folds", list)):
        if data.get(key) is not None and not isinstance(data[key], kind):
            raise refuse(f"'{key}' is {type(data[key]).__name__}, not {'an object' if kind is Mapping else 'a list'}")
    rank_lists = [(f"ranks -> {d}", r) for d, r in (data.get("ranks") or {}).items()]
    rank_lists += [(f"queries -> {k}", v) for k, v in (data.get("queries") or {}).items() if k.endswith("_ranks")]
    for where, ranks in rank_lists:
        if not isinstance(ranks, list) or not all(_is_number(r) for r in ranks):
            raise refuse(f"'{where}' is not a list of ranks (numbers)")
    lengths = {d: len(r) for d, r in (data.get("ranks") or {}).items() if isinstance(r, list)}
    for where, ranks in rank_lists:
        # a rank is 0-based and below the gallery's size: the other direction's query count
        # (t2i has one query per caption, i2t one per image), else the sizes the provenance records
        direction = where.split("-> ")[-1].removesuffix("_ranks")
        gallery = lengths.get("t2i" if direction == "i2t" else "i2t") or _gallery_size(data, direction)
        for k, rank in enumerate(ranks):
            if not (isinstance(rank, int) or math.isfinite(rank) and rank.is_integer()) or not 0 <= rank < gallery:
                raise refuse(f"'{where}' [{k}] is {rank!r}, not a rank: ranks are whole numbers from 0 (the first "
                             f"place) to {gallery - 1}")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


#: the largest gallery a rank may index when a result file records no size
MAX_GALLERY = 2**31


def _gallery_size(data: Mapping[str, Any], direction: str) -> int:
    """How many items a query of ``direction`` ranks, as the record's provenance gives it
    (captions for i2t, images for t2i), else :data:`MAX_GALLERY`."""
    dataset = (data.get("provenance") or {}).get("dataset")
    size = dataset.get("captions" if direction == "i2t" else "images") if isinstance(dataset, Mapping) else None
    return size if isinstance(size, int) and not isinstance(size, bool) and 0 < size <= MAX_GALLERY else MAX_GALLERY


def reranked_name(name: str, k: int, neighbours: int = 0) -> str:
    """The label of a model's re-ranked figures in tables and reports.

    Example:
        >>> reranked_name("teran-mrsw-hn-scenes", 20)
        'teran-mrsw-hn-scenes + verifier@20'
        >>> reranked_name("teran-mrsw-hn-scenes", 20, 1)
        'teran-mrsw-hn-scenes + verifier@20+1nn'
    """
    return f"{name} + verifier@{k}" + (f"+{neighbours}nn" if neighbours else "")


def within_groups_name(name: str) -> str:
    """The label of a model's verifier deciding within each hard-negative group.

    Example:
        >>> within_groups_name("teran-mrsw-hn-scenes")
        'teran-mrsw-hn-scenes + verifier, within groups'
    """
    return f"{name} + verifier, within groups"


def with_reranked(records: Sequence[RunRecord]) -> list[RunRecord]:
    """``records`` with, after each record evaluated with ``--rerank K``, a record of its
    re-ranked figures (``extras["rerank"]``: Recall@K and the groups) named
    :func:`reranked_name`, and with groups a record of the verifier deciding within each group
    named :func:`within_groups_name`, so comparison tables and reports show the two-stage model
    as rows of their own beside the pooler's. A record of such a name already present (a
    report's ``results.json`` read back) is not added again.

    Example:
        >>> [r.name for r in with_reranked(load_records("out/results.json"))]  # needs a results file  # doctest: +SKIP
        ['teran-mrsw-scenes', 'teran-mrsw-hn-scenes', 'teran-mrsw-hn-scenes + verifier@20']
    """
    names = {r.name for r in records}
    out: list[RunRecord] = []
    for record in records:
        out.append(record)
        figures = record.extras.get(RERANK)
        if not figures or reranked_name(record.name, figures["k"], figures.get("neighbours", 0)) in names:
            continue
        recall = figures.get("recall")
        if recall:
            result = EvalResult(protocol=str(recall["protocol"]), i2t=dict(recall["i2t"]), t2i=dict(recall["t2i"]),
                                rsum=float(recall["rsum"]), folds=list(recall.get("folds", [])))
        else:  # groups only: no Recall@K of its own
            result = EvalResult(protocol="none", i2t={}, t2i={}, rsum=float("nan"))
        extras = {"groups": figures["groups"]} if figures.get("groups") else {}
        provenance = {**record.provenance, "reranked": {"k": figures["k"], "neighbours": figures.get("neighbours", 0),
                                                      "verifier": figures["verifier"], "timings": figures["timings"]}}
        out.append(RunRecord(reranked_name(record.name, figures["k"], figures.get("neighbours", 0)), result, extras, provenance))
        within = figures.get("groups_within")
        if within and within_groups_name(record.name) not in names:
            groups_only = EvalResult(protocol="none", i2t={}, t2i={}, rsum=float("nan"))
            out.append(RunRecord(within_groups_name(record.name), groups_only, {"groups": within}, provenance))
    return out


def save_records(records: Sequence[RunRecord], path: str | os.PathLike, with_queries: bool = False) -> None:
    """One record as it is (the format of a single ``--json``), several as ``{"runs": [...]}``."""
    if len(records) == 1:
        records[0].save_json(path, with_queries)
        return
    runs = []
    for record in records:
        data = record.to_dict()
        if with_queries:
            data["queries"] = {k: np.asarray(v).tolist() for k, v in record.result.queries.items()}
        runs.append(data)
    Path(path).write_text(json.dumps({"format": RECORD_FORMAT, "runs": runs}, indent=1), encoding="utf-8")


# -- provenance ------------------------------------------------------------------------------


def _short_hash(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:12]


#: of each feature file the dataset fingerprint reads its first and last bytes (FEATURE_EDGE_BYTES
#: each) and FEATURE_BLOCKS blocks spread evenly between them: bounded work for any file size
FEATURE_EDGE_BYTES = 64 * 1024
FEATURE_BLOCKS = 8
FEATURE_BLOCK_BYTES = 4 * 1024
#: ...and about this much over all the files of a split at most: when a split has many files (one
#: per image), each file's sample shrinks, down to FEATURE_MIN_EDGE_BYTES at each end
FEATURE_SAMPLE_BUDGET = 64 * 1024 * 1024
FEATURE_MIN_EDGE_BYTES = 4 * 1024


def feature_files(dataset: Any) -> list[Path] | None:
    """The files a split's images are read from, in image order, for its fingerprint.

    A layout lists its own with a ``feature_files()`` method (``teran``: the region features,
    boxes and any pictures its sizes come from; a plugin's layout may do the same); for the
    others: ``scan-precomp``'s feature, box and size arrays, ``image-captions``' pictures. The
    scenes benchmark and the folders ``xmatch extract`` writes are read through these layouts.
    None when a layout says nothing.

    Example:
        >>> np.save("test_ims.npy", np.ones((2, 36, 8), np.float32))
        >>> _ = Path("test_caps.txt").write_text("".join(f"caption {k}\\n" for k in range(10)))
        >>> np.save("test_boxes.npy", np.tile(np.float32([0.1, 0.1, 0.5, 0.5]), (2, 36, 1)))
        >>> from xmatch.data import PrecompDataset
        >>> [p.name for p in feature_files(PrecompDataset(".", "test", boxes_normalized=True))]
        ['test_ims.npy', 'test_boxes.npy']
    """
    declared = getattr(dataset, "feature_files", None)
    if callable(declared):
        return [Path(p) for p in declared()]
    from xmatch.data import ImageCaptionsDataset, PrecompDataset

    if isinstance(dataset, PrecompDataset):
        return [p for p in (dataset.features_file, dataset.boxes_file, dataset.sizes_file) if p is not None]
    if isinstance(dataset, ImageCaptionsDataset):
        return [Path(p) for p in dataset.image_paths]
    return None


def _sample_spans(size: int, edge: int, blocks: int, block: int) -> list[tuple[int, int]]:
    """(offset, length) of the bytes sampled from a file of ``size`` bytes: all of a small
    file; else both ends and ``blocks`` blocks evenly spaced between them."""
    if size <= 2 * edge + blocks * block:
        return [(0, size)]
    inner = size - 2 * edge - block
    middle = [(edge + inner * k // max(blocks - 1, 1), block) for k in range(blocks)]
    return [(0, edge), *middle, (size - edge, edge)]


def files_digest(files: Sequence[str | os.PathLike]) -> str:
    """sha256 over each file's name, size and a sample of its bytes (both ends and a few blocks
    between them, see :data:`FEATURE_EDGE_BYTES`), in order: two feature sets of the same
    captions differ, a moved folder does not, and a file of any size costs a few reads.

    The sample catches another extraction (another backbone, weights or region count changes
    every file's bytes and most files' sizes) and a rewritten or truncated file; a change in the
    unsampled middle of a large file with its size kept is not seen (hash the files yourself,
    :func:`xmatch.io.files.sha256_file`, when that matters).

    Raises:
        xmatch.data.DataError: a file cannot be read (named).

    Example:
        >>> _ = Path("a.npy").write_bytes(b"one"), Path("b.npy").write_bytes(b"two")
        >>> files_digest(["a.npy", "b.npy"]) == files_digest(["a.npy", "b.npy"]) != files_digest(["b.npy", "a.npy"])
        True
    """
    from xmatch.data.errors import DataError

    files = [Path(f) for f in files]
    # a file's sample is at most 4 edges (2 ends, FEATURE_BLOCKS blocks of an edge / 4 at most)
    edge = min(FEATURE_EDGE_BYTES, max(FEATURE_MIN_EDGE_BYTES, FEATURE_SAMPLE_BUDGET // (4 * max(len(files), 1))))
    block = min(FEATURE_BLOCK_BYTES, edge // 4)
    digest = hashlib.sha256()
    for path in files:
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                digest.update(f"{path.name}\0{size}\0".encode())
                for offset, length in _sample_spans(size, edge, FEATURE_BLOCKS, block):
                    f.seek(offset)
                    digest.update(f.read(length))
        except OSError as exc:
            raise DataError(f"{path}: cannot be read for the dataset fingerprint ({exc.strerror or exc}).") from None
    return digest.hexdigest()


def dataset_fingerprint(dataset: Any) -> str:
    """12 hex digits over the split's layout, name, captions and image names, and over its
    feature files' names, sizes and a sample of their bytes (:func:`files_digest`): another
    caption or another feature set of the same captions changes it, a moved folder does not.

    Example:
        >>> dataset_fingerprint(open_dataset("scenes", None, split="test"))  # generates the scenes benchmark (minutes)  # doctest: +SKIP
        '5d0c43a1e2b7'
    """
    from xmatch.io.run_folder import data_fingerprint

    files = feature_files(dataset)
    return _short_hash([data_fingerprint(dataset), None if files is None else files_digest(files)])


def model_fingerprint(model: MatchingModel) -> str:
    """12 hex digits over everything that decides a model's scores: the encoders' spec and
    weights (:func:`xmatch.index.model_fingerprint`) and the pooler's spec and weights."""
    from xmatch.model.fingerprint import model_fingerprint as encoders

    pooler = {k: v.float().cpu().numpy().tobytes().hex() for k, v in model.pooler.state_dict().items()}
    try:
        spec = model.spec.get("pooler")
    except AttributeError:
        spec = type(model.pooler).__name__.removesuffix("Pooler")  # a model made without a spec: its pooler's class
    return _short_hash([encoders(model), spec, pooler])


def _provenance(models: Sequence[MatchingModel], names: Sequence[str], dataset: Any, dataset_name: str,
                recall: str, extras: Sequence[str]) -> dict[str, Any]:
    from xmatch.core.version import __version__

    return {
        "protocol": "+".join([*([recall] if recall != NO_RECALL else []), *extras]),
        "split": getattr(dataset, "split", None),
        "dataset": {
            "name": dataset_name, "fingerprint": dataset_fingerprint(dataset),
            "images": len(dataset.captions) // dataset.captions_per_image, "captions": len(dataset.captions),
        },
        "models": [{"name": n, "fingerprint": model_fingerprint(m)} for n, m in zip(names, models)],
        "ensemble": len(models) > 1,
        "xmatch": __version__,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


# -- running -------------------------------------------------------------------------------


@torch.inference_mode()
def _encode_captions(model: MatchingModel, texts: list[str], batch_size: int) -> BucketedEmbeddings:
    """Encode ``texts`` in order into length buckets, as ``encode_dataset`` does."""
    parts = [model.encode_texts(texts[i : i + batch_size], batch_size=batch_size) for i in range(0, len(texts), batch_size)]
    return BucketedEmbeddings.from_parts(parts, consume=True)


def run_protocols(
    models: MatchingModel | Sequence[MatchingModel],
    dataset: RetrievalSet,
    protocols: str | Sequence[str] = "full",
    *,
    name: str | None = None,
    model_names: Sequence[str] | None = None,
    dataset_name: str | None = None,
    relevance: Mapping[str, np.ndarray] | None = None,
    fold_images: int | None = None,
    groups: Any = None,
    caption_ids: Any = None,
    pmrp_dir: str | os.PathLike | None = None,
    word_classes: Any = None,
    probes: Sequence[Any] | Sequence[str] | None = None,
    probe_seed: int = 0,
    rerank: int | None = None,
    image_batch_size: int = 64,
    text_batch_size: int = 256,
    progress: bool = True,
    rerank_neighbours: int = 0,
) -> RunRecord:
    """Evaluate one model, or an ensemble (mean of the models' scores), under several protocols.

    Args:
        models: a model or several (an ensemble).
        dataset: the split (see :class:`~xmatch.eval.RetrievalSet`).
        protocols: e.g. ``"full,groups,probes"`` (see :func:`parse_protocols`); without a
            Recall@K protocol, the one the split declares (``dataset.recall_protocol``: the
            scenes ``groups`` split declares ``none``), else ``full``.
        name: the record's label (default: the model names joined by ``+``).
        model_names: one name per model, for the provenance (default ``model0``...).
        dataset_name: the dataset's name in the provenance (default: its class name).
        relevance: ``{name: [captions, images]}`` for NDCG@25.
        fold_images: images per fold of the Recall@K protocol.
        groups: ``groups``: a :class:`~xmatch.eval.groups.GroupSet` or a JSON file (default:
            the groups the dataset declares).
        caption_ids: ``eccv-caption`` / ``cxc``: COCO annotation ids of the captions (see
            :func:`xmatch.eval.eccv.coco_ids`).
        pmrp_dir: ``eccv-caption``: folder with the plausible-match files, for PMRP.
        word_classes: ``probes``: a tagger (the scenes grammar's is
            :func:`xmatch.scenes.tagger.scenes_tagger`), ``"nltk"`` or a word-list JSON file
            (default: the one the dataset declares).
        probes: ``probes``: perturbations or their names (``shuffle``, ``drop-noun``...;
            default: :func:`~xmatch.eval.probes.default_probes`).
        probe_seed: seed of the perturbations.
        rerank: K: also the figures with the model's verifier re-ranking each query's top K
            (:func:`~xmatch.eval.rerank.rerank_figures`; one model with a verifier), in
            ``extras["rerank"]``, beside the pooler's own.
        rerank_neighbours: with ``rerank``: each caption's list also holds this many nearest
            images of each of its top K (``rerank_figures(neighbours=...)``).

    Returns:
        A :class:`RunRecord`; ``extras`` holds each extra protocol's figures.

    Raises:
        ValueError / ImportError / FileNotFoundError: before anything is encoded, when an
        extra protocol lacks what it needs (groups, ids, the eccv-caption package, a tagger).
    """
    from xmatch.data.base import ImageTextDataset
    from xmatch.data.fit import check_images_fit

    models = [models] if isinstance(models, MatchingModel) else list(models)
    if not models:
        raise ValueError("run_protocols needs at least one model.")
    model_names = list(model_names or [f"model{k}" for k in range(len(models))])
    recall, extras = parse_protocols(protocols, getattr(dataset, "recall_protocol", None))
    c = dataset.captions_per_image
    if not c:
        raise ValueError("these protocols need the same number of captions for every image.")
    if recall == NO_RECALL and relevance:
        raise ValueError("NDCG (relevance) is a Recall@K figure; name a Recall@K protocol (e.g. full) beside the others.")
    n_images = len(dataset.captions) // c
    folds = [] if recall == NO_RECALL else fold_layout(n_images, recall, fold_images)
    if isinstance(dataset, ImageTextDataset):
        for model in models:
            check_images_fit(model, dataset, "evaluation")
    needs = _resolve_needs(dataset, extras, groups, caption_ids, pmrp_dir, word_classes, probes)
    check_rerank_models(models, model_names, rerank, rerank_neighbours)

    whole = bool(set(WHOLE_MATRIX) & set(extras))
    scored = [slice(0, n_images)] if whole else folds
    covers = scored == [slice(0, n_images)]  # the whole matrix is scored anyway: groups read it
    # else the groups protocol scores only its own pairs: a caption against its group's images
    pair_blocks = needs["groups"].blocks() if "groups" in extras and not covers else []
    blocks, timings, images = ensemble_blocks(
        models, dataset, [*scored, *pair_blocks], c, image_batch_size=image_batch_size,
        text_batch_size=text_batch_size, progress=progress, keep_images="probes" in extras,
    )
    blocks, pair_scores = blocks[: len(scored)], blocks[len(scored) :]
    full = blocks[0] if covers else None
    if whole:
        blocks = [full[f, c * f.start : c * f.stop] for f in folds]
    if recall == NO_RECALL:
        result = EvalResult(NO_RECALL, {}, {}, float("nan"))
    else:
        result = evaluate_blocks(blocks, recall, c, relevance)
    result.timings = timings

    figures: dict[str, Any] = {}
    if "groups" in extras:
        from xmatch.eval.groups import PairScores, score_groups

        if full is None:
            full = PairScores(pair_blocks, pair_scores, (n_images, len(dataset.captions)))
        figures["groups"] = score_groups(full, needs["groups"]).as_dict()
    if "eccv-caption" in extras:
        from xmatch.eval.eccv import eccv_caption_metrics, pmrp

        figures["eccv-caption"] = eccv_caption_metrics(full, needs["ids"], needs["package"])
        if pmrp_dir is not None:
            figures["eccv-caption"]["pmrp"] = pmrp(full, needs["ids"], needs["package"])
        else:
            from xmatch.eval.eccv import PMRP_HINT

            figures["eccv-caption"]["pmrp"] = {"missing": PMRP_HINT}
    if "cxc" in extras:
        from xmatch.eval.eccv import cxc_recalls

        figures["cxc"] = cxc_recalls(full, needs["ids"], package=needs["package"])
    if "probes" in extras:
        from xmatch.eval.probes import probe_figures

        def score_captions(texts: list[str]) -> list[np.ndarray]:
            total: list[np.ndarray] | None = None
            for model, img in zip(models, images):
                # one bar over the probes (probe_figures) instead of several per probe
                txt = _encode_captions(model, texts, text_batch_size)
                scored = score_blocks(model, Encoded(img, txt, 0.0), folds, c, progress=False)
                total = scored if total is None else [a + b for a, b in zip(total, scored)]
            return [b / len(models) for b in total]

        figures["probes"] = probe_figures(
            score_captions, list(dataset.captions), lambda b: evaluate_blocks(b, recall, c), result,
            needs["probes"], probe_seed, progress=progress,
        ).as_dict()
    if rerank is not None:
        figures[RERANK] = rerank_figures(
            models[0], dataset, rerank, recall=recall if folds else None, fold_images=fold_images,
            groups=needs.get("groups"), relevance=relevance, image_batch_size=image_batch_size,
            text_batch_size=text_batch_size, progress=progress, neighbours=rerank_neighbours,
        )
    provenance = _provenance(models, model_names, dataset, dataset_name or type(dataset).__name__, recall, extras)
    logger.info("%s: %s on %s (%s)", name or " + ".join(model_names), provenance["protocol"],
                provenance["dataset"]["name"], ", ".join(f"{k} {v:.1f} s" for k, v in timings.items()))
    return RunRecord(name or " + ".join(model_names), result, figures, provenance)


def _resolve_needs(dataset: Any, extras: Sequence[str], groups: Any, caption_ids: Any, pmrp_dir: Any,
                   word_classes: Any, probes: Any) -> dict[str, Any]:
    """Everything the extra protocols need, found (or refused) before the encoding starts."""
    needs: dict[str, Any] = {}
    if "groups" in extras:
        from xmatch.eval.groups import GroupSet, dataset_groups

        needs["groups"] = groups if isinstance(groups, GroupSet) else dataset_groups(dataset, groups)
    if {"eccv-caption", "cxc"} & set(extras):
        from xmatch.eval.eccv import coco_ids, load_package

        needs["package"] = load_package(pmrp_dir if "eccv-caption" in extras else None)
        needs["ids"] = coco_ids(dataset, caption_ids, needs["package"])
    if "probes" in extras:
        from xmatch.eval.probes import default_probes, make_tagger, parse_probe

        source = word_classes if word_classes is not None else getattr(dataset, "word_classes", None)
        if source is None and (probes is None or any(isinstance(p, str) and p != "shuffle" for p in probes)):
            raise ValueError(
                f"the probes need word classes and the {type(dataset).__name__} split declares none; pass "
                "--word-classes FILE (a JSON of word lists), --word-classes nltk, or --word-classes scenes."
            )
        tagger = make_tagger(source() if callable(source) else source) if source is not None else None
        if probes is None:
            needs["probes"] = default_probes(tagger)
        else:
            needs["probes"] = [parse_probe(p, tagger) if isinstance(p, str) else p for p in probes]
    return needs


__all__ = [
    "EXTRA_PROTOCOLS", "RunRecord", "dataset_fingerprint", "feature_files", "files_digest", "load_records",
    "model_fingerprint", "parse_protocols", "run_protocols", "save_records",
]
