"""One `privrelease standalone` per test module, stopped at the module's end."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.harness import Service


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder the module's service may read Parquet from by reference (its
    ``PRIVRELEASE_SOURCE_ROOTS``), so the CLI and the console can register from it."""
    return tmp_path_factory.mktemp("sources")


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory, sources: Path) -> Iterator[Service]:
    svc = Service(tmp_path_factory.mktemp("standalone"),
                  env={"PRIVRELEASE_SOURCE_ROOTS": sources.as_uri()})
    svc.start()
    yield svc
    if svc.proc and svc.proc.poll() is None:
        svc.stop()
