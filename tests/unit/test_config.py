"""``PRIVRELEASE_SPARK_REMOTE`` as ``service.config`` reads it: unset is embedded, and only
a local master or an ``sc://`` URL is accepted."""

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
