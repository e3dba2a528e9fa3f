"""``privrelease migrate-from-valkey`` (``service.storage.valkey_migration``): a populated
Valkey store, made by the real Lua scripts (releases in every status, allocations listed
and legacy, a notion lock, a retired version and dataset, archived and live audit events,
replays, the outbox, Idempotency-Keys, hold-outs) and the real key, console and analysis
code (API keys with grants, expiry and callback secrets, a revoked one, the console's
secret and sessions, analyses in every status), is moved into a fresh PostgreSQL
database and compared one by one through the ``Store``, ``KeyStore`` and
``AnalysisStore`` interfaces: budgets, documents, releases, lists, events, keys,
sessions, analyses and their pages. A second run moves nothing; the moved record keeps
working."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from service import analyses, apikeys
from service.console import session
from service.storage import database, rkeys, valkey_migration
from service.storage.event_archive import AuditArchive
from service.storage.ledger import Ledger, Reservation
from service.storage.pg_analyses import PgAnalysisStore
from service.storage.pg_keys import PgKeyStore
from service.storage.pg_ledger import PgLedger
from service.storage.release_documents import DocumentStore
from service.storage.store import ReleaseView, Store
from service.storage.valkey_analyses import ValkeyAnalysisStore
from service.storage.valkey_keys import ValkeyKeyStore
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
        # one release per millisecond at most: creation times are kept to the millisecond
        # (``now_iso``), and two releases of one millisecond are listed by id on
        # PostgreSQL but by the Valkey index's finer score; the order within a
        # millisecond is no part of the lists' contract (it made this test flaky)
        time.sleep(0.002)
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
    return {"datasets": [ds1, ds2, ds3], "releases": ids,
            **_keys_and_analyses(client, ids, docs)}


def _keys_and_analyses(client: redis.Redis, ids: dict[str, str], docs: DocumentStore
                       ) -> dict[str, Any]:
    """API keys, the console's secret and sessions, and analyses, made by the service's
    own code on the Valkey store (``ValkeyKeyStore``, ``ValkeyAnalysisStore``)."""
    keys = ValkeyKeyStore(client)
    made = {}
    for name, role, kw in (
            ("operator", "operator", {"label": "boot",
                                      "token": "pr_migrated_bootstrap_0123456789"}),
            ("analyst", "analyst", {"label": "grants",
                                    "datasets": ("ds_mig_one", "ds_mig_two")}),
            ("consumer", "consumer", {"label": "expires",
                                      "expires_at": "2031-05-06T07:08:09Z"})):
        made[name] = apikeys.create(keys, role, **kw)[0]
        time.sleep(0.002)  # created in this order (milliseconds apart)
    tokens = {"operator": "pr_migrated_bootstrap_0123456789"}
    revoked, tokens["revoked"] = apikeys.create(keys, "consumer", label="revoked")
    secret = keys.console_secret("a-console-secret-made-on-valkey")
    live, dead = (session.session_digest(secrets.token_urlsafe(32)) for _ in range(2))
    keys.add_session(live, made["analyst"].id, 3600)
    keys.add_session(dead, revoked.id, 3600)
    apikeys.revoke(keys, revoked.id)  # its session is left to run out: it is not moved
    store = ValkeyAnalysisStore(client)
    done = ids["ok"]
    ana: dict[str, str] = {}
    ana["queued"] = analyses.create(store, done, "npmle", {"method": "pava"}, [], "key_x",
                                    work=123.5)
    ana["running"] = analyses.create(store, done, "moments", {}, [ids["inline"]], "key_x")
    assert analyses.start(store, ana["running"], 600) is not None
    ana["inline"] = analyses.create(store, done, "moments", {"k": 2}, [], "key_y")
    assert analyses.start(store, ana["inline"], 600) is not None
    assert analyses.finish(store, ana["inline"], result_json='{"mean": 4.25}')  # legacy
    ana["stored"] = analyses.create(store, done, "npmle", {"method": "em"}, [], "key_x")
    assert analyses.start(store, ana["stored"], 600) is not None
    assert analyses.finish(store, ana["stored"], result_json='{"atoms": [1, 2]}', docs=docs,
                           release_id=done)  # its result a file of the document store
    ana["failed"] = analyses.create(store, done, "npmle", {}, [], "key_y")
    assert analyses.start(store, ana["failed"], 600) is not None
    assert analyses.finish(store, ana["failed"], error={"code": "analysis_failed",
                                                         "message": "x"})
    ana["cancelled"] = analyses.create(store, ids["inline"], "npmle", {}, [], "key_x")
    assert analyses.cancel(store, ana["cancelled"]) == "queued"
    orphan = analyses.create(store, "rel_never_moved", "npmle", {}, [], "key_x")
    return {"keys": made, "tokens": tokens, "revoked": revoked, "secret": secret,
            "sessions": {"live": live, "dead": dead}, "analyses": ana, "orphan": orphan}


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

    _compare_keys_and_analyses(source, target, client, made, moved)

    # a second run moves nothing and doubles nothing
    again = valkey_migration.migrate(source, target)
    assert again.datasets == [] and sorted(again.skipped) == sorted(made["datasets"])
    assert len(target.events("ds_mig_one")) == len(source.events("ds_mig_one"))
    assert (again.keys, again.sessions, again.console_secret, again.analyses) == (
        0, 0, False, 0) and again.orphan_analyses == 1
    assert len(PgKeyStore(target.pool).all_keys()) == len(made["keys"])

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


def _walk(store: Any, release_id: str, docs: DocumentStore | None
          ) -> list[tuple[list[str], str | None]]:
    """Every page of 2 of the release's analyses: (ids, next cursor)."""
    pages, cursor = [], None
    while True:
        items, cursor = analyses.page(store, release_id, 2, cursor, docs)
        pages.append(([a["id"] for a in items], cursor))
        if cursor is None:
            return pages


