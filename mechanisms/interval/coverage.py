"""Coverage τ = E_Z[P_Y(S_Z)], leakage 1 − τ, composition, and calibration.

Expected coverage is an integral over the anchor law (and over Y for the
progressive mechanism) of Σ_i P_Y(R_i)² (eq. 15). It is computed by
randomised quasi-Monte Carlo with a FIXED public seed: deterministic, from
public inputs only, and with an error bar from independent scrambles. The
ledger is charged the upper confidence bound on leakage, so a Monte Carlo
error can never undercharge.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from numpy.typing import ArrayLike
from scipy import stats
from scipy.stats import qmc

from mechanisms.interval.ranges import FloatArray, Law

#: public seed of the coverage integrator (anyone can recompute a charge)
SEED = 20_220_601
REPLICATES = 8
LOG2_POINTS = 13
#: one-sided 99.95% Student-t quantile with REPLICATES − 1 degrees of freedom
T_QUANTILE = float(stats.t.ppf(0.9995, REPLICATES - 1))
#: added to every leakage bound: covers the rounding of the integrand itself
FLOOR = 1e-9


class Design(Protocol):
    """Anything with a coverage integrand over ``dims`` uniforms."""

    @property
    def dims(self) -> int: ...

    def coverage_integrand(self, q: FloatArray, law: Law) -> FloatArray: ...


@dataclass(frozen=True)
class Estimate:
    """A coverage estimate with its standard error (between scrambles)."""

    value: float
    se: float

    @property
    def leakage(self) -> float:
        return 1.0 - self.value

    @property
    def leakage_bound(self) -> float:
        """Upper 99.95% bound on the leakage (what the ledger is charged)."""
        return min(1.0, max(0.0, 1.0 - self.value + T_QUANTILE * self.se + FLOOR))


@functools.cache
def _points(dims: int) -> FloatArray:
    """REPLICATES independent scrambled Sobol' nets, stacked: (R·2^LOG2_POINTS, dims)."""
    nets = [
        qmc.Sobol(d=dims, scramble=True, seed=SEED + r).random_base2(LOG2_POINTS)
        for r in range(REPLICATES)
    ]
    out = np.clip(np.vstack(nets), 1e-12, 1.0 - 1e-12)
    out.flags.writeable = False
    return out


def integrate(integrand: Callable[[FloatArray], FloatArray], dims: int) -> Estimate:
    """E[integrand(Q)] for Q uniform on (0,1)^dims, by randomised QMC."""
    q = _points(dims)
    values = np.asarray(integrand(q), dtype=np.float64).reshape(REPLICATES, -1).mean(axis=1)
    return Estimate(float(values.mean()), float(values.std(ddof=1) / math.sqrt(REPLICATES)))


def expected_coverage(design: Design, law: Law) -> Estimate:
    """τ(M) under the prior ``law``, from the design alone (never the data).

    A selective design is not Def 1 on its nulls; its coverage is the conservative
    ``selective_account(...).charged``.
    """
    from mechanisms.interval.designs import Selective

    if isinstance(design, Selective):
        return selective_account(design, law).charged
    return integrate(lambda q: design.coverage_integrand(q, law), design.dims)


