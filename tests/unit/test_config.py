"""``PRIVRELEASE_SPARK_REMOTE`` as ``service.config`` reads it: unset is embedded, and only
a local master or an ``sc://`` URL is accepted; ``PRIVRELEASE_WORKER_MEMORY`` in bytes or
with a unit; ``PRIVRELEASE_SPARK_CONNECT_TIMEOUT`` a positive number of seconds."""

from __future__ import annotations

import pytest

from service.config import Config


@pytest.mark.parametrize(("raw", "read"), [
    ("", None), ("  ", None), ("local[2]", "local[2]"), ("local", "local"),
    ("local[*]", "local[*]"), ("sc://spark.internal:15002", "sc://spark.internal:15002"),
])
def test_the_spark_remote_is_read(monkeypatch: pytest.MonkeyPatch, raw: str,
                                  read: str | None) -> None:
    monkeypatch.setenv("PRIVRELEASE_SPARK_REMOTE", raw)
    assert Config.from_env().spark_remote == read


def test_no_spark_remote_is_embedded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PRIVRELEASE_SPARK_REMOTE", raising=False)
    assert Config.from_env().spark_remote is None


@pytest.mark.parametrize("raw", ["local[0]", "local[two]", "yarn", "spark://host:7077",
                                 "http://host:15002"])
def test_other_spark_remotes_are_refused(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv("PRIVRELEASE_SPARK_REMOTE", raw)
    with pytest.raises(SystemExit, match="PRIVRELEASE_SPARK_REMOTE must be local"):
        Config.from_env()


@pytest.mark.parametrize(("raw", "read"), [("", 30.0), ("2.5", 2.5), ("120", 120.0)])
def test_the_spark_connect_timeout_is_read(monkeypatch: pytest.MonkeyPatch, raw: str,
                                           read: float) -> None:
    monkeypatch.setenv("PRIVRELEASE_SPARK_CONNECT_TIMEOUT", raw)
    assert Config.from_env().spark_connect_timeout == read


@pytest.mark.parametrize("raw", ["0", "-1", "inf", "soon"])
def test_a_spark_connect_timeout_that_would_never_or_always_end_is_refused(
        monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv("PRIVRELEASE_SPARK_CONNECT_TIMEOUT", raw)
    with pytest.raises(SystemExit, match="PRIVRELEASE_SPARK_CONNECT_TIMEOUT must be"):
        Config.from_env()


@pytest.mark.parametrize(("raw", "read"), [
    ("", 3 * 2**30), ("4GiB", 4 * 2**30), ("4 GiB", 4 * 2**30), ("512MiB", 512 * 2**20),
    ("3000MB", 3 * 10**9), ("2G", 2 * 2**30), ("1e9", 10**9), ("123456789", 123456789),
    ("2.5gib", int(2.5 * 2**30)),
])
def test_the_worker_memory_is_read_in_bytes_or_with_a_unit(
        monkeypatch: pytest.MonkeyPatch, raw: str, read: int) -> None:
    """PRIVRELEASE_WORKER_MEMORY: unset or empty is the documented 3 GiB."""
    monkeypatch.setenv("PRIVRELEASE_WORKER_MEMORY", raw)
    assert Config.from_env().worker_memory == read


@pytest.mark.parametrize("raw", ["4 gigabytes", "GiB", "-1GiB", "4PiB", "0", "0.1"])
def test_other_worker_memories_are_refused(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv("PRIVRELEASE_WORKER_MEMORY", raw)
    with pytest.raises(SystemExit, match="PRIVRELEASE_WORKER_MEMORY must be"):
        Config.from_env()
