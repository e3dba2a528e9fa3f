"""Dummy-category augmentation (Appendices B and C): a per-record coverage floor α.

The domain grows to [p+2]; categories p and p+1 (0-based) are dummies with
population share α each. Real records release A ∪ {d} with A from a
complement-symmetric independent design on [p] and d uniform on the two
dummies; 2m simulated dummy records (m per dummy) release Ã ∪ {d} with
Ã ~ ν. The induced conditional design is μ'_{a∪{d}} = ν_a for both kinds
(symmetry of ν makes (ν_a + ν_{a^c})/2 = ν_a), so no one can tell the kinds
apart, and every released subset holds a dummy: L'(Â) ≥ α for every record.

The paper's "2αn dummy users" does not give share α per dummy; here
m = round(α n/(1 − 2α)) per dummy and the *effective* share
α_eff = m/(n + 2m) is published: estimators must fix the dummy mass at it
(with it free, the augmented model is not identifiable).

For p = 2, 3 the base design draws any non-empty proper subset
(``design.proper``), which may be a singleton: the dummy alone covers it.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mechanisms.subset import bitmask, sampler
from mechanisms.subset.bitmask import Masks
from mechanisms.subset.design import Design, DesignError, proper, uniform
from mechanisms.subset.metrics import PrivacyReport, law_report


def base_design(p: int) -> Design:
    """The uniform design for p ≥ 4, every non-empty proper subset for p = 2, 3."""
    return uniform(p) if p >= 4 else proper(p)


@dataclass(frozen=True)
class DummyAugmentation:
    """A complement-symmetric independent base design plus dummy share α ∈ (0, 1/2)."""

    base: Design
    alpha: float

    def __post_init__(self) -> None:
        if not 0.0 < self.alpha < 0.5:
            raise DesignError("alpha", "the dummy share alpha must lie strictly between 0 and 1/2")
        if not self.base.is_independent or not self.base.is_complement_symmetric():
            raise DesignError("type", "dummy augmentation needs a complement-symmetric"
                                      " independent base design")
        if self.base.p + 2 > bitmask.MAX_P:
            raise DesignError("p", f"at most {bitmask.MAX_P - 2} real categories with dummies")

    @property
    def p(self) -> int:
        return self.base.p

    @property
    def p_augmented(self) -> int:
        return self.base.p + 2

    def dummy_count(self, n: int) -> int:
        """m dummy records per dummy category for n real records."""
        return round(Fraction(self.alpha) * n / (1 - 2 * Fraction(self.alpha)))

    def effective_alpha(self, n: int) -> Fraction:
        """The exact dummy share m/(n + 2m) of each dummy category (0 if n = 0)."""
        m = self.dummy_count(n)
        return Fraction(m, n + 2 * m) if n + 2 * m else Fraction(0)

    def population(self, w: ArrayLike, alpha: float | None = None) -> NDArray[np.float64]:
        """w' = ((1 − 2α)w, α, α) on [p+2]."""
        a = self.alpha if alpha is None else alpha
        return np.concatenate([(1.0 - 2.0 * a) * np.asarray(w, float), [a, a]])

    def law(self) -> tuple[Masks, NDArray[np.float64]]:
        """μ' on [p+2]: μ'_{a∪{d}} = ν_a for both dummies d."""
        masks, nu = self.base.nu()
        dummies = [bitmask.bit(self.p), bitmask.bit(self.p + 1)]
        both = np.concatenate([masks | dummies[0], masks | dummies[1]])
        order = np.argsort(both)
        return both[order], np.concatenate([nu, nu])[order]

    def report(self, w: ArrayLike, alpha: float | None = None) -> PrivacyReport:
        """Metrics of the augmented design for the augmented population."""
        masks, mu = self.law()
        return law_report(masks, mu, self.population(w, alpha))

    def size_coverage(self, w: ArrayLike, alpha: float | None = None) -> float:
        """τ' = w'ᵀQ'w' without enumeration (Q' = [[Q, ½], [½, I₂]] blocks)."""
        a = self.alpha if alpha is None else alpha
        real = (1.0 - 2.0 * a) * np.asarray(w, float)
        # real-real: Q; real-dummy: Σ_{a∋i} ν_a = 1/2 per dummy; dummy-dummy: 1 on the diagonal
        return float(real @ self.base.Q @ real + 2.0 * a * real.sum() + 2.0 * a * a)


@dataclass(frozen=True)
class DummyRelease:
    """Augmented output: real records in their order, 2m dummies at random positions."""

    masks: Masks
    #: which rows are dummies — never publish this, it undoes the augmentation
    dummy_rows: NDArray[np.bool_]
    n_real: int
    n_dummy_per_category: int

    @property
    def alpha_effective(self) -> Fraction:
        total = self.n_real + 2 * self.n_dummy_per_category
        return Fraction(self.n_dummy_per_category, total) if total else Fraction(0)


def privatize_with_dummies(
    x: ArrayLike, augmentation: DummyAugmentation, rng: np.random.Generator
) -> DummyRelease:
    """Privatize real records and interleave simulated dummy records (Appendix B)."""
    p = augmentation.p
    codes = sampler.check_codes(x, p)
    n = len(codes)
    m = augmentation.dummy_count(n)
    real_stream, dummy_stream, order_stream = rng.spawn(3)
    real = sampler.privatize(codes, augmentation.base, real_stream)
    real |= bitmask.bit(p + real_stream.integers(0, 2, size=n))
    fake = sampler.survey_question(augmentation.base, dummy_stream, 2 * m)
    fake |= bitmask.bit(p + np.repeat(np.arange(2), m))
    total = n + 2 * m
    positions = order_stream.choice(total, size=2 * m, replace=False)
    out = np.empty(total, dtype=np.uint64)
    is_dummy = np.zeros(total, dtype=bool)
    is_dummy[positions] = True
    out[positions] = fake
    out[~is_dummy] = real
    return DummyRelease(out, is_dummy, n, m)


def strip_dummies(masks: ArrayLike, p: int) -> Masks:
    """The real part of augmented subsets; each must hold exactly one dummy category."""
    values = bitmask.as_masks(masks)
    dummy_bits = values >> np.uint64(p)
    if np.any((dummy_bits != 1) & (dummy_bits != 2)):
        raise ValueError("every augmented subset must hold exactly one dummy category")
    return values & bitmask.full(p)
