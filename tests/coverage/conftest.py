"""The long coverage run (``coverage_full``) is left out unless ``-m`` names it."""

from __future__ import annotations

import pytest

MARKER = "coverage_full"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect ``coverage_full`` tests unless the marker expression asks for them: CI and
    ``make check`` run the small cases, ``make audit`` selects the long run by its marker."""
    if MARKER in (config.getoption("markexpr") or ""):
        return
    kept = [item for item in items if item.get_closest_marker(MARKER) is None]
    if len(kept) < len(items):
        config.hook.pytest_deselected(items=[i for i in items if i not in kept])
        items[:] = kept
