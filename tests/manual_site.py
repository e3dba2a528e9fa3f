"""The manual (mkdocs.yml, docs/) for tests: its strict build, its pages and their blocks."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import ROOT

DOCS = ROOT / "docs"
#: the line before a fenced block that a test runs, and the start of one that says why not
RUN_MARK = "<!-- run by tests/e2e/test_manual_blocks.py -->"
NOT_RUN = re.compile(r"<!-- not run: (.+) -->")
#: fenced blocks a reader would paste into a shell or Python
RUNNABLE = {"sh", "bash", "shell", "console", "python", "py", "pycon"}
#: every screenshot the manual shows, relative to docs/, in the order
#: tests/e2e/test_manual_browser.py takes them, with the page that shows it; the walk is their
#: only source (docs/bench's plots come from the benchmarks)
WALK_SHOTS = {
    "walk/manual-home.png": "index.md",
    "walk/manual-operator-guide.png": "index.md",
    "walk/operator-dataset.png": "guides/operator.md",
    "walk/operator-keys.png": "guides/operator.md",
    "walk/operator-budget-form.png": "guides/operator.md",
    "walk/analyst-estimate.png": "guides/analyst.md",
    "walk/analyst-release.png": "guides/analyst.md",
    "walk/analyst-analysis.png": "guides/analyst.md",
    "walk/service-releases.png": "guides/service.md",
    "walk/service-status.png": "guides/service.md",
    "walk/service-refused.png": "guides/service.md",
    "walk/operator-budget.png": "guides/operator.md",
    "walk/operator-audit.png": "guides/operator.md",
}
#: pictures drawn by something else than the walk
NOT_WALKED = ("bench/",)
_IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)|<img\b[^>]*\bsrc=[\"']([^\"']+)")


def build(dest: Path, config: Path = ROOT / "mkdocs.yml") -> subprocess.CompletedProcess[str]:
    """``mkdocs build --strict`` of ``config`` into ``dest`` (as ``make docs`` does)."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                           "-f", str(config), "-d", str(dest)],
                          cwd=config.parent, env=env, capture_output=True, text=True,
                          timeout=300)


@dataclass(frozen=True)
class Block:
    page: str  # relative to docs/
    line: int  # of the opening fence, from 1
    lang: str
    mark: str  # the line before the fence, stripped
    body: str


def blocks(page: str | None = None) -> list[Block]:
    """The fenced code blocks of every page (or one), in order."""
    found = []
    for path in sorted(DOCS.rglob("*.md")) if page is None else [DOCS / page]:
        lines = path.read_text().split("\n")
        i = 0
        while i < len(lines):
            m = re.match(r"^(\s*)```(\w*)", lines[i])
            if m is None:
                i += 1
                continue
            indent, start = m.group(1), i
            end = next(j for j in range(i + 1, len(lines))
                       if lines[j].strip() == "```" and lines[j].startswith(indent))
            body = "\n".join(line[len(indent):] for line in lines[start + 1:end]) + "\n"
            mark = lines[start - 1].strip() if start else ""
            found.append(Block(str(path.relative_to(DOCS)), start + 1, m.group(2), mark, body))
            i = end + 1
    return found


def images() -> dict[str, set[str]]:
    """Every image a page embeds (Markdown or ``<img>``), relative to docs/, with the
    pages that embed it."""
    found: dict[str, set[str]] = {}
    for path in sorted(DOCS.rglob("*.md")):
        page = path.relative_to(DOCS)
        for m in _IMAGE.finditer(path.read_text()):
            target = (page.parent / (m.group(1) or m.group(2))).as_posix()
            found.setdefault(os.path.normpath(target), set()).add(str(page))
    return found


def run_blocks(page: str) -> list[Block]:
    """The blocks of ``page`` marked as run by a test, in order."""
    return [b for b in blocks(page) if b.mark == RUN_MARK]
