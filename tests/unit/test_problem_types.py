"""Every problem code the source raises has a description (``/problems/<code>``): a code
added without one fails here, so no problem document's ``type`` is a generic page."""

from __future__ import annotations

import re
from pathlib import Path

from service.api.problem_types import PROBLEM_TYPES, WARNING_TYPES
from service.api.problems import _CODES

ROOT = Path(__file__).resolve().parents[2]
#: how codes are written where they are raised: ``code="x"``, a class's ``code = "x"`` or
#: ``default_code = "x"``, ``SomeError(409, "x"`` / ``problem(503, "x"``, ``"code": "x"``,
#: and ``VersionError(status, message, "x")``'s third argument
WRITTEN = [re.compile(r'(?:\bcode\s*=\s*|default_code\s*=\s*|Error\(\d{3}, |problem\(\d{3}, |'
                      r'"code": )"([a-z][a-z_]+)"'),
           re.compile(r'VersionError\(\d{3},[^)]*?,\s*"([a-z][a-z_]+)"', re.S)]
NOT_CODES = {"dataset_id", "version", "versions", "current_version"}  # fields, not codes


def _raised() -> set[str]:
    found: set[str] = set()
    for folder in ("service", "mechanisms"):
        for path in (ROOT / folder).rglob("*.py"):
            text = path.read_text()
            for pattern in WRITTEN:
                found |= set(pattern.findall(text))
    return found - NOT_CODES


def test_the_scan_finds_codes_of_each_form() -> None:
    raised = _raised()
    assert {"budget_exhausted", "memory_limit", "source_changed", "version_conflict",
            "storage_unavailable", "policy_violation", "csrf"} <= raised


def test_every_raised_code_is_described() -> None:
    described = set(PROBLEM_TYPES) | set(WARNING_TYPES)
    missing = sorted((_raised() | set(_CODES.values())) - described)
    assert not missing, f"problem codes without a description: {missing}"
