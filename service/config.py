"""All configuration, read once from ``PRIVRELEASE_*`` environment variables.

Each field documents its variable; the README's configuration table is
generated from the same names, so keep them in sync.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

ENV_PREFIX = "PRIVRELEASE_"


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(ENV_PREFIX + name, default)


def _int(name: str, default: int) -> int:
    raw = _env(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise SystemExit(f"{ENV_PREFIX}{name} must be an integer") from None


#: units a byte size may be written with (PRIVRELEASE_WORKER_MEMORY): decimal and binary
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "K": 2**10, "KIB": 2**10, "M": 2**20, "MIB": 2**20, "G": 2**30, "GIB": 2**30,
          "T": 2**40, "TIB": 2**40}


def _bytes(name: str, default: int) -> int:
    """A positive size in bytes, written as a number or with a unit (``4GiB``, ``3GB``)."""
    raw = (_env(name) or "").strip()
    if not raw:
        return default
    match = re.fullmatch(r"([0-9]+(?:\.[0-9]*)?(?:[eE][0-9]+)?)\s*([A-Za-z]*)", raw)
    unit = match.group(2).upper() if match else ""
    if match is None or unit not in _UNITS:
        raise SystemExit(f"{ENV_PREFIX}{name} must be a size in bytes, e.g. 4GiB or 3000MB")
    value = int(float(match.group(1)) * _UNITS[unit])
    if value <= 0:
        raise SystemExit(f"{ENV_PREFIX}{name} must be positive")
    return value


def _at_least(name: str, default: int, minimum: int) -> int:
    """An integer >= ``minimum``."""
    value = _int(name, default)
    if value < minimum:
        raise SystemExit(f"{ENV_PREFIX}{name} must be an integer >= {minimum}")
    return value


def _positive(name: str, default: float) -> float:
    """A finite number > 0 (0 or less would disable a protection silently)."""
    raw = _env(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SystemExit(f"{ENV_PREFIX}{name} must be a number") from None
    if not value > 0 or value == float("inf"):
        raise SystemExit(f"{ENV_PREFIX}{name} must be a positive finite number")
    return value


def _non_negative(name: str, default: float) -> float:
    """A finite number >= 0 (0: the feature it tunes is off)."""
    raw = _env(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SystemExit(f"{ENV_PREFIX}{name} must be a number") from None
    if not 0 <= value < float("inf"):
        raise SystemExit(f"{ENV_PREFIX}{name} must be a finite number >= 0")
    return value


def _bool(name: str, default: bool = False) -> bool:
    raw = _env(name)
    return default if raw is None or raw == "" else raw.lower() in {"1", "true", "yes", "on"}


def _rate_limit(raw: str | None, default: str | None) -> str | None:
    """Unset: the default; empty or ``off``: no limit."""
    if raw is None:
        return default
    raw = raw.strip()
    return None if raw.lower() in {"", "off"} else raw


def _log_level(raw: str) -> str:
    level = raw.strip().upper()
    if level not in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}:
        raise SystemExit(f"{ENV_PREFIX}LOG_LEVEL must be DEBUG, INFO, WARNING, ERROR or CRITICAL")
    return level


def _url(name: str, schemes: tuple[str, ...]) -> str | None:
    """Unset or empty: None; else a URL with one of ``schemes``. The rest of it is
    checked where it is opened (``service.storage.objects.from_config``): this module
    imports nothing of the service."""
    raw = (_env(name) or "").strip()
    if not raw:
        return None
    if not raw.startswith(tuple(f"{scheme}://" for scheme in schemes)):
        raise SystemExit(f"{ENV_PREFIX}{name} must start with "
                         + " or ".join(f"{scheme}://" for scheme in schemes))
    return raw


def _roots(name: str) -> tuple[str, ...]:
    """Comma-separated storage URLs (``file:///path`` or ``s3://bucket[/prefix]``); empty:
    none. Checked in full where they are used (``service.sources``)."""
    roots = tuple(r.strip() for r in (_env(name) or "").split(",") if r.strip())
    for root in roots:
        if not root.startswith(("file:///", "s3://")):
            raise SystemExit(f"{ENV_PREFIX}{name} must be comma-separated file:///path or "
                             "s3://bucket[/prefix] URLs")
    return roots


def _spark_remote(raw: str | None) -> str | None:
    """Unset or empty: None (embedded); else ``local``, ``local[N]``, ``local[*]`` or an
    ``sc://`` Spark Connect URL."""
    raw = (raw or "").strip()
    if not raw:
        return None
    if not (re.fullmatch(r"local(\[([1-9][0-9]{0,3}|\*)\])?", raw) or raw.startswith("sc://")):
        raise SystemExit(f"{ENV_PREFIX}SPARK_REMOTE must be local[N] or an sc:// URL")
    return raw


def _path(raw: str | None) -> Path | None:
    return Path(raw).resolve() if raw else None


@dataclass(frozen=True)
class Config:
    """Runtime settings shared by the API, the worker and the CLI."""

    #: PRIVRELEASE_DATA_DIR: datasets (and the embedded Valkey's AOF and PostgreSQL's
    #: cluster) live here
    data_dir: Path = field(default_factory=lambda: Path("var").resolve())
    #: PRIVRELEASE_REDIS_URL: external Redis/Valkey (the Celery broker, rate limits,
    #: caches: nothing that may not be lost); unset -> standalone embeds one
    redis_url: str | None = None
    #: PRIVRELEASE_DATABASE_URL: the PostgreSQL (>= 15) of the system of record,
    #: ``postgresql://user:password@host:5432/db``; required (standalone embeds one)
    database_url: str | None = None
    #: PRIVRELEASE_MAX_UPLOAD_BYTES: largest accepted request body (CSV upload); uploads
    #: stream to disk, so this bounds disk use and request time, not memory. 1 GiB holds
    #: a max_rows dataset of a handful of columns
    max_upload_bytes: int = 1024 * 1024 * 1024
    #: PRIVRELEASE_MAX_JSON_BYTES: largest accepted JSON body (every endpoint but the upload)
    max_json_bytes: int = 8 * 1024 * 1024
    #: PRIVRELEASE_MAX_ROWS: largest accepted dataset
    max_rows: int = 10_000_000
    #: PRIVRELEASE_ALLOW_SEEDS: accept client-chosen seeds (tests only)
    allow_seeds: bool = False
    #: PRIVRELEASE_BOOTSTRAP_KEY: register this token as an operator key at start
    bootstrap_key: str | None = None
    #: PRIVRELEASE_IDEMPOTENCY_TTL: seconds an Idempotency-Key is remembered
    idempotency_ttl: int = 24 * 3600
    #: PRIVRELEASE_KEY_CACHE_SECONDS: seconds an API process keeps a key it looked up
    #: (``apikeys.KeyCache``): a key revoked through another process is still accepted
    #: here for up to this long. 0: every request looks its key up
    key_cache_seconds: float = 1.0
    #: PRIVRELEASE_LEASE_SECONDS: a running job's lease; a lapsed one means its worker died
    lease_seconds: int = 30
    #: PRIVRELEASE_SWEEP_INTERVAL: seconds between sweeps for reservations whose job is gone
    sweep_interval: float = 3.0
    #: PRIVRELEASE_MAX_RESENDS: times the sweeper re-sends a job lost before it read its
    #: data (its message lost, or its worker gone) before refunding it instead
    max_resends: int = 3
    #: PRIVRELEASE_CALLBACK_HOSTS: comma-separated host[:port] a callback_url may target
    callback_hosts: tuple[str, ...] = ()
    #: PRIVRELEASE_TEST_JOB_DELAY: seconds a job sleeps once it has read its data, before
    #: the mechanism runs (fault-injection tests only; honoured only together with
    #: PRIVRELEASE_ALLOW_SEEDS)
    test_job_delay: float = 0.0
    #: PRIVRELEASE_TEST_ANALYSIS_DELAY: seconds an analysis sleeps before it runs (time
    #: limit and cancel tests only; honoured only together with PRIVRELEASE_ALLOW_SEEDS)
    test_analysis_delay: float = 0.0
    #: PRIVRELEASE_LOG_LEVEL: level of the ``privrelease`` loggers (JSON lines on stderr)
    log_level: str = "INFO"
    #: PRIVRELEASE_RATE_LIMIT: requests per API key (all endpoints), e.g. "600/minute"
    #: or "10/second;6000/hour"; "" or "off": no limit
    rate_limit: str | None = "6000/minute"
    #: PRIVRELEASE_METRICS_DIR: prometheus-client multiprocess directory for
    #: ``privrelease api`` (emptied at start); unset: a fresh temporary directory
    metrics_dir: Path | None = None
    #: PRIVRELEASE_METRICS_MAX_DATASETS: newest datasets whose budgets /metrics exports
    metrics_max_datasets: int = 1000
    #: PRIVRELEASE_METRICS_TOKEN: bearer token /metrics requires (the scraper's); unset:
    #: /metrics is open and exports no per-dataset series (no dataset ids, no budgets)
    metrics_token: str | None = None
    #: PRIVRELEASE_ACCESS_LOG: one JSON line per request on the ``privrelease.access``
    #: logger; ``privrelease standalone`` turns it off unless given ``--access-log``
    access_log: bool = True
    #: PRIVRELEASE_MAX_ANALYSIS_WORK: ceiling on an analysis's work estimate (abstract
    #: units, about one per array element an iteration touches: 5e9 is minutes of one
    #: core); a request above it is refused at POST (422 ``work_limit``) naming the
    #: parameter to lower. PRIVRELEASE_MAX_WORK sets this and the next when they are unset
    max_analysis_work: float = 5e9
    #: PRIVRELEASE_MAX_RELEASE_WORK: the same ceiling for a release (rows x grid, lattice,
    #: bins, cells, rounds or components the params ask for)
    max_release_work: float = 1e11
    #: PRIVRELEASE_WORKER_MEMORY: the memory a release may use in its worker, in bytes or
    #: with a unit (``4GiB``, ``3000MB``). A release whose bound (``Mechanism.memory``:
    #: the loaded columns and the mechanism's measured per-row figure, from the version's
    #: declared rows and columns) exceeds it is refused at POST and estimate (422
    #: ``memory_limit``) and again by the worker before it reads the data (refunded), never
    #: killed for memory and charged. Set it below the worker's real limit (cgroup, pod):
    #: the default suits a 4 GiB worker, whose interpreter and libraries take ~0.5 GiB
    worker_memory: int = 3 * 2**30
    #: PRIVRELEASE_ANALYSIS_TIME_LIMIT: seconds an analysis may run (Celery soft limit);
    #: then it ends ``failed`` with code ``time_limit``. With the grace it must stay below
    #: the broker's visibility timeout (900 s): a redelivered analysis is never re-run
    analysis_time_limit: float = 600.0
    #: PRIVRELEASE_RELEASE_TIME_LIMIT: seconds a release may run (soft limit); then it
    #: fails as any release does (charged, ``mechanism_failed``, once it read the data)
    release_time_limit: float = 3600.0
    #: PRIVRELEASE_TIME_LIMIT_GRACE: seconds after the soft limit before the worker
    #: process running the task is killed (Celery hard limit)
    time_limit_grace: float = 30.0
    #: PRIVRELEASE_TRUSTED_PROXIES: reverse proxies in front of the API whose
    #: X-Forwarded-For/-Proto are trusted (0: none), so limits see the client's address
    trusted_proxies: int = 0
    #: PRIVRELEASE_HEADER_TIMEOUT: seconds a client has to send a request's complete
    #: head (request line and headers) from the moment the server waits for it; later
    #: it is answered 408 and closed (slow clients cost a socket, never a thread)
    header_timeout: float = 10.0
    #: PRIVRELEASE_RESTART_LIMIT: how many times ``standalone`` restarts one of its
    #: processes (Valkey, worker, API) within PRIVRELEASE_RESTART_WINDOW seconds before
    #: it stops everything and exits non-zero
    restart_limit: int = 5
    #: PRIVRELEASE_RESTART_WINDOW: the window, in seconds, of PRIVRELEASE_RESTART_LIMIT
    restart_window: float = 300.0
    #: PRIVRELEASE_ESTIMATE_RATE_LIMIT: estimates per API key (on top of RATE_LIMIT),
    #: e.g. "30/minute"; "" or "off": no separate limit
    estimate_rate_limit: str | None = "60/minute"
    #: PRIVRELEASE_MAX_PRECOMPUTE_WORK: most work units a cost computation may take
    #: (interval: coverage evaluations x integrand points x ranges); beyond it, 422 naming
    #: the parameter. The default admits the largest design the schemas allow (~2.4e8)
    max_precompute_work: float = 2.5e8
    #: PRIVRELEASE_PRECOMPUTE_MAX_BYTES: disk the shared precompute cache
    #: (<data dir>/precompute) may use; least recently used entries go first
    precompute_max_bytes: int = 1024 * 1024 * 1024
    #: PRIVRELEASE_STORAGE_URL: where dataset versions and release artifacts are stored
    #: (service.storage.objects): ``file:///path`` (a local directory) or
    #: ``s3://bucket/prefix`` (S3-compatible object storage, credentials from the usual
    #: ``AWS_*`` variables); unset: ``file://`` of the data directory
    storage_url: str | None = None
    #: PRIVRELEASE_S3_ENDPOINT_URL: the S3 server of an ``s3://`` storage URL when it is
    #: not AWS (MinIO, Ceph RGW, GCS's S3 API): ``https://host[:port]``
    s3_endpoint_url: str | None = None
    #: PRIVRELEASE_SPARK_REMOTE: the engine of the statistics' passes (service.engines):
    #: unset, in the worker's process; ``sc://host:15002``, a Spark Connect server (the
    #: worker is a thin client); ``local[N]``, a local Spark Connect server with N cores
    spark_remote: str | None = None
    #: PRIVRELEASE_SPARK_CONNECT_TIMEOUT: seconds a run waits for the Spark Connect server
    #: to answer before it reads any data (``spark_session.reach``); one that does not is
    #: a failure before the read (refunded), never a worker hung on its retries
    spark_connect_timeout: float = 30.0
    #: PRIVRELEASE_SOURCE_ROOTS: comma-separated storage URLs (``file:///dir``,
    #: ``s3://bucket/prefix``) under which a dataset version may be registered by
    #: reference (``service.sources``); empty: registering by reference is off
    source_roots: tuple[str, ...] = ()
    #: PRIVRELEASE_MAX_SOURCE_FILES: most objects a source registered by reference may
    #: list (its Parquet files and the hidden ones skipped); more is refused
    max_source_files: int = 10_000

    @classmethod
    def from_env(cls) -> Config:
        """Build the configuration from the process environment."""
        return cls(
            data_dir=Path(_env("DATA_DIR") or "var").resolve(),
            redis_url=_env("REDIS_URL") or None,
            database_url=_env("DATABASE_URL") or None,
            max_upload_bytes=_int("MAX_UPLOAD_BYTES", cls.max_upload_bytes),
            max_json_bytes=_int("MAX_JSON_BYTES", cls.max_json_bytes),
            max_rows=_int("MAX_ROWS", cls.max_rows),
            allow_seeds=_bool("ALLOW_SEEDS"),
            bootstrap_key=_env("BOOTSTRAP_KEY") or None,
            idempotency_ttl=_int("IDEMPOTENCY_TTL", cls.idempotency_ttl),
            key_cache_seconds=_non_negative("KEY_CACHE_SECONDS", cls.key_cache_seconds),
            lease_seconds=_int("LEASE_SECONDS", cls.lease_seconds),
            sweep_interval=float(_env("SWEEP_INTERVAL") or cls.sweep_interval),
            max_resends=_at_least("MAX_RESENDS", cls.max_resends, 0),
            callback_hosts=tuple(h.strip().lower() for h in (_env("CALLBACK_HOSTS") or "")
                                 .split(",") if h.strip()),
            test_job_delay=float(_env("TEST_JOB_DELAY") or 0.0),
            test_analysis_delay=float(_env("TEST_ANALYSIS_DELAY") or 0.0),
            log_level=_log_level(_env("LOG_LEVEL") or cls.log_level),
            rate_limit=_rate_limit(_env("RATE_LIMIT"), cls.rate_limit),
            metrics_dir=_path(_env("METRICS_DIR")),
            metrics_max_datasets=_int("METRICS_MAX_DATASETS", cls.metrics_max_datasets),
            metrics_token=_env("METRICS_TOKEN") or None,
            access_log=_bool("ACCESS_LOG", default=True),
            trusted_proxies=_int("TRUSTED_PROXIES", cls.trusted_proxies),
            header_timeout=_positive("HEADER_TIMEOUT", cls.header_timeout),
            restart_limit=_int("RESTART_LIMIT", cls.restart_limit),
            restart_window=_positive("RESTART_WINDOW", cls.restart_window),
            max_analysis_work=_positive("MAX_ANALYSIS_WORK",
                                        _positive("MAX_WORK", cls.max_analysis_work)),
            max_release_work=_positive("MAX_RELEASE_WORK",
                                       _positive("MAX_WORK", cls.max_release_work)),
            worker_memory=_bytes("WORKER_MEMORY", cls.worker_memory),
            analysis_time_limit=_positive("ANALYSIS_TIME_LIMIT", cls.analysis_time_limit),
            release_time_limit=_positive("RELEASE_TIME_LIMIT", cls.release_time_limit),
            time_limit_grace=_positive("TIME_LIMIT_GRACE", cls.time_limit_grace),
            estimate_rate_limit=_rate_limit(_env("ESTIMATE_RATE_LIMIT"),
                                            cls.estimate_rate_limit),
            max_precompute_work=_positive("MAX_PRECOMPUTE_WORK", cls.max_precompute_work),
            precompute_max_bytes=_int("PRECOMPUTE_MAX_BYTES", cls.precompute_max_bytes),
            storage_url=_url("STORAGE_URL", ("file", "s3")),
            s3_endpoint_url=_url("S3_ENDPOINT_URL", ("http", "https")),
            spark_remote=_spark_remote(_env("SPARK_REMOTE")),
            spark_connect_timeout=_positive("SPARK_CONNECT_TIMEOUT",
                                            cls.spark_connect_timeout),
            source_roots=_roots("SOURCE_ROOTS"),
            max_source_files=_at_least("MAX_SOURCE_FILES", cls.max_source_files, 1),
        )

    @property
    def object_store_url(self) -> str:
        """PRIVRELEASE_STORAGE_URL, or the data directory's ``file://`` URL."""
        return self.storage_url or self.data_dir.as_uri()

    @property
    def datasets_dir(self) -> Path:
        """Dataset versions of the default ``file://`` store (``datasets/`` keys)."""
        return self.data_dir / "datasets"

    @property
    def staging_dir(self) -> Path:
        """This host's scratch folder: uploads and release tables are written here before
        they are stored (``dataset_files.DatasetStore.staging``); never shared."""
        return self.data_dir / ".staging"

    @property
    def releases_dir(self) -> Path:
        """Release documents (``release_documents``); tables written before they moved to
        the object store (``tables/``) are read here too."""
        return self.data_dir / "releases"

    @property
    def audit_dir(self) -> Path:
        """Audit events the old Valkey store had archived to disk
        (``<dataset>.jsonl``), read by ``privrelease migrate-from-valkey``."""
        return self.data_dir / "audit"

    @property
    def valkey_dir(self) -> Path:
        return self.data_dir / "valkey"

    @property
    def postgres_dir(self) -> Path:
        """The embedded PostgreSQL of ``standalone`` (service.processes.postgres)."""
        return self.data_dir / "postgres"

    def require_redis_url(self) -> str:
        """The Redis URL, or a clear exit when none is configured."""
        if not self.redis_url:
            raise SystemExit(
                f"{ENV_PREFIX}REDIS_URL is not set (use `privrelease standalone` to run "
                "an embedded Valkey)"
            )
        return self.redis_url

    def require_database_url(self) -> str:
        """The PostgreSQL URL, or a clear exit when none is configured."""
        if not self.database_url:
            raise SystemExit(
                f"{ENV_PREFIX}DATABASE_URL is not set: PostgreSQL is the system of record"
                " (Valkey is only the broker). Set it to a postgresql:// URL, or use"
                " `privrelease standalone` to run an embedded PostgreSQL; a deployment on"
                " the old Valkey store moves with `privrelease migrate-from-valkey`"
            )
        return self.database_url
