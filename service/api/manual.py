"""``/manual``: the manual (an MkDocs site) served by this process, offline.

``make docs`` (which ``make run`` and ``make test`` run) builds ``docs/`` with
``mkdocs build --strict`` into ``site/`` at the root of the checkout; this module serves
that folder read-only, with no key (the manual is public, like ``/docs``), under
``MANUAL_URL``. The built folder is never committed: when it is missing, every page
answers 404 saying how to build it. ``PRIVRELEASE_MANUAL_DIR`` in the app's config (or
the environment) names another folder, e.g. a site built elsewhere.

The pages load nothing from outside the service (Material's web fonts are off in
``mkdocs.yml``; a test scans the built HTML). The theme's few inline scripts (colour
palette, tab state) are allowed by their SHA-256 in each page's Content-Security-Policy,
computed from the page served, so no other inline script could run.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
from pathlib import Path

from flask import Blueprint, Flask, Response, current_app, redirect, send_from_directory
from werkzeug.wrappers import Response as BaseResponse

from service.api.problems import APIError

#: where the manual is served
MANUAL_URL = "/manual"
#: the folder ``make docs`` builds (mkdocs.yml's ``site_dir``) in a checkout
DEFAULT_DIR = Path(__file__).resolve().parents[2] / "site"
#: an inline ``<script>`` without ``src`` (Material's palette and tab scripts)
_INLINE_SCRIPT = re.compile(r"<script(?![^>]*\bsrc=)(?![^>]*type=\"application/json\")[^>]*>"
                            r"(.*?)</script>", re.S)
_CSP = ("default-src 'self'; img-src 'self' data:; style-src 'self'; font-src 'self';"
        " script-src 'self'{hashes}; worker-src 'self'; connect-src 'self';"
        " object-src 'none'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'")


def manual_dir(app: Flask) -> Path:
    """The built site's folder: the app's config, the environment, else ``site/``."""
    configured = app.config.get("PRIVRELEASE_MANUAL_DIR") or os.environ.get(
        "PRIVRELEASE_MANUAL_DIR")
    return Path(configured) if configured else DEFAULT_DIR


def script_hashes(html: str) -> list[str]:
    """CSP sources for the page's inline scripts (``'sha256-…'``, as browsers hash them)."""
    return ["'sha256-{}'".format(base64.b64encode(
        hashlib.sha256(body.encode()).digest()).decode()) for body in _INLINE_SCRIPT.findall(html)]


def init_app(app: Flask) -> None:
    """Serve the built site (no key needed: the manual is public)."""
    blp = Blueprint("manual", __name__)

    @blp.route(MANUAL_URL)
    def root() -> BaseResponse:
        return redirect(MANUAL_URL + "/", 308)

    @blp.route(MANUAL_URL + "/", defaults={"name": "index.html"})
    @blp.route(MANUAL_URL + "/<path:name>")
    def page(name: str) -> Response:
        directory = manual_dir(current_app)
        if not (directory / "index.html").is_file():
            raise APIError(404, "the manual is not built: run `make docs` (mkdocs build "
                           "--strict into site/; `make run` does it too)", code="not_found")
        if name.endswith("/"):
            name += "index.html"
        resp = send_from_directory(directory, name, max_age=300)
        hashes = ""
        if resp.mimetype == "text/html":
            resp.direct_passthrough = False  # read the file's body to hash its scripts
            hashes = "".join(" " + h for h in script_hashes(resp.get_data(as_text=True)))
        resp.headers["Content-Security-Policy"] = _CSP.format(hashes=hashes)
        resp.headers["X-Content-Type-Options"] = "nosniff"
        resp.headers["X-Frame-Options"] = "DENY"
        resp.headers["Referrer-Policy"] = "same-origin"
        return resp

    app.register_blueprint(blp)
