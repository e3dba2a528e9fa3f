"""Repeated draws on the same records: the intersection is what leaks (§1.5).

Given k independent releases A_1..A_k of the same X, the likelihood is
Π_i μ^(i)_{a_i}·1{x ∈ ∩a_i}, so A* = ∩A_i is sufficient. A* follows the
conditional law μ*_c = Σ_{∩a_i = c} Π μ^(i)_{a_i} — still of the form (1),
but |A*| = 1 is possible, which discloses X exactly (p = 4 uniform, two
draws: probability 2/3). This is why the ledger allows one draw per record
and column by default; these numbers describe what a second draw would cost.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mechanisms.subset import bitmask
from mechanisms.subset.bitmask import Masks
from mechanisms.subset.design import ENUMERATION_LIMIT, Design, DesignError
from mechanisms.subset.metrics import PrivacyReport, law_report

#: pairs of subsets intersected per chunk (bounds memory)
CHUNK_PAIRS = 1 << 22


@dataclass(frozen=True)
class Composed:
    """The conditional law of the intersection of independent draws."""

    p: int
    draws: int
    masks: Masks
    mu: NDArray[np.float64]

    def disclosure_by_category(self) -> NDArray[np.float64]:
        """P(|A*| = 1 | X = j) = μ*_{{j}}."""
        singles = bitmask.bit(np.arange(self.p))
        pos = np.clip(np.searchsorted(self.masks, singles), 0, len(self.masks) - 1)
        return np.where(self.masks[pos] == singles, self.mu[pos], 0.0)

    def disclosure_probability(self, w: ArrayLike) -> float:
        """P(|A*| = 1): the share of records whose category the draws reveal exactly."""
        return float(np.asarray(w, float) @ self.disclosure_by_category())

    def report(self, w: ArrayLike) -> PrivacyReport:
        return law_report(self.masks, self.mu, w)


def compose(designs: Sequence[Design]) -> Composed:
    """μ* of ∩A_i for independent draws with the given designs (same domain, p ≤ 16)."""
    if not designs:
        raise ValueError("compose at least one design")
    p = designs[0].p
    if any(d.p != p for d in designs) or p > ENUMERATION_LIMIT:
        raise DesignError("p", f"composition needs designs on one domain with p <= "
                               f"{ENUMERATION_LIMIT}")
    masks, mu = designs[0].law()
    for design in designs[1:]:
        masks, mu = _intersect(masks, mu, *design.law(), p)
    return Composed(p, len(designs), masks, mu)


def _intersect(
    masks_a: Masks, mu_a: NDArray[np.float64], masks_b: Masks, mu_b: NDArray[np.float64], p: int
) -> tuple[Masks, NDArray[np.float64]]:
    """μ*_c = Σ_{a∩b=c} μ_a μ_b over all pairs, binned on the 2**p masks."""
    total = np.zeros(1 << p)
    rows = max(1, CHUNK_PAIRS // max(len(masks_b), 1))
    for start in range(0, len(masks_a), rows):
        block = masks_a[start:start + rows, None] & masks_b[None, :]
        weight = mu_a[start:start + rows, None] * mu_b[None, :]
        total += np.bincount(block.ravel().astype(np.intp), weights=weight.ravel(),
                             minlength=1 << p)
    total[0] = 0.0  # a ∩ b = ∅ never happens: both draws hold X
    keep = np.flatnonzero(total > 0)
    return keep.astype(np.uint64), total[keep]