@dataclass(frozen=True)
class SelectiveAccount:
    """The two bounds behind a selective release's charge, and what they rest on.

    ``per_output``: E over outputs of each output's coverage, where a collected
    range counts its Def-1 coverage L(S_z) and a null — whose posterior is the prior
    times P(null | y)/P(null), not a restricted prior — counts 1/R with
    R = sup_y P(null | y)/P(null), the largest posterior/prior ratio a null carries.
    For a Def-1 posterior the same formula gives back L(S_z) (its ratio is 1/L(S_z)
    on S_z), i.e. coverage exp(−D_∞(posterior ‖ prior)). It is the conservative
    reading: writing the null posterior as the layer-cake mixture of restricted
    priors, p·r = ∫ P(r > t)·p|_{r>t} dt, gives coverage ∫ P(r > t)² dt >= 1/R
    (Cauchy–Schwarz). R is bounded above through inf_y P(collected | y)
    (``Selective.collect_floor``, an exact sweep over the anchor draws).

    ``refined``: (1 − ρ) + ρ τ_base, the coverage of releasing the base range when
    W = 1; the selective output is post-processing of it (Thm 6).

    ``charged`` is the smaller coverage (larger leakage bound) of the two.
    """

    refined: Estimate
    per_output: Estimate
    #: P(null) under the prior
    null_probability: float
    #: lower bound on inf_y P(collected | Y = y)
    collect_floor: float
    #: upper bound on sup_y P(null | y)/P(null); a null's coverage is counted as 1/this
    null_ratio: float

    @property
    def charged(self) -> Estimate:
        return max((self.refined, self.per_output), key=lambda e: e.leakage_bound)

    @property
    def null_coverage(self) -> float:
        return 1.0 / self.null_ratio if self.null_ratio > 0 else 1.0


def selective_account(design: Any, law: Law) -> SelectiveAccount:
    """Both bounds of a ``designs.Selective`` under ``law``, by the same fixed-seed QMC."""
    q = _points(design.dims)
    terms, anchors, kept = design.account_terms(q, law)
    per = terms.reshape(REPLICATES, -1, terms.shape[1]).mean(axis=1)
    size = q.shape[0] // REPLICATES
    floor = np.array([design.collect_floor(anchors[r * size:(r + 1) * size],
                                           kept[r * size:(r + 1) * size])
                      for r in range(REPLICATES)])
    rho = float(design.rho)
    collected, collect, base = per[:, 0], per[:, 1], per[:, 2]
    p_null = 1.0 - rho * collect
    worst = 1.0 - rho * floor  # >= sup_y P(null | y)
    with np.errstate(divide="ignore", invalid="ignore"):
        null_part = np.where(worst > 0.0, p_null * p_null / worst, 0.0)

    def estimate(values: FloatArray) -> Estimate:
        return Estimate(float(values.mean()), float(values.std(ddof=1) / math.sqrt(REPLICATES)))

    mean_null, mean_worst = float(p_null.mean()), float(worst.mean())
    return SelectiveAccount(
        refined=estimate(1.0 - rho + rho * base),
        per_output=estimate(collected + null_part),
        null_probability=mean_null,
        collect_floor=float(floor.mean()),
        null_ratio=mean_worst / mean_null if mean_null > 0 else 1.0,
    )


def monte_carlo_coverage(design: Design, law: Law, n: int, rng: np.random.Generator) -> float:
    """Plain Monte Carlo τ with n i.i.d. draws (a cross-check for the QMC integrator)."""
    return float(np.mean(design.coverage_integrand(rng.random((n, design.dims)), law)))


# --------------------------------------------------------------------------- closed forms


def case1_coverage(anchor_cdf_values: ArrayLike) -> FloatArray:
    """Per-anchor Case-I coverage F(u)² + (1 − F(u))² (eq. 14); its mean is τ̂."""
    f = np.asarray(anchor_cdf_values, dtype=np.float64)
    out: FloatArray = f * f + (1.0 - f) ** 2
    return out


def uniform_case1_coverage(b: float) -> float:
    """Y ~ U[0, 1], U ~ U[−b, 1 + b]: τ = (2b + 2/3)/(1 + 2b) (spec §4.6)."""
    return (2.0 * b + 2.0 / 3.0) / (1.0 + 2.0 * b)


def ring_coverage(tau_floor: float) -> float:
    """Quantile-circle ring under a continuous prior: 1 − 2E[w(1 − w)], w ~ U[τ, 1 − τ]."""
    t = tau_floor
    if t >= 0.5:
        return 0.5
    lo, hi = t, 1.0 - t
    integral = (hi**2 / 2 - hi**3 / 3) - (lo**2 / 2 - lo**3 / 3)
    return 1.0 - 2.0 * integral / (hi - lo)


# --------------------------------------------------------------------------- composition


