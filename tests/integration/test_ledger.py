"""The ledger against a real Valkey: atomic holds, exact totals, no overspend."""

from __future__ import annotations

import json
import secrets
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.storage import rkeys
from service.storage.ledger import NO_LEASE, Ledger, Reservation
from tests.integration.conftest import LEDGER_OUTPUT, LEDGER_REQUEST

#: the Valkey store's ``Ledger`` itself (its scripts, keys, AOF); PgLedger's same
#: accounting: tests/integration/test_pg_ledger.py
pytestmark = pytest.mark.valkey_store


def _ds() -> str:
    return "ds_" + secrets.token_hex(6)


def _reserve(ledger: Ledger, ds: str, units: int, **kw: object) -> tuple[str, object]:
    rid = "rel_" + secrets.token_hex(8)
    res = ledger.reserve(Reservation(ds, rid, {"epsilon": units}, actor="test",
                         fingerprint=secrets.token_hex(8), request_json=LEDGER_REQUEST, **kw))  # type: ignore[arg-type]
    return rid, res


def _commit(ledger: Ledger, ds: str, rid: str) -> bool:
    """Run the job as a worker does: take its lease, then commit as the lease holder."""
    run = ledger.mark_running(rid, "w")
    assert run is not None
    return ledger.commit(ds, run, LEDGER_OUTPUT) == "settled"


def test_reserve_commit_abort_balance(r: redis.Redis) -> None:
    ledger, ds = Ledger(r), _ds()
    ledger.open(ds, {"epsilon": 1000}, "op")
    rid1, res1 = _reserve(ledger, ds, 300)
    rid2, res2 = _reserve(ledger, ds, 500)
    assert res1.outcome == res2.outcome == "reserved"  # type: ignore[attr-defined]
    assert ledger.balance(ds)["epsilon"] == {"cap": 1000, "committed": 0, "reserved": 800,
                                             "remaining": 200}
    _, res3 = _reserve(ledger, ds, 201)
    assert (res3.outcome, res3.requested, res3.remaining) == ("exhausted", 201, 200)  # type: ignore[attr-defined]
    run1 = ledger.mark_running(rid1, "w")
    assert run1 is not None and run1.attempt == 1
    assert ledger.commit(ds, run1, LEDGER_OUTPUT) == "settled"
    assert ledger.commit(ds, run1, LEDGER_OUTPUT) == "ended", "a second commit charges nothing"
    assert ledger.abort(ds, rid2, '{"message": "x"}', "w")
    assert not ledger.abort(ds, rid1, '{"message": "x"}', "w"), "a committed release stays"
    assert ledger.balance(ds)["epsilon"] == {"cap": 1000, "committed": 300, "reserved": 0,
                                             "remaining": 700}
    kinds = [e["kind"] for e in ledger.events(ds)]
    assert kinds == ["cap", "reserve", "reserve", "commit", "abort"]


def test_a_zero_unit_hold_commits_and_aborts(r: redis.Redis) -> None:
    """An exact interval increment can be 0 units (the joint leakage already paid): its
    settle must not fail. Catches settle.lua's HINCRBY of '-0' (no integer to Valkey),
    which failed every commit of such a release and left it running until the sweeper."""
    ledger, ds = Ledger(r), _ds()
    ledger.open(ds, {"epsilon": 1000}, "op")
    rid, res = _reserve(ledger, ds, 0)
    assert res.outcome == "reserved"  # type: ignore[attr-defined]
    assert _commit(ledger, ds, rid)
    rid2, _ = _reserve(ledger, ds, 0)
    assert ledger.abort(ds, rid2, '{"message": "x"}', "w")
    assert ledger.balance(ds)["epsilon"] == {"cap": 1000, "committed": 0, "reserved": 0,
                                             "remaining": 1000}


