"""Privacy measures and their exact integer units (DESIGN §3).

Amounts never travel as float sums: a request's float is read as the decimal
it was written as, held as a ``Fraction``, and converted to integer units of
a per-measure quantum — costs rounded up, caps rounded down — so the ledger only ever
adds integers (BIGINT columns; below 2**53, as the old Valkey store's Lua doubles
needed, so its record moves exactly).
"""

from __future__ import annotations

import math
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Any

from mechanisms.base import LEDGER_UNITS
from mechanisms.suggest import did_you_mean

#: measure -> (units per 1.0, largest accepted cap). Every cap * 3 < 2**53.
#: Interval leakage is capped at 1 per column: it is 1 - coverage, and Thm 4's
#: additive bound on the composed leakage says nothing once the sum passes 1.
#: The units are the mechanisms' (``mechanisms.base.LEDGER_UNITS``: a mechanism refuses an
#: amount below one unit, as the API does). ρ's quantum of 1e-12 keeps a small Gaussian
#: release's ρ (ε²/2 of a pure release: 5e-9 at ε = 1e-4) exact enough.
MEASURES: dict[str, tuple[int, Fraction]] = {
    measure: (LEDGER_UNITS[measure], ceiling) for measure, ceiling in (
        ("epsilon", Fraction(10**6)), ("delta", Fraction(1)), ("rho", Fraction(10**3)),
        ("noiseless_bits", Fraction(10**6)), ("interval_leakage", Fraction(1)),
        ("subset_draws", Fraction(10**6)))
}
#: measures charged per column, written ``measure:<column>``
PER_COLUMN = frozenset({"interval_leakage", "subset_draws"})
#: the privacy notion each measure accounts (a dataset's metadata ``notions`` admits some)
NOTION_OF: dict[str, str] = {
    "epsilon": "dp", "delta": "dp", "rho": "dp", "noiseless_bits": "noiseless",
    "interval_leakage": "interval", "subset_draws": "subset",
}
NOTIONS = ("dp", "noiseless", "interval", "subset")
#: what a dataset document written before notions and record-level releases were opt-in
#: meant (every notion, record-level releases allowed): ``policy_of`` reads a document
#: without the fields so, and ``service.policy.migrate`` records it explicitly
LEGACY_POLICY: dict[str, Any] = {"notions": list(NOTIONS), "record_level": True}
#: notions that exclude each other on one dataset unless the operator allows both
#: (noiseless spec §11.3: the pair has no finite guarantee in either notion)
EXCLUSIVE = frozenset({"dp", "noiseless"})


def notions_of(measures: Any) -> set[str]:
    """The notions a release charging ``measures`` (``interval_leakage:age`` too) uses."""
    return {NOTION_OF[base_measure(m)] for m in measures}


def default_notions(caps: Any) -> list[str]:
    """The notions a dataset admits when its metadata names none: those of the measures its
    budgets name (``{"epsilon": 3, "delta": 1e-7}`` admits dp only), in ``NOTIONS`` order."""
    named = notions_of(caps)
    return [n for n in NOTIONS if n in named]


def admitted_notions(dataset: dict[str, Any]) -> list[str]:
    """The notions the dataset's document admits. Registration stores them; a document
    without the field was written before they were (``LEGACY_POLICY``: all four)."""
    return list(dataset.get("notions", LEGACY_POLICY["notions"]))


def record_level(dataset: dict[str, Any]) -> bool:
    """Whether the operator allowed record-level releases (one output per record) on the
    dataset: metadata ``record_level`` (stored at registration, default false; a document
    from before the field keeps what it allowed then, ``LEGACY_POLICY``)."""
    return bool(dataset.get("record_level", LEGACY_POLICY["record_level"]))


def notion_lock(measures: Any, dataset: dict[str, Any]) -> str:
    """Which exclusive notion a release locks the dataset to ('' for none): 'dp' or
    'noiseless' when the dataset admits both but not mixed (``allow_mixed_noiseless_dp``)."""
    if dataset.get("allow_mixed_noiseless_dp", False):
        return ""
    admitted = set(admitted_notions(dataset))
    if not admitted >= EXCLUSIVE:
        return ""  # only one of them is admitted at all: nothing to lock
    used = notions_of(measures) & EXCLUSIVE
    return next(iter(used)) if len(used) == 1 else ""


