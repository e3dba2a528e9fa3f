"""``/docs`` renders without the internet (issue #18 §2).

The page used to load Swagger UI from a CDN and was blank offline. Now its assets come
from an installed package and are served by the app: the HTML names only local URLs,
each answers with its content type, and a real headless Chromium whose every request
off this machine fails (a dead proxy for everything but loopback, and no name but
localhost resolves) renders the operation list from ``/openapi.json``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait

from service.api import apidocs
from tests.e2e import chromium
from tests.integration.liveserver import serve

#: how Chromium says a page off this machine could not be reached
OFFLINE = r"ERR_PROXY_CONNECTION_FAILED|ERR_NAME_NOT_RESOLVED"
CONTENT_TYPES = {".js": {"text/javascript", "application/javascript"}, ".css": {"text/css"},
                 ".png": {"image/png"}, ".json": {"application/json"}}


class _Urls(HTMLParser):
    """Every ``src``/``href`` of the page, and the spec URL its script loads."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []
        self.script = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.urls += [v for k, v in attrs if k in {"src", "href"} and v]

    def handle_data(self, data: str) -> None:
        self.script += data


def _page_urls(html: str) -> list[str]:
    parser = _Urls()
    parser.feed(html)
    spec_url = re.search(r'url:\s*"([^"]*)"', parser.script)
    assert spec_url, "the page's script names no spec url"
    return [*parser.urls, spec_url.group(1)]


def test_docs_page_names_only_local_assets_and_each_is_served(app: Flask) -> None:
    """Catches the CDN URL (or any other host) coming back into the page, and an asset
    the page names that the app does not serve (a blank page offline)."""
    client = app.test_client()
    page = client.get("/docs")
    assert page.status_code == 200 and page.mimetype == "text/html"
    urls = _page_urls(page.get_data(as_text=True))
    assert {apidocs.ASSETS_URL + "swagger-ui-bundle.js", apidocs.ASSETS_URL + "swagger-ui.css",
            "/openapi.json"} <= set(urls)
    for url in urls:
        assert url.startswith("/") and not url.startswith("//"), f"non-local URL {url!r}"
        resp = client.get(url)
        assert resp.status_code == 200, url
        assert resp.mimetype in CONTENT_TYPES[Path(url).suffix], (url, resp.mimetype)
        assert len(resp.get_data()) > 100, url
    for name in apidocs.ASSETS:  # every file the route offers is in the package
        assert client.get(apidocs.ASSETS_URL + name).status_code == 200, name
    # only Swagger UI's files: no path outside the package directory
    assert client.get(apidocs.ASSETS_URL + "..%2FLICENSE").status_code == 404
    assert client.get(apidocs.ASSETS_URL + "VERSION").status_code == 404


@pytest.fixture(scope="module")
def live_url(app: Flask) -> Iterator[str]:
    with serve(app) as url:
        yield url


def offline_chromium() -> webdriver.Chrome:
    """Debian's headless Chromium that can reach nothing but this machine's loopback:
    every request off loopback goes to a dead proxy, and no host name but localhost
    resolves."""
    return chromium.start(None, height=1600, extra=(
        "--proxy-server=http://127.0.0.1:9",
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1"))


def test_docs_render_offline_in_headless_chromium(live_url: str, worker: Any) -> None:
    """Catches a blank /docs offline: Swagger UI must load from the app and render the
    operations of /openapi.json, with no request leaving the machine."""
    browser = offline_chromium()
    try:
        browser.set_page_load_timeout(30)
        # the browser is offline indeed: a page off this machine does not load
        with pytest.raises(WebDriverException, match=OFFLINE):
            browser.get("http://example.com/")
        browser.get(live_url + "/docs")
        wait = WebDriverWait(browser, 30)
        create = wait.until(expected_conditions.presence_of_element_located(
            (By.ID, "operations-releases-releases_create")))
        assert "/v1/releases" in create.text and "POST" in create.text
        ids = {e.get_attribute("id") for e in browser.find_elements(
            By.CSS_SELECTOR, "[id^=operations-]")}
        assert {"operations-datasets-datasets_upload",
                "operations-releases-releases_estimate"} <= ids
        loaded = json.loads(browser.execute_script(
            "return JSON.stringify(performance.getEntriesByType('resource')"
            ".map(e => e.name))"))
        assert any(u.endswith("swagger-ui-bundle.js") for u in loaded)
        assert all(u.startswith(live_url + "/") for u in loaded), loaded
    finally:
        browser.quit()
