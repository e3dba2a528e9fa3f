"""Which audit checks each registered mechanism: one entry per mechanism name.

Every mechanism in ``mechanisms.registry`` must have an entry here (a test
fails otherwise), so a new mechanism cannot ship unaudited. An entry runs the
mechanism on its worst-case neighbours (DP) or checks its notion's defining
property (interval, subset, noiseless), together with a deliberately broken
variant — the negative control — that the check must flag.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

#: "ci" fits the CI budget (seconds per mechanism); "full" is ``make audit``
AuditSize = Literal["ci", "full"]


@dataclass(frozen=True)
class AuditReport:
    """What one audit of one mechanism found (a row of the README's audit table)."""

    mechanism: str
    #: the notion checked: "epsilon-DP", "(epsilon, delta)-DP", "interval", "subset", "noiseless"
    notion: str
    #: candidate events (or checks) tried on the selection half
    events_tried: int
    #: certified lower bound on the privacy loss (DP) or the notion's checked quantity
    certified: float
    #: what the ledger charges for the audited request, in the notion's unit
    charged: float
    #: the mechanism passed: nothing certified beyond what is charged
    passed: bool
    #: the negative control (same check, deliberately broken mechanism) was flagged
    control_caught: bool
    #: one line: the worst event, the neighbours, the control's certified value
    detail: str = ""


#: runs the audit of ``mechanism`` at ``size`` from ``seed``
AuditFn = Callable[[str, AuditSize, int], AuditReport]

#: modules whose import registers entries through ``entry`` (one per family)
ENTRY_MODULES = [
    "mechanisms.audit.dp",
    "mechanisms.interval.audit",
    "mechanisms.subset.audit",
    "mechanisms.noiseless.audit",
    "mechanisms.competitors.audit",
    "mechanisms.iclp.audit",
]

_ENTRIES: dict[str, AuditFn] = {}


def entry(*names: str) -> Callable[[AuditFn], AuditFn]:
    """Register ``fn`` as the audit of each mechanism in ``names`` (once each)."""

    def register(fn: AuditFn) -> AuditFn:
        for name in names:
            if name in _ENTRIES:
                raise ValueError(f"audit entry for {name!r} registered twice")
            _ENTRIES[name] = fn
        return fn

    return register


@functools.cache
def _load() -> None:
    for module in ENTRY_MODULES:
        importlib.import_module(module)


def entries() -> dict[str, AuditFn]:
    """Mechanism name -> its audit, after importing every family's entries."""
    _load()
    return dict(_ENTRIES)


def run(mechanism: str, size: AuditSize = "ci", seed: int = 0) -> AuditReport:
    """Audit one mechanism; KeyError if it has no entry."""
    return entries()[mechanism](mechanism, size, seed)
