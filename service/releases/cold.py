"""A cost's cold heavy parts (the service side of ``mechanisms.precompute``): where heavy
results are shared, the most work a request may ask for, and that no API thread ever
computes a cold one.

Cost and accuracy are answered before anything is reserved. Their heavy parts
(interval calibration, ICLP eigen-systems) depend only on public inputs, so:

* a request whose estimated work exceeds ``PRIVRELEASE_MAX_PRECOMPUTE_WORK`` is refused
  with 422 naming the parameter that drives it, before anything is computed;
* results are stored under ``<data dir>/precompute`` (one file per input digest, at most
  ``PRIVRELEASE_PRECOMPUTE_MAX_BYTES``), shared by every API process and worker on the
  host, so each is computed once per input;
* in an API request (:func:`api_scope`) a result that is not in the store is never
  computed: the gate raises ``mechanisms.precompute.Busy`` carrying the store key that
  missed, and the release or estimate is handed to a worker (``pricing.Unpriced``,
  answered 202 ``pricing``). A worker (:func:`worker_scope`) computes it into the store,
  so the retry, or the rest of the pricing job, is warm. The API's threads only ever read
  files, so health checks and reads keep answering whatever the load of cold requests.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import TracebackType

from mechanisms import precompute
from service.config import Config


def store(config: Config) -> precompute.DirectoryStore:
    """The shared store of this data directory."""
    return precompute.DirectoryStore(config.data_dir / "precompute",
                                     max_bytes=config.precompute_max_bytes)


class _Recording:
    """The shared store, remembering the first key this request missed (the job's key)."""

    def __init__(self, inner: precompute.Store) -> None:
        self.inner = inner
        self.missed: str | None = None

    def get(self, key: str) -> bytes | None:
        value = self.inner.get(key)
        if value is None and self.missed is None:
            self.missed = key
        return value

    def put(self, key: str, value: bytes) -> None:
        self.inner.put(key, value)


class _RefuseCold(contextlib.AbstractContextManager[None]):
    """The API's gate: a cold computation never starts in a request thread."""

    def __init__(self, seen: _Recording) -> None:
        self.seen = seen

    def __enter__(self) -> None:
        raise precompute.Busy(self.seen.missed)

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None,
                 tb: TracebackType | None) -> None:
        return None


def cold_key(err: precompute.Busy) -> str | None:
    """The store key whose miss refused the computation (None if unknown)."""
    return str(err.args[0]) if err.args and err.args[0] else None


@contextlib.contextmanager
def api_scope(config: Config, shared: precompute.Store) -> Iterator[None]:
    """Within the block, heavy results are read from the shared store, bounded by the work
    limit, and a missing one raises ``mechanisms.precompute.Busy`` instead of computing."""
    seen = _Recording(shared)
    with precompute.use(seen, lambda: _RefuseCold(seen), config.max_precompute_work):
        yield


@contextlib.contextmanager
def worker_scope(config: Config) -> Iterator[None]:
    """Within the block (a worker's job), cold results are computed and stored."""
    with precompute.use(store(config), None, config.max_precompute_work):
        yield
