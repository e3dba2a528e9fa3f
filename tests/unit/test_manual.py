"""The manual (issue #31 item 7): a strict MkDocs build that loads nothing from outside,
every shell or Python block either run by a test or marked with why not, and a README
whose links land in it."""

from __future__ import annotations

import re
import shutil
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from service.api.manual import script_hashes
from tests.conftest import ROOT
from tests.manual_site import (
    DOCS,
    NOT_RUN,
    NOT_WALKED,
    RUN_MARK,
    RUNNABLE,
    WALK_SHOTS,
    blocks,
    build,
    images,
)

#: links out of the site a reader may follow (none is loaded by a page)
OUTSIDE_LINKS = {"schemathesis.readthedocs.io"}
#: hosts of the service's own examples (`http://127.0.0.1:8000/console`)
OWN_HOSTS = {"127.0.0.1", "localhost", "host[:port]"}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("manual") / "site"
    done = build(dest)
    assert done.returncode == 0, done.stderr + done.stdout
    return dest


def _nav_pages(nav: list) -> list[str]:
    pages: list[str] = []
    for entry in nav:
        for value in entry.values() if isinstance(entry, dict) else [entry]:
            pages.extend(_nav_pages(value) if isinstance(value, list) else [value])
    return pages


def test_the_strict_build_makes_every_page(site: Path) -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert config["strict"] is True
    pages = _nav_pages(config["nav"])
    assert sorted(pages) == sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    for page in pages:
        assert (site / page).with_suffix(".html").is_file(), page
    # the assets the pages embed came along
    assert (site / "bench" / "dataplane.png").is_file()
    assert (site / "walk" / "analyst-estimate.png").is_file()


def test_every_picture_is_one_the_guide_walk_takes() -> None:
    """The manual's screenshots can only come from tests/e2e/test_manual_browser.py: every
    image a page embeds (but the benchmarks' plots) is one the walk saves, shown on the
    page of the guide whose step takes it, and every one the walk saves is shown; no
    other picture lies in docs/."""
    embedded = {img: pages for img, pages in images().items()
                if not img.startswith(NOT_WALKED)}
    assert embedded == {img: {page} for img, page in WALK_SHOTS.items()}
    on_disk = {str(p.relative_to(DOCS)) for suffix in ("png", "jpg", "jpeg", "gif", "svg", "webp")
               for p in DOCS.rglob(f"*.{suffix}")}
    assert {p for p in on_disk if not p.startswith(NOT_WALKED)} == set(WALK_SHOTS)
    for img in WALK_SHOTS:  # a real PNG, not an empty file
        data = (DOCS / img).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 10_000, img


