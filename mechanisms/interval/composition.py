"""Exact per-record composition of interval releases on one column (spec §1.7, §7.3).

Theorem 4 bounds the leakage of releases M_1..M_k of a column by the sum of their
leakages. When every release is a canonical partition of the raw column (Case-I,
Case-II, Case-K without exact reports), the ensemble ⊕M_j is itself a canonical
partition, the common refinement by all anchors, so its coverage is exact:

    τ(⊕M_j) = E[Σ_cells P_Y(cell)²]  over all the anchors,

computed here by the same scrambled-QMC integrator as single designs (anchors of
different releases are independent draws). Two readings:

* ``joint_coverage(designs, law)``: the expectation over every release's anchors,
  the charge of a set of designs fixed in advance;
* ``joint_coverage_given(anchors, design, law, rng)``: earlier releases' *realized*
  anchors (public, in their tables) and a fresh draw of the new design's, averaged
  over records: valid also when the new design was chosen after seeing the earlier
  output (adaptive), since it conditions on what was published.

The ledger's charge (``price``): a new release pays the joint leakage bound of the
column's *committed* releases with it, minus what they were charged (never negative),
when every release of the column is eligible and no pending one was itself charged an
increment; otherwise its standalone bound. ``price``'s docstring proves that the
column's charges then always cover the joint leakage of what was committed, whatever
the interleaving of reservations, commits and refunds. The refinement only lowers
Σ P², so the joint leakage is never below any one release's, and never above the
additive bound (Lemma 1).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
from numpy.typing import ArrayLike

from mechanisms.interval.coverage import Estimate, integrate, partition_coverage
from mechanisms.interval.designs import Canonical, IntervalMechanism
from mechanisms.interval.ranges import FloatArray, Law

#: fresh draws of the new design's anchors per record, at least, for the realized form
MIN_POINTS = 2**16


def eligible(design: object) -> bool:
    """A canonical partition of the raw column without exact reports: its ensemble with
    other such designs is again a canonical partition (the common refinement)."""
    return (isinstance(design, IntervalMechanism) and isinstance(design.partition, Canonical)
            and design.transform.identity and not design.exact_cells
            and design.exact_range is None)


def _check(designs: Sequence[IntervalMechanism]) -> None:
    if not designs:
        raise ValueError("no designs")
    for d in designs:
        if not eligible(d):
            raise ValueError("exact composition needs canonical designs on the raw column"
                             " without exact reports")


def joint_coverage(designs: Sequence[IntervalMechanism], law: Law) -> Estimate:
    """τ(⊕M_j) over independent anchor draws of every design (QMC, with its SE)."""
    _check(designs)
    dims = [d.partition.dims for d in designs]
    offsets = np.cumsum([0, *dims])

    def integrand(q: FloatArray) -> FloatArray:
        anchors = [d.partition.anchors(q[:, offsets[j]:offsets[j + 1]])
                   for j, d in enumerate(designs)]
        return partition_coverage(np.hstack(anchors), law)

    return integrate(integrand, int(offsets[-1]))


def joint_coverage_given(previous: Sequence[ArrayLike], design: IntervalMechanism, law: Law,
                         rng: np.random.Generator) -> Estimate:
    """n⁻¹ Σ_i E[Σ_cells P(cell)²] for record i's realized earlier anchors (each array
    (n, k_j)) refined by fresh anchors of ``design``; ``ceil(MIN_POINTS / n)`` draws per
    record, SE from the spread over records."""
    _check([design])
    arrays = [np.asarray(a, dtype=np.float64).reshape(np.shape(a)[0], -1) for a in previous]
    n = arrays[0].shape[0] if arrays else 0
    if n == 0 or any(a.shape[0] != n for a in arrays):
        raise ValueError("earlier anchors need one row per record, the same n")
    old = np.hstack(arrays)
    if not np.all(np.isfinite(old) | np.isnan(old)):
        raise ValueError("anchors must be finite (NaN: none)")
    old = np.where(np.isnan(old), np.inf, old)  # a missing anchor cuts nothing
    draws = max(1, math.ceil(MIN_POINTS / n))
    per_record = np.zeros(n)
    for _ in range(draws):
        fresh = design.partition.sample(rng, n)
        per_record += partition_coverage(np.hstack([old, fresh]), law)
    per_record /= draws
    se = float(per_record.std(ddof=1) / math.sqrt(n)) if n > 1 else 1.0
    return Estimate(float(per_record.mean()), se)


def exact_increment(joint: Estimate, already: Fraction, unit: int) -> Fraction:
    """What a new release adds under exact accounting: the joint leakage bound (rounded
    up to the ledger ``unit``) minus what the column was already charged, at least 0."""
    bound = Fraction(math.ceil(Fraction(joint.leakage_bound) * unit), unit)
    return max(Fraction(0), bound - already)


# ------------------------------------------------------------------ the ledger's charge

#: what a release on a column was charged: its standalone leakage bound (Thm 4, additive)
#: or the exact increment over the column's committed releases
ADDITIVE = "additive"
EXACT_INCREMENT = "exact_increment"


@dataclass(frozen=True)
class Held:
    """A release of the column as the pricing sees it: its design (None when it is not
    ``eligible``), the ledger units it holds, and whether those were an exact increment."""

    design: IntervalMechanism | None
    units: int
    incremental: bool


@dataclass(frozen=True)
class Pricing:
    """The charge of a new release (``units``), how (``charged``) and why (``reason``)."""

    units: int
    charged: str
    reason: str
    joint: Estimate | None = None
    already_units: int = 0


def price(new: object, standalone_units: int, committed: Sequence[Held],
          pending: Sequence[Held], law: Law, unit: int, *, max_releases: int,
          max_dims: int) -> Pricing:
    """What the ledger holds for a new release ``new`` on a column: the exact increment
    over the column's *committed* releases when that is safe and smaller, else its
    standalone bound ``standalone_units``.

    ``committed``: the column's releases whose charge is final (succeeded, or failed after
    reading the data); ``pending``: those holding a reservation (queued or running).
    Exact when ``new`` and every committed and pending release are ``eligible`` and no
    pending one was itself charged an increment; then the charge is
    ``max(0, ⌈J(C ∪ {new})·unit⌉ − Σ_C units)`` where J is the joint leakage bound of the
    ensemble (``joint_coverage``), if that is below the standalone charge.

    Why the column's charges always cover its joint leakage. Let L(S) be the true
    leakage of the ensemble of a set S of canonical releases. With Y, Y' two independent
    prior draws and all anchors drawn independently of them, 1 − L(S) = E Σ_cells P(cell)²
    = P(Y, Y' fall in one cell of every partition of S), so L(S) = P(∪_{j∈S} E_j) with
    E_j = "partition j separates Y and Y'": L is monotone and subadditive (Lemma 1;
    L(A ∪ B) ≤ L(A) + L(B)). Every charge satisfies s_j ≥ L({j}) (standalone bounds) or
    was priced as above; J ≥ L (upper confidence bound, as every interval charge).

    The ledger (reserve.lua / settle.lua) keeps a per-(dataset, version, column) history
    counter, bumped by every reservation of an interval release on the column and every
    charged settle of one; an exact-increment charge is reserved only if the counter still
    has the value read *before* the history was listed ('stale' otherwise: re-priced).
    Invariant I: with C the committed set and P the pending set of the column, every T
    with C ⊆ T ⊆ C ∪ P has Σ_T units ≥ L(T). It holds for the empty column, and:

    * reserving a standalone-charged j: a new T is T_old ∪ {j}, and
      Σ_T_old + s_j ≥ L(T_old) + L({j}) ≥ L(T_old ∪ {j}) (subadditivity);
    * reserving an increment-charged x priced at counter h: no reservation or charged
      settle happened since the history was read, so C is the committed set the price
      saw and P ⊆ the pending set it saw, all of them eligible and standalone-charged.
      For T = C ∪ Q ∪ {x}, Q ⊆ P: Σ_T ≥ J(C ∪ {x}) + Σ_Q s_q ≥ L(C ∪ {x}) + L(Q) ≥ L(T);
    * a commit (or a failure after reading the data, charged) moves a release from P to
      C and a refund removes it from P: either way the new family of sets T is a
      subfamily of the old one, so I still holds.

    With T = C: the committed total on the column is at least the joint leakage of the
    committed releases, refunds included (a price never rests on a pending release, so a
    refund can leave no later release underpaid), and never above the cap (reserve.lua
    checks the cap with the charge). The history is public designs, statuses and charges
    only: nothing the data decides changes a price.
    """
    def additive(reason: str) -> Pricing:
        return Pricing(standalone_units, ADDITIVE, reason)

    if not eligible(new):
        return additive("this design has exact reports, a transform or a non-canonical"
                        " partition: only canonical designs compose exactly")
    assert isinstance(new, IntervalMechanism)
    if not committed:
        return additive("no committed release on the column")
    if any(h.incremental for h in pending):
        return additive("a release charged an exact increment is still pending on the"
                        " column: prices rest on final charges only")
    if any(h.design is None for h in (*committed, *pending)):
        return additive("another release of the column is not a canonical design")
    if len(committed) + 1 > max_releases:
        return additive(f"more than {max_releases} committed releases of the column")
    designs = [h.design for h in committed if h.design is not None]
    if sum(d.partition.dims for d in designs) + new.partition.dims > max_dims:
        return additive(f"more than {max_dims} anchors in all")
    joint = joint_coverage([*designs, new], law)
    already = sum(h.units for h in committed)
    bound = math.ceil(Fraction(joint.leakage_bound) * unit)
    increment = max(0, bound - already)
    if increment >= standalone_units:
        return Pricing(standalone_units, ADDITIVE, "the exact increment is not smaller",
                       joint, already)
    return Pricing(increment, EXACT_INCREMENT,
                   "the joint leakage bound of the column's committed releases with this one,"
                   " minus what they were charged", joint, already)
