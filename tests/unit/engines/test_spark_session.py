"""What ``service.engines.spark_session`` says without starting Spark: the engine's name
in a release document never carries the Spark Connect URL's token or user, and a
session's retries of a server that is away end within the connect timeout."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.engines.spark_session import _retries, engine_name, is_local


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


def _waits(timeout: float) -> list[int]:
    """The waits (ms) pyspark's own retry state takes under ``_retries(timeout)`` for a
    server that stays away, until it gives up."""
    state = _retries(timeout).to_state()
    waits = []
    while (wait := state.next_attempt()) is not None:
        waits.append(wait)
    return waits


@settings(max_examples=200, deadline=None)
@given(st.floats(min_value=0.001, max_value=7 * 24 * 3600.0))
def test_the_retries_of_a_server_away_add_up_to_the_timeout(timeout: float) -> None:
    """Catches pyspark's default (15 tries, waits up to 60 s: over ten minutes) or a cut
    that overshoots the timeout: the waits add up to at most the timeout, and as many
    fit as do (one more would pass it), each at most pyspark's 60 s."""
    waits = _waits(timeout)
    budget = timeout * 1000
    assert sum(waits) <= budget
    longest = max(min(60_000, int(budget / 4)), 50)
    assert all(w <= longest for w in waits)
    following = min(longest, 50 * 4 ** min(len(waits), 16))
    assert sum(waits) + following > budget


def test_the_default_timeout_retries_seven_times_in_under_thirty_seconds() -> None:
    assert _waits(30.0) == [50, 200, 800, 3200, 7500, 7500, 7500]
