"""The manual at ``/manual/`` in a real headless Chromium against a live
`privrelease standalone`: the theme's scripts run under the page's CSP (no violation), the
pages load nothing from outside the service, search works offline, and each role's guide
is reached from the home page's table of roles and leads on to the console and the API.

Then the guide walk (issue #31): each role's guide read in the manual and its steps done
in the console as a person would, asserting at each step what the guide says will be seen;
the concepts page fits one 1280×900 screen. With PRIVRELEASE_GUIDE_SCREENSHOTS=docs it
saves every screenshot the manual embeds (tests/manual_site.py's WALK_SHOTS; the unit test
tests/unit/test_manual.py holds the pages to that list). What the guides say is HTTP only
(the quick start's curl session, the operator's registration by reference, the analyst's
notebook session) is run as pasted by tests/e2e/test_manual_blocks.py; the service guide's
polling, idempotency and callbacks are the API's, tested under tests/integration.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select, WebDriverWait

from tests.e2e import chromium
from tests.e2e.harness import TOKEN, Service
from tests.manual_site import WALK_SHOTS, build

SHOTS = os.environ.get("PRIVRELEASE_GUIDE_SCREENSHOTS")  # the docs/ folder
#: the operator guide's dataset: the console's example columns, 300 people
CSV = "age,income,group\n" + "".join(
    f"{20 + i % 50},{(i * 37) % 1000}.5,{'abc'[i % 3]}\n" for i in range(300))
#: its metadata as step 2 writes it: DP and interval releases, record-level allowed
METADATA = {"name": "people",
            "columns": {"age": {"type": "integer", "bounds": [0, 100]},
                        "income": {"type": "continuous", "bounds": [0, 1000]},
                        "group": {"type": "categorical", "categories": ["a", "b", "c"]}},
            "budgets": {"epsilon": 5, "delta": 1e-5, "interval_leakage": 1},
            "notions": ["dp", "interval"], "record_level": True}
#: the words concepts.md defines (issue #31 item 7)
CONCEPTS = ("dataset", "measure", "cap", "allocation", "notion", "admits", "version",
            "estimate", "release", "replay", "idempotency", "role")
#: the home page's table of roles: each role's first link, and a heading of that guide
ROLES = {"operator": ("Operator guide: register and budget",
                      "Budgets, allocations and the audit log"),
         "analyst": ("Analyst guide: a notebook", "Python client (notebooks and scripts)"),
         "consumer / internal service": ("Service guide: polling, idempotency, budget exhaustion",
                                         "Budget exhaustion")}


@pytest.fixture(scope="module")
def manual_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    site = tmp_path_factory.mktemp("manual") / "site"
    done = build(site)
    assert done.returncode == 0, done.stderr
    svc = Service(tmp_path_factory.mktemp("standalone"),
                  env={"PRIVRELEASE_MANUAL_DIR": str(site)})
    svc.start()
    yield svc
    svc.stop()


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[webdriver.Chrome]:
    driver = chromium.start(tmp_path_factory.mktemp("chromium"), height=900)
    yield driver
    driver.quit()


def _loaded_from(driver: WebDriver) -> set[str]:
    """Origins of the document and of everything it loaded (scripts, CSS, the search
    index and its worker)."""
    urls = driver.execute_script(
        "return [location.href].concat(performance.getEntriesByType('resource')"
        ".map(e => e.name))")
    return {u.split("/manual/")[0] for u in urls}


def _problems(driver: webdriver.Chrome) -> list[str]:
    """Console messages of the page: CSP refusals, failed loads, script errors."""
    return [e["message"] for e in driver.get_log("browser")
            if e["level"] in {"SEVERE", "WARNING"}]


def test_each_role_follows_its_guide_from_the_manual(manual_service: Service,
                                                     browser: webdriver.Chrome) -> None:
    d, url = browser, manual_service.url
    d.get(url + "/manual/")
    assert d.find_element(By.TAG_NAME, "h1").text == "privrelease"
    # the theme's own script ran (the inline palette script too: CSP by hash)
    WebDriverWait(d, 10).until(lambda _: d.execute_script(
        "return typeof document$ !== 'undefined' && document.body.dataset.mdColorScheme"))
    assert _problems(d) == []
    assert _loaded_from(d) == {url}

    for role, (title, heading) in ROLES.items():
        d.get(url + "/manual/")
        row = next(r for r in d.find_elements(By.CSS_SELECTOR, "table tr")
                   if r.find_elements(By.TAG_NAME, "td")
                   and r.find_elements(By.TAG_NAME, "td")[0].text == role)
        row.find_elements(By.TAG_NAME, "a")[0].click()
        def on_guide(_: WebDriver, title: str = title) -> bool:
            return bool(d.find_element(By.TAG_NAME, "h1").text == title)

        WebDriverWait(d, 10).until(on_guide)
        headings = [h.text for h in d.find_elements(By.CSS_SELECTOR, "h2, h3")]
        assert heading in headings, (role, headings)
        assert _problems(d) == [] and _loaded_from(d) == {url}, role

    # search runs offline (its worker and index come from the service)
    d.get(url + "/manual/concepts.html")
    search = d.find_element(By.CSS_SELECTOR, "input.md-search__input")
    search.click()
    search.send_keys("idempotency")
    WebDriverWait(d, 15).until(
        lambda _: d.find_elements(By.CSS_SELECTOR, ".md-search-result__item"))
    assert _problems(d) == [] and _loaded_from(d) == {url}

    # from the guides on to the service: the console and the API's own documentation
    d.get(url + "/")
    assert d.current_url.startswith(url + "/console/")
    d.get(url + "/manual/reference/api.html")
    assert "/docs" in d.find_element(By.TAG_NAME, "article").text
    d.get(url + "/console/signin")
    d.find_element(By.ID, "token").send_keys(TOKEN)
    d.find_element(By.ID, "signin").click()
    assert d.find_element(By.ID, "who")


class Walk:
    """A person reading the manual and doing its steps in the console: the guide page
    open in the manual, the console beside it, and the screenshots taken so far."""

    def __init__(self, driver: WebDriver, url: str) -> None:
        self.d, self.url = driver, url
        self.taken: list[str] = []
        # a 1280×900 viewport (the window's own frame comes on top of it)
        frame = driver.execute_script("return window.outerHeight - window.innerHeight")
        driver.set_window_size(1280, 900 + frame)

    def guide(self, page: str, title: str) -> str:
        """Open a page of the manual; its article's text, to hold the steps to."""
        self.d.get(f"{self.url}/manual/{page}.html")
        assert self.d.find_element(By.TAG_NAME, "h1").text == title
        return str(self.d.find_element(By.TAG_NAME, "article").text)

    def shot(self, name: str) -> None:
        """The screenshot a guide embeds at this step. A console page is signed in and no
        error page; an image on it has loaded."""
        d = self.d
        if "/console/" in d.current_url:
            assert d.find_element(By.ID, "who") and self.absent("token")
            assert not d.find_element(By.TAG_NAME, "h1").text[:3].isdigit()  # 403, 404...
        WebDriverWait(d, 30).until(lambda _: d.execute_script(
            "return [...document.images].every(i => i.complete && i.naturalWidth > 0)"))
        self.taken.append(f"walk/{name}.png")
        chromium.shot(d, SHOTS, f"walk/{name}")

    def absent(self, element_id: str) -> bool:
        """Whether the page has no such element (asked at once, not after the implicit
        wait a missing element would cost)."""
        self.d.implicitly_wait(0)
        try:
            return not self.d.find_elements(By.ID, element_id)
        finally:
            self.d.implicitly_wait(5)

    def scroll_to(self, element_id: str) -> None:
        """Bring an element to the top of the screen, with the heading above it."""
        self.d.execute_script("arguments[0].scrollIntoView(); window.scrollBy(0, -80)",
                              self.d.find_element(By.ID, element_id))

    def goto(self, path: str) -> None:
        self.d.get(self.url + path)

    def click(self, element_id: str) -> None:
        """Submit a form and wait for the page it answers with."""
        button = self.d.find_element(By.ID, element_id)
        button.click()
        chromium.reloaded(self.d, button)

    def type(self, element_id: str, text: str) -> None:
        field = self.d.find_element(By.ID, element_id)
        field.clear()
        field.send_keys(text)

    def choose(self, element_id: str, *, value: str | None = None,
               text: str | None = None) -> None:
        select = Select(self.d.find_element(By.ID, element_id))
        if value is not None:
            select.select_by_value(value)
        else:
            select.select_by_visible_text(text or "")

    def rows(self, table_id: str) -> list[list[str]]:
        return [[td.text for td in r.find_elements(By.TAG_NAME, "td")]
                for r in self.d.find_elements(By.CSS_SELECTOR, f"#{table_id} tbody tr")]


