"""``/manual/``: the built manual served by the app, read-only and without a key."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from flask import Flask

from service.api.manual import manual_dir, script_hashes
from tests.conftest import ROOT
from tests.manual_site import build


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("manual") / "site"
    done = build(dest)
    assert done.returncode == 0, done.stderr
    return dest


def test_the_manual_is_served_without_a_key(app: Flask, site: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(app.config, "PRIVRELEASE_MANUAL_DIR", str(site))
    client = app.test_client()
    index = client.get("/manual/")
    assert index.status_code == 200 and index.mimetype == "text/html"
    html = index.get_data(as_text=True)
    assert "Who does what" in html
    csp = index.headers["Content-Security-Policy"]
    assert "script-src 'self' 'sha256-" in csp and "frame-ancestors 'none'" in csp
    assert "unsafe-inline" not in csp
    for source in script_hashes(html):  # every inline script of the page may run, no other
        assert source in csp
    assert index.headers["X-Content-Type-Options"] == "nosniff"
    assert client.get("/manual").status_code == 308
    assert client.get("/manual").headers["Location"].endswith("/manual/")
    guide = client.get("/manual/guides/operator.html")
    assert guide.status_code == 200 and "register and budget" in guide.get_data(as_text=True)
    shot = client.get("/manual/walk/analyst-estimate.png")
    assert shot.status_code == 200 and shot.mimetype == "image/png"
    css = next(site.glob("assets/stylesheets/main.*.css")).name
    assert client.get(f"/manual/assets/stylesheets/{css}").status_code == 200
    # read-only, and nothing outside the folder
    assert client.post("/manual/").status_code == 405
    for path in ("/manual/no-such-page.html", "/manual/../pyproject.toml",
                 "/manual/%2e%2e/pyproject.toml"):
        assert client.get(path).status_code == 404, path
    # GET / points to it
    assert client.get("/", headers={"Accept": "application/json"}).get_json()[
        "links"]["manual"] == "/manual/"


def test_an_unbuilt_manual_says_how_to_build_it(app: Flask, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(app.config, "PRIVRELEASE_MANUAL_DIR", str(tmp_path / "site"))
    for path in ("/manual/", "/manual/concepts.html"):
        answer = app.test_client().get(path)
        assert answer.status_code == 404
        assert re.search(r"not built: run `make docs`", answer.get_json()["detail"]), path


def test_the_manual_is_looked_for_where_make_docs_builds_it(
        app: Flask, monkeypatch: pytest.MonkeyPatch) -> None:
    """mkdocs.yml's site_dir, at the root of the checkout, unless configured."""
    monkeypatch.delitem(app.config, "PRIVRELEASE_MANUAL_DIR", raising=False)
    monkeypatch.delenv("PRIVRELEASE_MANUAL_DIR", raising=False)
    site_dir = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["site_dir"]
    assert manual_dir(app) == ROOT / site_dir
    monkeypatch.setenv("PRIVRELEASE_MANUAL_DIR", "/srv/manual")
    assert manual_dir(app) == Path("/srv/manual")
