"""``xmatch serve``: an index behind an HTTP API and a web page (issue 40).

One process opens the index once and answers every request with it: text search, search by an
uploaded picture (a caption index), an item's thumbnail, the region-word alignment of one hit
for one query (JSON and PNG), ``/health`` and the index's card. The page at ``/`` is made of
the files in ``static/`` (no CDN: it works offline).

The modules have one job each: :mod:`~xmatch.serve.limits` (what a request may ask),
:mod:`~xmatch.serve.pictures` (which files may be served), :mod:`~xmatch.serve.alignment`
(region-word alignment of one pair), :mod:`~xmatch.serve.service` (the open index and the
answers, without HTTP), :mod:`~xmatch.serve.app` (the FastAPI application). FastAPI and
uvicorn are the optional extra ``serve`` (``pip install 'xmatch-zoo[serve]'``): only
:mod:`~xmatch.serve.app` imports them.
"""
