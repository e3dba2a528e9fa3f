"""Console actions added for issue #18 §1 (in-process, real worker): the budget form over
the API's PATCH, plots of releases and analyses, cursor paging, cancelling an analysis.

Each page calls the API's own view, so the checks compare the page with the API's answer
for the same input (detail and field), never with a copy of its wording.
"""

from __future__ import annotations

import html
import io
import json
import re
from typing import Any

import redis
from flask import Flask
from flask.testing import FlaskClient
from markupsafe import escape

from service import apikeys, wiring
from service.storage.keys import KeyStore
from tests.integration.conftest import PEOPLE_META, TOKEN, Api, people_csv
from tests.integration.test_analyses_api import _post, interval
from tests.integration.test_analysis_plots import _analysis
from tests.integration.test_console import _csrf, _signed_in

__all__ = ["interval"]  # a module-scoped fixture, used here

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _link(page: str, element_id: str) -> str | None:
    """The href of the link with ``element_id`` (either attribute order), unescaped."""
    found = re.search(rf'<a href="([^"]+)" id="{element_id}"', page)
    return str(found.group(1)).replace("&amp;", "&") if found else None


def _budget(api: Api, dataset_id: str) -> dict[str, Any]:
    doc: dict[str, Any] = api.get(f"/v1/datasets/{dataset_id}/budget").get_json()
    return doc


def _form(client: FlaskClient, dataset_id: str, **fields: str) -> Any:
    path = f"/console/datasets/{dataset_id}"
    return client.post(f"{path}/budget", data={"csrf_token": _csrf(client, path), **fields})


def test_budget_form_changes_caps_and_allocations(app: Flask, api: Api,
                                                  keys: KeyStore) -> None:
    """The form's cap and allocation land in the ledger through the PATCH route (catches a
    form that drops the allocation or sends the cap under another measure)."""
    ds = api.upload(people_csv(), PEOPLE_META).get_json()
    analyst, _ = apikeys.create(keys, "analyst", label="budgeted")
    client = _signed_in(app, TOKEN)
    page = client.get(f"/console/datasets/{ds['id']}").get_data(as_text=True)
    assert 'id="budget-form"' in page and f'value="{analyst.id}"' in page
    resp = _form(client, ds["id"], **{"cap.epsilon": "4", "alloc_key": analyst.id,
                                      "alloc_measure": "epsilon", "alloc_cap": "1.5"})
    assert resp.status_code == 302, resp.get_data(as_text=True)
    budget = _budget(api, ds["id"])
    assert budget["measures"]["epsilon"]["cap"] == 4.0
    assert budget["allocations"][analyst.id]["epsilon"]["cap"] == 1.5
    assert budget["measures"]["delta"]["cap"] == PEOPLE_META["budgets"]["delta"]  # kept


def test_budget_form_errors_are_the_apis(app: Flask, api: Api, keys: KeyStore) -> None:
    """An invalid cap (422) and an allocation above the cap (409) show the API's own detail
    and field on the page, with the status, and change nothing (catches a form that
    swallows errors or words them itself)."""
    ds = api.upload(people_csv(), PEOPLE_META).get_json()
    analyst, _ = apikeys.create(keys, "analyst", label="over")
    client = _signed_in(app, TOKEN)
    before = _budget(api, ds["id"])
    cases = [({"cap.epsilon": "lots"}, {"caps": {"epsilon": "lots"}}),
             ({"alloc_key": analyst.id, "alloc_measure": "epsilon", "alloc_cap": "9"},
              {"allocations": {analyst.id: {"epsilon": "9"}}})]
    for form, body in cases:
        expected = api.client.patch(f"/v1/datasets/{ds['id']}/budget", json=body,
                                    headers={"Authorization": f"Bearer {TOKEN}"}).get_json()
        resp = _form(client, ds["id"], **form)
        page = resp.get_data(as_text=True)
        assert resp.status_code == expected["status"], page
        assert str(escape(expected["detail"])) in page
        assert f'<code id="problem-field">{expected["field"]}</code>' in page
    resp = _form(client, ds["id"], alloc_cap="1")  # an amount without a key
    assert resp.status_code == 422 and 'id="problem-field">alloc_key<' in resp.get_data(True)
    resp = _form(client, ds["id"])  # nothing to change
    assert resp.status_code == 422 and "nothing to change" in resp.get_data(True)
    assert _budget(api, ds["id"]) == before


