"""Privacy mechanisms as a plain numpy/scipy library.

Nothing here imports Flask, Celery or Redis: a data scientist can use
``from mechanisms.dp import baselines`` in a notebook, and the service is only a
thin layer that validates requests, charges the ledger and calls ``run``.
"""

from __future__ import annotations

from mechanisms.base import (
    Analysis,
    ColumnMeta,
    DatasetMeta,
    Mechanism,
    MechanismInputError,
    Output,
    ReleaseView,
    Work,
)
from mechanisms.memory import Memory
from mechanisms.registry import get, names, register

__all__ = [
    "Analysis",
    "ColumnMeta",
    "DatasetMeta",
    "Mechanism",
    "MechanismInputError",
    "Memory",
    "Output",
    "ReleaseView",
    "Work",
    "get",
    "names",
    "register",
]
