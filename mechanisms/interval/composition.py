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

The exact charge of a new release is the joint leakage bound minus what the column
was already charged (never negative): the column's total is then the joint bound.
The refinement only lowers Σ P², so the joint leakage is never below any one
release's, and never above the additive bound (Lemma 1).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
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