def test_budget_form_is_for_operators_only(app: Flask, api: Api, keys: KeyStore) -> None:
    """Analysts and consumers see no budget form and a POST is the API's 403 (catches a
    form shown, or a change accepted, for a role the PATCH route refuses)."""
    ds = api.upload(people_csv(), PEOPLE_META).get_json()
    before = _budget(api, ds["id"])
    for role in ("analyst", "consumer"):
        client = _signed_in(app, apikeys.create(keys, role, label=f"no-{role}")[1])
        page = client.get(f"/console/datasets/{ds['id']}").get_data(as_text=True)
        assert 'id="budget-form"' not in page
        resp = _form(client, ds["id"], **{"cap.epsilon": "100"})
        assert resp.status_code == 403, role
    assert _budget(api, ds["id"]) == before


def test_release_page_shows_its_plot_as_png_and_svg(app: Flask, api: Api, worker: Any) -> None:
    """A table release's page embeds the PNG and links the SVG, both served (catches a
    page without the drawing or an SVG link to a missing route)."""
    ds = api.upload(people_csv(), PEOPLE_META).get_json()
    rel = api.post("/v1/releases", {"dataset_id": ds["id"], "mechanism": "laplace",
                                    "budget": {"epsilon": 0.5},
                                    "params": {"statistic": "count", "group_by": ["group"]}})
    assert rel.status_code == 202, rel.get_json()
    rid = rel.get_json()["id"]
    assert api.wait(rid)["status"] == "succeeded"
    client = _signed_in(app, TOKEN)
    page = client.get(f"/console/releases/{rid}").get_data(as_text=True)
    assert f'src="/console/releases/{rid}/plot.png"' in page
    svg_link = _link(page, "plot-svg")
    assert svg_link == f"/console/releases/{rid}/plot.svg"
    png, svg = client.get(f"/console/releases/{rid}/plot.png"), client.get(svg_link)
    assert png.status_code == 200 and png.data.startswith(PNG_MAGIC)
    assert svg.status_code == 200 and svg.mimetype == "image/svg+xml" and b"<svg" in svg.data


def test_analysis_page_shows_its_plot_and_cancel_refusals(app: Flask, api: Api, keys: KeyStore,
                                                          interval: dict[str, Any]) -> None:
    """An NPMLE analysis's page embeds its drawing (PNG served, SVG linked); a moments
    analysis, with nothing to draw, has no image. Cancelling an ended analysis shows the
    API's 409 on the page, and another consumer's try its 403 (catches a page without the
    plot or a cancel that bypasses the API's creator check)."""
    rid = interval["case1"]["id"]
    aid = _analysis(api, rid, "npmle", {"method": "pava"})
    client = _signed_in(app, TOKEN)
    path = f"/console/releases/{rid}/analyses/{aid}"
    page = client.get(path).get_data(as_text=True)
    assert f'src="{path}/plot.png"' in page and _link(page, "plot-svg") == f"{path}/plot.svg"
    png, svg = client.get(f"{path}/plot.png"), client.get(f"{path}/plot.svg")
    assert png.status_code == 200 and png.data.startswith(PNG_MAGIC)
    assert svg.status_code == 200 and b"<svg" in svg.data
    moments = _analysis(api, rid, "moments", {})
    page = client.get(f"/console/releases/{rid}/analyses/{moments}").get_data(as_text=True)
    assert 'id="plot"' not in page and "cancel-analysis" not in page
    resp = client.post(f"{path}/cancel", data={"csrf_token": _csrf(client, path)})
    assert resp.status_code == 409 and "nothing to cancel" in resp.get_data(as_text=True)
    other = _signed_in(app, apikeys.create(keys, "consumer", label="not-creator")[1])
    # the API checks who may cancel before whether anything is left to cancel
    resp = other.post(f"{path}/cancel", data={"csrf_token": _csrf(other, path)})
    assert resp.status_code == 403 and "creator" in resp.get_data(as_text=True)
    assert api.get(f"/v1/releases/{rid}/analyses/{aid}").get_json()["status"] == "succeeded"


