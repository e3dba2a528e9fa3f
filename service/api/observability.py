"""Request ids, JSON logs and Prometheus metrics for the API (and logs for the worker).

Logs and metrics never carry data values, request bodies, query strings or
tokens: an access line names the route template, not the path, and the key
id, not the token. Cluster-wide numbers (queue depth, remaining budgets,
releases done by workers on other hosts) are read from Redis at scrape
time, so every API host reports the same, correct values.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import re
import sys
import time
import traceback
import uuid
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from typing import Any, TextIO

import redis
from flask import Flask, Response, g, has_request_context, request
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client import values as prometheus_values
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from service import budget, wiring
from service.api.problems import PROBLEM_TYPE, APIError
from service.config import Config
from service.storage import release_metrics
from service.storage.store import DOWN, Store

log = logging.getLogger("privrelease.observability")
access_log = logging.getLogger("privrelease.access")

REQUEST_ID_HEADER = "X-Request-ID"
_SANE_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")
#: route label of requests that matched no route (404, 405): bounded cardinality
UNMATCHED = "unmatched"
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

# Not in the default registry: each app builds its own (see _registry), so a
# second create_app in one process (tests) registers nothing twice.
REQUESTS = Counter("privrelease_http_requests", "HTTP requests answered",
                   ["method", "route", "status"], registry=None)
LATENCY = Histogram("privrelease_http_request_duration_seconds",
                    "Time from the first before_request hook to the response",
                    ["method", "route", "status"], registry=None)


# --- logging -----------------------------------------------------------------

_STANDARD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message and the ``extra`` fields.

    An exception is logged as its type and stack frames only: exception
    messages may quote the data (a parser's "could not convert 'Alice'"),
    and logs never contain data values.
    """

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
                  .replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for name, value in vars(record).items():
            if name not in _STANDARD_ATTRS and not name.startswith("_"):
                doc[name] = value
        if record.exc_info and record.exc_info[0] is not None:
            exc_type, _, tb = record.exc_info
            doc["exc_type"] = exc_type.__name__
            doc["traceback"] = "".join(traceback.format_tb(tb))
        return json.dumps(doc, default=str, separators=(",", ":"))


