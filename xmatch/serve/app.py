"""The FastAPI application of ``xmatch serve`` (the optional extra ``serve``: ``pip install
'xmatch-zoo[serve]'``): routes over a :class:`~xmatch.serve.service.SearchService`, an
optional bearer token, a bound on request bodies, and JSON errors (``{"error": message}``
with a 4xx status; a failure of the server itself is a 500 whose traceback goes to the log,
never to the client). The OpenAPI page is FastAPI's, at ``/docs``.

No ``from __future__ import annotations`` here: FastAPI reads the routes' annotations as
objects, and the routes are made inside :func:`create_app`, where strings could not be resolved.
"""

import hmac
from pathlib import Path
from typing import Any

from xmatch.core.optional import require
from xmatch.serve.limits import RequestError
from xmatch.serve.service import SearchService

STATIC = Path(__file__).parent / "static"
#: what a client may fetch without the token: the page, its files, the health check, the API's schema
PUBLIC = ("/", "/health", "/docs", "/docs/oauth2-redirect", "/openapi.json", "/favicon.ico")
#: the page's own files only (its scripts, style, pictures): no other origin, no inline script
PAGE_POLICY = "default-src 'self'; img-src 'self' blob: data:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'"


def create_app(service: SearchService, *, token: str | None = None) -> Any:
    """The application serving ``service`` (a ``fastapi.FastAPI``; run it with uvicorn).

    Args:
        service: the open index and its limits.
        token: when given, every route but the page, ``/health`` and the API schema asks for
            ``Authorization: Bearer TOKEN`` (401 otherwise).

    Raises:
        MissingDependencyError: FastAPI is not installed (the message gives the pip command).

    Example:
        >>> app = create_app(service)  # a SearchService (xmatch.serve.service.open_service)  # doctest: +SKIP
        >>> uvicorn.run(app, host="127.0.0.1", port=8000)  # doctest: +SKIP
    """
    fastapi = require("fastapi", "xmatch-zoo[serve]", "xmatch serve")
    from fastapi import Depends, Query, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import FileResponse, JSONResponse, Response
    from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
    from fastapi.staticfiles import StaticFiles
    from pydantic import BaseModel, ConfigDict, Field
    from starlette.concurrency import run_in_threadpool
    from starlette.exceptions import HTTPException

    limits = service.limits
    bearer = HTTPBearer(auto_error=False)

    def authorize(credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
        if token is None:
            return
        given = credentials.credentials if credentials is not None else ""
        if not hmac.compare_digest(given.encode(), token.encode()):
            raise RequestError(401, "this server asks for a token: send the header 'Authorization: Bearer TOKEN' "
                               "(the --token it was started with).")

    class SearchRequest(BaseModel):
        """A text search (``POST /search``)."""

        model_config = ConfigDict(extra="forbid")
        text: str = Field(description="the query")
        k: int = Field(10, description="results (at most the server's --max-k)")
        rerank: int | None = Field(None, description="re-score the pooler's top K with the model's verifier head")
        exact: bool = Field(False, description="score every item (no stage 1)")

    app = fastapi.FastAPI(
        title="xmatch serve", description=f"Search the index {service.index.root} ({service.index.side}).",
        version=_version(),
    )
    protected = fastapi.APIRouter(dependencies=[Depends(authorize)])

    @app.exception_handler(RequestError)
    async def refused(request: Request, exc: RequestError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return JSONResponse({"error": str(exc)}, status_code=exc.status, headers=headers)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else "the request was refused"
        if exc.status_code == 404 and message == "Not Found":
            message = f"no such route: {request.url.path} (the routes are listed at /docs)."
        return JSONResponse({"error": message}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        if any(e.get("type") == "json_invalid" for e in errors):
            return JSONResponse({"error": "the request body is not valid JSON; send {\"text\": \"...\", \"k\": 10}."},
                                status_code=400)
        parts = [f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', 'invalid')}" for e in errors]
        return JSONResponse({"error": "invalid request: " + "; ".join(parts)}, status_code=422)

    @app.exception_handler(Exception)
    async def failed(request: Request, exc: Exception) -> JSONResponse:
        # Starlette raises the exception again once this answer is sent: the server logs its traceback
        return JSONResponse({"error": f"the server failed on this request ({type(exc).__name__}); its log has the "
                             "details."}, status_code=500)

    @app.get("/", include_in_schema=False)
    def page() -> FileResponse:
        return FileResponse(STATIC / "index.html", headers={"Content-Security-Policy": PAGE_POLICY})

    @app.get("/health", summary="the server is up; the number of items")
    def health() -> dict[str, Any]:
        return service.health()

    @protected.get("/card", summary="the index: model, fingerprint, size, side, limits")
    def card() -> dict[str, Any]:
        return service.card()

    @protected.get("/search", summary="text search: what `xmatch search --json` prints, plus unknown words")
    def search_get(text: str = Query(description="the query"), k: int = Query(10), rerank: int | None = Query(None),
                   exact: bool = Query(False)) -> dict[str, Any]:
        return service.search_text(text, k, rerank, exact)

    @protected.post("/search", summary="text search, the query as JSON")
    def search_post(body: SearchRequest) -> dict[str, Any]:
        return service.search_text(body.text, body.k, body.rerank, body.exact)

    @protected.post("/search/image", summary="search a caption index with a picture (the request body: PNG or JPEG bytes)")
    async def search_image(request: Request, k: int = Query(10), rerank: int | None = Query(None),
                           exact: bool = Query(False)) -> dict[str, Any]:
        data = await request.body()  # bounded by BoundedBody before the route runs
        return await run_in_threadpool(service.search_image, data, k, rerank, exact)

    @protected.get("/items/{item:path}/thumbnail", summary="the picture of a stored item, at most 256 px a side (JPEG)",
                   response_class=Response)
    def item_thumbnail(item: str) -> Response:
        return Response(service.thumbnail(item), media_type="image/jpeg", headers={"Cache-Control": "private, max-age=60"})

    @protected.get("/alignment", summary="region-word alignment of one hit for one query: JSON, or PNG with format=png")
    def item_alignment(query: str = Query(description="the text query"), item: str = Query(description="a stored id"),
                       format: str = Query("json", pattern="^(json|png)$")) -> Any:  # noqa: A002 - the query's name
        if format == "png":
            return Response(service.alignment_png(query, item), media_type="image/png")
        return service.alignment(query, item).as_dict()

    app.include_router(protected)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    app.add_middleware(BoundedBody, most=limits.max_upload_bytes)
    return app


class BoundedBody:
    """ASGI middleware: a request body over ``most`` bytes is answered 413 (JSON) as soon as
    it is announced (``Content-Length``) or, sent without a length, as soon as it grows past
    ``most``; nothing of it reaches the routes. Bodies within the bound are read whole and
    handed on; every answer gets ``X-Content-Type-Options: nosniff``."""

    def __init__(self, app: Any, most: int) -> None:
        self.app, self.most = app, most

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_nosniff(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (b"x-content-type-options", b"nosniff")]
            await send(message)

        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.most):
            await self._refuse(scope, receive, send_nosniff, f"the request body ({length.decode(errors='replace')} bytes)")
            return
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.most:
                await self._refuse(scope, receive, send_nosniff, "the request body")
                return
            more = message.get("more_body", False)
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        await self.app(scope, replay, send_nosniff)

    async def _refuse(self, scope: dict[str, Any], receive: Any, send: Any, what: str) -> None:
        from fastapi.responses import JSONResponse

        response = JSONResponse({"error": f"{what} is over the server's limit of {self.most} bytes "
                                 "(--max-upload-bytes)."}, status_code=413)
        await response(scope, receive, send)


def _version() -> str:
    from xmatch.core.version import __version__

    return __version__
