"""``privrelease migrate-from-valkey`` (``service.storage.valkey_migration``) on a frozen
old store: ``tests/data/valkey_store`` holds a populated Valkey store as ``DUMP`` payloads
with its data files, made by that store's own code before it was deleted (releases in
every status, allocations listed and legacy, a notion lock, a retired version and
dataset, archived and live audit events, replays, the outbox, Idempotency-Keys,
hold-outs, API keys with grants, expiry and callback secrets, a revoked one, the
console's secret and sessions, analyses in every status, and a dataset from before the
policy fields with an exact-increment interval charge), and what that store's readers
answered about it then (``expected.json``). It is ``RESTORE``d into a fresh Valkey,
moved into a fresh PostgreSQL database and compared one by one through the ``Store``,
``KeyStore`` and ``AnalysisStore`` interfaces: budgets, documents, releases, lists,
events, keys, sessions, analyses and their pages. A second run moves nothing; the moved
record keeps working. How the data was made: ``tests/data/valkey_store/README.md``."""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from service import analyses, apikeys, policy
from service.storage import database, rkeys, valkey_migration
from service.storage.ledger import Reservation
from service.storage.pg_analyses import PgAnalysisStore
from service.storage.pg_keys import PgKeyStore
from service.storage.pg_ledger import PgLedger
from service.storage.release_documents import DocumentStore
from service.storage.store import ReleaseView, Store
from service.storage.valkey_store import ValkeyRecord
from tests.conftest import ROOT, database_on, start_valkey

DATA = ROOT / "tests" / "data" / "valkey_store"
EXPECTED: dict[str, Any] = json.loads((DATA / "expected.json").read_text())
MADE: dict[str, Any] = EXPECTED["made"]
EPS = 10**9  # ledger units of one epsilon
INTERVAL, IUNIT = "interval_leakage:age", 10**12


def plain(value: Any) -> Any:
    """JSON's view of a reader's answer (as ``expected.json`` holds it): dataclasses as
    dicts, sets sorted, tuples as lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return plain(dataclasses.asdict(value))
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, set | frozenset):
        return sorted(plain(v) for v in value)
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


@dataclass
class Old:
    """The restored old store and an empty migrated PostgreSQL database."""

    source: ValkeyRecord
    target: PgLedger
    client: redis.Redis
    redis_url: str
    database_url: str
    data_dir: Path


@pytest.fixture()
def old(postgres_url: str, tmp_path: Path) -> Iterator[Old]:
    """The frozen store ``RESTORE``d into a fresh Valkey (each key with what was left of
    its time), its files copied into a data directory of its own."""
    server = start_valkey(tmp_path / "valkey")
    data_dir = tmp_path / "data"
    shutil.copytree(DATA / "files", data_dir)
    url = database_on(postgres_url)
    database.upgrade(url)
    pool = database.connect(url)
    try:
        raw = redis.Redis.from_url(server.connection_url + "/0")
        for item in json.loads((DATA / "keys.json").read_text()):
            raw.restore(item["key"], max(item["pttl"], 0), base64.b64decode(item["dump"]))
        raw.close()
        client = rkeys.connect(server.connection_url + "/0")
        docs = DocumentStore(data_dir / "releases")
        yield Old(ValkeyRecord(client, docs, data_dir / "audit"),
                  PgLedger(pool, documents=docs), client, server.connection_url + "/0", url,
                  data_dir)
    finally:
        pool.close()
        server.stop()


def _views(store: Store, datasets: list[str]) -> dict[str, list[str]]:
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


def _events(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Events without their ids (the store's own) and, for those the policy migration
    wrote (on Valkey when the data was made, on PostgreSQL now), without their times."""
    return [{k: v for k, v in e.items()
             if k != "id" and not (k == "at" and e.get("actor") == policy.ACTOR)}
            for e in events]


def _res(ds: str, rid: str, units: int, actor: str = "op") -> Reservation:
    request = json.dumps({"dataset_id": ds, "dataset_version": 1, "mechanism": "m",
                          "nonce": rid})
    return Reservation(ds, rid, {"epsilon": units} if units else {}, actor, rid, request)


