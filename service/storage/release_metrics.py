"""Release metrics kept in Redis, so every API host can export what every worker did.

Workers run on other hosts than the API that serves ``/metrics``, and
prometheus-client's in-process counters would only ever show one worker's
share. Each finished job adds to two hashes instead (one MULTI/EXEC, four
commands); ``service.api.observability`` turns them into a counter and a
histogram at scrape time.
"""

from __future__ import annotations

import logging
import math

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

SEP = "|"


def bucket_label(bound: float) -> str:
    """Prometheus' spelling of a bucket bound (``+Inf``, ``0.005``, ``1.0``)."""
    return "+Inf" if math.isinf(bound) else repr(float(bound))


def bucket_field(mechanism: str, bound: float) -> str:
    return f"{mechanism}{SEP}le={bucket_label(bound)}"


def record_release(client: redis.Redis, mechanism: str, outcome: str, seconds: float) -> None:
    """Count one finished job and its run time; best effort, never raises on Redis errors.

    A job's outcome must not depend on its metrics, so a Redis failure here
    is logged and dropped (the ledger write before it would have failed too).
    """
    if SEP in mechanism or SEP in outcome:
        raise ValueError(f"mechanism and outcome must not contain {SEP!r}")
    seconds = float(seconds) if math.isfinite(seconds) and seconds > 0 else 0.0
    bound = next(b for b in BUCKETS if seconds <= b)
    pipe = client.pipeline(transaction=True)
    pipe.hincrby(RELEASES, f"{mechanism}{SEP}{outcome}", 1)
    pipe.hincrby(RUNTIME, bucket_field(mechanism, bound), 1)
    pipe.hincrby(RUNTIME, f"{mechanism}{SEP}count", 1)
    pipe.hincrbyfloat(RUNTIME, f"{mechanism}{SEP}sum", seconds)
    try:
        pipe.execute()
    except redis.RedisError as err:
        log.warning("release metrics not recorded", extra={"error_type": type(err).__name__})