class _RequestIdFilter(logging.Filter):
    """Stamp records made while serving a request with its id."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id") and has_request_context():
            rid = g.get("request_id")
            if rid:
                record.request_id = rid
        return True


def configure_logging(level: str | int = "INFO", stream: TextIO | None = None) -> None:
    """JSON lines for the ``privrelease`` logger hierarchy; safe to call again.

    The handler writes to ``stream`` or to ``sys.stderr`` as it is now: in the
    worker, call this before Celery starts, which replaces ``sys.stderr`` with
    a proxy that would re-log every line as a Celery warning. Records do not
    propagate to the root logger, so a root handler installed by gunicorn,
    Celery or a library cannot print them a second time.
    """
    logger = logging.getLogger("privrelease")
    for old in [h for h in logger.handlers if getattr(h, "_privrelease", False)]:
        logger.removeHandler(old)
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(_RequestIdFilter())
    handler._privrelease = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(level.upper() if isinstance(level, str) else level)
    logger.propagate = False


def log_handler() -> logging.StreamHandler[TextIO] | None:
    """The handler ``configure_logging`` installed (tests swap its stream)."""
    for handler in logging.getLogger("privrelease").handlers:
        if getattr(handler, "_privrelease", False) and isinstance(handler,
                                                                   logging.StreamHandler):
            return handler
    return None


# --- request id, access log, request metrics ---------------------------------

def _request_id() -> str:
    """The request's id: the caller's ``X-Request-ID`` if it is a sane token."""
    rid: str | None = g.get("request_id")
    if rid is None:
        incoming = request.headers.get(REQUEST_ID_HEADER, "")
        rid = incoming if _SANE_ID.fullmatch(incoming) else uuid.uuid4().hex
        g.request_id = rid
    return rid


def _before() -> None:
    g.request_started = time.perf_counter()
    _request_id()


def _after(response: Response) -> Response:
    rid = _request_id()
    response.headers[REQUEST_ID_HEADER] = rid
    if response.mimetype == PROBLEM_TYPE and not response.direct_passthrough:
        _stamp_problem(response, rid)
    started = g.get("request_started")
    seconds = time.perf_counter() - started if started is not None else 0.0
    route = request.url_rule.rule if request.url_rule is not None else UNMATCHED
    status = str(response.status_code)
    REQUESTS.labels(request.method, route, status).inc()
    LATENCY.labels(request.method, route, status).observe(seconds)
    key = g.get("api_key")
    access_log.info("request", extra={
        "request_id": rid, "method": request.method, "route": route,
        "status": response.status_code, "duration_ms": round(seconds * 1000, 3),
        "key_id": getattr(key, "id", None),
    })
    return response


def _stamp_problem(response: Response, rid: str) -> None:
    """Add ``request_id`` to a problem document, so a client can quote it."""
    try:
        body = json.loads(response.get_data())
    except ValueError:
        return
    if isinstance(body, dict) and "request_id" not in body:
        body["request_id"] = rid
        response.set_data(json.dumps(body))


# --- cluster-wide metrics from Redis -------------------------------------------

class ClusterCollector(Collector):
    """Queue depth, remaining budgets and worker-side release stats, read at scrape time.

    One pipelined round trip to Valkey and three reads of the record per scrape, none
    growing with the history: the datasets' count (a counter kept with each
    registration), the newest ``max_datasets`` ids (one index range scan) and their
    balances (one query).
    """

    def __init__(self, client: redis.Redis, ledger: Store, queue: str | tuple[str, ...],
                 max_datasets: int) -> None:
        self.queues = (queue,) if isinstance(queue, str) else tuple(queue)
        self.client, self.ledger = client, ledger
        self.max_datasets = max(0, max_datasets)

    def describe(self) -> Iterable[Metric]:
        return []  # nothing to check at registration; no Redis call before a scrape

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("privrelease_redis_up",
                               "1 if the cluster metrics could be read from Redis")
        try:
            metrics = self._read()
        except DOWN as err:
            log.warning("cluster metrics unavailable", extra={"error_type": type(err).__name__})
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from metrics

    def _read(self) -> list[Metric]:
        pipe = self.client.pipeline(transaction=False)
        for name in self.queues:
            pipe.llen(name)
        pipe.hgetall(release_metrics.RELEASES)
        pipe.hgetall(release_metrics.RUNTIME)
        *depths, releases, runtime = pipe.execute()
        n_datasets = self.ledger.dataset_count()
        ids = self.ledger.datasets_page(self.max_datasets)[0] if self.max_datasets else []
        ledgers = self.ledger.balances(ids)

        queue = GaugeMetricFamily("privrelease_queue_depth",
                                  "Jobs waiting in the Celery queue", labels=["queue"])
        for name, depth in zip(self.queues, depths, strict=True):
            queue.add_metric([name], int(depth))
        datasets = GaugeMetricFamily("privrelease_datasets", "Registered datasets")
        datasets.add_metric([], int(n_datasets))
        remaining = GaugeMetricFamily(
            "privrelease_budget_remaining",
            "Cap minus committed minus reserved, in the measure's own unit "
            "(newest datasets only, see PRIVRELEASE_METRICS_MAX_DATASETS)",
            labels=["dataset", "measure"])
        for dataset_id, rows in zip(ids, ledgers, strict=True):
            for measure, row in rows.items():
                try:
                    value = budget.display(measure, row["remaining"])
                except KeyError:  # a measure this version does not know: skip it
                    continue
                remaining.add_metric([dataset_id, measure], value)
        return [queue, datasets, remaining, *_release_metrics(releases, runtime)]


def _release_metrics(releases: dict[str, str], runtime: dict[str, str]) -> list[Metric]:
    sep = release_metrics.SEP
    counter = CounterMetricFamily("privrelease_releases", "Release jobs finished by workers",
                                  labels=["mechanism", "outcome"])
    for name, value in sorted(releases.items()):
        mechanism, _, outcome = name.partition(sep)
        counter.add_metric([mechanism, outcome], float(value))
    histogram = HistogramMetricFamily("privrelease_job_seconds",
                                      "Run time of release jobs on the workers",
                                      labels=["mechanism"])
    mechanisms = sorted({name.partition(sep)[0] for name in runtime})
    for mechanism in mechanisms:
        cumulative, buckets = 0, []
        for bound in release_metrics.BUCKETS:
            cumulative += int(runtime.get(release_metrics.bucket_field(mechanism, bound), 0))
            buckets.append((release_metrics.bucket_label(bound), float(cumulative)))
        total = float(runtime.get(f"{mechanism}{sep}sum", 0))
        histogram.add_metric([mechanism], buckets, total)
    return [counter, histogram]


# --- wiring ----------------------------------------------------------------------

def _registry(app: Flask, config: Config) -> CollectorRegistry:
    """This app's registry: request metrics (per process, or merged from every
    gunicorn worker's files in multiprocess mode) plus the cluster collector."""
    registry = CollectorRegistry(auto_describe=True)
    multiproc_dir = os.environ.get(MULTIPROC_ENV)
    if multiproc_dir:
        if not getattr(prometheus_values.ValueClass, "_multiprocess", False):
            log.warning("prometheus_client was imported before %s was set; request metrics "
                        "of this process are not exported", MULTIPROC_ENV)
        MultiProcessCollector(registry, path=multiproc_dir)
    else:
        registry.register(REQUESTS)
        registry.register(LATENCY)
    from service.releases.queue import QUEUES  # releases, analyses and pricing jobs wait apart
    # dataset ids and budgets only go to an authenticated scraper
    per_dataset = config.metrics_max_datasets if config.metrics_token else 0
    services = wiring.of(app)
    registry.register(ClusterCollector(services.client, services.ledger, QUEUES, per_dataset))
    return registry


def init_app(app: Flask) -> None:
    """Request ids, JSON access logs and ``/metrics`` for ``app``.

    Call before ``ratelimit.init_app``: this before_request hook must run
    first, so a request refused by the limiter still has an id and a start time.
    """
    config: Config = app.config["PRIVRELEASE"]
    configure_logging(config.log_level)
    access_log.disabled = not config.access_log
    registry = _registry(app, config)
    app.before_request(_before)
    app.after_request(_after)

    def metrics() -> Response:
        """Prometheus text format; for the scraper: its own token (if set), no rate limit."""
        if config.metrics_token:
            scheme, _, token = request.headers.get("Authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(
                    token.strip().encode(), config.metrics_token.encode()):
                raise APIError(401, "/metrics needs the PRIVRELEASE_METRICS_TOKEN bearer token",
                               code="unauthorized")
        return Response(generate_latest(registry), content_type=CONTENT_TYPE_PLAIN_0_0_4)

    app.add_url_rule("/metrics", endpoint="metrics", view_func=metrics)
