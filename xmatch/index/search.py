"""The search index: a corpus encoded once, kept on disk, queried in two stages.

Stage 1 proposes candidates from an approximate nearest-neighbour structure
(:mod:`xmatch.index.candidates`, or Qdrant's MaxSim, :mod:`xmatch.index.qdrant`); stage 2
scores only those candidates exactly with the model's own pooler (:mod:`xmatch.index.rerank`);
on request (``rerank=K``), stage 3 re-scores the top K with the model's verifier head
(:mod:`xmatch.index.verifier`).
Where stage 1 is an exact scan whose estimate bounds the pooler's score (TERAN's poolers over a
flat token index, TERN's global cosine over a flat vector index, Qdrant's local MaxSim for
MrSw), the top-k is *proven* exact: a query whose bound leaves room for an unscored item to
enter the top-k is scored exhaustively instead.
"""

from __future__ import annotations

import contextlib
import numbers
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from xmatch.data._io import plain_path
from xmatch.model.embeddings import Embeddings
from xmatch.model.inputs import ImageInputs, PixelInputs, RegionInputs, input_type_of
from xmatch.index import checks, qdrant_location, verifier
from xmatch.index.candidates import FaissGenerator
from xmatch.index.errors import DamagedIndexError, EmptyIndexError, ModelMismatchError, SearchIndexError, WrongSideError
from xmatch.model.fingerprint import embedding_spec, model_fingerprint, short
from xmatch.index.ranking import Ranking
from xmatch.index.results import SearchResult
from xmatch.index.shards import STORED_DTYPES
from xmatch.index.store import (
    FORMAT,
    MANIFEST,
    PICTURES,
    ShardStore,
    check_side,
    manifest_signature,
    read_manifest,
    write_manifest,
)
from xmatch.model.model import MatchingModel

ENGINES = ("faiss", "qdrant")
MODEL_FOLDER = "model"



#: how the index encodes: ``"float32"`` as the model is, ``"bfloat16"`` under autocast
COMPUTE_DTYPES = ("float32", "bfloat16")


def check_compute_dtype(compute_dtype: str) -> None:
    """Refuse a ``compute_dtype`` other than :data:`COMPUTE_DTYPES`' (the message lists them)."""
    if compute_dtype not in COMPUTE_DTYPES:
        raise ValueError(f"compute_dtype must be one of {', '.join(COMPUTE_DTYPES)}, got {compute_dtype!r}.")


@contextlib.contextmanager
def encoding(model: MatchingModel, compute_dtype: str = "float32") -> Iterator[None]:
    """The context an index encodes in: inference mode, under bfloat16 autocast when
    ``compute_dtype`` is ``"bfloat16"`` (on a CPU with AVX512-BF16 or AMX, or a GPU: a CLIP
    ViT-B/32 tower encoded 1.8x the pictures/s; the embeddings differ from float32's by about
    bfloat16's resolution, docs/search.md). Callers cast what it gives back to float32.

    Raises:
        ValueError: another ``compute_dtype``.

    Example:
        >>> model = xmatch.build("teran-mrsw-scenes")
        >>> with encoding(model, "bfloat16"):
        ...     torch.is_autocast_enabled("cpu"), torch.is_inference_mode_enabled()
        (True, True)
    """
    check_compute_dtype(compute_dtype)
    with torch.inference_mode():
        if compute_dtype == "bfloat16":
            with torch.autocast(next(model.parameters()).device.type, dtype=torch.bfloat16):
                yield
        else:
            yield


