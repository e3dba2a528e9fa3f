"""Compact dataset documents in GET /v1/datasets and /v1/datasets/{id}: real Valkey.

Each ``versions`` entry there leaves out its ``columns`` (they stay at GET .../versions
and, for the current version, at the document's top level), so a dataset's entry grows
with its versions only by a few fields, not by versions x columns; ``expand=versions``
gives the entries with their columns, as GET .../versions shows them.
"""

from __future__ import annotations

import io
import json
from typing import Any

from tests.integration.conftest import Api

#: wide enough that one version's columns outweigh the bound on an entry's growth
WIDE_META: dict[str, Any] = {
    "name": "wide",
    "columns": {f"measurement_{i:02d}": {"type": "continuous", "bounds": [0, 1000 + i]}
                for i in range(12)},
    "budgets": {"epsilon": 5, "delta": 1e-5},
}


def _csv(n: int) -> str:
    names = list(WIDE_META["columns"])
    rows = [",".join(names)]
    rows += [",".join(str((r * 7 + c) % 1000) for c in range(len(names))) for r in range(n)]
    return "\n".join(rows) + "\n"


def _upload(api: Api) -> str:
    resp = api.upload(_csv(20), WIDE_META)
    assert resp.status_code == 201, resp.get_json()
    dataset_id: str = resp.get_json()["id"]
    return dataset_id


def _post_version(api: Api, dataset_id: str, n: int, make_current: bool = False) -> None:
    data = {"file": (io.BytesIO(_csv(n).encode()), "v.csv"),
            "make_current": str(make_current).lower()}
    resp = api.client.post(f"/v1/datasets/{dataset_id}/versions", data=data,
                           content_type="multipart/form-data",
                           headers={"Authorization": f"Bearer {api.token}"})
    assert resp.status_code == 201, resp.get_json()


def _listed(api: Api, dataset_id: str, query: str = "") -> dict[str, Any]:
    resp = api.get(f"/v1/datasets{query}")
    assert resp.status_code == 200, resp.get_json()
    [entry] = [d for d in resp.get_json() if d["id"] == dataset_id]
    return dict(entry)


def _size(doc: dict[str, Any]) -> int:
    return len(json.dumps(doc, separators=(",", ":")))


def test_list_and_show_leave_out_the_versions_columns(api: Api) -> None:
    """Catches list/show answers whose versions carry their columns (old code: every
    entry did, ~900 B each here), and top-level columns that are not the current
    version's."""
    dataset_id = _upload(api)
    _post_version(api, dataset_id, 30)
    _post_version(api, dataset_id, 40, make_current=True)
    versions = api.get(f"/v1/datasets/{dataset_id}/versions").get_json()
    single = api.get(f"/v1/datasets/{dataset_id}").get_json()
    for doc in (_listed(api, dataset_id), single):
        assert [v["version"] for v in doc["versions"]] == [1, 2, 3]
        assert all("columns" not in v for v in doc["versions"])
        # everything else of an entry as GET .../versions shows it
        assert doc["versions"] == [{k: v for k, v in e.items() if k != "columns"}
                                   for e in versions]
        assert [v["n_rows"] for v in doc["versions"]] == [20, 30, 40]
        assert [v["current"] for v in doc["versions"]] == [False, False, True]
        assert (doc["current_version"], doc["n_rows"]) == (3, 40)
        assert doc["columns"] == versions[2]["columns"]


def test_an_entry_grows_by_a_version_s_fields_not_its_columns(api: Api) -> None:
    """Catches an entry that grows with versions x columns: a version with the same 12
    columns added ~900 B to the old entry; compact, it adds its own few fields."""
    dataset_id = _upload(api)
    _post_version(api, dataset_id, 30)
    _post_version(api, dataset_id, 40)
    before = _listed(api, dataset_id)
    before_single = api.get(f"/v1/datasets/{dataset_id}").get_json()
    _post_version(api, dataset_id, 50)
    after = _listed(api, dataset_id)
    after_single = api.get(f"/v1/datasets/{dataset_id}").get_json()
    column_bytes = _size(api.get(f"/v1/datasets/{dataset_id}/versions/4")
                         .get_json()["columns"])
    assert column_bytes > 600  # the test's premise: columns would have shown
    assert 0 < _size(after) - _size(before) < 300
    assert 0 < _size(after_single) - _size(before_single) < 300


