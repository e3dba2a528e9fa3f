"""Broker settings that must agree with the tasks' own retry policies."""

from __future__ import annotations

from service.releases.queue import VISIBILITY_TIMEOUT
from workers import tasks


def test_visibility_timeout_outlasts_every_retry_countdown() -> None:
    """kombu keeps a message retried with a countdown in its unacked set until it is due;
    a visibility timeout shorter than the countdown would deliver that retry twice."""
    longest = max(getattr(task, "retry_backoff_max", 0) or 0
                  for task in (tasks.send_notification, tasks.run_release, tasks.run_analysis))
    assert longest == 600
    assert longest + 60 < VISIBILITY_TIMEOUT
