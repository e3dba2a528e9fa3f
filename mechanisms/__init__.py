"""Privacy mechanisms as a plain numpy/scipy library.

Nothing here imports Flask, Celery or Redis: a data scientist can use
``from mechanisms import baselines`` in a notebook, and the service is only a
thin layer that validates requests, charges the ledger and calls ``run``.
"""

from __future__ import annotations

from mechanisms.base import (
    ColumnMeta,
    DatasetMeta,
    Mechanism,
    MechanismInputError,
    Output,
)
from mechanisms.registry import get, names, register

__all__ = [
    "ColumnMeta",
    "DatasetMeta",
    "Mechanism",
    "MechanismInputError",
    "Output",
    "get",
    "names",
    "register",
]
