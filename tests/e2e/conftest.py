"""One `privrelease standalone` per test module, stopped at the module's end."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.harness import Service


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    svc = Service(tmp_path_factory.mktemp("standalone"))
    svc.start()
    yield svc
    if svc.proc and svc.proc.poll() is None:
        svc.stop()
