"""The shared store of heavy precomputations (``mechanisms.precompute``) in the object
store, so the API and every worker host share it without a shared POSIX folder.

A value is a pure function of its key (a digest of public inputs and the code that
computes it), so it is written once with a conditional put: a second writer of the same
key finds it there (AlreadyExists) and loses nothing. A failure to read or write is a
miss (the value is recomputed), never an error of the request. The cache is bounded:
whenever this process has written a tenth of ``max_bytes`` since it last looked, it lists
the prefix and deletes the oldest written values down to 80 % (an object store keeps no
read times, so the oldest written go first, where ``DirectoryStore`` drops the least
recently read). Inputs are public and chosen by callers (an eigen-system is megabytes),
so an unbounded cache would be a way to fill the store.
"""

from __future__ import annotations

import threading

from service.storage.objects import AlreadyExists, ObjectStore, ObjectStoreError

PREFIX = "precompute"


class ObjectCache:
    """``mechanisms.precompute.Store`` over ``objects`` under ``prefix``."""

    def __init__(self, objects: ObjectStore, max_bytes: int = 1 << 30,
                 prefix: str = PREFIX) -> None:
        self.objects, self.max_bytes, self.prefix = objects, max_bytes, prefix
        self._written = max_bytes  # look at the first write
        self._lock = threading.Lock()

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key[:2]}/{key}"

    def get(self, key: str) -> bytes | None:
        try:
            return self.objects.get(self._key(key))
        except (ObjectStoreError, OSError, ValueError):  # absent, unreadable, odd key: a miss
            return None

    def put(self, key: str, value: bytes) -> None:
        try:
            self.objects.put_new(self._key(key), value)
        except AlreadyExists:  # another process stored the same value first
            return
        except (ObjectStoreError, OSError, ValueError):  # full or away: recomputed next time
            return
        with self._lock:
            self._written += len(value)
            due = self._written >= self.max_bytes // 10
            if due:
                self._written = 0
        if due:
            self.prune()

    def prune(self) -> None:
        """Delete the oldest written values until the prefix holds <= 80 % of the cap."""
        try:
            entries = sorted(self.objects.listed(self.prefix + "/"),
                             key=lambda item: (item.modified, item.key))
        except (ObjectStoreError, OSError):
            return
        total = sum(item.size for item in entries)
        if total <= self.max_bytes:
            return
        for item in entries:
            if total <= 0.8 * self.max_bytes:
                break
            try:
                self.objects.delete(item.key)
            except (ObjectStoreError, OSError):
                return
            total -= item.size
