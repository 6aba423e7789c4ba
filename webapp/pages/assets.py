"""Plotly for the charts, served from the installed Python package: machines are offline, so never from a CDN."""

from __future__ import annotations

import gzip
import hashlib
from functools import lru_cache
from pathlib import Path

import plotly
from django.http import FileResponse, HttpRequest, HttpResponse, HttpResponseBase, HttpResponseNotModified
from django.views.decorators.http import require_safe

PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
# The URL carries the version, so a year of caching is safe: an upgrade changes the URL.
LONG_CACHE = "public, max-age=31536000, immutable"
JS_TYPE = "text/javascript; charset=utf-8"


def plotly_url() -> str:
    return f"/vendor/plotly.min.js?v={plotly.__version__}"


@lru_cache(maxsize=1)
def _plotly_gzip() -> tuple[bytes, str]:
    """The 4.8 MB file gzipped once per process (about 1.4 MB on the wire), with its ETag."""
    raw = PLOTLY_JS.read_bytes()
    return gzip.compress(raw, compresslevel=6), '"' + hashlib.sha1(raw).hexdigest()[:16] + '"'


@require_safe
def plotly_js(request: HttpRequest) -> HttpResponseBase:
    body, etag = _plotly_gzip()
    if request.headers.get("If-None-Match") == etag:
        return HttpResponseNotModified()
    if "gzip" in request.headers.get("Accept-Encoding", ""):
        response: HttpResponseBase = HttpResponse(body, content_type=JS_TYPE)
        response["Content-Encoding"] = "gzip"
    else:
        response = FileResponse(PLOTLY_JS.open("rb"), content_type=JS_TYPE)
    response["Cache-Control"] = LONG_CACHE
    response["ETag"] = etag
    response["Vary"] = "Accept-Encoding"
    return response