def test_lists_page_forward_and_back(app: Flask, api: Api, interval: dict[str, Any]) -> None:
    """Next and previous links walk the API's cursors: page 2 holds the next items and
    "previous" returns exactly page 1, on the analyses of a release and on the releases
    list (catches a previous link that restarts or repeats a page)."""
    rid = interval["case1"]["id"]
    for _ in range(3):
        assert _post(api, rid, "moments").status_code == 202
    expected = [a["id"] for a in api.get(f"/v1/releases/{rid}/analyses?limit=100")
                .get_json()]
    client = _signed_in(app, TOKEN)
    row = re.compile(rf'href="/console/releases/{rid}/analyses/(ana_[A-Za-z0-9_]+)"')

    def ids(page: str) -> list[str]:
        return row.findall(page)

    first = client.get(f"/console/releases/{rid}?limit=2").get_data(as_text=True)
    assert ids(first) == expected[:2] and _link(first, "analyses-pager-previous") is None
    nxt = _link(first, "analyses-pager-next")
    assert nxt is not None
    second = client.get(nxt).get_data(as_text=True)
    assert ids(second) == expected[2:4]
    prev = _link(second, "analyses-pager-previous")
    assert prev is not None
    assert ids(client.get(prev).get_data(as_text=True)) == expected[:2]

    shown = re.compile(r'<tr><td><a href="/console/releases/(rel_[A-Za-z0-9_]+)">')
    one = client.get("/console/releases?limit=1").get_data(as_text=True)
    two_link = _link(one, "pager-next")
    assert two_link is not None and "limit=1" in two_link
    two = client.get(two_link).get_data(as_text=True)
    assert shown.findall(two) and shown.findall(two) != shown.findall(one)
    back = _link(two, "pager-previous")
    assert back is not None
    assert shown.findall(client.get(back).get_data(as_text=True)) == shown.findall(one)
    bad = client.get("/console/releases?cursor=not-a-cursor")
    assert bad.status_code == 422  # the API's own cursor validation
    assert client.get("/console/jobs?status=bogus").status_code == 422  # the API's schema
    mine = client.get("/console/releases?mine=true").get_data(as_text=True)
    assert rid in shown.findall(mine)  # the operator's token requested the fixture's
    other = _signed_in(app, apikeys.create(wiring.of(app).keys, "analyst",
                                           label="no-releases")[1])
    page = other.get("/console/releases?mine=true").get_data(as_text=True)
    dataset_id = api.get(f"/v1/releases/{rid}").get_json()["dataset_id"]
    assert "No releases yet." in page and shown.findall(other.get(
        f"/console/releases?dataset_id={dataset_id}").get_data(as_text=True))


def _upload_version(client: FlaskClient, dataset_id: str, csv: str, **fields: str) -> Any:
    path = f"/console/datasets/{dataset_id}"
    return client.post(f"{path}/versions", content_type="multipart/form-data", data={
        "csrf_token": _csrf(client, path), "file": (io.BytesIO(csv.encode()), "v.csv"),
        **fields})


