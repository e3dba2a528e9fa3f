"""The statistical privacy audit: the harness's statistics and families, and every
mechanism's audit entry at ``size="ci"``.

Everything under ``tests/audit`` carries the ``audit`` marker. ``make test`` (CI) runs it
with the rest of the suite; ``make check`` leaves it out (it is most of the unit-level time).
"""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.audit)
