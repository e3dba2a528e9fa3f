"""privrelease-client: the privrelease API from Python, light enough for a notebook.

``Client()`` reads ``PRIVRELEASE_URL`` and ``PRIVRELEASE_KEY``; ``client.submit(...)``
gives a :class:`Release` to ``wait()`` on and read as a DataFrame (extras ``pandas``,
``polars``), draw (extra ``plot``) or analyse.
"""

from __future__ import annotations

from privrelease_client._version import __version__
from privrelease_client.client import DEFAULT_URL, Client
from privrelease_client.errors import (
    ApiError,
    BudgetExhausted,
    BudgetRefused,
    ConnectionFailed,
    MissingExtra,
    ReleaseFailed,
)
from privrelease_client.frames import result_columns
from privrelease_client.objects import PENDING, TERMINAL, Analysis, Progress, Release, Table

__all__ = ["DEFAULT_URL", "PENDING", "TERMINAL", "Analysis", "ApiError", "BudgetExhausted",
           "BudgetRefused", "Client", "ConnectionFailed", "MissingExtra", "Progress", "Release",
           "ReleaseFailed", "Table", "__version__", "result_columns"]
