"""What ``xmatch serve`` answers, without HTTP: one open index (opened once, following the
index's freshness rule: appends committed by other processes are seen at the next request),
searched by one request at a time, and its answers as JSON-ready dicts and bytes.

Every refusal is a :class:`~xmatch.serve.limits.RequestError` carrying its HTTP status and a
message that names what was wrong; the index's own errors are turned into one here.
"""

from __future__ import annotations

import contextlib
import io
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from xmatch.core.errors import XmatchError
from xmatch.index.errors import EmptyIndexError, NoVerifierError, SearchIndexError, WrongSideError
from xmatch.index.search import MODEL_FOLDER, SearchIndex
from xmatch.serve import alignment
from xmatch.serve.pictures import PictureFolder, read_picture, thumbnail
from xmatch.serve.limits import Limits, RequestError

#: side of a thumbnail, in pixels
THUMBNAIL_SIDE = 256


class SearchService:
    """An open index and what the server answers with it.

    Args:
        index: the open index (the service closes it in :meth:`close`).
        pictures: where its pictures are (thumbnails, the alignment figure).
        limits: what one request may ask.

    Example:
        >>> index = xmatch.index.create("idx", xmatch.build("teran-mrsw-scenes", pretrained=True), model_ref="teran-mrsw-scenes")
        >>> index.add(xmatch.RegionInputs(torch.rand(3, 36, 1280), torch.tensor([0.1, 0.1, 0.5, 0.5]).expand(3, 36, 4)))
        3
        >>> service = SearchService(index, PictureFolder(None), Limits())
        >>> answer = service.search_text("a red circle left of a zebra", k=2)
        >>> len(answer["hits"]), answer["exactness"], answer["unknown_words"]
        (2, 'exhaustive', ['zebra'])
    """

    def __init__(self, index: SearchIndex, pictures: PictureFolder, limits: Limits) -> None:
        self.index, self.pictures, self.limits = index, pictures, limits
        # the index object is not made for concurrent calls: one request uses it at a time
        self._lock = threading.Lock()

    # --- what the index is ---------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        """``{"status": "ok", "items": N}``."""
        with self._using():
            self.index.refresh()
            return {"status": "ok", "items": len(self.index)}

    def card(self) -> dict[str, Any]:
        """The index's card: its model (reference, fingerprint, pooler, whether it has a
        verifier), size, side, engine, whether pictures are served, and the request limits."""
        index = self.index
        with self._using():
            index.refresh()
            manifest = index.manifest
            model = index.model
            return {
                "model": manifest["model"].get("ref") or f"local-dir:{index.root / MODEL_FOLDER}",
                "fingerprint": index.fingerprint,
                "pooler": type(model.pooler).__name__.removesuffix("Pooler"),
                "verifier": getattr(model, "verifier", None) is not None,
                "size": len(index),
                "side": index.side,
                "engine": index.engine,
                "dtype": manifest["dtype"],
                "pictures": self.pictures.root is not None,
                "limits": {"max_query_chars": self.limits.max_query_chars, "max_k": self.limits.max_k,
                           "max_rerank": self.limits.max_rerank, "max_upload_bytes": self.limits.max_upload_bytes},
            }

    # --- searching -----------------------------------------------------------------------------

    def search_text(self, text: str, k: int = 10, rerank: int | None = None, exact: bool = False) -> dict[str, Any]:
        """What ``xmatch search INDEX --json --text TEXT`` prints for the query, plus
        ``unknown_words`` (the query's words the model's text side does not know) and
        ``warnings`` (what the command line says on stderr)."""
        text = self.limits.check_query(text)
        k, rerank = self.limits.check_k(k), self.limits.check_rerank(rerank)
        with self._using():
            unknown, warnings = unknown_words(self.index.model, text)
            warnings += self._rerank_warnings(rerank)
            result = self.index.search_texts([text], k=k, exact=exact, **_verifier(rerank))[0]
        return result.as_dict() | {"unknown_words": unknown, "warnings": warnings}

    def search_image(self, data: bytes, k: int = 10, rerank: int | None = None, exact: bool = False) -> dict[str, Any]:
        """The ``k`` best captions of an uploaded picture (a caption index of a model that reads
        pixels), as :meth:`search_text` answers."""
        from xmatch.model.inputs import PixelInputs, input_type_of

        k, rerank = self.limits.check_k(k), self.limits.check_rerank(rerank)
        if len(data) > self.limits.max_upload_bytes:
            raise RequestError(413, f"the upload is {len(data)} bytes, over the server's limit of "
                               f"{self.limits.max_upload_bytes} (--max-upload-bytes).")
        if self.index.side != "texts":
            raise RequestError(422, f"the index holds {self.index.side}: search it with text (GET /search?text=...); "
                               "a picture searches a caption index (xmatch index ... --side texts).")
        if input_type_of(self.index.model.image_encoder) is not PixelInputs:
            raise RequestError(422, "the index's model reads precomputed region features, not pictures: an uploaded "
                               "picture cannot be encoded (search with region features from Python: index.search_images).")
        picture = _decode_upload(data, self.limits.max_pixels)
        with self._using():
            warnings = self._rerank_warnings(rerank)
            result = self.index.search_images(PixelInputs([picture]), k=k, labels=["upload"], exact=exact,
                                              **_verifier(rerank))[0]
        return result.as_dict() | {"unknown_words": [], "warnings": warnings}

    # --- pictures ------------------------------------------------------------------------------

    def thumbnail(self, item: str) -> bytes:
        """The picture of the stored item ``item``, at most :data:`THUMBNAIL_SIDE` pixels a
        side, as JPEG bytes; only items the index holds are looked up."""
        path = self.pictures.path_of(self._known(item))
        return thumbnail(path, THUMBNAIL_SIDE, self.limits.max_pixels)

    def alignment(self, query: str, item: str) -> alignment.Alignment:
        """The region-word alignment of the stored picture ``item`` with ``query``."""
        query = self.limits.check_query(query)
        with self._using():
            return alignment.align(self.index, query, item)

    def alignment_png(self, query: str, item: str) -> bytes:
        """:meth:`alignment` drawn as the demo's figure, PNG bytes (on the item's picture where
        the server has it)."""
        pair = self.alignment(query, item)
        try:
            image = read_picture(self.pictures.path_of(item), self.limits.max_pixels)
        except RequestError as exc:
            if exc.status != 404:
                raise
            image = None  # no picture folder, or no file for it: the boxes are drawn on grey
        out = io.BytesIO()
        alignment.picture(pair, image).save(out, format="PNG")
        return out.getvalue()

    def close(self) -> None:
        """Close the index."""
        self.index.close()

    # --- helpers ---------------------------------------------------------------------------

    def _known(self, item: str) -> str:
        """``item`` when the index holds it (after taking in what was appended), else a 404."""
        with self._using():
            try:
                self.index.get([item])
            except KeyError:
                raise RequestError(404, f"the index holds no item {item!r}.") from None
        return item

    def _rerank_warnings(self, rerank: int | None) -> list[str]:
        """The warning ``xmatch search --rerank`` prints for a verifier with no validation
        record or one near chance."""
        if rerank is None or getattr(self.index.model, "verifier", None) is None:
            return []
        from xmatch.eval.rerank import recorded_validation, validation_warning

        reference = self.index.manifest["model"].get("ref") or f"local-dir:{self.index.root / MODEL_FOLDER}"
        try:
            keeps_record, record = recorded_validation(reference)
        except (OSError, ValueError):  # the model's own files moved: nothing to read
            return []
        warning = validation_warning(record, reference, rerank) if keeps_record else None
        return [warning] if warning else []

    @contextlib.contextmanager
    def _using(self) -> Iterator[None]:
        """Hold the index for one request (waiting at most ``limits.wait_s``), turning the
        index's errors into :class:`RequestError`."""
        if not self._lock.acquire(timeout=self.limits.wait_s):
            raise RequestError(503, f"the server is busy: the index was in use for over {self.limits.wait_s:g} s; "
                               "try again.")
        try:
            yield
        except RequestError:
            raise
        except (WrongSideError, NoVerifierError, EmptyIndexError) as exc:
            raise RequestError(422 if not isinstance(exc, EmptyIndexError) else 409, str(exc)) from None
        except SearchIndexError as exc:  # a change on disk that could not be taken in yet, damage
            raise RequestError(503, str(exc)) from None
        except (XmatchError, ValueError) as exc:  # what the index says of a query it refuses
            raise RequestError(422, str(exc)) from None
        finally:
            self._lock.release()