def test_versions_upload_current_and_retire_from_the_dataset_page(app: Flask, api: Api,
                                                                  r: redis.Redis) -> None:
    """An operator uploads v2, makes it current and retires v1 from the page, all through
    the API's routes (catches a form that drops make_current or retires the wrong version),
    and the API's refusals (retiring the current version: 409; changed metadata without
    compatible: 422) are shown with their detail and field."""
    ds = api.upload(people_csv(50), PEOPLE_META).get_json()
    client = _signed_in(app, TOKEN)
    path = f"/console/datasets/{ds['id']}"
    page = client.get(path).get_data(as_text=True)
    assert 'id="version-form"' in page and 'id="version-1"' in page
    resp = _upload_version(client, ds["id"], people_csv(70))
    assert resp.status_code == 302, resp.get_data(as_text=True)
    versions = api.get(f"/v1/datasets/{ds['id']}/versions").get_json()
    assert [(v["version"], v["n_rows"], v["current"]) for v in versions] == [
        (1, 50, True), (2, 70, False)]
    resp = client.post(f"{path}/versions/2", data={"csrf_token": _csrf(client, path),
                                                   "action": "current"})
    assert resp.status_code == 302
    # retiring the current version: the API's 409, on the page
    expected = api.client.patch(f"/v1/datasets/{ds['id']}/versions/2",
                                json={"status": "retired"},
                                headers={"Authorization": f"Bearer {TOKEN}"}).get_json()
    resp = client.post(f"{path}/versions/2", data={"csrf_token": _csrf(client, path),
                                                   "action": "retire"})
    assert resp.status_code == expected["status"] == 409
    assert str(escape(expected["detail"])) in resp.get_data(as_text=True)
    resp = client.post(f"{path}/versions/1", data={"csrf_token": _csrf(client, path),
                                                   "action": "retire"})
    assert resp.status_code == 302
    versions = api.get(f"/v1/datasets/{ds['id']}/versions").get_json()
    assert [(v["version"], v["status"], v["current"]) for v in versions] == [
        (1, "retired", False), (2, "active", True)]
    resp = _upload_version(client, ds["id"], people_csv(10), metadata=json.dumps(PEOPLE_META))
    page = resp.get_data(as_text=True)
    assert resp.status_code == 422 and 'id="problem-field">compatible<' in page
    shown = client.get(f"{path}/versions/2").get_data(as_text=True)
    assert "70 rows" in shown and 'id="version-columns"' in shown
    assert len(api.get(f"/v1/datasets/{ds['id']}/versions").get_json()) == 2  # nothing kept


def test_versions_forms_are_for_operators_only(app: Flask, api: Api, keys: KeyStore) -> None:
    """Analysts see the versions table but no form; their POSTs are the API's 403 and change
    nothing (catches a version action allowed for a role the API refuses)."""
    ds = api.upload(people_csv(30), PEOPLE_META).get_json()
    client = _signed_in(app, apikeys.create(keys, "analyst", label="no-versions")[1])
    path = f"/console/datasets/{ds['id']}"
    page = client.get(path).get_data(as_text=True)
    assert 'id="version-1"' in page and 'id="version-form"' not in page
    assert 'id="current-1"' not in page
    assert _upload_version(client, ds["id"], people_csv(40)).status_code == 403
    resp = client.post(f"{path}/versions/1", data={"csrf_token": _csrf(client, path),
                                                   "action": "retire"})
    assert resp.status_code == 403
    versions = api.get(f"/v1/datasets/{ds['id']}/versions").get_json()
    assert [(v["version"], v["status"]) for v in versions] == [(1, "active")]


def test_reupload_warning_is_shown_after_the_upload_form(app: Flask, api: Api) -> None:
    """A console upload matching an active dataset's columns and rows shows the API's
    possible_reupload warning naming it (catches a warning lost in the redirect)."""
    first = api.upload(people_csv(613), PEOPLE_META).get_json()
    client = _signed_in(app, TOKEN)
    resp = client.post("/console/datasets", content_type="multipart/form-data", data={
        "csrf_token": _csrf(client, "/console/datasets"), "metadata": json.dumps(PEOPLE_META),
        "file": (io.BytesIO(people_csv(613).encode()), "again.csv")})
    page = resp.get_data(as_text=True)
    assert resp.status_code == 201, page
    assert 'id="reupload-warning"' in page and first["id"] in page and "the same file" in page


def test_a_keys_datasets_are_an_explicit_choice(app: Flask, api: Api, keys: KeyStore,
                                                dataset: dict[str, Any]) -> None:
    """#31 item 6: a key made with no dataset ticked got every dataset. Now no choice, or
    "some" with none ticked, is refused and makes no key; "every dataset" must be chosen."""
    client = _signed_in(app, apikeys.create(keys, "operator", label="scope-op")[1])

    def create(label: str, **form: Any) -> Any:
        return client.post("/console/keys", data={
            "csrf_token": _csrf(client, "/console/keys"), "role": "analyst", "label": label,
            **form})

    for label, form, field in (("no-choice", {}, "scope"),
                               ("none-ticked", {"scope": "some"}, "datasets"),
                               ("both", {"scope": "all", "datasets": [dataset["id"]]}, "scope")):
        resp = create(label, **form)
        assert resp.status_code == 422, label
        assert f'<code id="problem-field">{field}</code>' in resp.get_data(as_text=True), label
    made = {k["label"]: k for k in api.get("/v1/keys?limit=1000").get_json()}
    assert not {"no-choice", "none-ticked", "both"} & set(made)
    assert create("some", scope="some", datasets=[dataset["id"]]).status_code == 201
    assert create("all", scope="all").status_code == 201
    made = {k["label"]: k for k in api.get("/v1/keys?limit=1000").get_json()}
    assert made["some"]["datasets"] == [dataset["id"]] and made["all"]["datasets"] is None


