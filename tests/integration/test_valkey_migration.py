"""``privrelease migrate-from-valkey`` (``service.storage.valkey_migration``): a populated
Valkey store, made by the real Lua scripts (releases in every status, allocations listed
and legacy, a notion lock, a retired version and dataset, archived and live audit events,
replays, the outbox, Idempotency-Keys, hold-outs), is moved into a fresh PostgreSQL
database and compared one by one through the ``Store`` interface: budgets, documents,
releases, lists, events. A second run moves nothing; the moved ledger keeps working."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from service.storage import database, rkeys, valkey_migration
from service.storage.event_archive import AuditArchive
from service.storage.ledger import Ledger, Reservation
from service.storage.pg_ledger import PgLedger
from service.storage.release_documents import DocumentStore
from service.storage.store import ReleaseView, Store
from tests.conftest import database_on

pytestmark = pytest.mark.valkey_store

#: fields of a Valkey release hash that are the store's own bookkeeping, not the release
INTERNAL = {"settled_by", "replay_key", "doc"}
EPS = 10**9  # ledger units of one epsilon


@pytest.fixture()
def stores(redis_url: str, postgres_url: str, tmp_path: Path
           ) -> Iterator[tuple[Ledger, PgLedger, redis.Redis]]:
    """A Valkey store of its own (DB 14) and an empty migrated PostgreSQL database."""
    client = rkeys.connect(redis_url.rsplit("/", 1)[0] + "/14")
    client.flushdb()
    docs = DocumentStore(tmp_path / "releases")
    source = Ledger(client, documents=docs, audit=AuditArchive(tmp_path / "audit"))
    url = database_on(postgres_url)
    database.upgrade(url)
    pool = database.connect(url)
    try:
        yield source, PgLedger(pool, documents=docs), client
    finally:
        pool.close()
        client.flushdb()


def _doc(ds: str, **extra: Any) -> str:
    return json.dumps({"id": ds, "status": "active", "created_by": "op", "version": 1,
                       "record_level": False, "notions": ["dp"], **extra})


def _res(ds: str, rid: str, units: int, actor: str = "op", **kw: Any) -> Reservation:
    request = json.dumps({"dataset_id": ds, "dataset_version": 1, "mechanism": "m",
                          "nonce": rid})
    return Reservation(ds, rid, {"epsilon": units} if units else {}, actor,
                       secrets.token_hex(8), request, **kw)


def _populate(source: Ledger, client: redis.Redis) -> dict[str, Any]:
    """Every kind of state the Valkey store keeps, made by its own scripts."""
    docs = source.documents
    assert docs is not None
    ds1, ds2, ds3 = "ds_mig_one", "ds_mig_two", "ds_mig_three"
    source.open(ds1, {"epsilon": 10 * EPS}, "op", _doc(ds1))
    source.open(ds2, {"epsilon": 5 * EPS, "delta": 10**9}, "op", _doc(ds2))
    source.open(ds3, {"epsilon": EPS}, "op", _doc(ds3))
    source.change_caps(ds2, [("key_a", {"epsilon": 2 * EPS})], "op")
    source.change_caps(ds2, [("key_b", {"epsilon": EPS})], "op")
    client.hset(rkeys.ledger(ds2), "alloc:key_b:scope", "legacy")  # policy.lua's mark
    ids: dict[str, str] = {}

    def reserve(name: str, ds: str, units: int, **kw: Any) -> str:
        rid = ids[name] = f"rel_{name}_{secrets.token_hex(4)}"
        assert source.reserve(_res(ds, rid, units, **kw)).outcome in {"reserved", "pricing"}
        return rid

    rid = reserve("ok", ds1, EPS, notion_lock="dp")
    run = source.mark_running(rid, "w1")
    assert run is not None and source.mark_data_read(run)
    docs.save_result(rid, run.attempt, json.dumps({"result": {"v": 1}, "accuracy": {},
                                                   "guarantee": "g"}))
    assert source.commit(ds1, run, "", None, result_stored=True) == "settled"
    rid = reserve("inline", ds1, EPS, idempotency_key=rkeys.idempotency("rel", "k1"))
    run = source.mark_running(rid, "w1")
    assert run is not None and source.mark_data_read(run)
    assert source.commit(ds1, run, json.dumps({"result": {"v": 2}, "accuracy": {},
                                               "guarantee": "g"}), 1) == "settled"
    rid = reserve("failed", ds1, EPS)
    run = source.mark_running(rid, "w2")
    assert run is not None and source.mark_data_read(run)
    assert source.fail(ds1, run, '{"code": "mechanism_failed"}') == "settled"
    rid = reserve("aborted", ds1, EPS)
    run = source.mark_running(rid, "w2")
    assert run is not None
    assert source.abort_run(ds1, run, '{"message": "x"}') == "settled"
    rid = reserve("cancelled", ds1, EPS)
    assert source.cancel(ds1, rid, "op") == "settled"
    source.audit.archive(client, ds1, hot_seconds=0)  # type: ignore[union-attr]
    reserve("queued", ds1, 2 * EPS)  # left in the outbox: its task never sent
    rid = reserve("running", ds1, EPS)
    run = source.mark_running(rid, "w3")
    assert run is not None and source.mark_data_read(run)
    client.delete(rkeys.lease(rid))  # its worker died: the lease lapsed
    reserve("pricing", ds1, 0, mode="pricing", replay=False)
    rid = reserve("refused", ds1, 0, mode="pricing", replay=False)
    assert source.refuse(ds1, rid, '{"code": "budget_exhausted"}', "budget_exhausted", "p")
    reserve("alloc", ds2, EPS, actor="key_a")
    reserve("legacy", ds2, EPS, actor="key_b")
    text = source.dataset_document(ds1)
    assert text is not None
    assert source.version_change(ds1, text, _doc(ds1, versions=[1, 2]), "retired", 2,
                                 "op")[0] == "ok"
    source.retire(ds3, "op")
    source.record_holdout(ds1, 7)
    for name in ("ok", "inline", "failed", "aborted", "cancelled", "alloc", "legacy"):
        source.enqueued(ids[name])  # their tasks were sent; "queued" and "pricing" not
    return {"datasets": [ds1, ds2, ds3], "releases": ids}


def _views(store: Store, datasets: list[str]) -> dict[str, list[str]]:
    """The ids of every list, all pages walked."""
    out = {}
    views = [ReleaseView("all"), ReleaseView("pending"), ReleaseView("failed"),
             ReleaseView("key", key_id="key_a"), ReleaseView("datasets", frozenset(datasets))]
    for view in views:
        ids: list[str] = []
        page, cursor = store.release_page(view, 3)
        ids += page
        while cursor is not None:
            page, cursor = store.release_page(view, 3, cursor)
            ids += page
        out[f"{view.kind}:{view.key_id}"] = ids
    return out


def test_a_populated_valkey_store_moves_whole_and_once(
        stores: tuple[Ledger, PgLedger, redis.Redis]) -> None:
    source, target, client = stores
    made = _populate(source, client)
    assert valkey_migration.pending(client)
    moved = valkey_migration.migrate(source, target)
    assert sorted(moved.datasets) == sorted(made["datasets"]) and moved.skipped == []
    assert moved.releases == len(made["releases"]) and moved.outbox == 2
    assert moved.idempotency_keys == 1 and not valkey_migration.pending(client)

    assert target.dataset_ids() == source.dataset_ids()
    for ds in made["datasets"]:
        assert target.dataset_document(ds) == source.dataset_document(ds)
        assert target.budget(ds) == source.budget(ds)
        assert target.named_measures(ds) == source.named_measures(ds)
        assert target.allocation_scopes(ds) == source.allocation_scopes(ds)
        assert target.notion_lock(ds) == source.notion_lock(ds)
        assert target.holdout_exposure(ds) == source.holdout_exposure(ds)
        strip = [{k: v for k, v in e.items() if k != "id"} for e in source.events(ds)]
        assert [{k: v for k, v in e.items() if k != "id"} for e in target.events(ds)] == strip
    assert source.notion_lock("ds_mig_one") == "dp"
    assert source.allocation_scopes("ds_mig_two") == {"key_a": "listed", "key_b": "legacy"}
    archived = AuditArchive(Path(source.audit.root))  # type: ignore[union-attr]
    assert archived.last_id("ds_mig_one") is not None  # some events came from the file

    for rid in made["releases"].values():
        before, after = source.release(rid), target.release(rid)
        assert before is not None and after is not None
        assert after == {k: v for k, v in before.items() if k not in INTERNAL}, rid
    assert _views(target, made["datasets"]) == _views(source, made["datasets"])
    key = rkeys.idempotency("rel", "k1")
    assert target.idempotency_record(key) == (source.idempotency_record(key)[0], None, None)
    assert target.unsent_ids() == source.unsent_ids() == {made["releases"]["queued"],
                                                          made["releases"]["pricing"]}
    assert [r for r, _ in target.stale(0)] == [r for r, _ in source.stale(0)]

    # a second run moves nothing and doubles nothing
    again = valkey_migration.migrate(source, target)
    assert again.datasets == [] and sorted(again.skipped) == sorted(made["datasets"])
    assert len(target.events("ds_mig_one")) == len(source.events("ds_mig_one"))

    # the moved ledger keeps working: the refused version, the lapsed run, the caps
    running = made["releases"]["running"]
    run = target.mark_running(running, "w9")
    assert run is not None and target.commit("ds_mig_one", run, "{}") == "settled"
    assert target.balance("ds_mig_one")["epsilon"] == source.balance("ds_mig_one")[
        "epsilon"] | {"committed": 4 * EPS, "reserved": 2 * EPS, "remaining": 4 * EPS}
    assert target.reserve(_res("ds_mig_one", "rel_over", 5 * EPS)).outcome == "exhausted"
    late = _res("ds_mig_one", "rel_v2", EPS)
    late = Reservation(**{**late.__dict__, "request_json": json.dumps(
        {"dataset_id": "ds_mig_one", "dataset_version": 2})})
    assert target.reserve(late).outcome == "version_retired"
    assert target.reserve(_res("ds_mig_three", "rel_gone", 1)).outcome == "retired"
    assert target.reserve(_res("ds_mig_two", "rel_a", 2 * EPS, actor="key_a")
                          ).outcome == "exhausted"  # key_a's allocation: 1 of 2 held


def test_the_command_refuses_while_a_worker_runs_then_moves(
        stores: tuple[Ledger, PgLedger, redis.Redis], redis_url: str, tmp_path: Path) -> None:
    """``privrelease migrate-from-valkey`` as an operator runs it: refused (exit 1,
    nothing moved) while a worker's heartbeat is live, then the whole record moved."""
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

    source, target, client = stores
    made = _populate(source, client)
    url = target.pool.conninfo
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIVRELEASE_")}
    env.update(PRIVRELEASE_REDIS_URL=redis_url.rsplit("/", 1)[0] + "/14",
               PRIVRELEASE_DATABASE_URL=url, PRIVRELEASE_DATA_DIR=str(tmp_path))
    command = [sys.executable, "-m", "service.processes.cli", "migrate-from-valkey"]
    client.set(rkeys.WORKERS + "w", client.info("server")["run_id"], ex=30)
    refused = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True,
                             timeout=120)
    assert refused.returncode == 1 and "stop the API and the workers" in refused.stderr
    assert target.dataset_ids() == []
    client.delete(rkeys.WORKERS + "w")
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "moved 3 dataset(s) with 11 release(s)" in done.stdout
    assert target.dataset_ids() == source.dataset_ids()
    for rid in made["releases"].values():
        before = source.release(rid)
        assert before is not None
        assert target.release(rid) == {k: v for k, v in before.items() if k not in INTERNAL}