def unknown_words(model: Any, text: str) -> tuple[list[str], list[str]]:
    """The words of ``text`` the model's text side does not know, and the warning ``xmatch
    search`` prints for them (none when every word is known or the encoder cannot say).

    Example:
        >>> unknown_words(xmatch.build("teran-mrsw-scenes"), "a red zebra")[0]
        ['zebra']
    """
    from xmatch.data.vocab import token_coverage

    coverage = token_coverage(model, [text])
    if coverage is None or not coverage.unknown:
        return [], []
    words = [w for w, _ in coverage.unknown_words]
    named = ", ".join(repr(w) for w in words) or "some word pieces"
    if coverage.all_unknown:
        warning = (f"no word of {text!r} is known to the model's text side ({named}): its ranking says nothing about "
                   "the query. Use a model trained on such words (xmatch models).")
    else:
        warning = (f"{coverage.unknown} of the {coverage.tokens} words of {text!r} are unknown to the model's text "
                   f"side ({named}) and do not steer the ranking.")
    return words, [warning]


def open_service(path: Path, images: Path | None = None, limits: Limits | None = None, *,
                 model: Any = None, device: str | None = None) -> SearchService:
    """Open the index at ``path`` once for serving: with its recorded model, or ``model`` (a
    model or a name, as :func:`xmatch.index.open` takes it). Pictures are read from
    ``images``, else from the folder the index records (:attr:`SearchIndex.pictures`) where it
    is still a folder; else there are none.

    Raises:
        FileNotFoundError: no index at ``path``, or ``images`` is not a folder.
    """
    from xmatch.index import open as open_index

    if images is not None and not images.is_dir():
        raise FileNotFoundError(f"picture folder {images} does not exist or is not a folder (xmatch serve --images DIR).")
    index = open_index(path, model, device=device)
    if images is None and index.pictures is not None and index.pictures.is_dir():
        images = index.pictures
    return SearchService(index, PictureFolder(images), limits or Limits())


def _verifier(rerank: int | None) -> dict[str, int]:
    return {} if rerank is None else {"rerank": rerank}


def _decode_upload(data: bytes, max_pixels: int) -> Any:
    """The uploaded picture, upright and RGB, its size checked from its header first."""
    from PIL import Image, ImageOps, UnidentifiedImageError

    from xmatch.io.pictures import ImageTooLargeError, check_pixels

    try:
        with Image.open(io.BytesIO(data)) as im:
            check_pixels(im.size, "the uploaded picture", max_pixels, fix="ask for a larger --max-pixels")
            im.load()
            return ImageOps.exif_transpose(im).convert("RGB")
    except ImageTooLargeError as exc:
        raise RequestError(413, str(exc)) from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise RequestError(422, f"the upload is not a picture Pillow can decode ({exc}); send a PNG or JPEG file "
                           "as the request body.") from None
