"""What ``service.engines.spark_session`` says without starting Spark: the engine's name
in a release document never carries the Spark Connect URL's token or user."""

from __future__ import annotations

import pytest

from service.engines.spark_session import engine_name, is_local


@pytest.mark.parametrize(("remote", "name"), [
    (None, "embedded"),
    ("local[2]", "spark local[2]"),
    ("local", "spark local"),
    ("sc://spark.internal:15002", "spark sc://spark.internal:15002"),
    ("sc://spark.internal", "spark sc://spark.internal"),
    ("sc://alice@spark.internal:443/;use_ssl=true;token=s3cr3t-t0ken",
     "spark sc://spark.internal:443"),
    ("sc://spark.internal:port", "spark sc://spark.internal"),
])
def test_the_engine_is_named_without_credentials(remote: str | None, name: str) -> None:
    assert engine_name(remote) == name
    assert "s3cr3t" not in engine_name(remote) and "alice" not in engine_name(remote)


def test_local_masters_are_told_from_urls() -> None:
    assert is_local("local") and is_local("local[*]") and is_local("local[4]")
    assert not is_local("sc://localhost:15002") and not is_local("localhost")
