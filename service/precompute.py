"""The service side of ``mechanisms.precompute``: where heavy results are shared, how many
cold ones an API process computes at once, and the most work a request may ask for.

Cost and accuracy are answered in the request thread (``estimate`` and
``POST /v1/releases`` need them before anything is reserved). Their heavy parts
(interval calibration, ICLP eigen-systems) depend only on public inputs, so:

* a request whose estimated work exceeds ``PRIVRELEASE_MAX_PRECOMPUTE_WORK`` is refused
  with 422 naming the parameter that drives it, before anything is computed;
* results are stored under ``<data dir>/precompute`` (one file per input digest, at most
  ``PRIVRELEASE_PRECOMPUTE_MAX_BYTES``), shared by every API process on the host, so each
  is computed once per input;
* a cold one passes a per-process gate of ``PRIVRELEASE_PRECOMPUTE_CONCURRENCY`` slots.
  A request that finds every slot taken is answered at once with 503 ``busy`` and
  ``Retry-After`` instead of queueing a thread behind the CPU, so the other threads keep
  answering (health checks, reads). Nothing was reserved; a retry is warm or gets a slot.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from flask import Flask

from mechanisms import precompute
from service.config import Config
from service.problems import APIError

#: per app (one app per API process): the gate's slots and the store
_GATE = "privrelease.precompute_gate"
_STORE = "privrelease.precompute_store"
#: whether this thread holds a slot already
_HOLDING = threading.local()


def store(config: Config) -> precompute.DirectoryStore:
    """The shared store of this data directory."""
    return precompute.DirectoryStore(config.data_dir / "precompute",
                                     max_bytes=config.precompute_max_bytes)


def _per_app(app: Flask, name: str, make: Any) -> Any:
    found = app.extensions.get(name)
    if found is None:
        # setdefault is atomic: two first requests racing end up with the same object
        found = app.extensions.setdefault(name, make())
    return found


@contextlib.contextmanager
def scope(app: Flask) -> Iterator[None]:
    """Within the block, heavy precomputations are shared, bounded and cold ones gated;
    a refused one is a 503 ``busy`` (nothing was reserved: the cost comes first)."""
    config: Config = app.config["PRIVRELEASE"]
    slots: threading.BoundedSemaphore = _per_app(
        app, _GATE, lambda: threading.BoundedSemaphore(max(1, config.precompute_concurrency)))
    shared: precompute.DirectoryStore = _per_app(app, _STORE, lambda: store(config))

    @contextlib.contextmanager
    def gate() -> Iterator[None]:
        if getattr(_HOLDING, "slot", False):  # a cold computation inside another: one slot
            yield
            return
        if not slots.acquire(blocking=False):
            raise precompute.Busy
        _HOLDING.slot = True
        try:
            yield
        finally:
            _HOLDING.slot = False
            slots.release()

    try:
        with precompute.use(shared, gate, config.max_precompute_work):
            yield
    except precompute.Busy:
        raise APIError(503, "the server is computing other costs; retry shortly",
                       code="busy") from None