class AmountError(ValueError):
    """A budget or cost amount that cannot be accepted; ``field`` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


def base_measure(measure: str) -> str:
    """``interval_leakage:age`` -> ``interval_leakage``."""
    return measure.split(":", 1)[0]


def unit(measure: str) -> int:
    return MEASURES[base_measure(measure)][0]


def to_fraction(value: Any, field: str) -> Fraction:
    """Read a JSON number exactly as written (0.1 is 1/10, not the nearest double)."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise AmountError(field, "must be a number")
    try:
        dec = Decimal(value) if isinstance(value, int | str) else Decimal(repr(value))
    except InvalidOperation:
        raise AmountError(field, "must be a number") from None
    if not dec.is_finite():
        raise AmountError(field, "must be finite")
    return Fraction(dec)


def cost_units(measure: str, amount: Fraction) -> int:
    """A cost in integer units, rounded up so the ledger never undercharges."""
    return math.ceil(amount * unit(measure))


def on_lattice(measure: str, amount: Fraction) -> Fraction:
    """``amount`` rounded down to a whole number of ``measure``'s units: what a request
    agrees to is read this way, so its cost (calibrated to it) is charged exactly and
    never above what the caller wrote."""
    return from_units(measure, cap_units(measure, amount))


def cap_units(measure: str, amount: Fraction) -> int:
    """A cap in integer units, rounded down so the ledger never over-allows."""
    return math.floor(amount * unit(measure))


def from_units(measure: str, units: int) -> Fraction:
    return Fraction(units, unit(measure))


def display(measure: str, units: int) -> float:
    """Units as a plain number for JSON output."""
    return float(from_units(measure, units))


def pasteable(amount: Fraction) -> float | str:
    """An exact amount as a request can send it back: a JSON number when the number's
    shortest decimal is the amount (``to_fraction`` reads it so), else that decimal as a
    string (read exactly too). Ledger amounts are whole units, finite decimals."""
    number = float(amount)
    if Fraction(Decimal(repr(number))) == amount:
        return number
    return format(Decimal(amount.numerator) / Decimal(amount.denominator), "f")


def parse_caps(raw: Any, columns: list[str], where: str = "metadata.budgets") -> dict[str, int]:
    """Validate a dataset's ``budgets`` into caps in units, one per ledger measure.

    Per-column measures given without a column apply to every column; an
    explicit ``measure:column`` overrides. Only the measures named get a cap: a
    dataset admits no measure its budgets do not name (no default caps: a
    ``subset_draws`` cap of 1 per categorical column once let an ε-only dataset release
    subsets).
    """
    if not isinstance(raw, dict):
        raise AmountError(where, "must be an object of measure -> cap")
    caps: dict[str, int] = {}
    explicit: dict[str, int] = {}
    for name, value in raw.items():
        field = f"{where}.{name}"
        base, _, column = str(name).partition(":")
        if base not in MEASURES:
            raise AmountError(field, f"unknown measure {base!r}{did_you_mean(base, MEASURES)};"
                              f" known: {sorted(MEASURES)}")
        if column and base not in PER_COLUMN:
            raise AmountError(field, f"measure {base!r} is not per column")
        if column and column not in columns:
            raise AmountError(field, f"unknown column {column!r}"
                              + did_you_mean(column, columns))
        amount = to_fraction(value, field)
        if amount < 0 or amount > MEASURES[base][1]:
            raise AmountError(field, f"must be between 0 and {MEASURES[base][1]}")
        if base == "subset_draws" and amount.denominator != 1:
            raise AmountError(field, "must be a whole number of draws")
        units = cap_units(base, amount)
        if column:
            explicit[name] = units
        elif base in PER_COLUMN:
            caps.update({f"{base}:{c}": units for c in columns})
        else:
            caps[base] = units
    caps.update(explicit)
    return caps