class SearchIndex(Ranking):
    """A searchable corpus of images (text-to-image search) or captions (image-to-text).

    Made by :func:`create` or :func:`open`; holds the model whose encoders made the stored
    token sets (its fingerprint is checked) and whose pooler ranks the candidates.

    Example:
        >>> index = xmatch.index.open("idx")  # needs an index built with `xmatch index`  # doctest: +SKIP
        >>> [r.ids for r in index.search_texts(["a red circle left of a blue seven"], k=5)]  # doctest: +SKIP
        [['913', '942', '907', '955', '931']]
    """

    def __init__(self, root: Path, manifest: dict[str, Any], model: MatchingModel, *, progress: bool = False,
                 in_memory: bool = False) -> None:
        self.root, self.manifest, self.model, self.progress = root, manifest, model, progress
        self.in_memory = in_memory
        self.model.eval()
        self.store = _open_store(root, manifest, in_memory)
        self._generators: dict[str, Any] = {}
        self._manifest_signature: tuple[int, int, int, bytes] | None = None

    # --- what the index holds --------------------------------------------------------------

    @property
    def side(self) -> str:
        """``"images"`` or ``"texts"``: what the stored items are."""
        return self.manifest["side"]

    @property
    def engine(self) -> str:
        return self.manifest["engine"]["name"]

    @property
    def fingerprint(self) -> str:
        return self.manifest["model"]["fingerprint"]

    @property
    def pictures(self) -> Path | None:
        """The folder the stored pictures were read from, as the index records it (``xmatch
        index --images DIR``, a dataset's folder of pictures; :meth:`record_pictures`), or None
        where it records none (the folder was not known, or the index was made before it was
        recorded)."""
        record = self.manifest.get(PICTURES)
        return Path(record["root"]) if record is not None else None

    def record_pictures(self, folder: str | os.PathLike) -> Path:
        """Record ``folder`` (made absolute, links resolved) as where the stored pictures are
        read from (``xmatch serve`` shows them from there), unless the index records a folder
        already: that one stays, since the ids already stored name pictures in it.

        Returns:
            The folder the index records.

        Example:
            >>> from xmatch.index.synthetic import scoring_model
            >>> index = xmatch.index.create("idx", scoring_model("MrSw", 16))
            >>> Path("photos").mkdir()
            >>> index.record_pictures("photos") == Path("photos").resolve() == xmatch.index.open("idx").pictures
            True
        """
        from filelock import FileLock

        with FileLock(str(self.root / ".lock")):
            self._reload_if_changed()
            if self.pictures is None:
                self.manifest[PICTURES] = {"root": str(Path(folder).expanduser().resolve())}
                write_manifest(self.root, self.manifest)
        return self.pictures

    def __len__(self) -> int:
        return len(self.store)

    @property
    def ids(self) -> list[str]:
        return self.store.ids

    def __repr__(self) -> str:
        ref = self.manifest["model"].get("ref") or "bundled model"
        return f"SearchIndex({str(self.root)!r}: {len(self)} {self.side}, {ref}, engine {self.engine})"

    def get(self, ids: Sequence[str]) -> Embeddings:
        """The stored token sets of ``ids`` (float32), with their region boxes where the index
        keeps them (``boxes``; None for caption indexes and grids without boxes): what the
        verifier reads, so ``model.verify(index.get(hit_ids), queries)`` gives the logits of
        ``search(..., rerank=K)``.

        Example:
            >>> index = xmatch.index.create("idx", xmatch.build("teran-mrsw-scenes", pretrained=True), model_ref="teran-mrsw-scenes")
            >>> index.add(xmatch.RegionInputs(torch.rand(2, 36, 1280), torch.tensor([0.1, 0.1, 0.5, 0.5]).expand(2, 36, 4)), ids=["a", "b"])
            2
            >>> got = index.get(["b"])
            >>> got.tokens.shape[0], got.boxes[0, 0].tolist()  # the boxes as stored (float16)
            (1, [0.0999755859375, 0.0999755859375, 0.5, 0.5])
        """
        self._reload_if_changed()
        return verifier.stored(self.store, torch.tensor(self.store.row_of([str(i) for i in ids]), dtype=torch.long))

    def verify(self) -> None:
        """Check every stored file against its checksum and every stored value for NaN and
        infinity (reads the whole corpus).

        Raises:
            DamagedIndexError: naming the damaged file (or, for engines that keep no files of
                their own, the first item holding a non-finite value) and the fix.
        """
        self._reload_if_changed()
        self.store.verify()
        if not getattr(self.store, "checks_values", False):
            checks.verify_finite(self.store, self.root)

    # --- appending ---------------------------------------------------------------------------

    def add(
        self,
        items: Embeddings | ImageInputs | Sequence[str],
        ids: Sequence[str | int] | None = None,
        *,
        batch_size: int = 64,
        compute_dtype: str = "float32",
    ) -> int:
        """Append one batch, committed atomically (a kill leaves the index as it was before).

        ``items`` are encoded here by the index's model, or come already encoded:

        - a caption index: the captions (a list of strings, stored with their text, which hits
          carry), or their :class:`~xmatch.Embeddings`;
        - an image index: :class:`~xmatch.RegionInputs` (precomputed regions) or
          :class:`~xmatch.PixelInputs` (pictures), as the model's image encoder reads them, or
          their :class:`~xmatch.Embeddings` (region boxes from ``Embeddings.boxes``).

        Embeddings must be made by this index's model. ``ids`` default to the next row numbers;
        an id already in the index is refused, and so is one that is not plain names joined by
        ``/`` (``trip/beach.jpg``; no newline, ``..`` or absolute path, at most 4096 bytes): the
        batch is then refused whole, nothing written.

        Args:
            items: what to add, as above.
            ids: one id per item.
            batch_size: images encoded at once (captions: 4x).
            compute_dtype: ``"bfloat16"`` encodes under bfloat16 autocast (:func:`encoding`).

        Returns:
            The number of items added.

        Example:
            >>> index = xmatch.index.create("idx", xmatch.build("teran-mrsw-scenes", pretrained=True), model_ref="teran-mrsw-scenes")
            >>> feats, boxes = torch.rand(2, 36, 1280), torch.tensor([0.1, 0.1, 0.5, 0.5]).expand(2, 36, 4)
            >>> index.add(xmatch.RegionInputs(feats, boxes), ids=["a", "b"])
            2
        """
        if isinstance(items, Embeddings):
            return self._append(items, ids, boxes=items.boxes, outside=True)
        if isinstance(items, str):
            raise TypeError("add takes a list of captions; wrap a single one in a list.")
        captions = _all_strings(items)
        if self.side == "texts":
            if not captions:
                raise WrongSideError(
                    f"{self.root} holds captions: add captions (a list of strings) or their xmatch.Embeddings, "
                    f"not {type(items).__name__}."
                )
            texts = list(items)
            with encoding(self.model, compute_dtype):
                embeddings = self.model.encode_texts(texts, batch_size=4 * batch_size).to(torch.float32)
            return self._append(embeddings, ids, texts=texts)
        if captions:
            raise WrongSideError(
                f"{self.root} holds images: add xmatch.RegionInputs, xmatch.PixelInputs (image files: "
                "xmatch.PixelInputs([...paths])) or their xmatch.Embeddings; captions go to a caption index (--side texts)."
            )
        inputs = _image_inputs(items, "add")
        with encoding(self.model, compute_dtype):
            embeddings = self.model.encode_images(inputs, batch_size=batch_size).to(torch.float32)
        return self._append(embeddings, ids, boxes=self._stored_boxes(inputs, embeddings))

    def _append(
        self,
        embeddings: Embeddings,
        ids: Sequence[str | int] | None,
        *,
        boxes: torch.Tensor | None = None,
        texts: list[str | None] | None = None,
        outside: bool = False,
    ) -> int:
        """Commit encoded items, with their region boxes (image index) or captions (caption
        index); ``outside``: the embeddings were not encoded here (their layout is checked
        against the model's)."""
        from filelock import FileLock

        n = len(embeddings)
        if texts is not None and len(texts) != n:
            raise ValueError(f"{len(texts)} texts for {n} embeddings.")
        with FileLock(str(self.root / ".lock")):
            self._reload_if_changed()
            ids = [str(i) for i in (ids if ids is not None else range(len(self), len(self) + n))]
            self._check_new_ids(ids, n)
            if embeddings.dim != self.manifest["dim"]:
                raise SearchIndexError(f"the index holds {self.manifest['dim']}-d tokens, the batch has {embeddings.dim}-d.")
            embeddings = embeddings.detach().to("cpu")
            checks.check_finite(embeddings, ids)
            expected = self._makes_pooled() if outside else None
            if expected is not None:
                checks.check_pooled(embeddings.pooled is not None, expected, self.root)
            self.store.add(embeddings, ids, boxes=boxes, texts=texts)
        return n

    def _makes_pooled(self) -> bool | None:
        """Whether this index's items carry pooled vectors: as the stored ones do, or, in an
        empty index, as the model makes them for one probe item (None: the image encoder does
        not say what it reads)."""
        if len(self):
            return bool(self.store.has_pooled())
        with torch.inference_mode():
            if self.side == "texts":
                return self.model.encode_texts(["a"]).pooled is not None
            encoder = self.model.image_encoder
            if input_type_of(encoder) is PixelInputs:
                from PIL import Image

                probe = PixelInputs([Image.new("RGB", (64, 64))])
            else:
                width = getattr(encoder, "feature_dim", None)
                if width is None:  # a plugin encoder that does not say its input width
                    return None
                probe = RegionInputs(torch.zeros(1, 1, width), torch.tensor([[[0.0, 0.0, 1.0, 1.0]]]))
            return self.model.encode_images(probe).pooled is not None

    def _stored_boxes(self, inputs: ImageInputs, e: Embeddings) -> torch.Tensor | None:
        """The region boxes stored with the image embeddings ``e`` of ``inputs`` (None when the
        tokens have none)."""
        if isinstance(inputs, PixelInputs):
            return self._pixel_boxes(inputs.images, e)
        return self._token_boxes(inputs.boxes, e)

    @staticmethod
    def _token_boxes(boxes: torch.Tensor | None, e: Embeddings) -> torch.Tensor | None:
        """Region boxes aligned with the stored tokens: the encoder's own (when it chose the
        regions), else the given ones (region r is token r)."""
        own = getattr(e, "boxes", None)
        if own is not None:
            return own
        if boxes is None:
            return None
        boxes = torch.as_tensor(boxes, dtype=torch.float32)[:, : e.tokens.shape[1]]
        if boxes.shape[:2] != e.tokens.shape[:2]:
            return None  # the encoder's tokens are not the given regions (e.g. a grid)
        return boxes

    def _pixel_boxes(self, images: Sequence[Any] | torch.Tensor, e: Embeddings) -> torch.Tensor | None:
        """Grid-cell boxes in each original image's frame, when the encoder can say (timm-grid)."""
        encoder = self.model.image_encoder
        if getattr(e, "boxes", None) is not None:
            return e.boxes
        # a preprocessed tensor has lost the original frames; so has a path or an array (no .size pair)
        if not hasattr(encoder, "image_boxes") or isinstance(images, torch.Tensor) or not all(
            isinstance(getattr(im, "size", None), tuple) for im in images
        ):
            return None
        boxes = torch.stack([encoder.image_boxes(*im.size) for im in images])
        return boxes if boxes.shape[:2] == e.tokens.shape[:2] else None

    def _check_new_ids(self, ids: list[str], n: int) -> None:
        if len(ids) != n:
            raise ValueError(f"{len(ids)} ids for {n} items.")
        for k, i in enumerate(ids):  # ids are printed, written a line each and named as paths: one rule for all
            plain_path(i, f"{self.root}: item {k} of the batch", "id", SearchIndexError)
        if len(set(ids)) != n:
            dup = next(i for i in ids if ids.count(i) > 1)
            raise SearchIndexError(f"id {dup!r} appears twice in the batch; ids must be unique.")
        present = set(self.store.ids)
        clash = next((i for i in ids if i in present), None)
        if clash is not None:
            raise SearchIndexError(f"id {clash!r} is already in the index {self.root}; ids must be unique.")

    def refresh(self) -> None:
        """Take in what any process committed since this index last looked, as every search,
        ``get()`` and append do first: for a caller that reads ``len(index)`` or ``ids``
        without searching (``xmatch serve``'s ``/health``).

        Raises:
            SearchIndexError: as a search would (the change could not be taken in, the index
                was rebuilt with another model, removed).

        Example:
            >>> from xmatch.index.synthetic import scoring_model
            >>> writer = xmatch.index.create("idx", scoring_model("MrSw", 16))
            >>> reader = xmatch.index.open("idx")
            >>> writer.add(xmatch.RegionInputs(torch.rand(2, 3, 16), torch.tensor([0.1, 0.1, 0.5, 0.5]).expand(2, 3, 4)))
            2
            >>> len(reader), (reader.refresh(), len(reader))[1]
            (0, 2)
        """
        self._reload_if_changed()

    def _reload_if_changed(self) -> None:
        """Take in what any process committed since this index last looked: each call reads the
        manifest's signature (:func:`~xmatch.index.store.manifest_signature`: its first bytes,
        which hold the generation id, and its inode, time and size), and where that changed,
        the manifest. Any other manifest (a new generation) reloads: after appends only the new
        shards are opened and the stage-1 structures extended; otherwise (an overwrite) the
        store is opened anew and the stage-1 structures are read again.

        Raises:
            DamagedIndexError: the manifest is gone.
            ModelMismatchError: the index was rebuilt with another model or for the other side.
            SearchIndexError: the change could not be taken in (the cause named); the next call
                tries again, and nothing is answered from the state before the change.
        """
        try:
            signature = manifest_signature(self.root)
            if signature == self._manifest_signature:
                return
            current = read_manifest(self.root)
        except FileNotFoundError:
            raise DamagedIndexError(f"{self.root / MANIFEST} is gone: the index was removed or moved.") from None
        except SearchIndexError as exc:
            raise self._not_reloaded(exc) from None
        if current != self.manifest:
            self._check_rebuilt(current)
            follow = getattr(self.store, "follow", None)
            try:
                if follow is None or not follow(current):
                    self.close()  # the old store's engine lock and connections go before the new one opens
                    self.store = _open_store(self.root, current, self.in_memory)
                    self._generators.clear()
            except Exception as exc:  # whatever the engine raised: named in the message
                raise self._not_reloaded(exc) from None
            self.manifest = current
        self._manifest_signature = signature  # only once the state it names is the one held

    def _check_rebuilt(self, current: dict[str, Any]) -> None:
        """Refuse a manifest of an index rebuilt since it was opened with another model (the
        queries would be encoded in another space) or for the other side."""
        was, now = self.manifest["model"]["fingerprint"], current["model"]["fingerprint"]
        if now != was:
            raise ModelMismatchError(
                f"the index {self.root} was rebuilt with another model (fingerprint {short(now)}, was {short(was)}) "
                "since it was opened: its items live in another space. Open it again (xmatch.index.open) to search "
                "it with its new model."
            )
        if current["side"] != self.side:
            raise WrongSideError(
                f"the index {self.root} was rebuilt to hold {current['side']} since it was opened; open it again "
                "(xmatch.index.open)."
            )

    def _not_reloaded(self, cause: Exception) -> SearchIndexError:
        return SearchIndexError(
            f"the index {self.root} changed on disk since it was last read (another process appended to it or "
            f"rebuilt it) and could not be reloaded ({cause}); nothing was answered from the old state. Search "
            "again once the writer has finished, or open the index again (xmatch.index.open)."
        )

    # --- searching ---------------------------------------------------------------------------

    def search_texts(self, texts: Sequence[str], k: int = 10, **options: Any) -> list[SearchResult]:
        """Text-to-image search: the ``k`` best images of each caption.

        Options are those of :meth:`search` (``candidates``, ``exact``, ``stage1``, ``rerank``, ...).

        Example:
            >>> index = xmatch.index.create("idx", xmatch.build("teran-mrsw-scenes", pretrained=True), model_ref="teran-mrsw-scenes")
            >>> index.add(xmatch.RegionInputs(torch.rand(3, 36, 1280), torch.tensor([0.1, 0.1, 0.5, 0.5]).expand(3, 36, 4)))
            3
            >>> hits = index.search_texts(["a red circle left of a blue seven"], k=2)[0]
            >>> len(hits.ids), set(hits.ids) <= {"0", "1", "2"}  # ids default to the row numbers
            (2, True)
        """
        if isinstance(texts, str):
            raise TypeError("search_texts takes a list of queries; wrap a single one in a list.")
        if self.side != "images":
            raise WrongSideError(
                f"{self.root} holds captions: search it with images (search_images / --image); "
                "for text queries index the images (xmatch index ... --side images)."
            )
        start = time.perf_counter()
        with torch.inference_mode():
            queries = self.model.encode_texts(list(texts))
        encoding = time.perf_counter() - start
        return _encoded(self.search(queries, k, labels=list(texts), **options), encoding)

    def search_images(
        self,
        inputs: ImageInputs,
        k: int = 10,
        *,
        labels: Sequence[str] | None = None,
        **options: Any,
    ) -> list[SearchResult]:
        """Image-to-text search over a caption index: the ``k`` best captions of each image.

        Args:
            inputs: the query images as the model's image encoder reads them:
                :class:`~xmatch.PixelInputs` (pictures) or :class:`~xmatch.RegionInputs`
                (precomputed region features).
            k: results per query.
            labels: the queries' names, copied into the results.
            **options: those of :meth:`search` (``candidates``, ``exact``, ``stage1``, ``rerank``, ...).

        Example:
            >>> index.search_images(xmatch.PixelInputs([Image.open("dog.png")]), k=5)[0].hits[0].text  # needs an index and a picture  # doctest: +SKIP
        """
        if self.side != "texts":
            raise WrongSideError(
                f"{self.root} holds images: search it with texts (search_texts / --text); "
                "for image queries index the captions (xmatch index ... --side texts)."
            )
        inputs = _image_inputs(inputs, "search_images")
        start = time.perf_counter()
        with torch.inference_mode():
            queries = self.model.encode_images(inputs)
        encoding = time.perf_counter() - start
        return _encoded(self.search(queries, k, labels=list(labels) if labels is not None else None, **options), encoding)

    def search(
        self,
        queries: Embeddings,
        k: int = 10,
        *,
        effort: float | None = None,
        candidates: int | None = None,
        exact: bool = False,
        stage1: str | None = None,
        nprobe: int | None = None,
        labels: Sequence[str] | None = None,
        rerank: int | None = None,
        rerank_batch: int = verifier.DEFAULT_BATCH,
    ) -> list[SearchResult]:
        """The ``k`` best stored items of each query (already encoded by this index's model).

        Each result records the time per query of each stage (``timings``, milliseconds).

        Args:
            queries: the queries' token sets (texts for an image index, images for a caption index).
            k: results per query; past the number of items, every item (as FAISS and Qdrant
                answer). Items whose stored values are not finite are left out of the hits
                (``result.extra["non_finite"]`` counts them).
            effort: how much work to spend for recall (default 1; a number > 0, 2 spends about
                twice as much at most, 0.5 half). Past the exact token scan, the token stage 1
                widens per query (centroid lists visited, candidates scored) until the k-th
                exact score beats its estimate of every item left unscored, up to a cap that
                scales with ``effort``; other stage-1 generators score ``effort`` times
                :func:`~xmatch.index.ranking.default_candidates`. A proven-exact search does not
                depend on it. Recall and work measured in docs/search.md.
            candidates: expert setting in place of ``effort``: items scored exactly per query,
                no widening (default :func:`~xmatch.index.ranking.default_candidates`; with a
                provable stage 1, the first batch, default ``2 k``, grown until proven).
            exact: score every item (no stage 1).
            stage1: ``tokens``, ``pooled`` or ``fde`` (FAISS), ``maxsim`` or ``pooled``
                (Qdrant); default: ``tokens`` / ``maxsim`` for token poolers, ``pooled`` for
                poolers of global vectors.
            nprobe: expert setting in place of ``effort``: centroid lists visited per query
                token (token indexes past 65,536 tokens), no widening (default 8 when only
                ``candidates`` is given).
            labels: the queries' texts, copied into the results.
            rerank: a third stage: the pooler's top ``rerank`` hits of each query (all of them
                when fewer) are re-scored by the model's verifier head and returned first, in
                its order; ``k`` hits are returned in all (see :mod:`xmatch.index.verifier`).
            rerank_batch: (query, item) pairs per verifier call.

        Raises:
            EmptyIndexError: the index holds nothing yet.
            ValueError: ``k`` is not a whole number >= 1, ``rerank`` is below 1, ``effort`` is
                not a number > 0 or comes with ``candidates`` / ``nprobe``.
            SearchIndexError: a query holds NaN or infinite values; the index changed on disk
                and could not be reloaded.
            NoVerifierError: ``rerank`` with a model that has no verifier head.

        Example:
            >>> index = xmatch.index.open("idx-v")  # needs an index built with a model that has a verifier head  # doctest: +SKIP
            >>> top = index.search_texts(["a red circle left of a blue seven"], k=5, rerank=20)[0]  # doctest: +SKIP
            >>> [(h.stage, h.verifier is not None) for h in top.hits][0], top.reranked  # doctest: +SKIP
            (('verifier', True), 20)
        """
        self._reload_if_changed()
        n = len(self)
        if n == 0:
            raise EmptyIndexError(f"the index {self.root} is empty; add items first (xmatch index ... --append).")
        k = _count_option("k", k)
        candidates = _count_option("candidates", candidates, none=True)
        nprobe = _count_option("nprobe", nprobe, none=True)
        k = min(k, n)  # past the corpus: all of it
        if queries.dim != self.manifest["dim"]:
            raise SearchIndexError(f"queries are {queries.dim}-d but the index holds {self.manifest['dim']}-d tokens.")
        bad = checks.non_finite_items(queries.tokens, queries.mask, queries.pooled)
        if bool(bad.any()):
            raise SearchIndexError(
                f"query {int(bad.nonzero()[0])} has NaN or infinite values in its embeddings; nothing was searched in "
                f"{self.root}. Check the query model's weights and inputs (a model with non-finite weights encodes "
                "every query so)."
            )
        labels = list(labels) if labels is not None else [None] * len(queries)
        if rerank is None:
            return self._ranked(queries, k, labels, candidates, exact, stage1, nprobe, effort)
        verifier.check(self.model, rerank, self.root, rerank_batch)
        results = self._ranked(queries, min(n, max(k, rerank)), labels, candidates, exact, stage1, nprobe, effort)
        return verifier.rerank_results(self.model, self.side, self.store, queries, results, rerank, k, rerank_batch)

    def prepare(self, stage1: str | None = None) -> None:
        """Build (or bring up to date) the stage-1 structure now rather than at the first query."""
        if len(self) == 0:
            return
        gen = self.generator(stage1)
        if isinstance(gen, FaissGenerator):
            gen.sync()

    def close(self) -> None:
        """Release the engine's resources (the Qdrant client's storage lock)."""
        close = getattr(self.store, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> SearchIndex:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _encoded(results: list[SearchResult], seconds: float) -> list[SearchResult]:
    """Put the queries' encoding time per query (milliseconds) first in every result's timings."""
    for result in results:
        result.timings = {"encode": 1000 * seconds / len(results), **result.timings}
    return results


def _open_store(root: Path, manifest: dict[str, Any], in_memory: bool = False) -> Any:
    if manifest["engine"]["name"] == "qdrant":
        from xmatch.index.qdrant import QdrantStore

        return QdrantStore(root, manifest)
    return ShardStore(root, manifest, in_memory)


# --- creating and opening ----------------------------------------------------------------------


def create(
    path: str | os.PathLike,
    model: MatchingModel,
    *,
    side: str = "images",
    model_ref: str | None = None,
    dtype: str = "float16",
    engine: str = "faiss",
    qdrant: str | None = None,
    collection: str | None = None,
    progress: bool = False,
) -> SearchIndex:
    """Create an empty index for ``model`` at ``path``.

    Args:
        path: the index folder (created; must not hold an index already).
        model: the model whose encoders fill the index and whose pooler ranks.
        side: ``"images"`` (answers text queries) or ``"texts"`` (answers image queries).
        model_ref: how to rebuild the model when opening: a zoo name with weights,
            ``local-dir:DIR`` or ``hf-hub:ORG/NAME``. Without it the model is saved into the
            index (``INDEX/model``), so the index is self-contained.
        dtype: ``"float16"`` (default, half the bytes) or ``"float32"`` for the stored tokens.
        engine: ``"faiss"`` (embedded, default) or ``"qdrant"`` (token sets in a Qdrant collection).
        qdrant: with ``engine="qdrant"``: a server URL (``http://host:6333``), or the name of
            the Qdrant Edge shard's folder inside the index (default ``qdrant``).
        collection: the collection name on a Qdrant server (default ``xmatch-<folder name>``).

    Example:
        >>> model = xmatch.build("teran-mrsw-scenes", pretrained=True)
        >>> index = xmatch.index.create("idx", model, model_ref="teran-mrsw-scenes")
        >>> len(index), index.side
        (0, 'images')
    """
    root = Path(path)
    check_side(side)
    if dtype not in STORED_DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(STORED_DTYPES)}, got {dtype!r}.")
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; engines: {', '.join(ENGINES)}.")
    if model_ref is not None:  # open() rebuilds the model from it: a reference without weights is refused now
        from xmatch.model.factory import check_reference

        check_reference(model_ref, "model_ref")
    if (root / MANIFEST).exists():
        raise SearchIndexError(f"{root} already holds an index; append to it (xmatch index ... --append) or choose another --out.")
    if root.exists() and any(root.iterdir()):
        raise SearchIndexError(f"{root} exists and is not an empty folder; choose another --out.")
    engine_record: dict[str, Any] = {"name": engine}
    if engine == "qdrant":  # checked before anything is written: a refused location leaves no folder
        engine_record |= qdrant_location.engine_record(root, qdrant, collection)
    root.mkdir(parents=True, exist_ok=True)
    from xmatch.core.version import __version__

    if model_ref is not None and model_ref.startswith("local-dir:"):
        model_ref = "local-dir:" + str(Path(model_ref[len("local-dir:") :]).resolve())
    if model_ref is None:
        from xmatch.io.bundle import save_pretrained

        save_pretrained(model, root / MODEL_FOLDER)
    manifest = {
        "format": FORMAT,
        "xmatch_version": __version__,
        "side": side,
        "dim": model.embed_dim,
        "dtype": dtype,
        "model": {"ref": model_ref, "fingerprint": model_fingerprint(model), "spec": embedding_spec(model),
                  "pooler": model.spec.get("pooler", {}).get("name")},
        "engine": engine_record,
        "items": 0,
        "shards": [],
    }
    write_manifest(root, manifest)
    return SearchIndex(root, manifest, model, progress=progress)


