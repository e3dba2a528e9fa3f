"""The web console driven in a real headless Chromium (Debian's chromium + chromedriver)
against a live `privrelease standalone`: every role signs in, an operator uploads through
the form and manages keys, an analyst estimates and requests a release and sees its plot,
a consumer sees no operator page; an operator changes a cap with the budget form and an
NPMLE analysis's page shows its drawing; an operator registers Parquet from the store.

The manual's screenshots of these pages come from tests/e2e/test_manual_browser.py.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import requests
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select, WebDriverWait

from tests.e2e import chromium
from tests.e2e.harness import TOKEN, Service

#: matches the upload form's pre-filled example metadata (age, income, group)
CSV = "age,income,group\n" + "".join(
    f"{20 + i % 50},{(i * 37) % 1000}.5,{'abc'[i % 3]}\n" for i in range(300))


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[webdriver.Chrome]:
    driver = chromium.start(tmp_path_factory.mktemp("chromium"))
    yield driver
    driver.quit()


def _session(driver: WebDriver) -> requests.Session:
    http = requests.Session()
    for c in driver.get_cookies():
        http.cookies.set(c["name"], c["value"], path=c.get("path", "/"))
    return http


def test_console_roles_in_chromium(service: Service, browser: WebDriver,
                                   tmp_path: Path) -> None:
    d = browser
    # operator: cookie flags
    chromium.sign_in(d, service.url, TOKEN)
    cookie = {c["name"]: c for c in d.get_cookies()}["privrelease_console"]
    assert cookie["httpOnly"] is True and cookie["sameSite"] == "Strict"
    assert cookie["path"] == "/console" and TOKEN not in cookie["value"]

    # operator: a bad upload shows the API's problem detail and field, a good one lands
    csv = tmp_path / "people.csv"
    csv.write_text(CSV)
    d.get(service.url + "/console/datasets")
    d.find_element(By.ID, "upload").click()  # no file chosen
    assert d.find_element(By.ID, "problem-field").text == "file"
    d.find_element(By.ID, "file").send_keys(str(csv))
    d.find_element(By.ID, "upload").click()
    rows = d.find_elements(By.CSS_SELECTOR, "#columns tbody tr")
    assert [r.find_element(By.TAG_NAME, "td").text for r in rows] == ["age", "income", "group"]
    dataset_id = d.current_url.rsplit("/", 1)[1]

    # operator: keys for an analyst and a consumer, tokens shown once
    tokens = {}
    for role in ("analyst", "consumer"):
        d.get(service.url + "/console/keys")
        Select(d.find_element(By.ID, "role")).select_by_visible_text(role)
        d.find_element(By.ID, "label").send_keys(f"browser {role}")
        if role == "analyst":  # the scope is an explicit choice (#31 item 6)
            d.find_element(By.ID, "scope-some").click()
            d.find_element(By.CSS_SELECTOR, f"input[name=datasets][value={dataset_id}]").click()
        else:
            d.find_element(By.ID, "scope-all").click()
        d.find_element(By.ID, "create-key").click()
        tokens[role] = d.find_element(By.ID, "new-token").text
        assert tokens[role].startswith("pr_")
    d.get(service.url + "/console/keys")
    assert tokens["analyst"] not in d.page_source  # shown once only

    # analyst: estimate, then request a count table, and see its plot
    chromium.sign_in(d, service.url, tokens["analyst"])
    d.get(service.url + "/console/mechanisms/laplace")
    Select(d.find_element(By.ID, "dataset_id")).select_by_value(dataset_id)
    Select(d.find_element(By.ID, "p.statistic")).select_by_visible_text("count")
    d.find_element(By.ID, "p.group_by").send_keys("group")  # a table: bars with error bars
    d.find_element(By.ID, "b.epsilon").send_keys("0.5")
    d.find_element(By.ID, "estimate-button").click()
    assert "Fits" in d.find_element(By.ID, "estimate").text
    assert "±" in d.find_element(By.ID, "estimate-sentence").text  # in words (#31 item 1)
    d.find_element(By.ID, "request-button").click()
    chromium.until_text(d, "status", "succeeded")
    plot = d.find_element(By.ID, "plot")
    assert d.execute_script("return arguments[0].complete && arguments[0].naturalWidth",
                            plot) > 100
    png = _session(d).get(plot.get_attribute("src") or "", timeout=30)
    assert png.status_code == 200 and png.content.startswith(b"\x89PNG")
    assert len(png.content) > 2000
    # the accuracy sentence first, shown in full with ± as itself; the JSON folded away
    sentence = d.find_element(By.ID, "accuracy-sentence")
    assert sentence.is_displayed() and "±" in sentence.text and "\\u00b1" not in sentence.text
    assert sentence.location["y"] < plot.location["y"]
    assert not d.find_element(By.ID, "accuracy").is_displayed()
    assert d.find_elements(By.CSS_SELECTOR, "#result-table tbody tr")

    # consumer: no operator links, operator pages refused
    chromium.sign_in(d, service.url, tokens["consumer"])
    d.get(service.url + "/console/datasets")
    assert not d.find_elements(By.ID, "nav-keys") and not d.find_elements(By.ID, "nav-jobs")
    assert not d.find_elements(By.ID, "upload-form")
    d.get(service.url + "/console/keys")
    assert d.find_element(By.TAG_NAME, "h1").text.startswith("403")

    # operator: budget chart, CSRF refusal, and revoking the analyst key
    chromium.sign_in(d, service.url, TOKEN)
    d.get(f"{service.url}/console/datasets/{dataset_id}")
    chart = d.find_element(By.ID, "budget-chart")
    assert d.execute_script("return arguments[0].naturalWidth", chart) > 100
    analyst_id = next(k["id"] for k in service.call("GET", "/v1/keys").json()
                      if k["label"] == "browser analyst")
    http = _session(d)
    forged = http.post(f"{service.url}/console/keys/{analyst_id}/revoke", timeout=30)
    assert forged.status_code == 400  # no CSRF token: refused, key still valid
    assert requests.get(service.url + "/v1/datasets", timeout=30, headers={
        "Authorization": f"Bearer {tokens['analyst']}"}).status_code == 200
    d.get(service.url + "/console/keys")
    button = d.find_element(By.ID, f"revoke-{analyst_id}")
    button.click()
    chromium.reloaded(d, button)
    d.implicitly_wait(0)
    assert not d.find_elements(By.ID, f"row-{analyst_id}")
    d.implicitly_wait(5)
    # refused by every API process within PRIVRELEASE_KEY_CACHE_SECONDS (1 s): the one that
    # answered the check above may keep the key that long
    deadline = time.monotonic() + 3
    while requests.get(service.url + "/v1/datasets", timeout=30, headers={
            "Authorization": f"Bearer {tokens['analyst']}"}).status_code != 401:
        assert time.monotonic() < deadline, "the revoked key is still accepted"
        time.sleep(0.1)
    d.get(f"{service.url}/console/datasets/{dataset_id}/audit")
    assert d.find_elements(By.CSS_SELECTOR, "#events tbody tr")


def test_budget_form_and_analysis_plot_in_chromium(service: Service,
                                                   browser: WebDriver) -> None:
    """An operator adds an interval-leakage cap with the budget form, and an NPMLE run from
    a release's page shows its drawing: the image loads (naturalWidth > 0) and its SVG
    link answers SVG."""
    d = browser
    # interval releases opted in (the notion and record-level ones); the cap comes later
    dataset_id = service.upload({"epsilon": 1}, notions=["dp", "interval"], record_level=True)
    chromium.sign_in(d, service.url, TOKEN)
    d.get(f"{service.url}/console/datasets/{dataset_id}")
    d.find_element(By.ID, "new-measure").send_keys("interval_leakage")
    d.find_element(By.ID, "new-cap").send_keys("1")
    button = d.find_element(By.ID, "set-budget")
    button.click()
    chromium.reloaded(d, button)
    cells = [[td.text for td in r.find_elements(By.TAG_NAME, "td")]
             for r in d.find_elements(By.CSS_SELECTOR, "#budget tbody tr")]
    measures = {row[0]: row[1] for row in cells}
    assert measures["interval_leakage:x"] == "1.0" and measures["epsilon"] == "1.0"

    body = {"dataset_id": dataset_id, "mechanism": "interval.case1",
            "params": {"column": "x", "anchors": {"family": "uniform", "low": 0, "high": 1}},
            "budget": {"interval_leakage": 0.9}}
    created = service.call("POST", "/v1/releases", json=body)
    assert created.status_code == 202, created.text
    rid = created.json()["id"]
    assert service.wait(rid)["status"] == "succeeded"
    d.get(f"{service.url}/console/releases/{rid}")
    Select(d.find_element(By.ID, "analysis")).select_by_visible_text("npmle")
    d.find_element(By.ID, "run-analysis").click()
    chromium.until_text(d, "status", "succeeded")
    plot = d.find_element(By.ID, "plot")
    WebDriverWait(d, 30).until(lambda drv: drv.execute_script(
        "return arguments[0].complete && arguments[0].naturalWidth", plot))
    assert d.execute_script("return arguments[0].naturalWidth", plot) > 100
    svg = _session(d).get(d.find_element(By.ID, "plot-svg").get_attribute("href") or "",
                         timeout=30)
    assert svg.status_code == 200 and svg.headers["Content-Type"].startswith("image/svg+xml")


def test_register_from_the_store_in_chromium(service: Service, browser: WebDriver,
                                             sources: Path) -> None:
    """An operator registers a local folder of Parquet (under the service's source root)
    with the "Register from the store" form: the browser lands on the new dataset's page
    (post/redirect/get), a reload of it registers nothing more, and the same form posted
    a second time (its idempotency key, as a resubmission sends it) answers the same
    dataset; a source outside the root shows the API's detail and field with what was
    typed. Then a new version from the store on the dataset's page."""
    d = browser
    folder = sources / "console-people"
    folder.mkdir()
    for k, n in enumerate((150, 90)):  # 240 rows: not the shape of another dataset here
        i = range(k * 150, k * 150 + n)
        pq.write_table(pa.table({"age": [20 + j % 50 for j in i],
                                 "income": [(j * 37) % 1000 + 0.5 for j in i],
                                 "group": ["abc"[j % 3] for j in i]}),
                       folder / f"part-{k}.parquet")
    (folder / "_SUCCESS").write_bytes(b"")
    chromium.sign_in(d, service.url, TOKEN)
    before = {x["id"] for x in service.call("GET", "/v1/datasets").json()}

    d.get(service.url + "/console/datasets")
    d.find_element(By.ID, "source").send_keys("file:///etc")  # outside the root
    d.find_element(By.ID, "register").click()
    assert d.find_element(By.ID, "problem-field").text == "source"
    metadata = json.loads(d.find_element(By.ID, "source-metadata").get_attribute("value")
                          or "")
    api = service.call("POST", "/v1/datasets", json={"source": "file:///etc",
                                                     "metadata": metadata}).json()
    assert api["status"] == 403 and api["code"] == "source_not_allowed"
    assert d.find_element(By.ID, "problem").text == f"{api['detail']} field: source"
    assert d.find_element(By.ID, "source").get_attribute("value") == "file:///etc"
    source = d.find_element(By.ID, "source")
    source.clear()
    source.send_keys(folder.as_uri())
    # the form as the browser will post it (its CSRF token and idempotency key; a
    # textarea's line breaks sent as CRLF, as HTML's form submission does)
    form = d.find_element(By.ID, "register-form")
    fields = {e.get_attribute("name"): (e.get_attribute("value") or "").replace("\n", "\r\n")
              for e in form.find_elements(By.CSS_SELECTOR, "input, textarea")}
    button = d.find_element(By.ID, "register")
    button.click()
    chromium.reloaded(d, button)
    dataset_id = d.current_url.rsplit("/", 1)[1]
    assert d.current_url == f"{service.url}/console/datasets/{dataset_id}"  # redirected
    assert "240 rows" in d.find_element(By.TAG_NAME, "main").text
    assert d.find_element(By.CSS_SELECTOR, "#version-1 .source").text == (
        f"{folder.as_uri()} · 2 objects · 1 hidden skipped")

    d.refresh()
    assert d.current_url == f"{service.url}/console/datasets/{dataset_id}"
    again = _session(d).post(service.url + "/console/datasets/register", data=fields,
                             allow_redirects=False, timeout=60)
    assert again.status_code == 302
    assert again.headers["Location"].endswith(f"/console/datasets/{dataset_id}")
    made = {x["id"] for x in service.call("GET", "/v1/datasets").json()} - before
    assert made == {dataset_id}

    d.find_element(By.ID, "version-source").send_keys((folder / "part-1.parquet").as_uri())
    d.find_element(By.ID, "version-source-current").click()
    button = d.find_element(By.ID, "register-version")
    button.click()
    chromium.reloaded(d, button)
    assert "current" in d.find_element(By.ID, "version-2").text
    d.refresh()
    versions = service.call("GET", f"/v1/datasets/{dataset_id}/versions").json()
    assert [(v["version"], v["n_rows"], v["current"]) for v in versions] == [
        (1, 240, False), (2, 90, True)]
