"""The sweeper re-sends lost jobs instead of refunding them (issue #19 §4: no release lost).

A Valkey database of its own (so the session's worker never sees these jobs), an
app on it, and a real worker started only once the losses are staged: a queued
release whose message the broker lost, a running one whose worker died before
reading its data, one re-sent past the bound, and one with two messages (its
original only delayed). The re-send's claim (``Store.claim_resend``: one transaction)
and the sweeper's pacing are tested against the same database with a recording sender.
The rig's record is a database of its own too.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from flask import Flask

from service import wiring
from service.releases import queue, submit, sweeper
from service.releases.queue import RELEASES_QUEUE, Queue
from service.storage.ledger import Reservation
from service.storage.store import Store
from tests.conftest import until
from tests.integration.conftest import PEOPLE_META, Api, people_csv
from tests.integration.record_state import (
    backdate,
    field,
    lapse,
    queued_messages,
    run_store,
    set_resent,
    worker_rig,
)
from tests.integration.test_precompute import _Sent

LEASE = 2
DB = 6
#: each job sleeps this long once it read its data, so two messages of one release
#: are run at once by the worker's two processes (one waits for the other's lease)
DELAY = 1.0
EPSILON = 0.5


@pytest.fixture(scope="module")
def rig(redis_url: str, service_env: dict[str, str], app: Flask,
        tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
        ) -> Iterator[dict[str, Any]]:
    """Its own database (and record: ``record_state.own_database``), an app on it, and a
    worker started on demand (its own sweeper never runs during the test: the test
    sweeps)."""
    with worker_rig(request, redis_url, service_env, app, tmp_path_factory.mktemp("resend"),
                    DB, LEASE, {"PRIVRELEASE_TEST_JOB_DELAY": str(DELAY)}) as made:
        yield {"api": Api(made.app.test_client()), "client": made.client,
               "start": made.start, "log": made.log, "ledger": run_store(made.app, LEASE),
               "queue": wiring.of(made.app).queue}


def _release(api: Api, ds: str, value: int) -> str:
    resp = api.post("/v1/releases", {
        "dataset_id": ds, "mechanism": "geometric", "budget": {"epsilon": EPSILON},
        "params": {"statistic": "count",
                   "condition": {"column": "age", "op": "ge", "value": value}}})
    assert resp.status_code == 202, resp.get_json()
    submit.flush_outbox()  # out of the outbox, as the API's flusher has it within 0.1 s
    return str(resp.get_json()["id"])


def _take(client: redis.Redis, release_id: str) -> tuple[str, str]:
    """A worker takes the release's waiting message: out of the queue, into kombu's
    unacked set (its delivery tag, and the message as kombu records it; its delivery
    time left out of kombu's index, so that it is never stranded, whatever min_age)."""
    (message,) = [m for m in client.lrange(RELEASES_QUEUE, 0, -1) if release_id in m]
    client.lrem(RELEASES_QUEUE, 0, message)
    tag = f"tag_{release_id}"
    client.hset(sweeper.UNACKED, tag, json.dumps([json.loads(message), "", RELEASES_QUEUE]))
    return tag, message


def _put_back(client: redis.Redis, taken: tuple[str, str]) -> None:
    """kombu puts a taken message back at the front of its queue (RPUSH: a worker's warm
    shutdown, or the visibility timeout)."""
    tag, message = taken
    client.hdel(sweeper.UNACKED, tag)
    client.zrem(sweeper.UNACKED_INDEX, tag)
    client.rpush(RELEASES_QUEUE, message)


def _to_front(client: redis.Redis, release_id: str) -> None:
    """The release's waiting messages at the front of the queue, next to be taken."""
    for message in [m for m in client.lrange(RELEASES_QUEUE, 0, -1) if release_id in m]:
        client.lrem(RELEASES_QUEUE, 0, message)
        client.rpush(RELEASES_QUEUE, message)


def _lose(client: redis.Redis, release_id: str) -> None:
    """The broker loses the release's waiting message(s)."""
    lost = [m for m in client.lrange(RELEASES_QUEUE, 0, -1) if release_id in m]
    assert lost, release_id
    for message in lost:
        client.lrem(RELEASES_QUEUE, 0, message)


def test_lost_jobs_are_resent_and_run_once_and_extra_messages_do_nothing(
        rig: dict[str, Any]) -> None:
    """Catches the sweeper refunding a job that could simply run (main refunded "job
    message lost" and "worker died" at once: accepted releases lost), a re-send without
    a bound, a re-send of a release whose messages wait, and a duplicate or late message
    running a job twice: every job here ran once per charge (attempts, one commit event
    each), the one re-sent past the bound was refunded, once.

    The losses are found once the queue is empty (no worker consumes it yet: nothing
    tells a lost message from a waiting one while messages wait and none is taken;
    test_sweeper_backlog.py finds one lost in a backlog that workers take)."""
    api, client, ledger = rig["api"], rig["client"], rig["ledger"]
    resp = api.upload(people_csv(50), PEOPLE_META)
    assert resp.status_code == 201
    ds = str(resp.get_json()["id"])
    lost, dead, twice, bounded = (_release(api, ds, v) for v in (30, 31, 32, 33))
    _lose(client, lost)  # queued, sent, its message gone
    _lose(client, dead)  # its worker started it, then died before reading the data
    run = ledger.mark_running(dead, "w")
    assert run is not None and run.attempt == 1
    lapse(ledger, dead)
    _lose(client, bounded)
    taken = _take(client, twice)  # a worker holds twice's message (kombu's unacked set)

    assert sweeper.sweep(client, ledger, rig["queue"], min_age=0, max_resends=1) == []
    for rid in (lost, dead, bounded):
        assert field(ledger, rid, "resends") == "1"
        assert queued_messages(client, rid) == 1
    assert field(ledger, twice, "resends") is None  # held by a worker
    _put_back(client, taken)  # the worker shut down: kombu puts it back at the front
    rig["queue"].run(twice)  # and a message of it delayed until now
    _to_front(client, twice)
    assert queued_messages(client, twice) == 2
    _lose(client, bounded)  # lost again: past the bound of 1 once found
    assert sweeper.sweep(client, ledger, rig["queue"], min_age=0, max_resends=1) == []
    for rid in (lost, dead, bounded):  # messages wait, none taken: none found lost
        assert field(ledger, rid, "resends") == "1"
        assert field(ledger, rid, "status") in {"queued", "running"}
    assert field(ledger, twice, "resends") is None

    rig["start"]()
    for rid in (lost, dead, twice):
        assert api.wait(rid, timeout=60)["status"] == "succeeded", rid
    # both of twice's messages consumed, at once: the second found the first's lease and
    # waited (a retry), then found the release ended
    until(lambda: queued_messages(client, twice) == 0)
    assert f"run_release[{twice}] retry" in rig["log"].read_text()
    until(lambda: client.llen(RELEASES_QUEUE) == 0)
    # the queue is empty: bounded's second loss is found; past the bound: refunded
    assert sweeper.sweep(client, ledger, rig["queue"], min_age=0, max_resends=1) == [
        bounded]
    doc = api.get(f"/v1/releases/{bounded}").get_json()
    assert doc["status"] == "failed"
    assert doc["error"]["message"] == ("job gone (job message lost) after 1 re-sends;"
                                       " reservation refunded")
    rig["queue"].run(lost)  # a late redelivery
    until(lambda: queued_messages(client, lost) == 0)
    time.sleep(0.5)  # the late message's run, had it started, would have counted by now
    attempts = {rid: field(ledger, rid, "attempts") for rid in (lost, dead, twice)}
    assert attempts == {lost: "1", dead: "2", twice: "1"}
    events = api.get(f"/v1/datasets/{ds}/ledger").get_json()
    commits = Counter(e["release_id"] for e in events if e["kind"] == "commit")
    aborts = Counter(e["release_id"] for e in events if e["kind"] == "abort")
    assert commits == {lost: 1, dead: 1, twice: 1} and aborts == {bounded: 1}
    row = api.get(f"/v1/datasets/{ds}/budget").get_json()["measures"]["epsilon"]
    assert row["committed"] == pytest.approx(3 * EPSILON, abs=1e-9)
    assert row["reserved"] == 0


def _reserved(ledger: Store, rid: str) -> str:
    ledger.open("ds_resend", {"epsilon": 10**9}, actor="t")
    assert ledger.reserve(Reservation("ds_resend", rid, {"epsilon": 10}, actor="t", fingerprint=rid,
                          request_json=json.dumps({"dataset_id": "ds_resend"})
                          )).outcome == "reserved"
    ledger.enqueued(rid)  # sent, and its message lost
    return rid


def test_a_resend_is_claimed_only_for_a_gone_unread_job_and_paced(rig: dict[str, Any]) -> None:
    """Catches a re-send of a job a run holds or that read its data (a second run of
    one that may have died because of its data), a claim lost when the broker is down
    (the job would be refunded early), and re-sends every pass (a message on its way
    to a worker would burn the bound: the sweeper waits ``min_age`` after a re-send)."""
    client, ledger = rig["client"], rig["ledger"]
    held = _reserved(ledger, "rel_" + "h" * 24)
    assert ledger.mark_running(held, "w") is not None  # a run holds the lease
    read = _reserved(ledger, "rel_" + "r" * 24)
    run = ledger.mark_running(read, "w")
    assert run is not None and ledger.mark_data_read(run)
    for rid in (held, read):
        assert sweeper._resend(ledger, rid, 3, Queue(_Sent()), "test") == 0
        assert field(ledger, rid, "resends") is None
    lapse(ledger, read)  # its worker died after reading: charged, not re-sent
    sent = _Sent()
    assert sweeper.sweep(client, ledger, Queue(sent), min_age=0) == [read]
    assert sent.calls == []
    assert ledger.abort("ds_resend", held, "{}", "test")

    gone = _reserved(ledger, "rel_" + "g" * 24)
    down = _Sent(fail=True)
    assert sweeper.sweep(client, ledger, Queue(down), min_age=0) == []
    assert [field(ledger, gone, f) for f in ("resends", "resent_at")] == ["0", None]
    # reserved long ago, re-sent lately: left to that message until min_age has passed
    backdate(ledger, gone, time.time() - 100)
    set_resent(ledger, gone, time.time() - 10)
    sent = _Sent()
    assert sweeper.sweep(client, ledger, Queue(sent), min_age=30) == []
    assert sent.calls == []
    set_resent(ledger, gone, time.time() - 40)
    assert sweeper.sweep(client, ledger, Queue(sent), min_age=30) == []
    assert sent.calls == [(queue.RUN_RELEASE, gone)]
    assert field(ledger, gone, "resends") == "1"
    assert field(ledger, gone, "status") == "queued"
    assert ledger.abort("ds_resend", gone, "{}", "test")
    assert ledger.balance("ds_resend")["epsilon"]["reserved"] == 0


def test_a_queued_job_whose_message_a_worker_took_long_ago_is_resent(
        rig: dict[str, Any]) -> None:
    """Catches a job stranded in kombu's unacked set for its 15-minute visibility timeout
    (a worker took its message, then died or lost its connection in a failover, before
    starting it): re-sent once the delivery is ``min_age`` old; one delivered lately, or
    whose delivery time kombu did not record, is left to the worker that took it."""
    client, ledger = rig["client"], rig["ledger"]
    now = time.time()
    stranded, fresh, unknown = (_reserved(ledger, "rel_" + c * 24) for c in "suk")
    for rid in (stranded, fresh, unknown):
        backdate(ledger, rid, now - 100)
    client.hset(sweeper.UNACKED, mapping={
        f"t_{rid}": json.dumps([{"headers": {"id": rid}}, "", RELEASES_QUEUE])
        for rid in (stranded, fresh, unknown)})
    client.zadd(sweeper.UNACKED_INDEX, {f"t_{stranded}": now - 31, f"t_{fresh}": now - 29})
    sent = _Sent()
    try:
        assert sweeper.sweep(client, ledger, Queue(sent), min_age=30) == []
    finally:
        client.delete(sweeper.UNACKED, sweeper.UNACKED_INDEX)
    assert sent.calls == [(queue.RUN_RELEASE, stranded)]
    for rid in (stranded, fresh, unknown):
        assert field(ledger, rid, "status") == "queued"
        assert ledger.abort("ds_resend", rid, "{}", "test")


def test_a_queued_release_whose_message_was_lost_is_resent_within_seconds(
        rig: dict[str, Any]) -> None:
    """Catches a lost message re-sent only after two leases (~65 s after standalone
    restarted its Valkey): a queued release in neither queue nor the unacked set is
    re-sent once it is ``lost_age`` old, paced by ``lost_age``, and never refunded on
    that pace; a young running job (its lease lapsed) is left to the ``min_age`` pace."""
    client, ledger = rig["client"], rig["ledger"]
    now = time.time()
    lost = _reserved(ledger, "rel_" + "l" * 24)
    dead = _reserved(ledger, "rel_" + "d" * 24)
    assert ledger.mark_running(dead, "w") is not None
    lapse(ledger, dead)  # its worker died: judged on the min_age pace
    backdate(ledger, lost, now - 2)
    backdate(ledger, dead, now - 6)
    sent = _Sent()
    assert sweeper.sweep(client, ledger, Queue(sent), min_age=60, lost_age=5) == []
    assert sent.calls == []  # 2 s old: the broker may be between its pop and its record
    backdate(ledger, lost, now - 6)
    assert sweeper.sweep(client, ledger, Queue(sent), min_age=60, lost_age=5) == []
    assert sent.calls == [(queue.RUN_RELEASE, lost)]  # and not the running one
    assert sweeper.sweep(client, ledger, Queue(sent), min_age=60, lost_age=5) == []
    assert len(sent.calls) == 1  # re-sent lately: left to that message for lost_age
    set_resent(ledger, lost, time.time() - 6, resends=3)  # the bound reached: still no refund
    assert sweeper.sweep(client, ledger, Queue(sent), min_age=60, lost_age=5) == []
    assert field(ledger, lost, "status") == "queued"
    assert ledger.balance("ds_resend")["epsilon"]["reserved"] >= 20
    for rid in (lost, dead):
        assert ledger.abort("ds_resend", rid, "{}", "test")