def _compare_keys_and_analyses(source: Ledger, target: PgLedger, client: redis.Redis,
                               made: dict[str, Any], moved: valkey_migration.Moved) -> None:
    """Keys, the console's secret and sessions, analyses: the same through both stores."""
    old_keys, new_keys = ValkeyKeyStore(client), PgKeyStore(target.pool)
    assert (moved.keys, moved.sessions, moved.console_secret) == (len(made["keys"]), 1, True)
    assert new_keys.all_keys() == old_keys.all_keys()  # every field, secrets included
    assert [k["id"] for k in new_keys.all_keys()] == [k.id for k in made["keys"].values()]
    for key in made["keys"].values():  # by token digest, by id, the secret that signs
        token_digest = old_keys.digests()[key.id]
        assert new_keys.key_by_digest(token_digest) == old_keys.key_by_digest(token_digest)
        assert apikeys.get(new_keys, key.id) == key
        assert apikeys.callback_secret(new_keys, key.id) == apikeys.callback_secret(
            old_keys, key.id)
    assert made["keys"]["consumer"].expires_at == "2031-05-06T07:08:09Z"
    assert apikeys.lookup(new_keys, made["tokens"]["operator"]) == made["keys"]["operator"]
    assert apikeys.lookup(new_keys, made["tokens"]["revoked"]) is None  # revoked stays so
    assert new_keys.console_secret("another") == made["secret"]  # old cookies still verify
    assert new_keys.session_key_id(made["sessions"]["live"]) == made["keys"]["analyst"].id
    assert new_keys.session_key_id(made["sessions"]["dead"]) is None

    old, new = ValkeyAnalysisStore(client), PgAnalysisStore(target.pool)
    docs = source.documents
    assert moved.analyses == len(made["analyses"]) and moved.orphan_analyses == 1
    assert new.fields(made["orphan"]) is None  # its release is not in PostgreSQL
    for name, analysis_id in made["analyses"].items():
        assert new.fields(analysis_id) == old.fields(analysis_id), name  # field by field
        assert analyses.document(new, analysis_id, docs) == analyses.document(
            old, analysis_id, docs), name
    assert analyses.document(new, made["analyses"]["stored"], docs)["result"] == {
        "atoms": [1, 2]}
    assert analyses.document(new, made["analyses"]["inline"], docs)["result"] == {
        "mean": 4.25}
    for release_id in {made["releases"]["ok"], made["releases"]["inline"]}:
        assert _walk(new, release_id, docs) == _walk(old, release_id, docs)
        assert new.count(release_id) == old.count(release_id)
    assert len(_walk(new, made["releases"]["ok"], docs)) == 3  # 5 analyses, pages of 2
    # and they keep working: the queued one starts once, the running one ends once
    queued, running = made["analyses"]["queued"], made["analyses"]["running"]
    assert analyses.start(new, queued, 60) is not None
    assert analyses.start(new, queued, 60) is None  # redelivered: worker lost
    assert new.status(queued) == "failed"
    assert analyses.finish(new, running, result_json="{}", docs=docs,
                           release_id=made["releases"]["ok"])
    assert not analyses.finish(new, running, result_json="{}")
    assert analyses.cancel(new, running) is None


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
    assert "3 API key(s), 1 console session(s) and 6 analys(es)" in done.stdout
    assert "1 analys(es) of releases not in PostgreSQL left behind" in done.stdout
    assert target.dataset_ids() == source.dataset_ids()
    for rid in made["releases"].values():
        before = source.release(rid)
        assert before is not None
        assert target.release(rid) == {k: v for k, v in before.items() if k not in INTERNAL}
