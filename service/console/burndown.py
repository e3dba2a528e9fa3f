"""A dataset's budget over time, replayed from its audit stream.

The ledger keeps only the current balance; the stream records every change to it
(``service/storage/lua``): ``cap`` sets a dataset cap (``allocation`` events, a key's cap, are
skipped here), ``reserve`` holds a cost, ``commit`` moves what was
held to committed (a failed job that read the data is charged too), ``abort`` and
``cancel`` refund what was held. Replaying them in order gives, after each event, the
same cap, committed and reserved the ledger had then, in exact integer units.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from service import budget


@dataclass
class Series:
    """One measure's steps: after event ``i`` at ``times[i]``, these units held."""

    times: list[str] = field(default_factory=list)
    cap: list[int] = field(default_factory=list)
    committed: list[int] = field(default_factory=list)
    reserved: list[int] = field(default_factory=list)

    def display(self, measure: str) -> dict[str, list[float]]:
        """The steps in the API's display amounts (ε, δ, ...)."""
        return {name: [budget.display(measure, u) for u in getattr(self, name)]
                for name in ("cap", "committed", "reserved")}


def replay(events: Iterable[Mapping[str, Any]]) -> dict[str, Series]:
    """Per measure, cap/committed/reserved after every event that changed it."""
    state: dict[str, dict[str, int]] = {}
    out: dict[str, Series] = {}
    for event in events:
        kind = event.get("kind")
        units: Mapping[str, int] = event.get("units") or {}
        if kind not in {"cap", "reserve", "commit", "abort", "cancel"}:
            continue
        for measure, u in units.items():
            row = state.setdefault(measure, {"cap": 0, "committed": 0, "reserved": 0})
            if kind == "cap":
                row["cap"] = int(u)
            elif kind == "reserve":
                row["reserved"] += int(u)
            elif kind == "commit":
                row["reserved"] -= int(u)
                row["committed"] += int(u)
            else:  # abort, cancel: refunded
                row["reserved"] -= int(u)
            series = out.setdefault(measure, Series())
            series.times.append(str(event.get("at", "")))
            series.cap.append(row["cap"])
            series.committed.append(row["committed"])
            series.reserved.append(row["reserved"])
    return out
