"""Observability and rate-limit plumbing that needs no Redis: config, logs, metrics dir."""

from __future__ import annotations

import io
import json
import logging
import os
import sys
from pathlib import Path

import pytest

from service.api.observability import JsonFormatter, configure_logging
from service.config import Config
from service.processes import server
from service.storage.release_metrics import BUCKETS, bucket_label


@pytest.mark.parametrize(("raw", "expected"), [
    (None, Config.rate_limit), ("", None), ("off", None), (" OFF ", None),
    ("3/minute", "3/minute"), ("10/second;1000/hour", "10/second;1000/hour"),
])
def test_rate_limit_from_env(monkeypatch: pytest.MonkeyPatch, raw: str | None,
                             expected: str | None) -> None:
    monkeypatch.delenv("PRIVRELEASE_RATE_LIMIT", raising=False)
    if raw is not None:
        monkeypatch.setenv("PRIVRELEASE_RATE_LIMIT", raw)
    assert Config.from_env().rate_limit == expected


def test_observability_settings_from_env(monkeypatch: pytest.MonkeyPatch,
                                         tmp_path: Path) -> None:
    monkeypatch.setenv("PRIVRELEASE_LOG_LEVEL", "debug")
    monkeypatch.setenv("PRIVRELEASE_METRICS_DIR", str(tmp_path / "m"))
    monkeypatch.setenv("PRIVRELEASE_METRICS_MAX_DATASETS", "7")
    config = Config.from_env()
    assert config.log_level == "DEBUG"
    assert config.metrics_dir == tmp_path / "m"
    assert config.metrics_max_datasets == 7
    for name in ("LOG_LEVEL", "METRICS_DIR", "METRICS_MAX_DATASETS"):
        monkeypatch.delenv("PRIVRELEASE_" + name)
    config = Config.from_env()
    assert (config.log_level, config.metrics_dir, config.metrics_max_datasets) == (
        "INFO", None, 1000)
    monkeypatch.setenv("PRIVRELEASE_LOG_LEVEL", "loud")
    with pytest.raises(SystemExit, match="LOG_LEVEL"):
        Config.from_env()


def test_json_formatter_drops_exception_messages() -> None:
    """An exception message may quote a data value; its type and frames are enough."""
    cell = "Alice Smith"
    try:
        float(cell)
    except ValueError:
        record = logging.getLogger("privrelease.x").makeRecord(
            "privrelease.x", logging.ERROR, __file__, 1, "ingest failed", (), sys.exc_info(),
            extra={"dataset_id": "ds_1"})
    doc = json.loads(JsonFormatter().format(record))
    assert doc["msg"] == "ingest failed" and doc["dataset_id"] == "ds_1"
    assert doc["exc_type"] == "ValueError" and "float(" in doc["traceback"]
    assert "Alice" not in json.dumps(doc)


def test_configure_logging_is_idempotent_and_json() -> None:
    buf = io.StringIO()
    logger = logging.getLogger("privrelease")
    saved = list(logger.handlers), logger.level, logger.propagate
    try:
        configure_logging("WARNING", stream=buf)
        configure_logging("INFO", stream=buf)
        logging.getLogger("privrelease.worker").info("job done", extra={"release_id": "rel_1"})
        logging.getLogger("privrelease.worker").debug("hidden")
        lines = buf.getvalue().splitlines()
        assert len(lines) == 1
        doc = json.loads(lines[0])
        assert doc["logger"] == "privrelease.worker" and doc["release_id"] == "rel_1"
        assert doc["level"] == "INFO" and doc["ts"].endswith("Z")
    finally:
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        for handler in saved[0]:
            logger.addHandler(handler)
        logger.setLevel(saved[1])
        logger.propagate = saved[2]


def test_prepare_metrics_dir_empties_only_old_metric_files(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(server.MULTIPROC_ENV, "")  # restored (unset) after the test
    (tmp_path / "counter_123.db").write_bytes(b"old")
    (tmp_path / "keep.txt").write_text("not ours")
    path, temporary = server.prepare_metrics_dir(tmp_path)
    assert (path, temporary) == (tmp_path, False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]
    assert os.environ[server.MULTIPROC_ENV] == str(tmp_path)

    path, temporary = server.prepare_metrics_dir(None)
    try:
        assert temporary and path.is_dir() and not any(path.iterdir())
        assert os.environ[server.MULTIPROC_ENV] == str(path)
    finally:
        path.rmdir()


def test_gunicorn_options_mark_dead_workers() -> None:
    assert server.options("127.0.0.1", 8000, 2)["child_exit"] is server.child_exit


def test_histogram_buckets_end_with_inf_and_use_prometheus_spelling() -> None:
    assert list(BUCKETS) == sorted(BUCKETS) and bucket_label(BUCKETS[-1]) == "+Inf"
    assert bucket_label(1) == "1.0" and bucket_label(0.005) == "0.005"


def test_retry_after_means_what_each_status_needs() -> None:
    """A 429 keeps the window's Retry-After (never 0), a 503 gets the service's short
    delay (not a rate window's), anything else has none."""
    from flask import Response

    from service.api.problems import RETRY_AFTER_SECONDS
    from service.api.ratelimit import _retry_after

    refused = Response(status=429, headers={"Retry-After": "0"})
    assert _retry_after(refused).headers["Retry-After"] == "1"
    later = Response(status=429, headers={"Retry-After": "17"})
    assert _retry_after(later).headers["Retry-After"] == "17"
    down = Response(status=503, headers={"Retry-After": "59"})
    assert _retry_after(down).headers["Retry-After"] == str(RETRY_AFTER_SECONDS)
    ok = Response(status=200, headers={"Retry-After": "59"})
    assert "Retry-After" not in _retry_after(ok).headers


def test_rate_limiter_failures_log_one_line_without_a_trace() -> None:
    """flask-limiter logs an exception per request while Valkey is down: kept as a warning
    naming the error type, without the repeated stack trace."""
    import logging
    import sys

    from service.api.ratelimit import _one_line

    try:
        raise ConnectionError("Error 111 connecting to 127.0.0.1:6379")
    except ConnectionError:
        record = logging.LogRecord("privrelease.ratelimit", logging.ERROR, __file__, 1,
                                   "Failed to rate limit. Swallowing error", None,
                                   sys.exc_info())
    assert _one_line(record)
    assert record.exc_info is None and record.levelname == "WARNING"
    assert record.error_type == "ConnectionError"  # type: ignore[attr-defined]
