"""The web console: HTML pages at ``/console`` over the API's own operations.

Signed in with an API key (``session``), a person sees and does what that key may
through the HTTP API, checked by the same functions (``ops``, ``auth.key_refusal``).
Assets are the package's own CSS; plots are the server's PNGs.
"""

from __future__ import annotations

from flask import Flask


def init_app(app: Flask) -> None:
    """Mount the console (its cookie settings and session interface included)."""
    from service.console import session
    from service.console.views import bp

    session.configure(app)
    app.register_blueprint(bp)
