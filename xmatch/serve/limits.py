"""What one request to ``xmatch serve`` may ask: bounds on the query, ``k``, the re-ranked
hits, the uploaded picture, and how long a request may wait for the index."""

from __future__ import annotations

from dataclasses import dataclass

from xmatch.core.errors import XmatchError


class RequestError(XmatchError, ValueError):
    """A request the service refuses: ``status`` is the HTTP status it answers with (4xx),
    the message says what was wrong and what is allowed."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Limits:
    """Bounds on what one request may ask (``xmatch serve`` options of the same names).

    Attributes:
        max_query_chars: longest text query, in characters.
        max_k: most results per query.
        max_rerank: most hits the verifier re-scores per query.
        max_upload_bytes: largest uploaded picture, in bytes.
        max_pixels: largest uploaded picture, width x height from its header (refused
            before it is decoded).
        wait_s: longest a request waits for the index while others use it (then 503).

    Example:
        >>> Limits().check_k(10)
        10
        >>> Limits(max_k=50).check_k(51)
        Traceback (most recent call last):
        ...
        xmatch.serve.limits.RequestError: k must be a whole number from 1 to 50 (the server's --max-k), got 51.
    """

    max_query_chars: int = 1000
    max_k: int = 100
    max_rerank: int = 100
    max_upload_bytes: int = 10_000_000
    max_pixels: int = 50_000_000
    wait_s: float = 30.0

    def check_k(self, k: int) -> int:
        """``k`` if it is a whole number in ``[1, max_k]``, else a 422 :class:`RequestError`."""
        return _bounded("k", k, self.max_k, "--max-k")

    def check_rerank(self, rerank: int | None) -> int | None:
        """``rerank`` (None: no third stage) if in ``[1, max_rerank]``, else a 422."""
        return None if rerank is None else _bounded("rerank", rerank, self.max_rerank, "--max-rerank")

    def check_query(self, text: str) -> str:
        """The query stripped of surrounding blanks; an empty or over-long one is a 422."""
        text = text.strip()
        if not text:
            raise RequestError(422, "the query is empty; give the words to search for (text=...).")
        if len(text) > self.max_query_chars:
            raise RequestError(
                422, f"the query is {len(text)} characters long, over the server's limit of {self.max_query_chars} "
                "(--max-query-chars); shorten it."
            )
        return text


def _bounded(name: str, value: int, most: int, option: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
        raise RequestError(422, f"{name} must be a whole number from 1 to {most} (the server's {option}), got {value!r}.")
    return value
