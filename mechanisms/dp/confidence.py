"""Per-entry or simultaneous intervals for releases of many numbers (tables, matrices).

A cross-tab's or a covariance matrix's interval for each entry holds with probability at
least 95 % on its own; all of them at once hold much less often (12 cells: at least
0.95^12 ≈ 54 %). Both are honest if the statement says which. ``simultaneous`` asks for
intervals that hold for every entry at once: each entry's at level ``level^(1/k)``
(Šidák). That is exact here, not a bound: each entry gets its own independent noise draw
(``VectorNoise.sample`` draws i.i.d. per coordinate) and a deterministic error bound, so
P(all k hold) = ∏ P(each holds) ≥ (level^(1/k))^k = level.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from marshmallow import Schema, fields, validate

LEVEL = 0.95


class ConfidenceSchema(Schema):
    """``{"level": 0.95, "simultaneous": false}``: the intervals a table states."""

    level = fields.Float(load_default=LEVEL, allow_nan=False,
                         validate=validate.Range(min=0.5, max=0.999), metadata={
                             "description": "the coverage of each interval (per entry), or "
                                            "of all at once (simultaneous)"})
    simultaneous = fields.Boolean(load_default=False, metadata={
        "description": "intervals that hold for every cell or entry at once (Šidák) rather "
                       "than each on its own"})


@dataclass(frozen=True)
class Confidence:
    level: float = LEVEL
    simultaneous: bool = False

    def per_entry(self, entries: int) -> float:
        """The level each of ``entries`` intervals is computed at."""
        if not self.simultaneous or entries <= 1:
            return self.level
        return float(self.level ** (1.0 / entries))

    def document(self, entries: int) -> dict[str, Any]:
        """The ``confidence`` block of an accuracy statement."""
        joint = self.level if self.simultaneous else self.level ** entries
        return {"level": self.level, "simultaneous": self.simultaneous,
                "per_entry_level": self.per_entry(entries),
                "all_entries_at_least": joint}

    def joint(self, entries: int, noun: str = "entry") -> str:
        """How a statement says which intervals it gives, after naming one entry's."""
        if self.simultaneous or entries <= 1:
            return ""
        return (f"; these are per-{noun} intervals: all {entries} hold together with"
                f" probability at least {percent(self.level ** entries)} (ask \"confidence\":"
                " {\"simultaneous\": true} for intervals that hold at once)")


def percent(p: float) -> str:
    """``p`` as a percentage rounded down (a floor stays true after "at least")."""
    return f"{math.floor(p * 1000) / 10:g}%"


def read(params: Mapping[str, Any]) -> Confidence:
    """The request's confidence (the schema has filled the defaults)."""
    raw = params.get("confidence")
    if not isinstance(raw, Mapping):
        return Confidence()
    return Confidence(float(raw.get("level", LEVEL)), bool(raw.get("simultaneous", False)))