def test_only_the_runs_lease_holder_settles(r: redis.Redis) -> None:
    """Catches issue #14 finding 6 at the ledger: main's settle script took a commit (or
    an abort) from any worker, so a run that stalled past its lease while another run
    took the job over could still commit its own output, or refund the job."""
    ledger, ds = Ledger(r, lease_seconds=30), _ds()
    ledger.open(ds, {"epsilon": 1000}, "op")
    rid, _ = _reserve(ledger, ds, 300)
    stalled = ledger.mark_running(rid, "host")
    assert stalled is not None and stalled.attempt == 1
    assert ledger.mark_running(rid, "host") is None  # its lease is live
    r.delete(rkeys.lease(rid))  # lapsed: the run stalled
    taken = ledger.mark_running(rid, "host")  # the same host name: a different run
    assert taken is not None and taken.attempt == 2 and taken.token != stalled.token
    assert not ledger.renew_lease(stalled) and not ledger.mark_data_read(stalled)
    assert ledger.commit(ds, stalled, LEDGER_OUTPUT, table_version=1) == "lost"
    assert ledger.fail(ds, stalled, "{}") == "lost"
    assert ledger.abort_run(ds, stalled, "{}") == "lost"
    assert not ledger.abort(ds, rid, "{}", "sweeper", holder=NO_LEASE)  # a run holds it
    assert not ledger.charge_gone(ds, rid, "{}", "sweeper")
    assert ledger.balance(ds)["epsilon"]["reserved"] == 300
    assert r.hget(rkeys.release(rid), "data_read") is None
    assert ledger.renew_lease(taken) and ledger.mark_data_read(taken)
    assert r.hget(rkeys.release(rid), "data_read") == "1"
    assert ledger.commit(ds, taken, LEDGER_OUTPUT, table_version=2) == "settled"
    assert ledger.commit(ds, stalled, LEDGER_OUTPUT, table_version=1) == "ended"
    assert r.hget(rkeys.release(rid), "table") == "2"
    assert ledger.balance(ds)["epsilon"] == {"cap": 1000, "committed": 300, "reserved": 0,
                                             "remaining": 700}
    commits = [e for e in ledger.events(ds) if e["kind"] == "commit"]
    assert len(commits) == 1 and commits[0]["outcome"] == "succeeded"


def test_failure_after_reading_is_charged_and_keeps_its_replay(r: redis.Redis) -> None:
    """'fail' charges like a commit (one commit event, outcome failed) and, unlike a refund,
    leaves the request's replay in place: asking again answers with the failed release."""
    ledger, ds = Ledger(r), _ds()
    ledger.open(ds, {"epsilon": 1000}, "op")
    fp = "fp_" + ds
    rid = "rel_f" + ds
    assert ledger.reserve(Reservation(ds, rid, {"epsilon": 100}, actor="t", fingerprint=fp,
                          request_json=LEDGER_REQUEST)).outcome == "reserved"
    run = ledger.mark_running(rid, "w")
    assert run is not None and ledger.mark_data_read(run)
    assert ledger.fail(ds, run, '{"code": "mechanism_failed"}') == "settled"
    assert r.hget(rkeys.release(rid), "status") == "failed"
    assert ledger.balance(ds)["epsilon"]["committed"] == 100
    again = ledger.reserve(Reservation(
        ds, "rel_g" + ds, {"epsilon": 100}, actor="t", fingerprint=fp,
                           request_json=LEDGER_REQUEST))
    assert (again.outcome, again.release_id) == ("replay", rid)
    events = ledger.events(ds)
    assert [(e["kind"], e.get("outcome")) for e in events] == [
        ("cap", None), ("reserve", None), ("commit", "failed")]


def test_open_registers_a_dataset_once(r: redis.Redis) -> None:
    """A re-sent open (a lost reply) changes nothing: one document, one cap event."""
    ledger, ds = Ledger(r), _ds()
    doc = json.dumps({"id": ds})
    try:
        assert ledger.open(ds, {"epsilon": 10}, "op", doc) == ("opened", ds)
        assert ledger.open(ds, {"epsilon": 99}, "op", json.dumps({"id": "other"})) == (
            "exists", ds)
        assert r.get(rkeys.dataset(ds)) == doc
        assert r.zscore(rkeys.DATASETS, ds) is not None
        assert [e["kind"] for e in ledger.events(ds)] == ["cap"]
        assert ledger.balance(ds)["epsilon"]["cap"] == 10
    finally:
        r.delete(rkeys.dataset(ds))
        r.zrem(rkeys.DATASETS, ds)


def test_replay_and_idempotency(r: redis.Redis) -> None:
    ledger, ds = Ledger(r), _ds()
    ledger.open(ds, {"epsilon": 1000}, "op")
    fp = secrets.token_hex(8)
    first = ledger.reserve(Reservation(
        ds, "rel_a" + ds, {"epsilon": 100}, actor="t", fingerprint=fp,
                           request_json=LEDGER_REQUEST, idempotency_key="pr:idem:t:" + ds))
    again = ledger.reserve(Reservation(
        ds, "rel_b" + ds, {"epsilon": 100}, actor="t", fingerprint=fp,
                           request_json=LEDGER_REQUEST))
    retry = ledger.reserve(Reservation(
        ds, "rel_c" + ds, {"epsilon": 100}, actor="t", fingerprint=fp,
                           request_json=LEDGER_REQUEST, idempotency_key="pr:idem:t:" + ds))
    other = ledger.reserve(Reservation(ds, "rel_d" + ds, {"epsilon": 100}, actor="t",
                           fingerprint=fp + "x", request_json=LEDGER_REQUEST,
                           idempotency_key="pr:idem:t:" + ds))
    assert first.outcome == "reserved"
    assert (again.outcome, again.release_id) == ("replay", first.release_id)
    assert (retry.outcome, retry.release_id) == ("idempotent", first.release_id)
    assert other.outcome == "idem_mismatch"
    assert ledger.balance(ds)["epsilon"]["reserved"] == 100
    # an aborted release is no longer a replay target: the retry runs afresh
    ledger.abort(ds, first.release_id, "{}", "w")
    fresh = ledger.reserve(Reservation(
        ds, "rel_e" + ds, {"epsilon": 100}, actor="t", fingerprint=fp,
                           request_json=LEDGER_REQUEST))
    assert fresh.outcome == "reserved"