def _says(guide: str, *phrases: str) -> None:
    """The guide says what the walk is about to check (so the two cannot drift apart)."""
    flat = " ".join(guide.split())
    for phrase in phrases:
        assert phrase in flat, phrase


def test_the_guides_walked_in_the_console(manual_service: Service,
                                          browser: webdriver.Chrome,
                                          tmp_path: Path) -> None:
    walk = Walk(browser, manual_service.url)
    d, url = browser, manual_service.url

    # the manual: its home page and the operator's guide reached from its table of roles
    walk.goto("/manual/")
    assert d.find_element(By.TAG_NAME, "h1").text == "privrelease"
    walk.shot("manual-home")
    d.find_element(By.LINK_TEXT, "Operator guide").click()
    WebDriverWait(d, 10).until(lambda _: d.find_element(By.TAG_NAME, "h1").text
                               == ROLES["operator"][0])
    walk.shot("manual-operator-guide")

    # concepts on one screen: the whole article above the fold at 1280×900
    walk.guide("concepts", "Concepts")
    terms = [t.text for t in d.find_elements(By.CSS_SELECTOR, "article table td strong")]
    assert terms == list(CONCEPTS), terms
    height, bottom = d.execute_script(
        "return [window.innerHeight, document.querySelector('article')"
        ".getBoundingClientRect().bottom]")
    assert height == 900 and bottom <= height, (height, bottom)

    # operator guide, step by step
    guide = walk.guide("guides/operator", ROLES["operator"][0])
    _says(guide, "In the console, step by step", "the console opens on Datasets",
          "the notions it admits", "only those ticked below", "shows the token once",
          "Change budget", "Allocations per key", "Audit log")
    chromium.sign_in(d, url, TOKEN)                                     # 1. sign in
    assert d.find_element(By.TAG_NAME, "h1").text == "Datasets"
    people = tmp_path / "people.csv"                                    # 2. register
    people.write_text(CSV)
    d.find_element(By.ID, "file").send_keys(str(people))
    walk.type("metadata", json.dumps(METADATA))
    walk.click("upload")
    dataset_id = d.current_url.rsplit("/", 1)[1]
    assert dataset_id.startswith("ds_"), d.find_element(By.TAG_NAME, "main").text[:500]
    assert "300 rows." in d.find_element(By.TAG_NAME, "main").text
    assert d.find_element(By.ID, "policy-notions").text == "dp, interval"
    assert [row[0] for row in walk.rows("columns")] == ["age", "income", "group"]
    walk.shot("operator-dataset")
    walk.goto("/console/keys")                                          # 3. a key
    walk.choose("role", text="analyst")
    walk.type("label", "walk analyst")
    d.find_element(By.ID, "scope-some").click()
    d.find_element(By.CSS_SELECTOR, f"input[name=datasets][value={dataset_id}]").click()
    walk.click("create-key")
    token = d.find_element(By.ID, "new-token").text
    assert token.startswith("pr_")
    row = next(r for r in walk.rows("keys") if r[2] == "walk analyst")
    key_id = row[0]
    assert row[1] == "analyst" and row[3] == dataset_id
    walk.shot("operator-keys")
    walk.goto(f"/console/datasets/{dataset_id}")                        # 4. budget
    d.find_element(By.CSS_SELECTOR, "input[name='cap.epsilon']").send_keys("3")
    for measure in ("epsilon", "interval_leakage:income"):  # leakage is per column
        walk.choose("alloc-key", value=key_id)
        walk.choose("alloc-measure", text=measure)
        walk.type("alloc-cap", "1")
        walk.click("set-budget")
        assert walk.absent("problem")
    caps = {r[0]: r[1] for r in walk.rows("budget")}
    assert caps["epsilon"] == "3.0" and caps["interval_leakage:income"] == "1.0", caps
    assert sorted((r[0], r[1], r[2]) for r in walk.rows("allocations")) == [
        (key_id, "epsilon", "1.0"), (key_id, "interval_leakage:income", "1.0")]
    walk.scroll_to("budget")  # the tables under their heading
    walk.shot("operator-budget-form")

    # analyst guide, step by step, with the key the operator made
    guide = walk.guide("guides/analyst", ROLES["analyst"][0])
    _says(guide, "In the console, step by step", "lists only the datasets the key is granted",
          "whether it fits the remaining budget", "Nothing is spent",
          "accuracy sentence first", "npmle", "Run analysis")
    chromium.sign_in(d, url, token)                                     # 1. sign in
    assert [r[0] for r in walk.rows("datasets")] == [dataset_id]
    assert walk.absent("upload-form")
    walk.goto("/console/mechanisms/laplace")                            # 2. estimate
    walk.choose("dataset_id", value=dataset_id)
    walk.choose("p.statistic", text="count")
    walk.type("p.group_by", "group")
    walk.type("b.epsilon", "0.5")
    walk.click("estimate-button")
    assert "Fits the remaining budget." in d.find_element(By.ID, "estimate").text
    said = d.find_element(By.ID, "estimate-sentence").text
    assert said.startswith("Expected accuracy: With probability at least 95%, each of the 3"
                           " noisy cells is within ±"), said
    walk.shot("analyst-estimate")
    walk.click("request-button")                                        # 3. request
    chromium.until_text(d, "status", "succeeded")
    sentence, plot = d.find_element(By.ID, "accuracy-sentence"), d.find_element(By.ID, "plot")
    assert sentence.text.startswith("Accuracy:") and "±" in sentence.text
    assert sentence.location["y"] < plot.location["y"]
    assert sorted(r[0] for r in walk.rows("result-table")) == ["a", "b", "c"]
    walk.shot("analyst-release")
    walk.goto("/console/mechanisms/interval.case1")                    # 4. analyse
    walk.choose("dataset_id", value=dataset_id)
    walk.type("p.column", "income")
    walk.type("p.anchors", '{"family": "uniform", "low": 0, "high": 1000}')
    walk.type("b.interval_leakage", "0.5")
    walk.click("request-button")
    chromium.until_text(d, "status", "succeeded", timeout=60)
    walk.choose("analysis", text="npmle")
    walk.click("run-analysis")
    chromium.until_text(d, "status", "succeeded", timeout=60)
    assert d.find_element(By.ID, "result").text and d.find_element(By.ID, "plot")
    walk.shot("analyst-analysis")

    # service guide: what the console shows of a service's releases
    guide = walk.guide("guides/service", ROLES["consumer / internal service"][0])
    _says(guide, "What the console shows", "only mine", "reloads itself until it ends",
          "409 budget_exhausted", "the amount requested and what remains", "Does not fit")
    # the service's own release, over HTTP as a service makes it
    body: dict[str, Any] = {"dataset_id": dataset_id, "mechanism": "laplace",
                            "params": {"statistic": "mean", "column": "income"},
                            "budget": {"epsilon": 0.25}}
    made = requests.post(url + "/v1/releases", json=body, timeout=30, headers={
        "Authorization": f"Bearer {token}", "Idempotency-Key": "walk-service-1"})
    assert made.status_code == 202, made.text
    release_id = made.json()["id"]
    walk.goto("/console/releases")                                     # 1. its releases
    d.find_element(By.ID, "only-mine").click()
    listed = {r[0]: r for r in walk.rows("releases")}
    assert len(listed) == 3 and release_id in listed
    walk.shot("service-releases")
    d.find_element(By.LINK_TEXT, release_id).click()                    # 2. a status
    chromium.until_text(d, "status", "succeeded")
    assert "epsilon 0.25" in d.find_element(By.TAG_NAME, "main").text
    assert d.find_element(By.ID, "guarantee").text
    walk.shot("service-status")
    walk.goto("/console/mechanisms/laplace")                            # 3. exhausted
    walk.choose("dataset_id", value=dataset_id)
    walk.choose("p.statistic", text="mean")
    walk.type("p.column", "income")
    walk.type("b.epsilon", "0.5")  # 0.25 of the key's 1 is left
    walk.click("estimate-button")
    assert "Does not fit the remaining budget." in d.find_element(By.ID, "estimate").text
    assert ["epsilon", "0.5", "0.25", "0.25"] in walk.rows("estimate")
    walk.click("request-button")
    assert d.find_element(By.ID, "problem").text == (
        "not enough of your allocation of epsilon budget left"
        " epsilon: requested 0.5, remaining 0.25")
    spent = manual_service.call("GET", f"/v1/datasets/{dataset_id}/budget").json()
    assert spent["allocations"][key_id]["epsilon"]["committed"] == 0.75  # nothing more
    walk.shot("service-refused")

    # back to the operator guide: the budget spent, and the audit log
    walk.guide("guides/operator", ROLES["operator"][0])
    chromium.sign_in(d, url, TOKEN)
    walk.goto(f"/console/datasets/{dataset_id}")                        # 5. the budget
    committed = {r[0]: r[2] for r in walk.rows("budget")}
    assert committed["epsilon"] == "0.75"  # the analyst's 0.5 and the service's 0.25
    assert 0 < float(committed["interval_leakage:income"]) <= 0.5  # its bound, at most asked
    chart = d.find_element(By.ID, "budget-chart")
    walk.scroll_to("budget-chart")  # the chart under "Over time"
    walk.shot("operator-budget")
    assert d.execute_script("return arguments[0].naturalWidth", chart) > 100
    d.find_element(By.ID, "audit-link").click()                          # 6. the audit log
    kinds = {r[1].split(" ")[0] for r in walk.rows("events")}
    assert {"cap", "allocation", "reserve", "commit"} <= kinds, kinds
    walk.shot("operator-audit")

    assert walk.taken == list(WALK_SHOTS)
