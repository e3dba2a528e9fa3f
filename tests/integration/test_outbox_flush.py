"""The POST takes its release out of the outbox off the request path (issue #29): a
per-process ``submit.OutboxFlusher`` deletes the published ids in one statement every
``OUTBOX_FLUSH_SECONDS``; a process that dies first leaves its rows, the sweeper re-sends
them after ``OUTBOX_GRACE``, and the second message is harmless: the release runs once,
with one output and one charge.

A Valkey database of its own (the session's worker never sees these jobs), an app on it,
and a worker started only once the messages are staged. On PostgreSQL the rig's record is
a database of its own too.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from flask import Flask

from service import wiring
from service.releases import pricing, submit, sweeper
from service.releases.queue import RELEASES_QUEUE
from service.storage.ledger import Reservation
from service.storage.store import Store
from tests.conftest import until
from tests.integration.conftest import PEOPLE_META, Api, people_csv
from tests.integration.record_state import field, queued_messages, worker_rig

DB = 8
EPSILON = 0.5
#: a run's lease: a second message taken while the first run holds it is retried after
#: the lease (then finds the release ended), so keep it short
LEASE = 2


@pytest.fixture(scope="module")
def rig(redis_url: str, service_env: dict[str, str], app: Flask,
        tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
        ) -> Iterator[dict[str, Any]]:
    """Its own Valkey database and record, an app on them, a dataset, and a worker
    started on demand (its sweeper never runs during the test: the test sweeps)."""
    with worker_rig(request, redis_url, service_env, app, tmp_path_factory.mktemp("outbox"),
                    DB, LEASE) as made:
        api = Api(made.app.test_client())
        resp = api.upload(people_csv(50), PEOPLE_META)
        assert resp.status_code == 201, resp.get_json()
        yield {"app": made.app, "api": api, "client": made.client, "start": made.start,
               "ds": str(resp.get_json()["id"]), "svc": wiring.of(made.app)}


def _body(ds: str, value: int) -> dict[str, Any]:
    return {"dataset_id": ds, "mechanism": "geometric", "budget": {"epsilon": EPSILON},
            "params": {"statistic": "count",
                       "condition": {"column": "age", "op": "ge", "value": value}}}


class _Failing:
    """The store, its batched delete failing while ``down``."""

    def __init__(self, inner: Store) -> None:
        self.inner, self.down, self.batches = inner, False, []

    def enqueued_many(self, ids: list[str]) -> None:
        if self.down:
            raise ConnectionError("record away")
        self.batches.append(list(ids))
        self.inner.enqueued_many(ids)


def _reserved(svc: Any, ds: str, value: int) -> str:
    """A reservation as the POST makes it (the release enters the outbox), no message."""
    prepared = pricing.prepare(svc.ledger, _body(ds, value), allow_seeds=True)
    res = svc.ledger.reserve(Reservation(
        ds, submit.new_id(), prepared.cost_units, actor="t",
        fingerprint=prepared.request_fingerprint, replay_fingerprint=prepared.fingerprint,
        request_json=prepared.job().to_json()))
    assert res.outcome == "reserved"
    return str(res.release_id)


def test_a_post_leaves_the_outbox_in_the_flushers_batch(
        rig: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """No worker runs: only the flusher can take these releases out of the outbox. The
    POST itself makes no ``enqueued`` call (a transaction it paid before); within the
    flusher's interval every published release is out, in one delete per batch."""
    api, svc = rig["api"], rig["svc"]
    ledger = svc.ledger

    def refused(release_id: str) -> None:
        raise AssertionError("the POST took its release out of the outbox itself")

    monkeypatch.setattr(ledger, "enqueued", refused)
    flusher = submit.outbox_flusher(ledger)
    assert submit.outbox_flusher(ledger) is flusher
    ids = []
    for value in range(20, 26):
        resp = api.post("/v1/releases", _body(rig["ds"], value))
        assert resp.status_code == 202, resp.get_json()
        ids.append(resp.get_json()["id"])
    until(lambda: not set(ids) & ledger.unsent_ids(), timeout=5)
    for rid in ids:  # still queued: their messages wait for a worker, sent once
        assert api.get(f"/v1/releases/{rid}").get_json()["status"] == "queued"
        assert queued_messages(rig["client"], rid) == 1
    for rid in ids:  # refunded, their messages dropped: the worker started later skips them
        assert ledger.abort(rig["ds"], rid, '{"message": "test"}', "t")
    for message in rig["client"].lrange(RELEASES_QUEUE, 0, -1):
        rig["client"].lrem(RELEASES_QUEUE, 0, message)