def partition_coverage(anchors: ArrayLike, law: Law) -> FloatArray:
    """Σ_k P_Y(cell_k)² for each row's canonical partition (anchors need not be sorted)."""
    a = np.sort(np.asarray(anchors, dtype=np.float64), axis=1)
    f = law.cdf(a)
    n = a.shape[0]
    f = np.hstack([np.zeros((n, 1)), f, np.ones((n, 1))])
    p = np.diff(f, axis=1)
    out: FloatArray = np.sum(p * p, axis=1)
    return out


def ensemble_coverage(anchor_sets: Sequence[ArrayLike], law: Law) -> FloatArray:
    """Per-record coverage of the ensemble ⊕M_j (Def 3): the common refinement."""
    arrays = [np.asarray(a, dtype=np.float64) for a in anchor_sets]
    merged = np.hstack([a.reshape(a.shape[0], -1) for a in arrays])
    return partition_coverage(merged, law)


def composed_leakage(leakages: Sequence[float]) -> float:
    """Theorem 4: 1 − τ(⊕M_j) <= Σ_j (1 − τ(M_j)), for dependent or adaptive anchors too."""
    return float(min(1.0, math.fsum(leakages)))


# --------------------------------------------------------------------------- calibration


class CalibrationError(ValueError):
    """No parameter value in range meets the leakage target."""


def calibrate_scale(
    leakage_of: Callable[[float], float], target: float, lo: float, hi: float,
    grid: int = 14, resolution: float = 1e-4,
) -> float:
    """The smallest scale past the leakiest one with leakage(scale) <= target.

    Leakage of a location–scale anchor design rises from the bunched-anchor
    limit to a peak and then falls to 0 as anchors spread (Thm 1). If even the
    peak meets the target, the peak scale is returned (the design leaks less
    than agreed). Otherwise: bisection over a fixed log-grid of scales (ratio
    e^resolution) along the falling branch. Working on a fixed grid makes the
    result a fixed point: calibrating again to the leakage it charges returns
    the same scale, so a worker that only knows the charge rebuilds the design.
    """
    if not (math.isfinite(lo) and math.isfinite(hi) and 0.0 < lo < hi):
        # a degenerate or overflowing scale range (prior SD 0 or inf): no scale to search
        raise CalibrationError("the column's prior has no usable spread to calibrate against")
    steps = math.ceil(math.log(hi / lo) / resolution)

    def scale(i: int) -> float:
        return float(lo * math.exp(i * resolution))

    coarse = [round(j * steps / (grid - 1)) for j in range(grid)]
    values = [leakage_of(scale(i)) for i in coarse]
    peak = int(np.argmax(values))
    if values[peak] <= target:
        return scale(coarse[peak])
    later = [j for j in range(peak, grid) if values[j] <= target]
    if not later:
        raise CalibrationError("no anchor scale in range meets the leakage budget")
    a, b = coarse[later[0] - 1], coarse[later[0]]  # leakage(a) > target >= leakage(b)
    while b - a > 1:
        mid = (a + b) // 2
        if leakage_of(scale(mid)) <= target:
            b = mid
        else:
            a = mid
    return scale(b)


def calibrate_increasing(
    leakage_of: Callable[[float], float], target: float, lo: float, hi: float, bits: int = 16
) -> float:
    """The largest x on a fixed grid of [lo, hi] with leakage(x) <= target (leakage
    increasing in x); the grid makes the result a fixed point, as for the scale."""
    steps = 2**bits

    def point(i: int) -> float:
        return lo + (hi - lo) * i / steps

    if leakage_of(point(0)) > target:
        raise CalibrationError("even the least leaky setting exceeds the leakage budget")
    if leakage_of(point(steps)) <= target:
        return point(steps)
    a, b = 0, steps  # leakage(a) <= target < leakage(b)
    while b - a > 1:
        mid = (a + b) // 2
        if leakage_of(point(mid)) <= target:
            a = mid
        else:
            b = mid
    return point(a)
