"""``/docs`` without the internet: Swagger UI's assets served by this process.

flask-smorest renders the ``/docs`` page and loads Swagger UI's script and CSS from
``OPENAPI_SWAGGER_UI_URL``; a CDN there leaves the page blank on a machine without
internet (issue #18). The assets come from the ``flask-swagger-ui`` distribution (a
pinned dependency that ships Swagger UI's ``dist`` files), never copied into this
repository, and are served under ``ASSETS_URL``, cached for a day (the URLs carry no
version, so an upgrade of the package is seen within a day).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from flask import Blueprint, Flask, Response, send_from_directory

from service.api.problems import APIError

#: where the page finds Swagger UI's files (flask-smorest appends the file names)
ASSETS_URL = "/docs/assets/"
#: the files of Swagger UI's ``dist`` the page and its browsers may ask for (no other)
ASSETS = frozenset({"swagger-ui.css", "swagger-ui-bundle.js", "swagger-ui-standalone-preset.js",
                    "swagger-ui.js", "index.css", "favicon-16x16.png", "favicon-32x32.png"})


def assets_dir() -> Path:
    """Swagger UI's ``dist`` directory inside the installed ``flask-swagger-ui``."""
    return Path(str(resources.files("flask_swagger_ui") / "dist"))


def init_app(app: Flask) -> None:
    """Serve the assets (no key needed: the page and the spec are public, as before)."""
    blp = Blueprint("apidocs", __name__)
    directory = assets_dir()

    @blp.route(ASSETS_URL + "<name>")
    def asset(name: str) -> Response:
        if name not in ASSETS:
            raise APIError(404, "no such file", code="not_found")
        return send_from_directory(directory, name, max_age=86400)

    app.register_blueprint(blp)
