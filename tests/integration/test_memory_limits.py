"""A release that would exceed its worker's memory is refused before any data is read
(issue #30 item 6): at POST and estimate (422 ``memory_limit`` naming the input and the
limit), and by the worker, which refunds it, never run, killed and charged.

A Valkey, a worker and an app of their own (``test_work_limits.Stack``) with
PRIVRELEASE_WORKER_MEMORY at 8 MiB: DIP's bound (16 MiB fixed) is above it whatever the
rows, a Laplace mean's (one row group of 300 rows, 1 MiB fixed) below it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from mechanisms import registry
from service import datasets, wiring
from service.errors import ServiceError
from service.releases import pricing, submit
from service.storage.ledger import Reservation
from tests.integration.conftest import PEOPLE_META, people_csv
from tests.integration.record_state import field, own_database
from tests.integration.test_work_limits import Stack

LIMIT = 8 * 2**20


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory,
          request: pytest.FixtureRequest) -> Iterator[Stack]:
    s = Stack(tmp_path_factory.mktemp("memory"), own_database(request),
              WORKER_MEMORY="8MiB")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def people(stack: Stack) -> str:
    resp = stack.api.upload(people_csv(300), PEOPLE_META)
    assert resp.status_code == 201, resp.get_json()
    return str(resp.get_json()["id"])


DIP = {"mechanism": "dip", "params": {"columns": ["age", "income"]},
       "budget": {"epsilon": 0.5}}


def _bound(stack: Stack, ds: str) -> float:
    doc = datasets.get(wiring.of(stack.app).ledger, ds)
    assert doc is not None
    mech = registry.get("dip")
    return mech.memory(mech.load_params(DIP["params"]), datasets.meta(doc)).bytes


def test_post_and_estimate_refuse_a_release_above_the_worker_memory(
        stack: Stack, people: str) -> None:
    """Catches: main queued any release whatever its memory; a worker past its memory was
    OOM-killed, the job re-run three times and then charged as failed."""
    for path in ("/v1/releases", "/v1/releases/estimate"):
        resp = stack.api.post(path, {"dataset_id": people, **DIP})
        assert resp.status_code == 422, resp.get_json()
        body = resp.get_json()
        assert body["code"] == "memory_limit" and body["field"] == "dataset_id"
        assert body["limit"] == LIMIT and body["memory"] == _bound(stack, people) > LIMIT
        assert "8 MiB" in body["detail"]
    measures = stack.api.get(f"/v1/datasets/{people}/budget").get_json()["measures"]
    assert measures["epsilon"]["reserved"] == 0 and measures["epsilon"]["committed"] == 0
    count = stack.api.post("/v1/releases", {
        "dataset_id": people, "mechanism": "laplace", "budget": {"epsilon": 0.1},
        "params": {"statistic": "mean", "column": "age"}})
    assert count.status_code == 202, count.get_json()
    assert stack.api.wait(count.get_json()["id"])["status"] == "succeeded"


def test_the_worker_refunds_a_release_above_its_memory_before_reading(
        stack: Stack) -> None:
    """An API whose limit is larger (here: none) queued it; the worker, whose memory is
    8 MiB, refuses it before the data is read: refunded, with the reason, not charged."""
    upload = stack.api.upload(people_csv(300), PEOPLE_META)
    assert upload.status_code == 201, upload.get_json()
    people = str(upload.get_json()["id"])
    ledger = wiring.of(stack.app).ledger
    prepared = pricing.prepare(ledger, {"dataset_id": people, **DIP}, allow_seeds=True)
    rid = submit.new_id()
    res = ledger.reserve(Reservation(people, rid, prepared.cost_units, actor="key_test",
                                     fingerprint=prepared.fingerprint,
                                     request_json=prepared.job().to_json()))
    assert res.outcome == "reserved"
    wiring.of(stack.app).queue.run(rid)
    doc: dict[str, Any] = stack.api.wait(rid)
    assert doc["status"] == "failed", doc
    assert "worker memory of 8 MiB" in doc["error"]["message"]
    assert field(ledger, rid, "data_read") is None
    row = stack.api.get(f"/v1/datasets/{people}/budget").get_json()["measures"]["epsilon"]
    assert row["committed"] == 0 and row["reserved"] == 0
    kinds = [e["kind"] for e in stack.api.get(f"/v1/datasets/{people}/ledger").get_json()]
    assert kinds == ["cap", "reserve", "abort"]


def test_a_row_map_on_spark_is_bounded_by_what_the_worker_holds(stack: Stack,
                                                                  people: str) -> None:
    """With Spark configured a record-level row map keeps its table on the engine: the
    worker holds at most the rows it shows inline (``memory.held``), so a limit between
    that and the embedded bound refuses the release embedded and admits it distributed.
    (A 10^8-row DIP was refused at POST although Spark would have held its table.)"""
    from mechanisms import memory
    from service.storage.release_tables import INLINE_ROWS

    ledger = wiring.of(stack.app).ledger
    doc = datasets.get(ledger, people)
    assert doc is not None
    mech, meta = registry.get("dip"), datasets.meta(doc)
    params = mech.load_params(DIP["params"])
    embedded = memory.held(mech, params, meta, distributed=False, held_rows=INLINE_ROWS)
    spread = memory.held(mech, params, meta, distributed=True, held_rows=INLINE_ROWS)
    assert embedded.bytes == _bound(stack, people) > spread.bytes
    limit = (embedded.bytes + spread.bytes) / 2
    body = {"dataset_id": people, **DIP}
    with pytest.raises(ServiceError) as refused:
        pricing.prepare(ledger, body, allow_seeds=True, max_memory=limit)
    assert refused.value.code == "memory_limit"
    assert pricing.prepare(ledger, body, allow_seeds=True, max_memory=limit,
                           distributed=True).cost_units
    laplace = registry.get("laplace")  # a streaming release: the same bound either way
    mean = laplace.load_params({"statistic": "mean", "column": "age"})
    assert (memory.held(laplace, mean, meta, distributed=True, held_rows=1)
            == laplace.memory(mean, meta))


#: record-level releases that are no row map (docs/reference/mechanisms.md, "Record-level
#: releases on Spark"): they read whole columns in the worker even with Spark configured
UNMAPPED = [
    # (DIP's hold-out needs a dataset registered with allow_holdout: test_record_maps)
    {"mechanism": "opm.l2ball", "params": {"column": "income"}, "budget": {"epsilon": 0.5}},
    {"mechanism": "subset.dummy", "params": {"column": "group", "alpha": 0.1},
     "budget": {"subset_draws:group": 1}},
]


@pytest.mark.parametrize("release", UNMAPPED, ids=lambda r: str(r["mechanism"]))
def test_a_release_that_is_no_row_map_is_bounded_embedded_on_spark_too(
        stack: Stack, people: str, release: dict[str, Any]) -> None:
    """With Spark configured, a record-level release that is no row map (DIP's hold-out,
    opm.l2ball's one joint draw, subset's dummy records) still runs in the
    worker: its bound is the embedded one, so a limit just below it refuses it at
    ``prepare`` (nothing reserved, no data read) and one at it admits it. Catches: such
    a release priced by the row maps' small distributed bound, then run whole in a worker
    that cannot hold it."""
    from mechanisms import memory
    from service.storage.release_tables import INLINE_ROWS

    ledger = wiring.of(stack.app).ledger
    doc = datasets.get(ledger, people)
    assert doc is not None
    mech, meta = registry.get(release["mechanism"]), datasets.meta(doc)
    params = mech.load_params(release["params"])
    assert not getattr(mech, "mappable", lambda *_: False)(params, meta)
    whole = mech.memory(params, meta)
    assert memory.held(mech, params, meta, distributed=True,
                       held_rows=INLINE_ROWS) == whole
    body = {"dataset_id": people, **release}
    before = stack.api.get(f"/v1/datasets/{people}/ledger").get_json()
    with pytest.raises(ServiceError) as refused:
        pricing.prepare(ledger, body, allow_seeds=True, max_memory=whole.bytes - 1,
                        distributed=True)
    assert refused.value.code == "memory_limit"
    assert pricing.prepare(ledger, body, allow_seeds=True, max_memory=whole.bytes,
                           distributed=True).cost_units
    assert stack.api.get(f"/v1/datasets/{people}/ledger").get_json() == before
