"""The Qdrant engine: the token sets live in a Qdrant collection as multi-vectors.

Qdrant stores a variable number of vectors per point and scores a multi-vector query by
late interaction (``MultiVectorComparator.MAX_SIM``: for each query vector, the best stored
vector, summed). With a caption as the query and an image's regions stored, that is exactly
TERAN's MrSw. Each item is a point ``id = row`` with named vectors ``tokens`` (the real tokens,
no padding) and, when the model has them, ``pooled``; the payload holds the item's id, row and
caption.

- **Embedded local mode** (``qdrant=PATH``, default ``INDEX/qdrant``): no server; Qdrant scans
  every point exactly, so stage 1 is exhaustive MaxSim. The tests use it.
- **Server** (``qdrant=http://host:6333``): the collection can be sharded and replicated over
  a cluster; MaxSim candidates then come from Qdrant's HNSW graph (approximate), and stage 2
  stays exact: the candidates' token sets are fetched from Qdrant and scored by the pooler.

Appends are committed by the index manifest: points of an append that was killed before its
manifest was written (``row >= items``) are invisible to searches and removed by the next append.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from xmatch.model.embeddings import Embeddings
from xmatch.index.candidates import Candidates
from xmatch.index.errors import DamagedIndexError, SearchIndexError
from xmatch.index.interaction import Interaction
from xmatch.index.shards import STORED_DTYPES
from xmatch.index.store import write_manifest
from xmatch.model.masks import pad_stack

#: points per upsert request
UPSERT_BATCH = 256


def qdrant() -> Any:
    from xmatch.core.optional import require

    return require("qdrant_client", "xmatch-zoo[index]", "the Qdrant engine")


def is_url(location: str) -> bool:
    return location.startswith(("http://", "https://"))


class QdrantStore:
    """The corpus of an index kept in a Qdrant collection (local folder or server)."""

    def __init__(self, root: Path, manifest: dict[str, Any]) -> None:
        self.root, self.manifest = root, manifest
        engine = manifest["engine"]
        self.location, self.collection = engine["location"], engine["collection"]
        client = qdrant().QdrantClient
        try:
            self.client = client(url=self.location) if is_url(self.location) else client(path=self.location)
        except RuntimeError as exc:  # local mode: another process holds the folder
            raise SearchIndexError(f"Qdrant storage {self.location} is in use ({exc}); close the other client.") from None
        self._ids: list[str] | None = None
        if len(self) and not self.client.collection_exists(self.collection):
            raise DamagedIndexError(
                f"the index {root} records {len(self)} items in the Qdrant collection {self.collection!r} at "
                f"{self.location}, which does not exist; restore it or rebuild the index."
            )

    @property
    def exhaustive(self) -> bool:
        """Local mode scans every point: its MaxSim ranking is exact."""
        return not is_url(self.location)

    def __len__(self) -> int:
        return int(self.manifest.get("items", 0))

    def close(self) -> None:
        self.client.close()

    def has_pooled(self) -> bool:
        return bool(self.manifest["engine"].get("pooled", False))

    def _committed(self) -> Any:
        m = qdrant().models
        return m.Filter(must=[m.FieldCondition(key="row", range=m.Range(lt=len(self)))])

    def _payloads(self, rows: list[int]) -> list[dict[str, Any]]:
        points = self.client.retrieve(self.collection, ids=rows, with_payload=True, with_vectors=False)
        by_row = {int(p.id): p.payload for p in points}
        missing = [r for r in rows if r not in by_row]
        if missing:
            raise DamagedIndexError(f"the Qdrant collection {self.collection!r} lacks committed rows {missing[:5]}.")
        return [by_row[r] for r in rows]

    @property
    def ids(self) -> list[str]:
        if self._ids is None or len(self._ids) != len(self):
            self._ids = [p["id"] for start in range(0, len(self), 4096)
                         for p in self._payloads(list(range(start, min(start + 4096, len(self)))))]
        return self._ids

    def ids_of(self, rows: list[int]) -> list[str]:
        return [p["id"] for p in self._payloads(rows)]

    def texts(self, rows: list[int]) -> list[str | None]:
        return [p.get("text") for p in self._payloads(rows)]

    def row_of(self, ids: list[str]) -> list[int]:
        rows = {item: row for row, item in enumerate(self.ids)}
        missing = [i for i in ids if i not in rows]
        if missing:
            raise KeyError(f"id {missing[0]!r} is not in the index {self.root} ({len(missing)} unknown ids).")
        return [rows[i] for i in ids]

    def add(self, embeddings: Embeddings, ids: list[str], boxes: torch.Tensor | None = None,
            texts: list[str] | None = None) -> None:
        """Upsert one batch as points ``len(self) ...``, then commit it in the manifest."""
        m = qdrant().models
        self._ensure_collection(embeddings)
        self.client.delete(self.collection, points_selector=m.FilterSelector(filter=m.Filter(
            must=[m.FieldCondition(key="row", range=m.Range(gte=len(self)))])), wait=True)
        dtype = STORED_DTYPES[self.manifest["dtype"]]
        # the stored precision, as the FAISS engine keeps it: both engines score the same values
        tokens = embeddings.tokens.to(dtype).float()
        pooled = None if embeddings.pooled is None else embeddings.pooled.to(dtype).float()
        start = len(self)
        points = []
        for k, item in enumerate(ids):  # building the request: Qdrant takes one point object per item
            vector = {"tokens": tokens[k][embeddings.mask[k]].tolist()}
            if pooled is not None and self.has_pooled():
                vector["pooled"] = pooled[k].tolist()
            payload = {"id": item, "row": start + k} | ({"text": texts[k]} if texts is not None else {})
            if boxes is not None:
                payload["boxes"] = boxes[k][embeddings.mask[k]].tolist()
            points.append(m.PointStruct(id=start + k, vector=vector, payload=payload))
        for i in range(0, len(points), UPSERT_BATCH):
            self.client.upsert(self.collection, points=points[i : i + UPSERT_BATCH], wait=True)
        self.manifest["items"] = start + len(ids)
        write_manifest(self.root, self.manifest)
        if self._ids is not None:
            self._ids.extend(ids)

    def _ensure_collection(self, embeddings: Embeddings) -> None:
        if self.client.collection_exists(self.collection):
            if "pooled" not in self.manifest["engine"]:  # made beforehand (sharded, replicated) by its owner
                vectors = self.client.get_collection(self.collection).config.params.vectors
                self.manifest["engine"]["pooled"] = isinstance(vectors, dict) and "pooled" in vectors
            return
        m = qdrant().models
        datatype = m.Datatype.FLOAT16 if self.manifest["dtype"] == "float16" else m.Datatype.FLOAT32
        vectors = {"tokens": m.VectorParams(
            size=embeddings.dim, distance=m.Distance.DOT, datatype=datatype,
            multivector_config=m.MultiVectorConfig(comparator=m.MultiVectorComparator.MAX_SIM),
        )}
        if embeddings.pooled is not None:
            vectors["pooled"] = m.VectorParams(size=embeddings.dim, distance=m.Distance.DOT, datatype=datatype)
        self.client.create_collection(self.collection, vectors_config=vectors)
        if not self.exhaustive:  # a server filters on the committed rows through a payload index
            self.client.create_payload_index(self.collection, "row", field_schema=m.PayloadSchemaType.INTEGER)
        self.manifest["engine"]["pooled"] = embeddings.pooled is not None
        write_manifest(self.root, self.manifest)

    def boxes(self, rows: torch.Tensor) -> torch.Tensor | None:
        """Region boxes ``[n, T, 4]`` of ``rows`` from the payload (None when not kept)."""
        payloads = self._payloads(torch.as_tensor(rows, dtype=torch.long).tolist())
        if not payloads or any("boxes" not in p for p in payloads):
            return None
        return pad_stack([torch.tensor(p["boxes"], dtype=torch.float32) for p in payloads])[0]

    def gather(self, rows: torch.Tensor) -> Embeddings:
        """Float32 token sets of ``rows`` fetched from Qdrant, in the order given."""
        rows_list = torch.as_tensor(rows, dtype=torch.long).tolist()
        names = ["tokens", "pooled"] if self.has_pooled() else ["tokens"]
        points = self.client.retrieve(self.collection, ids=rows_list, with_vectors=names, with_payload=False)
        by_row = {int(p.id): p.vector for p in points}
        missing = [r for r in rows_list if r not in by_row]
        if missing:
            raise DamagedIndexError(f"the Qdrant collection {self.collection!r} lacks committed rows {missing[:5]}.")
        tokens, mask = pad_stack([torch.as_tensor(np.asarray(by_row[r]["tokens"], dtype=np.float32)) for r in rows_list])
        pooled = None
        if self.has_pooled():
            pooled = torch.as_tensor(np.asarray([by_row[r]["pooled"] for r in rows_list], dtype=np.float32))
        return Embeddings(tokens, mask, pooled)

    def blocks(self, first: int = 0, size: int = 1024):
        for start in range(first, len(self), size):
            yield start, self.gather(torch.arange(start, min(start + size, len(self))))

    def verify(self) -> None:
        """Check that the collection holds every committed row.

        Raises:
            DamagedIndexError: rows are missing from the collection.
        """
        count = self.client.count(self.collection, count_filter=self._committed(), exact=True).count
        if count != len(self):
            raise DamagedIndexError(
                f"the Qdrant collection {self.collection!r} at {self.location} holds {count} of the {len(self)} "
                f"committed items of the index {self.root}."
            )


class QdrantGenerator:
    """Stage 1 from Qdrant: MaxSim over the stored multi-vectors, or the pooled vectors.

    Qdrant's MaxSim sums over the *query's* tokens, so it is exactly the pooler's score for
    MrSw (MrAvgw up to the query's length) when captions query images, and for MwSr when
    images query captions; in local mode (exhaustive) those rankings are exact and bound
    every other item. Other poolers use it as an estimate.
    """

    def __init__(self, store: QdrantStore, name: str, interaction: Interaction | None, side: str, *,
                 exact_pooled: bool = False) -> None:
        if name not in ("maxsim", "pooled"):
            raise ValueError(f"unknown stage-1 generator {name!r} for the Qdrant engine; generators: maxsim, pooled.")
        if name == "maxsim" and interaction is None:
            raise ValueError("this pooler reads only global vectors; use stage1='pooled'.")
        self.store, self.name, self.interaction, self.side = store, name, interaction, side
        self.exact_pooled = exact_pooled

    @property
    def _bounded(self) -> bool:
        if not self.store.exhaustive:
            return False
        if self.name == "pooled":
            return self.exact_pooled
        i = self.interaction
        query_sum = i.text_sum if self.side == "images" else i.image_sum
        corpus_sum = i.image_sum if self.side == "images" else i.text_sum
        return i.bounded and query_sum and not corpus_sum and not (i.per_word and self.side == "texts")

    def propose(self, query: Embeddings, n: int) -> Candidates:
        if self.name == "pooled" and (query.pooled is None or not self.store.has_pooled()):
            raise SearchIndexError("stage1='pooled' needs global vectors on both sides; this model has none.")
        rows, bounds, floors = [], [], []
        for q in range(len(query)):  # Qdrant answers one query per request
            vector = query.pooled[q].tolist() if self.name == "pooled" else query.tokens[q][query.mask[q]].tolist()
            found = self.store.client.query_points(
                self.store.collection, query=vector, using="tokens" if self.name == "maxsim" else "pooled",
                limit=n, query_filter=self.store._committed(), with_payload=False,
            ).points
            rows.append(torch.tensor([int(p.id) for p in found], dtype=torch.long))
            scores = torch.tensor([float(p.score) for p in found])
            if self.name == "maxsim" and self.interaction.per_word:
                scores = scores / float(query.lengths[q])
            bounds.append(scores)
            complete = len(found) < n or n >= len(self.store)
            floors.append(float("-inf") if complete or not len(scores) else float(scores[-1]))
        if not self._bounded:
            return Candidates(rows)
        return Candidates(rows, bounds, torch.tensor(floors))
