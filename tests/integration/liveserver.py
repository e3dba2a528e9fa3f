"""The app on a real socket of this machine, for clients that cannot use Flask's test
client (a browser, a generated HTTP client)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from flask import Flask
from werkzeug.serving import make_server


@contextmanager
def serve(app: Flask) -> Iterator[str]:
    """``http://127.0.0.1:<free port>`` while the block runs (threaded, like gunicorn's)."""
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join(timeout=10)
