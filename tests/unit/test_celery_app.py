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


def test_release_workers_run_without_acknowledgements() -> None:
    """Only the queues whose lost jobs the record sends again (runs, pricing) are served
    without kombu's unacked record; analyses and callbacks (a callback's retry waits up to
    10 minutes in the broker) get a second process that keeps it."""
    from celery import Celery

    from service.config import Config
    from service.releases import queue
    from workers.__main__ import split

    assert set(queue.RESENT_QUEUES) == {queue.RELEASES_QUEUE, queue.PRICING_QUEUE}
    assert queue.ROUTES[queue.NOTIFY] == queue.NOTIFICATIONS_QUEUE
    assert split(list(queue.QUEUES), False) == (
        ["releases", "pricing"], ["analyses", "notifications"], False)
    assert split(list(queue.QUEUES), True) == (list(queue.QUEUES), [], True)
    assert split(["releases"], False) == (["releases"], [], False)
    assert split(["analyses"], False) == (["analyses"], [], True)
    app = queue.configure(Celery("t"), Config(redis_url="redis://h:1/0"), ack_emulation=False)
    assert app.conf.broker_transport_options["ack_emulation"] is False
    assert queue.configure(Celery("t"), Config(redis_url="redis://h:1/0")) \
        .conf.broker_transport_options["ack_emulation"] is True
