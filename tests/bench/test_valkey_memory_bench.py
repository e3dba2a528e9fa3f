"""Bench: Valkey memory per finished release over 10^5 releases (issue 19 §3).

The same rig and measure as ``tests/integration/test_valkey_memory.py`` (real reserve,
run, result file, commit), ten times the CI count; about 3 minutes.
"""

from __future__ import annotations

from tests.integration.test_valkey_memory import (
    BOUND,
    STREAM_BOUND,
    Rig,
    finished_release,
    measure,
    report,
    rig,
)

__all__ = ["rig"]  # the module-scoped fixture, shared


def test_bench_valkey_memory_1e5_releases(rig: Rig) -> None:
    for i in range(200):
        finished_release(rig, i)
    got = measure(rig, 100_000, first=200)
    report(got)
    assert got["per_release"] <= BOUND, got
    assert got["audit_stream"] <= STREAM_BOUND, got