def test_the_datasets_page_drafts_metadata_from_a_file(app: Flask, keys: KeyStore) -> None:
    """#31 item 8: the console offers `datasets draft`; it registers nothing, and the
    upload form comes back with the draft and the notes (bounds: why not read)."""
    client = _signed_in(app, apikeys.create(keys, "operator", label="draft-op")[1])
    before = client.get("/console/datasets").get_data(as_text=True).count("<tr><td><a")
    resp = client.post("/console/datasets/draft", data={
        "csrf_token": _csrf(client, "/console/datasets"),
        "file": (io.BytesIO(people_csv(30).encode()), "clinic.csv")},
        content_type="multipart/form-data")
    page = resp.get_data(as_text=True)
    assert resp.status_code == 200
    textarea = page.split('id="metadata"', 1)[1].split(">", 1)[1].split("</textarea>", 1)[0]
    drafted = json.loads(html.unescape(textarea))
    assert drafted["name"] == "clinic" and drafted["budgets"] == {}
    assert drafted["columns"]["age"] == {"type": "integer", "bounds": [None, None]}
    assert 'id="draft-notes"' in page and "bounds are not read from the data" in page
    assert page.count("<tr><td><a") == before  # nothing registered
    bad = client.post("/console/datasets/draft", data={
        "csrf_token": _csrf(client, "/console/datasets"),
        "file": (io.BytesIO(b"\xff\xfe\x00garbage"), "x.csv")},
        content_type="multipart/form-data")
    assert bad.status_code == 422 and "neither CSV" in bad.get_data(as_text=True)
    analyst = _signed_in(app, apikeys.create(keys, "analyst", label="draft-an")[1])
    assert analyst.post("/console/datasets/draft", data={
        "csrf_token": _csrf(analyst, "/console/datasets")}).status_code == 403


def test_an_exhausted_budget_is_shown_on_the_release_form(app: Flask, api: Api,
                                                          keys: KeyStore) -> None:
    """A request beyond the key's allocation is the API's 409 on the mechanism's page, in
    its problem box with the API's detail, measure and amounts, and nothing spent (catches
    the domain refusal escaping the page as the API's JSON)."""
    ds = api.upload(people_csv(), PEOPLE_META).get_json()
    analyst, token = apikeys.create(keys, "analyst", label="short")
    assert api.client.patch(f"/v1/datasets/{ds['id']}/budget", headers=api._h(), json={
        "allocations": {analyst.id: {"epsilon": 0.1}}}).status_code == 200
    body = {"dataset_id": ds["id"], "mechanism": "laplace",
            "params": {"statistic": "mean", "column": "income"}, "budget": {"epsilon": 0.5}}
    expected = Api(app.test_client(), token).post("/v1/releases/estimate", body).get_json()
    assert expected["fits"] is False
    client = _signed_in(app, token)
    path = "/console/mechanisms/laplace"
    resp = client.post(path, data={
        "csrf_token": _csrf(client, path), "action": "request", "dataset_id": ds["id"],
        "p.statistic": "mean", "p.column": "income", "b.epsilon": "0.5"})
    refused = Api(app.test_client(), token).post("/v1/releases", body).get_json()
    assert resp.status_code == refused["status"] == 409
    assert resp.mimetype == "text/html"
    page = resp.get_data(as_text=True)
    assert f'<div class="problem" id="problem" role="alert"><strong>{escape(refused["detail"])}' \
        in page and 'id="release-form"' in page
    amounts = re.search(r'<span class="amounts" id="problem-amounts">([^<]*)</span>', page)
    assert amounts and amounts.group(1) == (
        f"{refused['measure']}: requested {refused['requested']:g},"
        f" remaining {refused['remaining']:g}") == "epsilon: requested 0.5, remaining 0.1"
    assert _budget(api, ds["id"])["allocations"][analyst.id]["epsilon"]["committed"] == 0
