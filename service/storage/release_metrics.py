"""Release metrics kept in Redis, so every API host can export what every worker did.

Workers run on other hosts than the API that serves ``/metrics``, and
prometheus-client's in-process counters would only ever show one worker's
share. Finished jobs add to two hashes instead; ``service.api.observability``
turns them into a counter and a histogram at scrape time.

A worker drains hundreds of jobs a second, and a write per job (a MULTI/EXEC
round trip, fsynced to Valkey's AOF) cost it as much as a ledger step. So each
process counts its finished jobs in memory and writes the sums at most once per
``FLUSH_SECONDS`` (``Batch``): the first job after a quiet spell at once, those
that follow within the spell together at its end, one MULTI/EXEC for all (a scrape
never sees a count without its bucket). The hashes' fields and meaning are as
before: only when they are added to changes. What a process counted and had not
written when it was killed (SIGKILL, a hard time limit) is lost, as a write
Valkey refused always was: at most its last ``FLUSH_SECONDS`` of jobs. A worker
that stops normally writes what it holds (``flush``, on Celery's process
shutdown signals: ``workers.celery_app``).
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections import Counter

import redis

from service.storage import rkeys

log = logging.getLogger("privrelease.metrics")  # the JSON log setup

#: count per ``<mechanism>|<outcome>``
RELEASES = f"{rkeys.P}stats:releases"
#: per mechanism: ``<mechanism>|le=<bound>`` (non-cumulative bucket counts),
#: ``<mechanism>|sum`` (seconds) and ``<mechanism>|count``
RUNTIME = f"{rkeys.P}stats:runtime"

#: upper bounds (seconds) of the job run time histogram; the last bucket is +Inf.
#: Changing them orphans old fields; the count and sum stay right.
BUCKETS: tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                              10.0, 30.0, 60.0, 120.0, 300.0, 600.0, math.inf)
#: seconds a process's counts wait at most before they are written
FLUSH_SECONDS = 1.0

SEP = "|"


def bucket_label(bound: float) -> str:
    """Prometheus' spelling of a bucket bound (``+Inf``, ``0.005``, ``1.0``)."""
    return "+Inf" if math.isinf(bound) else repr(float(bound))


def bucket_field(mechanism: str, bound: float) -> str:
    return f"{mechanism}{SEP}le={bucket_label(bound)}"


class _Counts:
    """What a batch holds: increments of ``RELEASES`` and ``RUNTIME`` fields, and the
    run time seconds to add per ``<mechanism>|sum`` field."""

    def __init__(self) -> None:
        self.releases: Counter[str] = Counter()
        self.runtime: Counter[str] = Counter()
        self.seconds: dict[str, float] = {}

    def __bool__(self) -> bool:
        return bool(self.releases)


class Batch:
    """One process's finished jobs for one Valkey client, written at most once per
    ``every`` seconds (module docstring). The writes after the first of a spell are
    made by a thread of the batch's own, alive only while counts wait."""

    def __init__(self, client: redis.Redis, every: float = FLUSH_SECONDS) -> None:
        self.client, self.every = client, every
        self._lock = threading.Lock()
        self._counts = _Counts()
        self._quiet_from = 0.0  # monotonic time from which a job is written at once
        self._writer: threading.Thread | None = None

    def add(self, mechanism: str, outcome: str, seconds: float) -> None:
        """Count one finished job of ``seconds``; written now if nothing was written in the
        last ``every`` seconds, else at the end of that spell."""
        bound = next(b for b in BUCKETS if seconds <= b)
        with self._lock:
            counts = self._counts
            counts.releases[f"{mechanism}{SEP}{outcome}"] += 1
            counts.runtime[bucket_field(mechanism, bound)] += 1
            counts.runtime[f"{mechanism}{SEP}count"] += 1
            total = f"{mechanism}{SEP}sum"
            counts.seconds[total] = counts.seconds.get(total, 0.0) + seconds
            now = time.monotonic()
            if now < self._quiet_from:  # written lately: the writer thread writes it
                if self._writer is None:
                    self._writer = threading.Thread(target=self._write_spells, daemon=True,
                                                    name="privrelease-metrics")
                    self._writer.start()
                return
            self._quiet_from = now + self.every
            taken, self._counts = counts, _Counts()
        self._write(taken)

    def flush(self) -> None:
        """Write whatever waits, now."""
        with self._lock:
            taken, self._counts = self._counts, _Counts()
        self._write(taken)

    def _write_spells(self) -> None:
        """At the end of each spell, write what it counted; end with a spell that
        counted nothing."""
        while True:
            with self._lock:
                wait = self._quiet_from - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            with self._lock:
                taken, self._counts = self._counts, _Counts()
                if not taken:
                    self._writer = None
                    return
                self._quiet_from = time.monotonic() + self.every
            self._write(taken)

    def _write(self, counts: _Counts) -> None:
        """One MULTI/EXEC of every increment; best effort (a Redis failure is logged and
        the counts dropped: a job's outcome must not depend on its metrics)."""
        if not counts:
            return
        pipe = self.client.pipeline(transaction=True)
        for name, n in counts.releases.items():
            pipe.hincrby(RELEASES, name, n)
        for name, n in counts.runtime.items():
            pipe.hincrby(RUNTIME, name, n)
        for name, seconds in counts.seconds.items():
            pipe.hincrbyfloat(RUNTIME, name, seconds)
        try:
            pipe.execute()
        except redis.RedisError as err:
            log.warning("release metrics not recorded", extra={"error_type": type(err).__name__})


#: this process's batches, one per client (keyed by the process: a forked child starts
#: its own, never the parent's)
_batches: dict[tuple[int, int], Batch] = {}
_batches_lock = threading.Lock()


def record_release(client: redis.Redis, mechanism: str, outcome: str, seconds: float) -> None:
    """Count one finished job and its run time in this process's batch for ``client``
    (``Batch``); best effort, never raises on Redis errors."""
    if SEP in mechanism or SEP in outcome:
        raise ValueError(f"mechanism and outcome must not contain {SEP!r}")
    seconds = float(seconds) if math.isfinite(seconds) and seconds > 0 else 0.0
    key = (os.getpid(), id(client))
    with _batches_lock:
        batch = _batches.get(key)
        if batch is None:  # the batch keeps its client: the id names no other meanwhile
            batch = _batches[key] = Batch(client)
    batch.add(mechanism, outcome, seconds)


def flush() -> None:
    """Write every count this process holds (a worker process about to stop)."""
    pid = os.getpid()
    with _batches_lock:
        mine = [batch for (owner, _), batch in _batches.items() if owner == pid]
    for batch in mine:
        batch.flush()
