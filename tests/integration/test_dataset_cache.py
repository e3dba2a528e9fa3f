"""The POST's cached registry reads (``service.releases.dataset_cache``): one read per
dataset while it does not change, and every change seen by the next POST, whether the
cached read would have admitted the request (the reservation finds it ``stale``) or
refused it (judged again on a fresh read)."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from flask import Flask

from service import wiring
from service.releases import dataset_cache
from service.storage.pg_ledger import PgLedger
from tests.integration.conftest import PEOPLE_META, Api, people_csv


def _mean(dataset_id: str, epsilon: float, **extra: Any) -> dict[str, Any]:
    return {"dataset_id": dataset_id, "mechanism": "laplace",
            "params": {"statistic": "mean", "column": "age"},
            "budget": {"epsilon": epsilon}, **extra}


def _auth(api: Api) -> dict[str, str]:
    return {"Authorization": f"Bearer {api.token}"}


@pytest.fixture()
def reads(app: Flask, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The datasets the store was asked to read for pricing, in order."""
    ledger = wiring.of(app).ledger
    if not isinstance(ledger, PgLedger):
        pytest.fail("the session's store is PostgreSQL")
    asked: list[str] = []
    real = ledger.dataset_for_pricing

    def counted(dataset_id: str) -> Any:
        asked.append(dataset_id)
        return real(dataset_id)

    monkeypatch.setattr(ledger, "dataset_for_pricing", counted)
    return asked


def test_posts_read_the_registry_once_and_see_every_change(app: Flask, api: Api,
                                                           reads: list[str]) -> None:
    resp = api.upload(people_csv(60), PEOPLE_META)
    assert resp.status_code == 201, resp.get_json()
    ds = resp.get_json()["id"]
    for i in range(3):
        first = api.post("/v1/releases", _mean(ds, 0.01 + i / 1000))
        assert first.status_code == 202, first.get_json()
    assert reads == [ds]  # the first POST's read served the others

    # a refusal on the cached read is judged again on a fresh one: version 2, just added
    added = api.client.post(f"/v1/datasets/{ds}/versions", headers=_auth(api),
                            content_type="multipart/form-data",
                            data={"file": (io.BytesIO(people_csv(40).encode()), "v.csv")})
    assert added.status_code == 201, added.get_json()
    reads.clear()
    ok = api.post("/v1/releases", _mean(ds, 0.02, version=2))
    assert ok.status_code == 202, ok.get_json()
    assert ok.get_json()["dataset_version"] == 2 and reads == [ds]

    # an admission on the cached read that the registry has moved past: version 2 retired
    # after the cache read it; the reservation is stale and the fresh read refuses
    retired = api.client.patch(f"/v1/datasets/{ds}/versions/2", headers=_auth(api),
                               json={"status": "retired"})
    assert retired.status_code == 200, retired.get_json()
    reads.clear()
    def remaining() -> float:  # earlier releases may commit meanwhile: that keeps it
        row = api.get(f"/v1/datasets/{ds}/budget").get_json()["measures"]["epsilon"]
        return float(row["remaining"])

    before = remaining()
    refused = api.post("/v1/releases", _mean(ds, 0.03, version=2))
    assert (refused.status_code, refused.get_json()["code"]) == (409, "version_retired")
    assert reads == [ds]
    assert remaining() == before  # nothing held

    # a request the registry refuses whatever its state costs no second read
    reads.clear()
    bad = api.post("/v1/releases", _mean(ds, 0.03, version=7))
    assert bad.status_code in {404, 422} and reads == [ds]
    bad = api.post("/v1/releases", _mean(ds, 0.03, version=7))
    assert bad.status_code in {404, 422} and reads == [ds, ds]  # cached, then fresh


def test_a_cached_read_of_a_retired_dataset_is_never_used(app: Flask, api: Api,
                                                          reads: list[str]) -> None:
    resp = api.upload(people_csv(60), PEOPLE_META)
    ds = resp.get_json()["id"]
    assert api.post("/v1/releases", _mean(ds, 0.01)).status_code == 202
    gone = api.client.delete(f"/v1/datasets/{ds}", headers=_auth(api))
    assert gone.status_code in {200, 204}, gone.get_data()
    refused = api.post("/v1/releases", _mean(ds, 0.02))
    assert refused.status_code == 409, refused.get_json()
    assert json.dumps(refused.get_json()).count("retired") >= 1


def test_the_cache_keeps_the_newest_reads_of_a_store(app: Flask, api: Api) -> None:
    ledger = wiring.of(app).ledger
    cache = dataset_cache.DatasetCache(kept=2)
    ids = [api.upload(people_csv(20), PEOPLE_META).get_json()["id"] for _ in range(3)]
    for one in ids:
        assert cache.read(ledger, one) is not None
    assert cache.get(ids[0]) is None and cache.get(ids[2]) is not None
    assert cache.read(ledger, "ds_does_not_exist") is None
    assert dataset_cache.cache_for(ledger) is dataset_cache.cache_for(ledger)