def test_a_broken_link_fails_the_strict_build(tmp_path: Path) -> None:
    """--strict is on for real: an anchor that is nowhere fails the build."""
    shutil.copytree(DOCS, tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    page = tmp_path / "docs" / "concepts.md"
    page.write_text(page.read_text() + "\nSee [nowhere](guarantees.md#no-such-heading).\n")
    done = build(tmp_path / "site", tmp_path / "mkdocs.yml")
    assert done.returncode != 0
    assert "no-such-heading" in done.stdout + done.stderr


class _Requests(HTMLParser):
    """What a page makes the browser load (src, stylesheets, icons, inline CSS url()) and
    where its links go."""

    def __init__(self) -> None:
        super().__init__()
        self.loads: list[str] = []
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        for name in ("src", "srcset", "poster", "data"):
            if name in a:
                self.loads.append(a[name])
        if tag == "link" and a.get("rel") not in {"canonical", "prev", "next"}:
            self.loads.append(a.get("href", ""))
        elif tag == "a" and "href" in a:
            self.links.append(a["href"])
        self.loads.extend(re.findall(r"url\(['\"]?([^'\")]+)", a.get("style", "")))


def _outside(url: str) -> bool:
    return urlsplit(url.strip()).scheme in {"http", "https"} or url.strip().startswith("//")


def test_the_site_loads_nothing_from_outside(site: Path) -> None:
    pages = list(site.rglob("*.html"))
    assert len(pages) > 15
    for page in pages:
        html = page.read_text()
        parsed = _Requests()
        parsed.feed(html)
        assert parsed.loads, page
        assert [u for u in parsed.loads if _outside(u)] == [], page
        for link in parsed.links:
            if _outside(link):
                host = urlsplit(link).netloc
                assert host in OUTSIDE_LINKS | OWN_HOSTS or host.split(":")[0] in OWN_HOSTS, \
                    (page, link)
        assert "fonts.googleapis" not in html and "fonts.gstatic" not in html
        # the theme loads mermaid from a CDN only for a mermaid block: there is none
        assert 'class="mermaid"' not in html
    for sheet in site.rglob("*.css"):
        css = sheet.read_text()
        urls = re.findall(r"url\(\s*['\"]?([^'\")]+)", css) + re.findall(
            r"@import\s+['\"]([^'\"]+)", css)
        assert [u for u in urls if _outside(u)] == [], sheet
    # nor does the theme ask a forge for a repository's stars
    assert "repo_url" not in yaml.safe_load((ROOT / "mkdocs.yml").read_text())


def test_every_shell_and_python_block_is_run_or_says_why_not() -> None:
    runnable = [b for b in blocks() if b.lang in RUNNABLE]
    assert len(runnable) >= 10
    unmarked = [f"{b.page}:{b.line}" for b in runnable
                if b.mark != RUN_MARK and NOT_RUN.fullmatch(b.mark) is None]
    assert unmarked == []
    for b in runnable:
        if (found := NOT_RUN.fullmatch(b.mark)) is not None:
            reason = found.group(1)
            assert len(reason) > 20, (b.page, b.line)
            # a test named as running the commands instead exists
            for named in re.findall(r"tests/[\w/]+\.py", reason):
                assert (ROOT / named).is_file(), (b.page, named)
    run = {(b.page, b.lang) for b in runnable if b.mark == RUN_MARK}
    # the blocks tests/e2e/test_manual_blocks.py runs (each role's guide has one)
    assert run == {("guides/quickstart.md", "sh"), ("guides/operator.md", "sh"),
                   ("guides/analyst.md", "python"), ("reference/api.md", "bash")}


def test_the_readme_is_short_and_its_links_land() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 80
    assert "make run" in readme and "make test" in readme
    for role in ("operator", "analyst", "consumer"):
        assert role in readme
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme)
    assert len(targets) >= 10
    for target in targets:
        assert (ROOT / target).exists(), target


def test_every_readme_section_of_before_landed_in_a_page() -> None:
    """The headings the README had before the move (issue #31 item 7) are in the manual."""
    headings: set[str] = set()
    for page in DOCS.rglob("*.md"):
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        headings.update(h.strip() for h in re.findall(r"^#{1,6} (.+)$", text, re.M))
    for heading in ("Quick start", "What the API guarantees", "Mechanisms",
                    "Exact integer noise", "The adversarial audit", "Running it",
                    "Configuration", "Access control", "Privacy notions per dataset",
                    "Release outputs and analyses", "Jobs and notifications", "Web console",
                    "Python client (notebooks and scripts)", "Command line",
                    "Dataset metadata", "DIP parameters", "Tests", "Benchmarks",
                    "ICLP accuracy", "Failover (PostgreSQL)"):
        assert heading in headings, heading


def test_inline_scripts_are_hashed_as_browsers_hash_them() -> None:
    html = ('<script src="a.js"></script><script>var a=1</script>'
            '<script id="__config" type="application/json">{}</script>')
    # sha256 of the UTF-8 bytes of "var a=1", base64 (CSP Level 2)
    assert script_hashes(html) == ["'sha256-WazVQOu5lmXfSreSrMJd1CsaQ4c00fUQpJfBYCuMSIw='"]