def test_concurrent_reservations_never_overspend(r: redis.Redis, redis_url: str) -> None:
    """200 racing reservations against a cap for exactly 50: 50 win, totals exact."""
    ds = _ds()
    Ledger(r).open(ds, {"epsilon": 50 * 7, "delta": 10**9}, "op")
    violations: list[int] = []
    stop = threading.Event()

    def watch() -> None:
        watcher = Ledger(rkeys.connect(redis_url))
        while not stop.is_set():
            row = watcher.balance(ds)["epsilon"]
            if row["committed"] + row["reserved"] > row["cap"]:
                violations.append(row["committed"] + row["reserved"])

    def one(i: int) -> str:
        ledger = Ledger(rkeys.connect(redis_url))
        rid = f"rel_{ds}_{i}"
        res = ledger.reserve(Reservation(ds, rid, {"epsilon": 7, "delta": 1}, actor="t",
                             fingerprint=f"{ds}-{i}", request_json=LEDGER_REQUEST))
        if res.outcome == "reserved" and i % 2:
            _commit(ledger, ds, rid)
        return res.outcome

    watcher = threading.Thread(target=watch)
    watcher.start()
    with ThreadPoolExecutor(32) as pool:
        outcomes = list(pool.map(one, range(200)))
    stop.set()
    watcher.join()
    assert outcomes.count("reserved") == 50
    assert outcomes.count("exhausted") == 150
    assert not violations
    row = Ledger(r).balance(ds)["epsilon"]
    assert row["committed"] + row["reserved"] == 50 * 7
    assert Ledger(r).balance(ds)["delta"]["committed"] + \
        Ledger(r).balance(ds)["delta"]["reserved"] == 50


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    cap=st.integers(0, 10**12),
    ops=st.lists(st.tuples(st.sampled_from(["reserve", "commit", "abort"]),
                           st.integers(1, 10**11)), max_size=30),
)
def test_ledger_invariants(r: redis.Redis, cap: int, ops: list[tuple[str, int]]) -> None:
    """Whatever the sequence, held <= cap and committed equals the sum of commits."""
    ledger, ds = Ledger(r), _ds()
    ledger.open(ds, {"epsilon": cap}, "op")
    open_ids: list[tuple[str, int]] = []
    committed = 0
    for op, amount in ops:
        if op == "reserve":
            rid, res = _reserve(ledger, ds, amount)
            if res.outcome == "reserved":  # type: ignore[attr-defined]
                open_ids.append((rid, amount))
        elif open_ids:
            rid, units = open_ids.pop(0)
            if op == "commit":
                assert _commit(ledger, ds, rid)
                committed += units
            else:
                assert ledger.abort(ds, rid, "{}", "w")
        row = ledger.balance(ds)["epsilon"]
        assert row["committed"] + row["reserved"] <= cap
        assert row["committed"] == committed
        assert row["reserved"] == sum(u for _, u in open_ids)
    events = ledger.events(ds)
    assert sum(e["units"].get("epsilon", 0) for e in events if e["kind"] == "commit") \
        == committed


def test_valkey_kill_loses_no_committed_spend(tmp_path: object) -> None:
    """SIGKILL Valkey right after commits; AOF (fsync always) brings every one back."""
    from pathlib import Path

    from service.processes.valkey import EmbeddedValkey

    server = EmbeddedValkey(Path(str(tmp_path)) / "valkey")
    server.start()
    ledger, ds = Ledger(rkeys.connect(server.url)), _ds()
    ledger.open(ds, {"epsilon": 10**9}, "op")
    for i in range(20):
        rid, _ = _reserve(ledger, ds, 1000 + i)
        if i % 4:
            _commit(ledger, ds, rid)
    before = ledger.balance(ds)
    assert server.proc is not None
    server.proc.kill()  # SIGKILL: no shutdown save, only the AOF
    server.proc.wait()
    again = EmbeddedValkey(server.data_dir, port=server.port)
    again.start()
    try:
        after = Ledger(rkeys.connect(again.url)).balance(ds)
        assert after == before
        assert after["epsilon"]["committed"] == sum(1000 + i for i in range(20) if i % 4)
    finally:
        again.stop()
