"""How private a design is for a population w (§1.4): there is no ε, only measurements.

With L(a) = 1_aᵀw the probability mass of subset a and P(A=a) = μ_a L(a):

* size coverage τ = E[L(A)] = wᵀQw (leakage 1 − τ);
* mutual information I(X;A) = E[−log2 L(A)] bits (the paper's Def. 6 lacks
  a minus sign: H(X|A) = −E log P(X|A) = H(X) − I); ≤ 1 bit for any
  independent design;
* prediction risk R = Σ_a μ_a max_{x∈a} w_x (the MAP guesser's accuracy).

All depend on w, so a release reports them for an *estimated* ŵ (a
function of the released subsets only) or for a stated prior.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mechanisms.subset import bitmask
from mechanisms.subset.bitmask import Masks
from mechanisms.subset.design import Design, r_p, uniform_support_size


@dataclass(frozen=True)
class PrivacyReport:
    """Design-level privacy of a release for one population w."""

    size_coverage: float
    size_leakage: float
    mi_bits: float | None
    entropy_bits: float
    conditional_entropy_bits: float | None
    prediction_risk: float
    baseline_risk: float
    #: the smallest L(a) over the support: the worst coverage any record can get
    min_individual_coverage: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def entropy_bits(w: ArrayLike) -> float:
    """H(X) in bits (0·log 0 = 0)."""
    w = np.asarray(w, float)
    positive = w[w > 0]
    return float(-(positive * np.log2(positive)).sum())


def law_report(masks: Masks, mu: ArrayLike, w: ArrayLike) -> PrivacyReport:
    """Metrics of any conditional law μ on listed subsets (composed laws included)."""
    w = np.asarray(w, float)
    mu = np.asarray(mu, float)
    rows = bitmask.indicators(masks, len(w))
    size = rows @ w
    tau = float(mu @ size**2)
    positive = size > 0
    mi = float(-(mu[positive] * size[positive] * np.log2(size[positive])).sum())
    top = np.max(np.where(rows > 0, w[None, :], -np.inf), axis=1)
    risk = float(mu @ top)
    h = entropy_bits(w)
    return PrivacyReport(tau, 1.0 - tau, mi, h, h - mi, risk, float(w.max()),
                         float(size[mu > 0].min()))


def privacy_report(design: Design, w: ArrayLike) -> PrivacyReport:
    """Metrics of ``design`` under w; exact for every uniform design.

    Enumerable designs are summed over their support. The uniform design
    beyond that uses closed forms: τ = 1/r_p + (1 − 1/r_p)Σw², R from the
    sorted w (subsets whose largest member is the k-th largest: C(p−k, s−1)
    of each size s), I by size classes under the uniform prior (otherwise
    not computed: it would need all 2**p subsets).
    """
    w = np.asarray(w, float)
    if design.enumerable:
        masks, mu = design.law()
        return law_report(masks, mu, w)
    return uniform_closed_form(design.p, w)


def uniform_closed_form(p: int, w: ArrayLike) -> PrivacyReport:
    """The uniform design's metrics without enumeration (any p ≤ 63)."""
    w = np.asarray(w, float)
    q = float(1 / r_p(p))
    tau = q + (1.0 - q) * float(w @ w)
    mu = 2.0 / uniform_support_size(p)
    ranked = np.sort(w)[::-1]
    ways = [sum(math.comb(p - k, s - 1) for s in range(2, p - 1)) for k in range(1, p + 1)]
    risk = float(mu * (ranked @ np.asarray(ways, float)))
    h = entropy_bits(w)
    mi: float | None = None
    if np.allclose(w, 1.0 / p, rtol=0, atol=1e-15):
        mi = -sum(mu * math.comb(p, s) * (s / p) * math.log2(s / p) for s in range(2, p - 1))
    return PrivacyReport(tau, 1.0 - tau, mi, h, None if mi is None else h - mi, risk,
                         float(w.max()), float(ranked[-1] + ranked[-2]))


def non_private_report(w: ArrayLike) -> PrivacyReport:
    """Reference A = {X} (not subset-private): leakage 1 − Σw², H(X) bits, R = 1."""
    w = np.asarray(w, float)
    h = entropy_bits(w)
    tau = float(w @ w)
    return PrivacyReport(tau, 1.0 - tau, h, h, 0.0, 1.0, float(w.max()), float(w[w > 0].min()))


def fully_private_report(w: ArrayLike) -> PrivacyReport:
    """Reference A = [p]: no leakage; the guesser falls back to max w."""
    w = np.asarray(w, float)
    h = entropy_bits(w)
    return PrivacyReport(1.0, 0.0, 0.0, h, h, float(w.max()), float(w.max()), 1.0)


def individual_report(mask: int, w: ArrayLike, true_code: int | None = None) -> dict[str, Any]:
    """Per-record view (Fig. 4): L(a), 1 − L(a), the MAP guess, and whether it is right."""
    w = np.asarray(w, float)
    inside = bitmask.members(mask)
    size = float(w[inside].sum())
    guess = inside[int(np.argmax(w[inside]))]
    doc: dict[str, Any] = {
        "size": size,
        "size_leakage": 1.0 - size,
        "map_guess": guess,
        "posterior_max": float(w[guess] / size) if size > 0 else None,
    }
    if true_code is not None:
        doc["prediction_leakage"] = int(guess == true_code)
    return doc


def posterior(mask: int, w: ArrayLike) -> NDArray[np.float64]:
    """P(X = x | A = a) = w_x 1{x∈a}/L(a): the only thing a release says (Definition 1)."""
    w = np.asarray(w, float)
    inside = bitmask.indicators(np.array([mask], dtype=np.uint64), len(w))[0]
    result: NDArray[np.float64] = w * inside / float(w @ inside)
    return result