def open(  # noqa: A001 - the public name is xmatch.index.open, as the issue asks
    path: str | os.PathLike,
    model: MatchingModel | str | None = None,
    *,
    device: str | torch.device | None = None,
    progress: bool = False,
    in_memory: bool = False,
) -> SearchIndex:
    """Open an index for searching and appending.

    Args:
        path: the index folder.
        model: the model to query with: None (the one the index records: its zoo name or
            bundle, or the copy saved inside the index), a model, or a name for
            ``xmatch.build(name, pretrained=True)``. Its pooler ranks; its encoders must be
            the index's (same fingerprint), or the index is refused.
        device: where the model runs (default CPU).
        in_memory: read the stored token sets into memory instead of mapping them (steadier
            latency where the system reclaims cold file pages; costs their size in RAM).

    Raises:
        FileNotFoundError: no index at ``path``.
        ModelMismatchError: ``model`` is not the model the index was built with.
        DamagedIndexError: a file of the index is missing or damaged (named).

    Example:
        >>> created = xmatch.index.create("idx", xmatch.build("teran-mrsw-scenes", pretrained=True), model_ref="teran-mrsw-scenes")
        >>> created.add(xmatch.RegionInputs(torch.rand(2, 36, 1280), torch.tensor([0.1, 0.1, 0.5, 0.5]).expand(2, 36, 4)))
        2
        >>> index = xmatch.index.open("idx")  # `xmatch index` writes one from the command line
        >>> len(index), index.side
        (2, 'images')
    """
    root = Path(path)
    manifest = read_manifest(root)
    recorded = model is None
    if model is None or isinstance(model, str):
        model = _load_model(root, manifest, model, device)
    elif device is not None:
        model = model.to(device)
    found = model_fingerprint(model)
    if found != manifest["model"]["fingerprint"]:
        ref = manifest["model"].get("ref") or f"the model saved in {root / MODEL_FOLDER}"
        if recorded:  # opened without a model: the recorded reference itself no longer gives the index's model
            raise ModelMismatchError(
                f"the index {root} records the model {ref}, but that model's fingerprint is {short(found)}, not the "
                f"{short(manifest['model']['fingerprint'])} the index was built with: the reference in {root / MANIFEST} "
                "was changed, or the weights it names were replaced since. Pass the model the index was built with, "
                "xmatch.index.open(path, model=...) (xmatch search --model MODEL), or re-index with this one "
                "(xmatch index ... --out NEW_INDEX)."
            )
        raise ModelMismatchError(
            f"the query model (fingerprint {short(found)}) is not the model the index {root} was built with "
            f"({ref}, fingerprint {short(manifest['model']['fingerprint'])}): its embeddings live in another space. "
            f"Open the index without a model to use {ref}, or re-index with this model (xmatch index ... --out NEW_INDEX)."
        )
    return SearchIndex(root, manifest, model, progress=progress, in_memory=in_memory)


