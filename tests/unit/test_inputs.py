"""Request-body guards: JSON nesting depth, judged before any recursive parser runs."""

from __future__ import annotations

import json
import time

import pytest

from service.api.inputs import MAX_JSON_DEPTH, too_deep


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("depth", [0, 1, MAX_JSON_DEPTH])
def test_depth_up_to_the_limit_is_accepted(depth: int) -> None:
    assert not too_deep(_nested(depth))
    assert not too_deep(json.dumps({"a": {"b": [1, [2, {"c": "x"}]]}}))


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 100_000])
def test_deeper_is_refused(depth: int) -> None:
    assert too_deep(_nested(depth))
    assert too_deep('{"a": ' * depth + "1" + "}" * depth)


def test_brackets_inside_strings_do_not_count() -> None:
    inside = json.dumps({"s": "[" * 1000, "t": 'a\\"[[[' * 100, "u": ["{{{"]})
    assert not too_deep(inside)
    assert not too_deep(inside.encode())
    assert too_deep('["\\"", ' + _nested(MAX_JSON_DEPTH) + "]")  # an escaped quote ends no string


@pytest.mark.parametrize("body", [
    b'"\\' * 1_000_000,  # a string that never ends, full of escapes
    b'"' * 2_000_000,
    b'"a\\"[' * 400_000,
    b"[" * 2_000_000,
])
def test_hostile_bodies_are_judged_in_linear_time(body: bytes) -> None:
    start = time.perf_counter()
    too_deep(body)
    assert time.perf_counter() - start < 2.0
