"""A dataset's budget over time, replayed from its audit stream.

The ledger keeps only the current balance; the stream records every change to it
(``service/storage/lua``, the steps of ``service.storage.pg_ledger``): ``cap`` sets a
dataset cap (``allocation`` events, a key's cap, are skipped here), ``reserve`` holds a
cost, ``commit`` moves what was held to committed (a failed job that read the data is
charged too), ``abort`` and ``cancel`` refund what was held, and a ``policy`` event with
units (the one-time interval recharge) adds them to committed. Replaying them in order
gives, after each event, the same cap, committed and reserved the ledger had then, in
exact integer units.

A chart reads a bounded window, the newest events (``Store.budget_window``): what held
before it is the ledger's balance now with the window's events undone, and the caps the
``cap`` events before it set (``replay_window``), so a long history costs what a short
one does, and the window's steps are those a replay of the whole history gives.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from service import budget
from service.storage.store import BudgetWindow

#: per event kind that moves units, its (committed, reserved) change per unit; ``cap``
#: sets the cap instead
MOVES: dict[str, tuple[int, int]] = {"reserve": (0, 1), "commit": (1, -1), "abort": (0, -1),
                                     "cancel": (0, -1), "policy": (1, 0)}


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

    def add(self, at: str, row: Mapping[str, int]) -> None:
        self.times.append(at)
        self.cap.append(row["cap"])
        self.committed.append(row["committed"])
        self.reserved.append(row["reserved"])


def _zero() -> dict[str, int]:
    return {"cap": 0, "committed": 0, "reserved": 0}


def _moves(event: Mapping[str, Any]) -> Iterable[tuple[str, int]]:
    """(measure, units) of an event that changes the chart (none for the other kinds)."""
    if event.get("kind") not in {"cap", *MOVES}:
        return []
    units: Mapping[str, int] = event.get("units") or {}
    return [(measure, int(u)) for measure, u in units.items()]


def replay(events: Iterable[Mapping[str, Any]],
           start: Mapping[str, Mapping[str, int]] | None = None,
           start_at: str = "") -> dict[str, Series]:
    """Per measure, cap/committed/reserved after every event that changed it; from
    ``start`` (per measure, what held at ``start_at``: each its first step) if given,
    else from nothing."""
    state = {measure: dict(row) for measure, row in (start or {}).items()}
    out: dict[str, Series] = {}
    for measure, row in sorted(state.items()):
        out.setdefault(measure, Series()).add(start_at, row)
    for event in events:
        kind = event.get("kind")
        for measure, u in _moves(event):
            row = state.setdefault(measure, _zero())
            if kind == "cap":
                row["cap"] = u
            else:
                committed, reserved = MOVES[str(kind)]
                row["committed"] += committed * u
                row["reserved"] += reserved * u
            out.setdefault(measure, Series()).add(str(event.get("at", "")), row)
    return out


def window_start(window: BudgetWindow) -> dict[str, dict[str, int]]:
    """What held before the window's first event: per measure, the cap its ``cap``
    events last set before the window, and the committed and reserved units of the
    balance with every event of the window undone."""
    state = {measure: {"cap": window.caps.get(measure, 0), "committed": row["committed"],
                       "reserved": row["reserved"]}
             for measure, row in window.balance.items()}
    for measure, cap in window.caps.items():
        state.setdefault(measure, _zero())["cap"] = cap
    for event in reversed(window.events):
        if event.get("kind") == "cap":
            continue
        for measure, u in _moves(event):
            committed, reserved = MOVES[str(event.get("kind"))]
            row = state.setdefault(measure, _zero())
            row["committed"] -= committed * u
            row["reserved"] -= reserved * u
    return state


def replay_window(window: BudgetWindow) -> dict[str, Series]:
    """``replay`` of a ``Store.budget_window``: the whole history when it is complete,
    otherwise its events from what held before them (``window_start``), the first step
    at the time of the newest event before the window."""
    if window.complete:
        return replay(window.events)
    return replay(window.events, window_start(window), window.start_at)
