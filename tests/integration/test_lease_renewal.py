"""A run's lease kept alive while it works (``service.releases.run._lease``): one thread
per process renews every run's lease a third of a lease after it was taken or renewed,
tells a run that lost it, and stops renewing a run that ended. On the session's record,
its runs leased for one second."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable

from flask import Flask

from service.releases import run
from service.storage.ledger import Reservation, Run
from service.storage.store import Store
from tests.integration.conftest import LEDGER_REQUEST
from tests.integration.record_state import lapse, run_store

LEASE = 1


def _until(check: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "not within the timeout"
        time.sleep(0.05)


def _started(store: Store) -> tuple[str, Run]:
    """A release of a dataset of its own, started (nobody else sends or runs it), and
    the dataset's id."""
    ds = "ds_lease_" + secrets.token_hex(4)
    store.open(ds, {"epsilon": 100}, "test")
    rid = store.reserve(Reservation(ds, "rel_lease_" + secrets.token_hex(6), {"epsilon": 1},
                                    actor="test", fingerprint=secrets.token_hex(8),
                                    request_json=LEDGER_REQUEST)).release_id
    store.enqueued(rid)  # out of the outbox: no sweeper sends it
    started = store.mark_running(rid, "lease-test")
    assert started is not None
    return ds, started


def test_leases_are_renewed_while_runs_work_and_no_longer_once_they_end(app: Flask) -> None:
    store = run_store(app, LEASE)
    (_, first), (_, second) = _started(store), _started(store)
    with run._lease(store, first) as lost_first, run._lease(store, second) as lost_second:
        time.sleep(3 * LEASE)  # three leases long: renewed all along, both
        assert store.lease_held(first.release_id) and store.lease_held(second.release_id)
        assert not lost_first.is_set() and not lost_second.is_set()
    time.sleep(LEASE / 3)
    _until(lambda: not store.lease_held(first.release_id), timeout=3 * LEASE)
    assert not store.lease_held(second.release_id)


def test_a_run_whose_lease_another_run_took_is_told(app: Flask) -> None:
    store = run_store(app, LEASE)
    ds, stalled = _started(store)
    with run._lease(store, stalled) as lost:
        lapse(store, stalled.release_id)
        taken = store.mark_running(stalled.release_id, "lease-test")  # another run
        assert taken is not None and taken.attempt == 2
        _until(lost.is_set, timeout=2 * LEASE)
        assert store.abort_run(ds, stalled, "{}") == "lost"
    assert store.lease_held(taken.release_id)  # the other run's, never renewed away
    assert store.abort_run(ds, taken, "{}") == "settled"