def test_expand_versions_gives_the_full_entries(api: Api) -> None:
    """Catches ``expand=versions`` ignored, or entries other than GET .../versions's."""
    dataset_id = _upload(api)
    _post_version(api, dataset_id, 30)
    _post_version(api, dataset_id, 40, make_current=True)
    versions = api.get(f"/v1/datasets/{dataset_id}/versions").get_json()
    assert all(len(v["columns"]) == 12 for v in versions)
    listed = _listed(api, dataset_id, "?expand=versions")
    single = api.get(f"/v1/datasets/{dataset_id}?expand=versions").get_json()
    assert listed["versions"] == versions
    assert single["versions"] == versions
    compact = _listed(api, dataset_id)
    assert {k: v for k, v in listed.items() if k != "versions"} == {
        k: v for k, v in compact.items() if k != "versions"}


def test_an_unknown_expansion_is_refused(api: Api) -> None:
    """Catches an ``expand`` that takes any value (a typo would silently compact)."""
    dataset_id = _upload(api)
    for path in ("/v1/datasets?expand=columns", f"/v1/datasets/{dataset_id}?expand=x"):
        resp = api.get(path)
        assert resp.status_code == 422, path
        assert (resp.get_json()["code"], resp.get_json()["field"]) == (
            "validation_error", "expand.0"), path


def test_an_empty_expand_is_refused_not_read_as_no_expansion(api: Api) -> None:
    """Catches ``?expand=`` answered 200 although the schema's items are an enum (found by
    the contract fuzzer: ST201, a schema-violating request accepted)."""
    for path in ("/v1/datasets?expand=", "/v1/datasets?expand=versions"):
        resp = api.get(path)
        assert resp.status_code == (422 if path.endswith("=") else 200), path
    resp = api.get("/v1/datasets?expand=")
    assert resp.get_json()["field"] == "expand"


def _walk(api: Api, query: str) -> tuple[list[str], int]:
    """Every id of ``GET /v1/datasets<query>`` following ``X-Next-Cursor``; and pages."""
    ids: list[str] = []
    pages, url = 0, f"/v1/datasets{query}"
    while True:
        resp = api.get(url)
        assert resp.status_code == 200, resp.get_json()
        pages += 1
        ids += [d["id"] for d in resp.get_json()]
        cursor = resp.headers.get("X-Next-Cursor")
        if not cursor:
            return ids, pages
        assert resp.headers["Link"].endswith('; rel="next"')
        url = f"/v1/datasets{query}&cursor={cursor}"


def test_the_list_is_paged_newest_first_and_a_limited_key_pages_its_own(api: Api) -> None:
    """Catches GET /v1/datasets reading every dataset in one answer (149 ms at 1,000):
    pages of ``limit`` from the registry's index, newest first, each dataset once; a key
    limited to some datasets pages through those only."""
    from service import apikeys, wiring

    made = [_upload(api) for _ in range(5)]
    everything, _ = _walk(api, "?limit=1000")
    ids, pages = _walk(api, "?limit=2")
    assert ids == everything and len(set(ids)) == len(ids)
    assert pages == -(-len(ids) // 2)
    assert ids[:5] == made[::-1]  # newest first
    first = api.get("/v1/datasets?limit=2")
    assert [d["id"] for d in first.get_json()] == made[:-3:-1]
    _, token = apikeys.create(wiring.of(api.client.application).keys, "analyst", "paged",
                              datasets=(made[0], made[3]))
    mine = Api(api.client, token)
    assert _walk(mine, "?limit=1") == ([made[3], made[0]], 2)
    assert _walk(mine, "?limit=5") == ([made[3], made[0]], 1)
    bad = api.get("/v1/datasets?cursor=not-a-cursor")
    assert (bad.status_code, bad.get_json()["field"]) == (422, "cursor")
