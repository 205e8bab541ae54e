"""The region-word alignment of one hit for one query, as ``xmatch serve`` answers it: the
cosine of every region (or grid cell) of the stored item with every word of the query, each
word's best region, and the picture drawn as the demo draws it (:mod:`xmatch.demo.draw`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image

from xmatch.demo.draw import PALETTE, draw_alignment
from xmatch.demo.run import POOLER_MARKS, token_labels
from xmatch.index.search import SearchIndex
from xmatch.serve.limits import RequestError


@dataclass
class Alignment:
    """One (query, item) pair's region-word cosines.

    Attributes:
        query: the text query.
        item: the stored item's id.
        words: the query's tokens as the text encoder reads them, in order.
        boxes: ``[R][4]`` the regions' boxes ``x1, y1, x2, y2`` in [0, 1] of the picture, or
            None where the index keeps none.
        cosines: ``[R][W]`` region-word cosines (:meth:`MatchingModel.alignment`).
        marks: which cosines the pooler sums: ``words``, ``regions`` or ``both``.
        pooler: the model's pooler (``MrSw``, ...).
    """

    query: str
    item: str
    words: list[str]
    boxes: list[list[float]] | None
    cosines: list[list[float]]
    marks: str
    pooler: str

    def best(self) -> list[dict[str, Any]]:
        """Each word's best region: ``{"word", "region", "cosine", "colour"}`` (one colour per
        word, from the demo's palette; ``box`` too where the index keeps boxes).

        Example:
            >>> a = Alignment("a red 7", "948", ["red", "7"], None, [[0.1, 0.9], [0.4, 0.2]], "words", "MrSw")
            >>> [(b["word"], b["region"], b["colour"]) for b in a.best()]
            [('red', 1, '#e69f00'), ('7', 0, '#56b4e9')]
        """
        out = []
        for j, word in enumerate(self.words):
            column = [row[j] for row in self.cosines]
            region = max(range(len(column)), key=column.__getitem__)
            colour = "#{:02x}{:02x}{:02x}".format(*PALETTE[j % len(PALETTE)])
            entry = {"word": word, "region": region, "cosine": column[region], "colour": colour}
            if self.boxes is not None:
                entry["box"] = self.boxes[region]
            out.append(entry)
        return out

    def as_dict(self) -> dict[str, Any]:
        """The JSON answer of ``GET /alignment``."""
        return {"query": self.query, "item": self.item, "pooler": self.pooler, "marks": self.marks,
                "words": self.words, "boxes": self.boxes, "cosines": self.cosines, "best": self.best()}


def align(index: SearchIndex, query: str, item: str) -> Alignment:
    """The alignment of the stored image ``item`` with the text ``query`` (an image index).

    Raises:
        RequestError: 422 for a caption index or a pooler that does not score with the
            region-word matrix (TERN's global cosine); 404 for an id the index does not hold.
    """
    model = index.model
    pooler = type(model.pooler).__name__.removesuffix("Pooler")
    if index.side != "images":
        raise RequestError(422, f"the index holds captions: an alignment pairs a text query with a stored picture "
                           "(an image index, xmatch index ... --side images).")
    if not getattr(model.pooler, "uses_tokens", True) or pooler not in POOLER_MARKS:
        raise RequestError(422, f"the model's pooler {pooler} does not score with the region-word matrix (it compares "
                           "global vectors): there is no alignment to show.")
    try:
        img = index.get([item])
    except KeyError:
        raise RequestError(404, f"the index holds no item {item!r}.") from None
    with torch.inference_mode():
        txt = model.encode_texts([query])
        matrix = model.alignment(img, txt).float().cpu()
    real = img.mask[0].cpu()
    boxes = None if img.boxes is None else img.boxes[0].float().cpu()[: len(real)][real].tolist()
    words = token_labels(model, query)
    if len(words) != matrix.shape[1]:  # an encoder whose tokens are not its words: numbered instead
        words = [f"#{k}" for k in range(matrix.shape[1])]
    return Alignment(query, item, words, boxes, matrix.tolist(), POOLER_MARKS[pooler], pooler)


def picture(alignment: Alignment, image: Any | None) -> Any:
    """The demo's alignment figure of ``alignment`` on ``image`` (a PIL picture; a grey square
    where the server has none), as a PIL picture.

    Raises:
        RequestError: 422 where the index keeps no boxes for its items.
    """
    if alignment.boxes is None:
        raise RequestError(422, "the index keeps no region boxes for its items, so the regions cannot be drawn; "
                           "GET /alignment without format=png gives the cosines.")
    notes = [f"{alignment.pooler} sums the cosines marked with a dot. Rows: the regions the score reads, numbered as "
             "on the image."]
    if image is None:
        image = Image.new("RGB", (224, 224), (200, 200, 200))
        notes.append("The server has no picture folder (xmatch serve --images DIR): boxes drawn on grey.")
    elif max(image.size) > 448:  # the figure enlarges it twice: keep it a page's width
        image = image.copy()
        image.thumbnail((448, 448))
    return draw_alignment(image, np.asarray(alignment.boxes), alignment.words, np.asarray(alignment.cosines),
                          marks=alignment.marks, notes=notes, title=f"{alignment.item}: \"{alignment.query}\"")