def test_a_frozen_valkey_store_moves_whole_and_once(old: Old) -> None:
    target, releases = old.target, MADE["releases"]
    assert valkey_migration.pending(old.client)
    moved = valkey_migration.migrate(old.source, target)
    assert sorted(moved.datasets) == sorted(MADE["datasets"]) and moved.skipped == []
    assert moved.releases == len(releases) == 12 and moved.outbox == 2
    assert moved.idempotency_keys == 1 and not valkey_migration.pending(old.client)
    # the dataset from before the policy fields: written down on PostgreSQL after the move
    # (as the command does)
    written = policy.migrate(target, moved.datasets)
    assert written.datasets == ["ds_mig_legacy"]
    assert written.legacy_allocations == {"ds_mig_legacy": ["key_c"]}
    assert written.recharged == {"ds_mig_legacy": {INTERVAL: IUNIT // 10}}

    assert target.dataset_ids() == EXPECTED["dataset_ids"]
    for ds in MADE["datasets"]:
        want = EXPECTED["datasets"][ds]
        assert target.dataset_document(ds) == want["document"], ds
        assert plain(target.budget(ds)) == want["budget"], ds
        assert target.balance(ds) == want["balance"], ds
        assert plain(target.named_measures(ds)) == want["named_measures"], ds
        assert target.allocation_scopes(ds) == want["allocation_scopes"], ds
        assert target.notion_lock(ds) == want["notion_lock"], ds
        assert target.holdout_exposure(ds) == want["holdout_exposure"], ds
        assert _events(target.events(ds)) == _events(want["events"]), ds
    assert target.notion_lock("ds_mig_one") == "dp"
    assert target.allocation_scopes("ds_mig_two") == {"key_a": "listed", "key_b": "legacy"}
    assert target.allocation_scopes("ds_mig_legacy") == {"key_c": "legacy"}
    assert target.balance("ds_mig_legacy")[INTERVAL]["committed"] == 3 * IUNIT // 10
    archived = (old.data_dir / "audit" / "ds_mig_one.jsonl").read_text().splitlines()
    assert 0 < len(archived) < len(target.events("ds_mig_one"))  # from the file and stream

    for rid in releases.values():
        assert target.release(rid) == EXPECTED["releases"][rid], rid
    assert _views(target, MADE["datasets"]) == EXPECTED["views"]
    for key, fingerprint in EXPECTED["idempotency"].items():
        assert target.idempotency_record(key) == (fingerprint, None, None)
    assert plain(target.unsent_ids()) == EXPECTED["unsent_ids"] == sorted(
        [releases["queued"], releases["pricing"]])
    assert [r for r, _ in target.stale(0)] == EXPECTED["stale"]

    _compare_keys_and_analyses(target, moved)

    # a second run moves nothing and doubles nothing
    again = valkey_migration.migrate(old.source, target)
    assert again.datasets == [] and sorted(again.skipped) == sorted(MADE["datasets"])
    rewritten = policy.migrate(target, MADE["datasets"])  # once written, never again
    assert rewritten.datasets == [] and rewritten.recharged == {}
    assert len(target.events("ds_mig_one")) == len(EXPECTED["datasets"]["ds_mig_one"][
        "events"])
    assert (again.keys, again.sessions, again.console_secret, again.analyses) == (
        0, 0, False, 0) and again.orphan_analyses == 1
    assert len(PgKeyStore(target.pool).all_keys()) == len(MADE["keys"])

    # the moved ledger keeps working: the refused version, the lapsed run, the caps
    run = target.mark_running(releases["running"], "w9")
    assert run is not None and target.commit("ds_mig_one", run, "{}") == "settled"
    assert target.balance("ds_mig_one")["epsilon"] == EXPECTED["datasets"]["ds_mig_one"][
        "balance"]["epsilon"] | {"committed": 4 * EPS, "reserved": 2 * EPS,
                                 "remaining": 4 * EPS}
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


def _compare_keys_and_analyses(target: PgLedger, moved: valkey_migration.Moved) -> None:
    """Keys, the console's secret and sessions, analyses: as the old store answered."""
    keys = PgKeyStore(target.pool)
    assert (moved.keys, moved.sessions, moved.console_secret) == (len(MADE["keys"]), 1, True)
    assert keys.all_keys() == EXPECTED["all_keys"]  # every field, secrets included
    assert [k["id"] for k in keys.all_keys()] == [  # in the order they were made
        MADE["keys"][name]["id"] for name in ("operator", "analyst", "consumer")]
    for digest, record in EXPECTED["by_digest"].items():
        assert keys.key_by_digest(digest) == record
    for key_id, secret in EXPECTED["callback_secrets"].items():
        assert apikeys.callback_secret(keys, key_id) == secret
    for name, key in MADE["keys"].items():
        assert plain(apikeys.get(keys, key["id"])) == key, name
    assert MADE["keys"]["consumer"]["expires_at"] == "2031-05-06T07:08:09Z"
    assert plain(apikeys.lookup(keys, MADE["tokens"]["operator"])) == MADE["keys"]["operator"]
    assert apikeys.lookup(keys, MADE["tokens"]["revoked"]) is None  # revoked stays so
    assert keys.console_secret("another") == MADE["secret"]  # old cookies still verify
    sessions = MADE["sessions"]
    assert keys.session_key_id(sessions["live"]) == MADE["keys"]["analyst"]["id"]
    assert keys.session_key_id(sessions["dead"]) is None

    store, docs = PgAnalysisStore(target.pool), target.documents
    assert moved.analyses == len(MADE["analyses"]) and moved.orphan_analyses == 1
    assert store.fields(MADE["orphan"]) is None  # its release is not in PostgreSQL
    for name, analysis_id in MADE["analyses"].items():
        want = EXPECTED["analyses"][analysis_id]
        assert store.fields(analysis_id) == want["fields"], name  # field by field
        assert plain(analyses.document(store, analysis_id, docs)) == want["document"], name
    stored = analyses.document(store, MADE["analyses"]["stored"], docs)
    inline = analyses.document(store, MADE["analyses"]["inline"], docs)
    assert stored is not None and stored["result"] == {"atoms": [1, 2]}
    assert inline is not None and inline["result"] == {"mean": 4.25}
    for release_id, pages in EXPECTED["walks"].items():
        assert plain(_walk(store, release_id, docs)) == pages
        assert store.count(release_id) == EXPECTED["counts"][release_id]
    assert len(EXPECTED["walks"][MADE["releases"]["ok"]]) == 3  # 5 analyses, pages of 2
    # and they keep working: the queued one starts once, the running one ends once
    queued, running = MADE["analyses"]["queued"], MADE["analyses"]["running"]
    assert analyses.start(store, queued, 60) is not None
    assert analyses.start(store, queued, 60) is None  # redelivered: worker lost
    assert store.status(queued) == "failed"
    assert analyses.finish(store, running, result_json="{}", docs=docs,
                           release_id=MADE["releases"]["ok"])
    assert not analyses.finish(store, running, result_json="{}")
    assert analyses.cancel(store, running) is None


def test_the_command_refuses_while_a_worker_runs_then_moves(old: Old) -> None:
    """``privrelease migrate-from-valkey`` as an operator runs it: refused (exit 1,
    nothing moved) while a worker's heartbeat is live, then the whole record moved."""
    target, client = old.target, old.client
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIVRELEASE_")}
    env.update(PRIVRELEASE_REDIS_URL=old.redis_url, PRIVRELEASE_DATABASE_URL=old.database_url,
               PRIVRELEASE_DATA_DIR=str(old.data_dir))
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
    assert "moved 4 dataset(s) with 12 release(s)" in done.stdout
    assert "3 API key(s), 1 console session(s) and 6 analys(es)" in done.stdout
    assert "1 analys(es) of releases not in PostgreSQL left behind" in done.stdout
    assert "Recorded the legacy policy of 1 dataset(s)" in done.stdout
    assert target.dataset_ids() == EXPECTED["dataset_ids"]
    for rid in MADE["releases"].values():
        assert target.release(rid) == EXPECTED["releases"][rid], rid
