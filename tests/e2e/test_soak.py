"""A short soak (8 clients, a few seconds) keeps the load invariants honest in CI.

The full run is ``make soak`` (64 clients x 120 s, with the memory check); this one
runs the same mix and the same checks but for memory: no 5xx, no overspend, no lost
or duplicated release, every mechanism released, retries and replays consistent.
"""

from __future__ import annotations

from pathlib import Path

from tests.load import soak


def test_short_soak_keeps_every_invariant(tmp_path: Path) -> None:
    with soak.standalone(tmp_path) as svc:
        report = soak.run(svc, clients=8, seconds=10, max_growth=None, drain_timeout=60)
    print(report.render())
    assert report.violations == {}, report.render()
    kinds = {k[0]: k[1] for k in report.kinds()}
    # the mix really ran: releases were accepted and refused, analyses were queued
    assert kinds["release"] > 30 and kinds["analysis"] > 5, kinds
    statuses = {s for c in report.calls if c.kind == "release" for s in [c.status]}
    assert {202, 409} <= statuses, statuses
    assert report.counts["commit"] > 10, report.counts
