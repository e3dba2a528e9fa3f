"""The registry reads a POST prices on, kept per process and checked by its reservation.

Pricing a release reads the dataset's document and the measures its caps name
(``Store.dataset_for_pricing``), one transaction before the reservation's. A POST takes
that read from this cache instead, and the reservation proves it current: the read's
``stamp`` (a digest of the document and of those measures, computed by the store) goes
with the ``Reservation``, and the store reserves only while the dataset's stamp is still
that one; otherwise it answers ``stale`` and changes nothing, and the POST prices again
on a fresh read. So a cached read can admit a release only if nothing it was priced on
has changed when the units are held (which is stronger than the two transactions before:
the registry could change between them). A cached read never refuses either: whatever a
POST would refuse on it is judged again on a fresh read (``submit``), so a new version,
a new cap or a reactivated dataset is seen at once.

Only the API's POST uses it; estimates (no reservation to check them) and pricing jobs
read fresh. A store that cannot compute a stamp (``''``) is never
cached.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict

from service.storage.store import Store

#: datasets a process keeps (their documents: a few kB each)
KEPT = 1024

PricingRead = tuple[str, set[str], str]


class DatasetCache:
    """Pricing reads by dataset id, the most recently used kept (``KEPT``)."""

    def __init__(self, kept: int = KEPT) -> None:
        self.kept = kept
        self._reads: OrderedDict[str, PricingRead] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, dataset_id: str) -> PricingRead | None:
        with self._lock:
            read = self._reads.get(dataset_id)
            if read is not None:
                self._reads.move_to_end(dataset_id)
            return read

    def read(self, ledger: Store, dataset_id: str) -> PricingRead | None:
        """A fresh read from ``ledger``, kept if it has a stamp; None if no such dataset."""
        read = ledger.dataset_for_pricing(dataset_id)
        with self._lock:
            self._reads.pop(dataset_id, None)
            if read is not None and read[2]:
                self._reads[dataset_id] = read
                if len(self._reads) > self.kept:
                    self._reads.popitem(last=False)
        return read

    def drop(self, dataset_id: str) -> None:
        with self._lock:
            self._reads.pop(dataset_id, None)


_CACHES: weakref.WeakKeyDictionary[Store, DatasetCache] = weakref.WeakKeyDictionary()
_CACHES_LOCK = threading.Lock()


def cache_for(ledger: Store) -> DatasetCache:
    """The process's cache of ``ledger``'s reads (one per store: tests run several)."""
    with _CACHES_LOCK:
        cache = _CACHES.get(ledger)
        if cache is None:
            cache = _CACHES[ledger] = DatasetCache()
        return cache