def _count_option(name: str, value: Any, *, none: bool = False) -> Any:
    """``value`` checked as a whole number >= 1 (None allowed where ``none``)."""
    if value is None and none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a whole number >= 1, got {value!r}.")
    return int(value)


def _all_strings(items: Any) -> bool:
    return isinstance(items, Sequence) and not isinstance(items, str) and all(isinstance(t, str) for t in items)


def _image_inputs(items: Any, method: str) -> ImageInputs:
    """Images as typed inputs, or an error that names the wrapping."""
    if isinstance(items, (RegionInputs, PixelInputs)):
        return items
    raise TypeError(
        f"{method} takes typed images, got {type(items).__name__}: wrap region features as "
        "xmatch.RegionInputs(regions, boxes, mask), pictures or image files as xmatch.PixelInputs([...])."
    )


def _load_model(root: Path, manifest: dict[str, Any], name: str | None, device: Any) -> MatchingModel:
    from xmatch.core.spec import SpecError
    from xmatch.model.factory import build, build_reference

    ref = name or manifest["model"].get("ref")
    if ref is None:
        bundle = root / MODEL_FOLDER
        if not bundle.is_dir():
            raise SearchIndexError(f"{root} records no model and has no {MODEL_FOLDER}/ bundle; pass model=... to open().")
        return build(f"local-dir:{bundle}", pretrained=True, device=device)
    if name is not None:
        return build_reference(ref, device=device)
    try:
        return build_reference(ref, device=device)
    except SpecError as exc:  # the manifest's reference: the message names the index and what to pass instead
        raise SearchIndexError(
            f"{root} records the model {ref!r}, which cannot be built: {exc} Pass the model the index was built "
            "with: xmatch.index.open(path, model=...) (xmatch search --model MODEL)."
        ) from None