def test_the_flusher_batches_and_keeps_what_it_could_not_delete(rig: dict[str, Any]) -> None:
    """``batch`` ids make it delete at once, in one call; a failed delete keeps its ids
    for the next round; ``flush_outbox`` (the process's exit) deletes what is left."""
    svc = rig["svc"]
    store = _Failing(svc.ledger)
    flusher = submit.OutboxFlusher(store, seconds=3600, batch=3)  # type: ignore[arg-type]
    ids = [_reserved(svc, rig["ds"], v) for v in (40, 41, 42, 43)]
    assert set(ids) <= svc.ledger.unsent_ids()
    for rid in ids[:3]:
        flusher.sent(rid)
    until(lambda: store.batches, timeout=5)  # the third woke it: one delete of three
    assert store.batches == [ids[:3]]
    assert svc.ledger.unsent_ids() & set(ids) == {ids[3]}
    store.down = True
    flusher.sent(ids[3])
    assert flusher.flush() == 0 and flusher._ids == [ids[3]]  # kept for the next round
    assert ids[3] in svc.ledger.unsent_ids()
    store.down = False
    submit._FLUSHERS[store] = flusher  # as outbox_flusher registers it
    try:
        assert submit.flush_outbox() >= 1
    finally:
        del submit._FLUSHERS[store]
    assert store.batches[-1] == [ids[3]] and not svc.ledger.unsent_ids() & set(ids)
    for rid in ids:  # nothing was sent: the worker must not run these
        assert svc.ledger.abort(rig["ds"], rid, '{"message": "test"}', "t")


def test_a_release_published_twice_runs_once(rig: dict[str, Any]) -> None:
    """An API process that published a release and died before its flusher's delete
    leaves the release in the outbox; after the grace the sweeper sends it again, so two
    messages wait. The worker runs it once: one attempt, one result, one commit, charged
    once."""
    api, client, svc = rig["api"], rig["client"], rig["svc"]
    ledger, ds = svc.ledger, rig["ds"]
    before = api.get(f"/v1/datasets/{ds}/budget").get_json()["measures"]["epsilon"]
    rid = _reserved(svc, ds, 30)
    svc.queue.run(rid)  # its publish; the id went to a flusher that never deleted it
    assert rid in ledger.unsent_ids()
    # its grace over (the sweeper's pass sends it: grace 0 stands for 5 s gone by)
    assert sweeper.send_outbox(ledger, svc.queue, grace=0.0) == [rid]
    assert rid not in ledger.unsent_ids() and queued_messages(client, rid) == 2

    rig["start"]()
    assert api.wait(rid, timeout=60)["status"] == "succeeded"
    until(lambda: queued_messages(client, rid) == 0)
    time.sleep(0.5)  # the second message's run, had it started, would have counted by now
    assert field(ledger, rid, "attempts") == "1"
    # one output, in the release's row (its commit wrote it), and no file of any run
    assert ledger.release(rid)["output"]
    assert not list(svc.documents.folder(rid).glob("result.*.json"))
    events = api.get(f"/v1/datasets/{ds}/ledger").get_json()
    kinds = Counter(e["kind"] for e in events if e["release_id"] == rid)
    assert kinds == {"reserve": 1, "commit": 1}
    after = api.get(f"/v1/datasets/{ds}/budget").get_json()["measures"]["epsilon"]
    assert after["committed"] - before["committed"] == pytest.approx(EPSILON, abs=1e-9)
    assert after["reserved"] == pytest.approx(before["reserved"], abs=1e-9)
