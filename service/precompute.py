"""The service side of ``mechanisms.precompute``: where heavy results are shared, and how
many cold ones an API process computes at once.

Cost and accuracy are answered in the request thread (``estimate`` and
``POST /v1/releases`` need them before anything is reserved). Their heavy parts
(interval calibration, ICLP eigen-systems) depend only on public inputs, so:

* they are stored under ``<data dir>/precompute`` (one file per input digest, shared by
  every API process and the worker on the host), so each is computed once per input;
* a cold one passes a per-process gate of ``PRIVRELEASE_PRECOMPUTE_CONCURRENCY`` slots.
  A request that finds every slot taken is answered at once with 503 ``busy`` and
  ``Retry-After`` instead of queueing a thread behind the CPU, so the other threads keep
  answering (health checks, reads). A retry after the running ones finish is warm.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from flask import Flask

from mechanisms import precompute
from service.config import Config
from service.problems import APIError

#: the gate's slot, per app (one app per API process)
_GATE = "privrelease.precompute_gate"


def store(config: Config) -> precompute.DirectoryStore:
    """The shared store of this data directory."""
    return precompute.DirectoryStore(config.data_dir / "precompute")


def _slots(app: Flask) -> threading.BoundedSemaphore:
    slots = app.extensions.get(_GATE)
    if slots is None:
        config: Config = app.config["PRIVRELEASE"]
        # setdefault is atomic: two first requests racing end up with the same semaphore
        slots = app.extensions.setdefault(
            _GATE, threading.BoundedSemaphore(max(1, config.precompute_concurrency)))
    return slots


@contextlib.contextmanager
def scope(app: Flask) -> Iterator[None]:
    """Within the block, heavy precomputations are shared and cold ones gated; a refused
    one is a 503 ``busy`` (nothing was reserved: the cost is computed before the ledger)."""
    slots = _slots(app)

    @contextlib.contextmanager
    def gate() -> Iterator[None]:
        if not slots.acquire(blocking=False):
            raise precompute.Busy
        try:
            yield
        finally:
            slots.release()

    try:
        config: Config = app.config["PRIVRELEASE"]
        with precompute.use(store(config), gate, config.max_precompute_work):
            yield
    except precompute.Busy:
        raise APIError(503, "the server is computing other costs; retry shortly",
                       code="busy") from None
