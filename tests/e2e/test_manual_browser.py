"""The manual at ``/manual/`` in a real headless Chromium against a live
`privrelease standalone`: the theme's scripts run under the page's CSP (no violation), the
pages load nothing from outside the service, search works offline, and each role's guide
is reached from the home page's table of roles and leads on to the console and the API.

Set PRIVRELEASE_MANUAL_SCREENSHOTS=docs/manual to also write the screenshots the manual's
home page embeds.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from tests.e2e import chromium
from tests.e2e.harness import TOKEN, Service
from tests.manual_site import build

SHOTS = os.environ.get("PRIVRELEASE_MANUAL_SCREENSHOTS")
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


def _shot(driver: WebDriver, name: str) -> None:
    chromium.shot(driver, SHOTS, name)


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
    _shot(d, "home")
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
        if role == "operator":
            _shot(d, "operator-guide")

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
